package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestRetentionRemovesSettledEvents: with a retention, the leader removes
// fired and cancelled events once it has passed since they settled, and
// leaves pending ones; the id is then free, and the clean-up lag returns to
// zero.
func TestRetentionRemovesSettledEvents(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) { tu.Retention = 500 * time.Millisecond })
	defer n.close()
	s := n.host.Replica(0)
	req := func(id string, delay time.Duration) Request {
		r := Request{ID: id, Delay: delay, HasDelay: true, Topic: "ret", Payload: []byte(id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		return r
	}
	var reqs []Request
	for i := range 20 {
		reqs = append(reqs, req(fmt.Sprintf("fire-%d", i), 0))
	}
	reqs = append(reqs, req("cancel-me", time.Hour), req("pending", time.Hour))
	ctx := context.Background()
	if _, err := n.host.Schedule(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if r, err := n.host.Cancel(ctx, "cancel-me", nil); err != nil || r.Outcome != raftfsm.Cancelled {
		t.Fatalf("Cancel: %+v, %v", r, err)
	}
	publishtest.Consume(t, brokers, 20, 30*time.Second, "ret")
	if _, found, _ := n.host.Get(ctx, "fire-0"); !found {
		t.Fatal("a fired event was removed at once, long before its retention")
	}
	waitFor(t, 30*time.Second, "the settled events are removed", func() bool {
		st := s.Stats()
		return st.Expired == 21 && st.Retained == 0
	})
	for _, id := range []string{"fire-0", "fire-19", "cancel-me"} {
		if _, found, err := n.host.Get(ctx, id); err != nil || found {
			t.Fatalf("Get(%q) after the retention: found=%v err=%v", id, found, err)
		}
	}
	if _, found, _ := n.host.Get(ctx, "pending"); !found {
		t.Fatal("the retention removed a pending event")
	}
	if lag := s.CleanupLag(); lag != 0 {
		t.Fatalf("CleanupLag = %v with nothing left to remove", lag)
	}
	res, err := n.host.Schedule(ctx, []Request{req("cancel-me", time.Hour)})
	if err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("re-scheduling an expired id: %+v, %v; want Created", res, err)
	}
}
