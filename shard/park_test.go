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

// TestNewLeaderMarksWhatItsPredecessorParked: an event whose record Kafka
// acknowledged while one replica led, and whose MarkFired failed there, is
// marked by the replica that leads next, which asks the others for their
// parked events before it fires; Kafka holds one record of it. Before, only
// the replica that parked the event knew, and the next leader produced it
// again: under packet loss a fault run refired 35 events at once so.
func TestNewLeaderMarksWhatItsPredecessorParked(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	var failed atomic.Int32
	leader, other, _ := openPairWith(t, brokers, 500*time.Millisecond, Knobs{BatchMark: func() error {
		if failed.Add(1) == 1 {
			return errors.New("leadership lost while committing log")
		}
		return nil
	}})
	r := Request{ID: "handed", Delay: 200 * time.Millisecond, HasDelay: true, Topic: "handpark", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	if res, err := leader.Schedule(context.Background(), []Request{r}); err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("Schedule: %v %+v", err, res)
	}
	waitFor(t, 10*time.Second, "the leader parks the event its failed mark named", func() bool { return len(leader.Parked()) == 1 })
	// The leader would mark it again at its next sweep (sweepInterval):
	// hand the shard over before.
	if err := leader.raft.LeadershipTransfer().Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the new leader marks the event fired", func() bool {
		rec, found, err := other.fsm.Get("handed")
		return err == nil && found && rec.State == raftfsm.StateFired
	})
	if !other.IsLeader() {
		t.Fatal("leadership went back: the test needs the other replica to lead")
	}
	// A second copy would come from the new leader's wheel at once: wait
	// well past that.
	got := publishtest.Consume(t, brokers, 2, 3*time.Second, "handpark")
	if _, ok := got.ByID["handed"]; !ok || got.Dups != 0 {
		t.Fatalf("%d records of the event in Kafka, want 1", len(got.Records))
	}
}
