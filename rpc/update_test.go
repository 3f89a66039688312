package rpc_test

import (
	"context"
	"testing"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/rpctest"
	"github.com/chimehq/chime/shard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestUpdateRejectsInvalidRequestsAndChangesNothing(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: validEvent()}); err != nil {
		t.Fatal(err)
	}
	before := len(e.backend.Calls())
	in2s := durationpb.New(2 * time.Second)
	for _, tc := range []struct {
		req *chimev1.UpdateRequest
		msg string
	}{
		{&chimev1.UpdateRequest{Delay: in2s}, "id: required"},
		{&chimev1.UpdateRequest{Id: "order-42"}, "request: nothing to change: set deliver_at or delay, key, payload or headers"},
		{&chimev1.UpdateRequest{Id: "order-42", Delay: in2s, DeliverAt: timestamppb.New(t0)}, "deliver_at: set at most one of deliver_at and delay (both are set)"},
		{&chimev1.UpdateRequest{Id: "order-42", Delay: durationpb.New(-time.Second)}, "delay: must not be negative (got -1s)"},
		{&chimev1.UpdateRequest{Id: "order-42", Payload: make([]byte, 1<<20+1)}, "payload: 1048577 bytes, at most 1048576 allowed (--max-payload)"},
		{&chimev1.UpdateRequest{Id: "order-42", Headers: &chimev1.HeaderList{Headers: []*chimev1.Header{{Key: "Chime-Id", Value: []byte("x")}}}},
			`headers[0].key: the "chime-" prefix is reserved for headers Chime adds`},
	} {
		_, err := e.client.Update(ctx(t), tc.req)
		wantStatus(t, err, codes.InvalidArgument, tc.msg)
	}
	if n := len(e.backend.Calls()); n != before {
		t.Fatalf("invalid updates reached the backend: %+v", e.backend.Calls()[before:])
	}
}

// TestUpdateKeepsATombstoneEmpty: an Update cannot give a tombstone event a
// payload (FAILED_PRECONDITION naming the payload, nothing changed); an
// empty one, and a change of anything else, it can.
func TestUpdateKeepsATombstoneEmpty(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	ev := validEvent()
	ev.Payload, ev.Tombstone = nil, true
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "order-42", Payload: []byte("x")})
	wantStatus(t, err, codes.FailedPrecondition, "payload: the event is a tombstone (its record has a null value), so an update cannot give it a payload; nothing was changed")
	for _, req := range []*chimev1.UpdateRequest{
		{Id: "order-42", Payload: []byte{}},
		{Id: "order-42", Key: []byte("k2"), Delay: durationpb.New(time.Minute)},
	} {
		if _, err := e.client.Update(ctx(t), req); err != nil {
			t.Fatalf("Update %v: %v", req, err)
		}
	}
	g, err := e.client.Get(ctx(t), &chimev1.GetRequest{Id: "order-42"})
	if err != nil || !g.Event.GetTombstone() || len(g.Event.Payload) != 0 || g.Version != 3 || string(g.Event.Key) != "k2" {
		t.Fatalf("Get after the updates: %v, %v; want a tombstone at version 3", g, err)
	}
}

