package shard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestParkedEventIsMarkedNotProducedAgain: an event whose record Kafka
// acknowledged and whose MarkFired failed (as one proposed as leadership
// went does) is parked, not fired again: the leader marks it on its next
// try, and Kafka holds one record of it. Before parking, the event went
// back into the wheel and its record was produced a second time, which is
// what a fault run's leader did under packet loss each time it lost its
// leadership and won it back.
func TestParkedEventIsMarkedNotProducedAgain(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	var failed atomic.Int32
	n := openNodeWith(t, t.TempDir(), "", brokers, 1, Knobs{BatchMark: func() error {
		if failed.Add(1) == 1 {
			return errors.New("leadership lost while committing log")
		}
		return nil
	}})
	defer n.close()
	s := n.host.Replica(0)
	r := Request{ID: "parked", Delay: 200 * time.Millisecond, HasDelay: true, Topic: "park", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	res, err := n.host.Schedule(context.Background(), []Request{r})
	if err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("Schedule: %v %+v", err, res)
	}

	publishtest.WaitFor(t, 10*time.Second, "the event marked fired after its first mark failed", func() bool {
		rec, found, err := s.fsm.Get("parked")
		return err == nil && found && rec.State == raftfsm.StateFired
	})
	if failed.Load() != 1 {
		t.Fatalf("%d batch marks; want the one that failed only (the parked event is marked apart)", failed.Load())
	}
	s.firing.mu.Lock()
	left := len(s.firing.parked)
	s.firing.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d events still parked after their mark committed", left)
	}
	// A second copy would come from the wheel after the retry delay (1 s):
	// wait past it.
	got := publishtest.Consume(t, brokers, 2, 3*time.Second, "park")
	if _, ok := got.ByID["parked"]; !ok || got.Dups != 0 {
		t.Fatalf("%d records of the event in Kafka, want 1", len(got.Records))
	}
}
