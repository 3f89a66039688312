package cluster_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// TestQueryByPriorityAcrossNodes: List, Count and CancelMatching by
// priority, asked of a node that does not lead every shard, reach the
// other shards' leaders (as ShardListV2, ShardCountV2, ShardCancelV2) and
// select by priority there, an event scheduled without one being of
// priority 5.
func TestQueryByPriorityAcrossNodes(t *testing.T) {
	const shards = 2
	c := nodetest.MakeCluster(t, 3, nodetest.Options{Shards: shards})
	c.WaitSettled(60 * time.Second)
	var via *nodetest.Node
	for _, id := range c.IDs() {
		if id != c.Leader(0) && (via == nil || id != c.Leader(1)) {
			via = c.Node(id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sched := via.Scheduler()
	// Events of priorities 9, 0 and the default in both shards.
	var evs []*chimev1.ScheduleRequest
	perShard := map[uint32]int{}
	for i := 0; len(evs) < 12; i++ {
		id := fmt.Sprintf("prio-%d", i)
		s := shard.For(id, shards)
		if perShard[s] == 6 {
			continue
		}
		perShard[s]++
		ev := &chimev1.Event{Id: id, Topic: "payments", Payload: []byte("p"), Delay: durationpb.New(time.Hour)}
		switch len(evs) % 3 {
		case 0:
			p := uint32(9)
			ev.Priority = &p
		case 1:
			p := uint32(0)
			ev.Priority = &p
		}
		evs = append(evs, &chimev1.ScheduleRequest{Event: ev})
	}
	want := map[uint32][]string{}
	for _, r := range evs {
		if _, err := sched.Schedule(ctx, r); err != nil {
			t.Fatalf("schedule %s: %v", r.Event.Id, err)
		}
		p := uint32(5)
		if r.Event.Priority != nil {
			p = *r.Event.Priority
		}
		want[p] = append(want[p], r.Event.Id)
	}
	list := func(f *chimev1.EventFilter) []string {
		t.Helper()
		resp, err := sched.List(ctx, &chimev1.ListRequest{Filter: f, Limit: 100})
		if err != nil {
			t.Fatalf("List(%v) through %s: %v", f, via.ID, err)
		}
		var ids []string
		for _, g := range resp.Events {
			ids = append(ids, g.Event.Id)
		}
		slices.Sort(ids)
		return ids
	}
	for _, p := range []uint32{0, 5, 9} {
		f := &chimev1.EventFilter{Topic: "payments", Priorities: []uint32{p}}
		w := slices.Sorted(slices.Values(want[p]))
		if got := list(f); !slices.Equal(got, w) {
			t.Errorf("List of priority %d through %s = %v, want %v", p, via.ID, got, w)
		}
		if n, err := sched.Count(ctx, &chimev1.CountRequest{Filter: f}); err != nil || n.Count != uint64(len(w)) {
			t.Errorf("Count of priority %d through %s = %v, %v; want %d", p, via.ID, n, err, len(w))
		}
	}
	stream, err := sched.CancelMatching(ctx, &chimev1.CancelMatchingRequest{Filter: &chimev1.EventFilter{Topic: "payments", Priorities: []uint32{9}}})
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
			t.Fatalf("CancelMatching of priority 9 through %s: %v", via.ID, err)
		}
		last = p
	}
	if !last.GetDone() || last.Cancelled != uint64(len(want[9])) {
		t.Fatalf("CancelMatching of priority 9 through %s: %v; want %d cancelled", via.ID, last, len(want[9]))
	}
	pending := []chimev1.EventState{chimev1.EventState_EVENT_STATE_SCHEDULED}
	w := slices.Sorted(slices.Values(append(slices.Clone(want[0]), want[5]...)))
	if got := list(&chimev1.EventFilter{Topic: "payments", States: pending}); !slices.Equal(got, w) {
		t.Errorf("pending after the cancel: %v, want %v (priorities 0 and 5 untouched)", got, w)
	}
}