func TestUpdate(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	for _, id := range []string{"pending", "fired", "cancelled"} {
		ev := validEvent()
		ev.Id = id
		if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	e.backend.Fire("fired", t0.Add(2*time.Second), 1)
	if _, err := e.client.Cancel(ctx(t), &chimev1.CancelRequest{Id: "cancelled"}); err != nil {
		t.Fatal(err)
	}

	_, err := e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "nope", Delay: durationpb.New(time.Second)})
	wantStatus(t, err, codes.NotFound, `id: no event "nope" (never scheduled, or settled longer ago than the cluster's retention and removed)`)
	_, err = e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "fired", Delay: durationpb.New(time.Second)})
	wantStatus(t, err, codes.FailedPrecondition, `id: event "fired" has already fired; only a scheduled event can be updated`)
	_, err = e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "cancelled", Delay: durationpb.New(time.Second)})
	wantStatus(t, err, codes.FailedPrecondition, `id: event "cancelled" has been cancelled; only a scheduled event can be updated`)
	_, err = e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "pending", Delay: durationpb.New(time.Second), ExpectedVersion: 2})
	wantStatus(t, err, codes.FailedPrecondition, `expected_version: event "pending" is at version 1, not 2`)

	e.clock.Advance(time.Second)
	resp, err := e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "pending", Delay: durationpb.New(5 * time.Second),
		Payload: []byte("later"), Headers: &chimev1.HeaderList{}, ExpectedVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	due := timestamppb.New(t0.Add(6 * time.Second))
	if want := (&chimev1.UpdateResponse{Id: "pending", Due: due, Version: 2}); !proto.Equal(resp, want) {
		t.Fatalf("Update = %v, want %v", resp, want)
	}
	// Unset fields are kept (the key), set ones replace (the payload, and
	// the headers by an empty list).
	got, err := e.client.Get(ctx(t), &chimev1.GetRequest{Id: "pending"})
	if err != nil {
		t.Fatal(err)
	}
	ev := validEvent()
	ev.Id, ev.Delay, ev.DeliverAt, ev.Payload, ev.Headers = "pending", nil, due, []byte("later"), nil
	ev.Priority = proto.Uint32(5) // Get shows the default
	want := &chimev1.GetResponse{Event: ev, State: chimev1.EventState_EVENT_STATE_SCHEDULED, Due: due, CreatedAt: timestamppb.New(t0), Version: 2}
	if !proto.Equal(got, want) {
		t.Fatalf("Get after the update =\n%v\nwant\n%v", got, want)
	}
	// An empty key removes it; the due time stays.
	if resp, err = e.client.Update(ctx(t), &chimev1.UpdateRequest{Id: "pending", Key: []byte{}}); err != nil || resp.Version != 3 || !proto.Equal(resp.Due, due) {
		t.Fatalf("Update of the key = %v, %v", resp, err)
	}
	if got, _ = e.client.Get(ctx(t), &chimev1.GetRequest{Id: "pending"}); len(got.Event.Key) != 0 {
		t.Fatalf("key %q after it was removed", got.Event.Key)
	}
}

// refusingBackend refuses every Replace request with err, as a shard leader
// refuses one whose event is being fired.
type refusingBackend struct {
	*rpctest.Backend
	err error
}

func (b refusingBackend) Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	res, err := b.Backend.Schedule(ctx, reqs)
	for i, r := range reqs {
		if err == nil && r.Replace {
			res[i] = shard.Result{Err: b.err}
		}
	}
	return res, err
}

func TestScheduleReplace(t *testing.T) {
	e := start(t, rpc.Limits{}, nil)
	ev := validEvent()
	if _, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev}); err != nil {
		t.Fatal(err)
	}
	ev.OnConflict = 7
	_, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
	wantStatus(t, err, codes.InvalidArgument, "event.on_conflict: unknown value 7 (ON_CONFLICT_REJECT or ON_CONFLICT_REPLACE)")
	ev.OnConflict, ev.Payload = chimev1.OnConflict_ON_CONFLICT_REPLACE, []byte("replaced")
	resp, err := e.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
	if err != nil || resp.Existing || resp.Version != 2 {
		t.Fatalf("REPLACE = %v, %v; want version 2, not existing", resp, err)
	}

	// A refused Replace is that event's answer in a batch, and the call's for a Schedule.
	r := start(t, rpc.Limits{}, refusingBackend{rpctest.New(nil), shard.ErrFiring})
	other := validEvent()
	other.Id = "other"
	batch, err := r.client.BatchSchedule(ctx(t), &chimev1.BatchScheduleRequest{Events: []*chimev1.Event{ev, other}})
	if err != nil {
		t.Fatal(err)
	}
	if got := batch.Results[0]; codes.Code(got.Code) != codes.Aborted || got.Id != ev.Id {
		t.Errorf("refused Replace in a batch: %v", got)
	}
	if got := batch.Results[1]; got.Code != 0 || got.Version != 1 {
		t.Errorf("the other event of the batch: %v", got)
	}
	_, err = r.client.Schedule(ctx(t), &chimev1.ScheduleRequest{Event: ev})
	if status.Code(err) != codes.Aborted {
		t.Errorf("refused Replace: %v, want Aborted", err)
	}
}
