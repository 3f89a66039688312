package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/chimehq/chime/raftfsm"
)

func TestScheduleFireCancelRestart(t *testing.T) {
	brokers := startBroker(t)
	dir := t.TempDir()
	n := openNode(t, dir, "", brokers, 2)
	ctx := context.Background()

	req := func(id string, delay time.Duration) Request {
		r := Request{ID: id, Delay: delay, HasDelay: true, Topic: "orders", Payload: []byte("p-" + id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true)
		return r
	}
	// Soon, later (fires after the restart), and one to cancel.
	var reqs []Request
	for i := range 20 {
		reqs = append(reqs, req(fmt.Sprintf("soon-%d", i), time.Duration(i)*20*time.Millisecond))
	}
	for i := range 10 {
		reqs = append(reqs, req(fmt.Sprintf("later-%d", i), 3*time.Second))
	}
	reqs = append(reqs, req("cancel-me", 2*time.Second))
	res, err := n.host.Schedule(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != raftfsm.Created {
			t.Fatalf("request %d (%s): outcome %v", i, reqs[i].ID, r.Outcome)
		}
	}
	// A re-send is idempotent: same seq and due.
	again, err := n.host.Schedule(ctx, reqs[:1])
	if err != nil || again[0].Outcome != raftfsm.Existing || again[0].Due != res[0].Due {
		t.Fatalf("re-send: %+v, %v; want Existing with due %d", again, err, res[0].Due)
	}
	cr, err := n.host.Cancel(ctx, "cancel-me")
	if err != nil || cr.Outcome != raftfsm.Cancelled {
		t.Fatalf("cancel: %+v, %v", cr, err)
	}
	if cr, _ := n.host.Cancel(ctx, "nope"); cr.Outcome != raftfsm.NotFound {
		t.Fatalf("cancel of an unknown id: %v", cr.Outcome)
	}

	got, _ := consume(t, brokers, "orders", 20, 10*time.Second)
	if len(got) != 20 {
		t.Fatalf("before restart: consumed %d records, want the 20 'soon' ones", len(got))
	}
	waitFor(t, 5*time.Second, "soon events marked fired", func() bool {
		rec, ok, _ := n.host.Get(ctx, "soon-19")
		return ok && rec.State == raftfsm.StateFired
	})
	// Every stage of firing was timed: wake, slot, read, hold, lease, produce, mark.
	if got := testutil.CollectAndCount(n.metrics.FireStage); got != 7 {
		t.Fatalf("chime_fire_stage_seconds has %d stages, want 7", got)
	}

	// Restart before the 'later' events are due: they must fire from Pebble.
	n.close()
	n = openNode(t, dir, n.addr, brokers, 2)
	defer n.close()

	got, dups := consume(t, brokers, "orders", 30, 15*time.Second)
	if len(got) != 30 {
		t.Fatalf("after restart: consumed %d distinct records, want 30", len(got))
	}
	if _, ok := got["cancel-me"]; ok {
		t.Fatal("a cancelled event was produced")
	}
	for id, c := range got {
		if c.fired.Before(c.due) {
			t.Errorf("%s fired early: due %v, fired %v", id, c.due, c.fired)
		}
		if c.value != "p-"+id {
			t.Errorf("%s: value %q", id, c.value)
		}
	}
	t.Logf("duplicates: %d", dups)
	rec, ok, err := n.host.Get(ctx, "later-3")
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	waitFor(t, 5*time.Second, "later events marked fired", func() bool {
		rec, _, _ = n.host.Get(ctx, "later-3")
		return rec.State == raftfsm.StateFired
	})
	if rec.FiredAt < rec.Due {
		t.Fatalf("later-3 marked fired at %d before due %d", rec.FiredAt, rec.Due)
	}
}
