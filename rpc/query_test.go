package rpc_test

import (
	"fmt"
	"io"
	"testing"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestQueriesRejectInvalidRequestsAndChangeNothing(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	ev := validEvent()
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	ev.Id = "order-43"
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	first, err := e.client.List(ctx(t), &chimev1.ListRequest{Filter: &chimev1.EventFilter{IdPrefix: "order-"}, Limit: 1})
	if err != nil || len(first.Events) != 1 || first.NextPageToken == "" {
		t.Fatalf("List: %v, %v", first, err)
	}
	before := len(e.backend.Calls())
	for _, tc := range []struct {
		filter *chimev1.EventFilter
		limit  uint32
		token  string
		msg    string
	}{
		{&chimev1.EventFilter{States: []chimev1.EventState{chimev1.EventState(9)}}, 0, "", "filter.states[0]: unknown state 9; one of SCHEDULED, FIRED, CANCELLED, DEAD_LETTERED"},
		{&chimev1.EventFilter{States: []chimev1.EventState{chimev1.EventState_EVENT_STATE_UNSPECIFIED}}, 0, "", "filter.states[0]: unknown state EVENT_STATE_UNSPECIFIED; one of SCHEDULED, FIRED, CANCELLED, DEAD_LETTERED"},
		{&chimev1.EventFilter{DueAfter: timestamppb.New(t0), DueBefore: timestamppb.New(t0.Add(-time.Second))}, 0, "", "filter.due_before: 2026-03-01T11:59:59Z is not after filter.due_after 2026-03-01T12:00:00Z"},
		{&chimev1.EventFilter{Priorities: []uint32{9, 10}}, 0, "", "filter.priorities[1]: 10 above 9; priorities are 0 (lowest) to 9 (highest)"},
		{&chimev1.EventFilter{IdPrefix: "order-", Priorities: []uint32{5}}, 1, first.NextPageToken, "page_token: issued for another query: give the same filter as the page it came from, or no token to start over"},
		{nil, 1001, "", "limit: 1001, at most 1000 allowed"},
		{&chimev1.EventFilter{IdPrefix: "order-4"}, 1, first.NextPageToken, "page_token: issued for another query: give the same filter as the page it came from, or no token to start over"},
		{nil, 0, "garbage!", "page_token: not a token this server issued"},
	} {
		_, err := e.client.List(ctx(t), &chimev1.ListRequest{Filter: tc.filter, Limit: tc.limit, PageToken: tc.token})
		wantStatus(t, err, codes.InvalidArgument, tc.msg)
		if tc.token == "" && tc.limit == 0 {
			_, err = e.client.Count(ctx(t), &chimev1.CountRequest{Filter: tc.filter})
			wantStatus(t, err, codes.InvalidArgument, tc.msg)
		}
	}
	for _, tc := range []struct {
		filter *chimev1.EventFilter
		msg    string
	}{
		{nil, "filter: empty; give an id_prefix, a topic or a due range (to cancel every pending event, a due range that covers them all)"},
		{&chimev1.EventFilter{IdPrefix: "order-", States: []chimev1.EventState{chimev1.EventState_EVENT_STATE_FIRED}}, "filter.states: CancelMatching cancels pending events only: leave states empty or give SCHEDULED alone"},
		{&chimev1.EventFilter{Priorities: []uint32{9}}, "filter: priorities alone select too much for a bulk cancel; give an id_prefix, a topic or a due range as well (to cancel every pending event of these priorities, a due range that covers them all)"},
		{&chimev1.EventFilter{IdPrefix: "order-", Priorities: []uint32{12}}, "filter.priorities[0]: 12 above 9; priorities are 0 (lowest) to 9 (highest)"},
	} {
		stream, err := e.client.CancelMatching(ctx(t), &chimev1.CancelMatchingRequest{Filter: tc.filter})
		if err == nil {
			_, err = stream.Recv()
		}
		wantStatus(t, err, codes.InvalidArgument, tc.msg)
	}
	if n := len(e.backend.Calls()); n != before {
		t.Fatalf("invalid queries reached the backend: %+v", e.backend.Calls()[before:])
	}
	// The token continues its own query.
	next, err := e.client.List(ctx(t), &chimev1.ListRequest{Filter: &chimev1.EventFilter{IdPrefix: "order-"}, Limit: 1, PageToken: first.NextPageToken})
	if err != nil || len(next.Events) != 1 || next.Events[0].Event.Id != "order-43" || next.NextPageToken != "" {
		t.Fatalf("second page: %v, %v", next, err)
	}
}

func TestListPagesAndBulkCancel(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	for i := range 25 {
		ev := validEvent()
		ev.Id = fmt.Sprintf("cart-%02d", 24-i)
		ev.DeliverAt, ev.Delay = nil, durationpb.New(time.Duration(i%5)*time.Second)
		if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		resp, err := e.client.List(ctx(t), &chimev1.ListRequest{Filter: &chimev1.EventFilter{IdPrefix: "cart-"}, Limit: 10, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range resp.Events {
			got = append(got, fmt.Sprintf("%s@%ds", g.Event.Id, g.Due.AsTime().Sub(t0)/time.Second))
		}
		if token = resp.NextPageToken; token == "" {
			if pages != 2 {
				t.Fatalf("%d pages of 10 for 25 events", pages+1)
			}
			break
		}
	}
	if len(got) != 25 || got[0] != "cart-04@0s" || got[1] != "cart-09@0s" || got[5] != "cart-03@1s" || got[24] != "cart-20@4s" {
		t.Fatalf("list by due, then id: %v", got)
	}
	if n, err := e.client.Count(ctx(t), &chimev1.CountRequest{Filter: &chimev1.EventFilter{IdPrefix: "cart-0"}}); err != nil || n.Count != 10 {
		t.Fatalf("Count: %v, %v", n, err)
	}
	for _, dry := range []bool{true, false, false} {
		stream, err := e.client.CancelMatching(ctx(t), &chimev1.CancelMatchingRequest{Filter: &chimev1.EventFilter{IdPrefix: "cart-1"}, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		var last *chimev1.CancelMatchingProgress
		for {
			p, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			last = p
		}
		want := uint64(10)
		if dry == false && last.Cancelled == 0 {
			want = 0 // the re-run
		}
		if !last.Done || last.Matched != want || (!dry && last.Cancelled != want) || (dry && last.Cancelled != 0) {
			t.Fatalf("CancelMatching (dry run %v): last message %v", dry, last)
		}
	}
	left, err := e.client.Count(ctx(t), &chimev1.CountRequest{Filter: &chimev1.EventFilter{IdPrefix: "cart-", States: []chimev1.EventState{chimev1.EventState_EVENT_STATE_SCHEDULED}}})
	if err != nil || left.Count != 15 {
		t.Fatalf("pending after the bulk cancel: %v, %v", left, err)
	}
}
