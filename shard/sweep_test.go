package shard

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestSweepFiresAnOrphan: a pending event that the firing lost (taken out
// of the wheel and put nowhere, as the unknown path that left a recurring
// occurrence unfired did) is put back by the leader's sweep once two checks
// found it overdue and nowhere, fires, and is counted; one the firing holds
// (in the wheel for a later retry, or pinned by a change) is left alone.
func TestSweepFiresAnOrphan(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1)
	defer n.close()
	s := n.host.Replica(0)
	var reqs []Request
	for _, id := range []string{"orphan", "pinned"} {
		r := Request{ID: id, Delay: time.Hour, HasDelay: true, Topic: "sweep", Payload: []byte(id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		reqs = append(reqs, r)
	}
	// Due in an hour, beyond the horizon: the sweep reads what Pebble says,
	// so the test makes the two overdue by reading it at a clock two hours
	// on, through the sweep's own functions rather than its loop.
	res, err := n.host.Schedule(context.Background(), reqs)
	if err != nil || res[0].Outcome != raftfsm.Created || res[1].Outcome != raftfsm.Created {
		t.Fatalf("Schedule: %v %+v", err, res)
	}
	orphan, pinned := res[0], res[1]
	f := s.firing
	if err := f.pin(pinned.Seq, pinned.Due, raftfsm.DefaultPolicy); err != nil {
		t.Fatal(err)
	}
	overdue := []loaded{{orphan.Seq, orphan.Due, raftfsm.DefaultPolicy}, {pinned.Seq, pinned.Due, raftfsm.DefaultPolicy}}

	found, placed := f.sweep(overdue, nil)
	if len(placed) != 0 || !found[orphan.Seq] || found[pinned.Seq] {
		t.Fatalf("first check: found %v, placed %v; want the orphan found (it is beyond the horizon, so in no part of the firing), nothing placed", found, placed)
	}
	found, placed = f.sweep(overdue, found)
	if len(placed) != 1 || placed[0].seq != orphan.Seq || len(found) != 0 {
		t.Fatalf("second check: found %v, placed %v; want the orphan placed", found, placed)
	}
	if _, ok := f.handles.get(orphan.Seq); !ok {
		t.Fatal("the placed orphan is not in the wheel")
	}
	if found, placed = f.sweep(overdue, map[uint64]bool{orphan.Seq: true, pinned.Seq: true}); len(found)+len(placed) != 0 {
		t.Fatalf("a third check, with both suspected: found %v, placed %v; want neither, one in the wheel and one pinned", found, placed)
	}
	f.unpin(pinned.Seq)

	// The loop, on a leader, with a real event due now and lost from the
	// wheel: fired within two checks and a bit, and counted.
	r := Request{ID: "lost", Delay: 50 * time.Millisecond, HasDelay: true, Topic: "lost", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	if res, err = n.host.Schedule(context.Background(), []Request{r}); err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("Schedule: %v %+v", err, res)
	}
	f.mu.Lock()
	h, ok := f.handles.take(res[0].Seq)
	if ok {
		f.wheel.Remove(h)
	}
	f.mu.Unlock()
	if !ok {
		t.Fatal("the event is not in the wheel (fired already?)")
	}
	got := publishtest.Consume(t, brokers, 1, sweepAge+3*sweepInterval+5*time.Second, "lost")
	if _, ok := got.ByID["lost"]; !ok {
		t.Fatal("the event lost from the wheel was never produced")
	}
	if c := testutil.ToFloat64(n.metrics.Orphans); c != 1 {
		t.Fatalf("chime_fire_orphans_total = %v, want 1", c)
	}
}
