package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// scheduleMany schedules n events id prefix+i on topic, due at due(i), in
// batches.
func scheduleMany(t *testing.T, cl chimev1.SchedulerClient, prefix, topic string, n int, due func(i int) time.Time) {
	t.Helper()
	for from := 0; from < n; from += 1000 {
		req := &chimev1.BatchScheduleRequest{}
		for i := from; i < min(n, from+1000); i++ {
			req.Events = append(req.Events, &chimev1.Event{Id: fmt.Sprintf("%s%06d", prefix, i), Topic: topic, DeliverAt: timestamppb.New(due(i))})
		}
		resp, err := cl.BatchSchedule(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Results {
			if r.Code != 0 {
				t.Fatalf("%s: %s", r.Id, r.Message)
			}
		}
	}
}

// cancelMatching runs a CancelMatching to its end or its first error, and
// returns the last totals it received.
func cancelMatching(cl chimev1.SchedulerClient, prefix string, onProgress func()) (*chimev1.CancelMatchingProgress, error) {
	stream, err := cl.CancelMatching(context.Background(), &chimev1.CancelMatchingRequest{Filter: &chimev1.EventFilter{IdPrefix: prefix}})
	if err != nil {
		return nil, err
	}
	last := &chimev1.CancelMatchingProgress{}
	for {
		p, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return last, nil
		}
		if err != nil {
			return last, err
		}
		last = p
		if onProgress != nil {
			onProgress()
		}
	}
}

func count(t *testing.T, cl chimev1.SchedulerClient, prefix string, st chimev1.EventState) uint64 {
	t.Helper()
	resp, err := cl.Count(context.Background(), &chimev1.CountRequest{Filter: &chimev1.EventFilter{IdPrefix: prefix, States: []chimev1.EventState{st}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// TestQueriesAndBulkCancelAcrossProcesses, on a 3-process cluster of 8
// shards: a List by prefix is complete and in order across every shard; a
// bulk cancel of 100,000 events reports exact counts and none of them fires,
// while the events it did not match do; a leader killed in the middle of a
// bulk cancel loses nothing, and running it again finishes it.
func TestQueriesAndBulkCancelAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster with 160,000 events for about 40 s; skipped with -short")
	}
	t.Parallel()
	c := newCluster(t, 3)
	st := c.waitSettled(30 * time.Second)
	cl := c.nodes["n1"].client()
	col := collect(t, c.brokers, "proc.bulk", "proc.keep")

	start := time.Now()
	scheduleMany(t, cl, "kill/", "proc.bulk", 60_000, func(int) time.Time { return start.Add(time.Hour) })
	// keep/ and bulk/ fall due together, 30 s after they are scheduled,
	// and bulk/ is cancelled at once: the time it has to beat is what
	// scheduling and cancelling 100,000 events take, whatever the machine
	// did before.
	fireAt := time.Now().Add(30 * time.Second)
	// keep/ is due over one second, three events per millisecond step, so
	// that due times tie and the order falls to the ids.
	keepDue := func(i int) time.Time { return fireAt.Add(time.Duration(i/3) * time.Millisecond) }
	scheduleMany(t, cl, "keep/", "proc.keep", 1000, keepDue)
	scheduleMany(t, cl, "bulk/", "proc.bulk", 100_000, func(int) time.Time { return fireAt })
	t.Logf("scheduled 161,000 events in %v", time.Since(start).Round(time.Millisecond))

	cancelStart := time.Now()
	got, err := cancelMatching(cl, "bulk/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Done || got.Matched != 100_000 || got.Cancelled != 100_000 || got.SkippedFired != 0 || got.SkippedHeld != 0 {
		t.Fatalf("bulk cancel of 100,000, %v before they fall due: %v", time.Until(fireAt).Round(time.Millisecond), got)
	}
	t.Logf("bulk cancel of 100,000 in %v", time.Since(cancelStart).Round(time.Millisecond))
	if n := count(t, cl, "bulk/", chimev1.EventState_EVENT_STATE_CANCELLED); n != 100_000 {
		t.Fatalf("%d bulk/ events cancelled, want 100,000", n)
	}

	// The list, from another node, in pages of 70.
	var listed []string
	req := &chimev1.ListRequest{Filter: &chimev1.EventFilter{IdPrefix: "keep/"}, Limit: 70}
	for {
		resp, err := c.nodes["n2"].client().List(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range resp.Events {
			listed = append(listed, g.Event.Id)
			if want := keepDue(len(listed) - 1); !g.Due.AsTime().Equal(want) {
				t.Fatalf("listed %s due %v, want %v", g.Event.Id, g.Due.AsTime(), want)
			}
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			break
		}
	}
	if len(listed) != 1000 || !slices.IsSorted(listed) || listed[0] != "keep/000000" || listed[999] != "keep/000999" {
		t.Fatalf("listed %d keep/ events (first %v), want all 1000 in order", len(listed), listed[:min(3, len(listed))])
	}

	// Events too large for one shard's answer to hold a page of them: the
	// shards' answers through Peer stop short, and the pages still come
	// complete and in order.
	big := make([]byte, 800<<10) // five of them, about one shard's share, pass 3 MiB
	for from := 0; from < 40; from += 10 {
		req := &chimev1.BatchScheduleRequest{}
		for i := from; i < from+10; i++ {
			req.Events = append(req.Events, &chimev1.Event{Id: fmt.Sprintf("big/%03d", i), Topic: "proc.keep",
				DeliverAt: timestamppb.New(start.Add(time.Hour)), Payload: big})
		}
		if _, err := cl.BatchSchedule(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	var bigs []string
	pages := 0
	req = &chimev1.ListRequest{Filter: &chimev1.EventFilter{IdPrefix: "big/"}, Limit: 1000}
	for {
		resp, err := c.nodes["n3"].client().List(context.Background(), req, grpc.MaxCallRecvMsgSize(8<<20))
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, g := range resp.Events {
			bigs = append(bigs, g.Event.Id)
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			break
		}
	}
	if len(bigs) != 40 || !slices.IsSorted(bigs) || pages < 10 {
		t.Fatalf("listed %d big/ events in %d pages (%v), want all 40 in order over at least 10 pages", len(bigs), pages, bigs)
	}

	// Kill a node that leads shards, not the one running the cancel, once
	// the cancel has made progress.
	victim := ""
	for _, s := range st.Shards {
		if s.Leader != "n1" {
			victim = s.Leader
			break
		}
	}
	killed := false
	first, err := cancelMatching(cl, "kill/", func() {
		if !killed {
			killed = true
			if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Errorf("killing %s: %v", victim, err)
			}
		}
	})
	t.Logf("bulk cancel of kill/ with %s killed after its first progress: %v, %v", victim, first, err)
	if !killed {
		t.Fatal("the bulk cancel finished without reporting progress once")
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		st := c.status("n1")
		for _, s := range st.GetShards() {
			if s.Leader == "" || s.Leader == victim {
				return false, "a leader for every shard without " + victim + ": " + nodetest.Describe(st)
			}
		}
		return st != nil, "status"
	})
	again, err := cancelMatching(cl, "kill/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Done || first.Cancelled+again.Cancelled > 60_000 || again.SkippedFired != 0 {
		t.Fatalf("re-run after the kill: %v (the first run reported %v)", again, first)
	}
	if p, n := count(t, cl, "kill/", chimev1.EventState_EVENT_STATE_SCHEDULED), count(t, cl, "kill/", chimev1.EventState_EVENT_STATE_CANCELLED); p != 0 || n != 60_000 {
		t.Fatalf("after the re-run: %d kill/ events pending, %d cancelled; want 0 and 60,000", p, n)
	}

	// keep/ fires; bulk/ never does.
	keep := map[string]time.Time{}
	for i := range 1000 {
		keep[fmt.Sprintf("keep/%06d", i)] = keepDue(i)
	}
	col.waitIDs(t, keep, time.Until(fireAt)+15*time.Second)
	// Watch until every shard has fired past fireAt, with 3 s to spare.
	barrier(t, cl, col, "proc.keep", clusterShards, fireAt.Add(3*time.Second))
	recs, _ := col.byID()
	for id := range recs {
		if !strings.HasPrefix(id, "keep/") && !strings.HasPrefix(id, barrierPrefix) {
			t.Errorf("%s was produced after its bulk cancel was acknowledged", id)
		}
	}
}
