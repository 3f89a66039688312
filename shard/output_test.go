package shard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestOutputReachesKafka: an event's partition and tombstone travel from
// the Request through Raft and the fire batch to the record: it lands on
// its partition with a null value, and an Update that would give the
// tombstone a payload is refused with nothing changed, while one of its
// due time keeps both.
func TestOutputReachesKafka(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs() // 3 partitions a topic
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.ClockSkewBound = 10 * time.Millisecond // no predecessor to fence off
	})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()

	tomb := delayed("tomb", "compacted", time.Hour)
	tomb.Payload, tomb.Output = nil, raftfsm.Output{Partition: 2, HasPartition: true, Tombstone: true}
	tomb.ContentHash = raftfsm.ContentHash(tomb.Topic, nil, nil, nil, 0, int64(time.Hour), false, true, raftfsm.DefaultPolicy, tomb.Output)
	plain := delayed("plain", "compacted", 200*time.Millisecond)
	if _, err := n.host.Schedule(ctx, []Request{tomb, plain}); err != nil {
		t.Fatal(err)
	}

	_, err := s.Update(ctx, Change{Change: raftfsm.Change{ID: "tomb", Fields: raftfsm.ChangePayload, Payload: []byte("x")}})
	if !errors.Is(err, ErrTombstonePayload) {
		t.Fatalf("Update giving the tombstone a payload: %v, want ErrTombstonePayload", err)
	}
	if rec, _, err := s.Get(ctx, "tomb"); err != nil || rec.Version != 1 || len(rec.Payload) != 0 {
		t.Fatalf("after the refused update: %+v, %v; want version 1 unchanged", rec, err)
	}
	res, err := s.Update(ctx, Change{Change: raftfsm.Change{ID: "tomb", Fields: raftfsm.ChangeDue}, Delay: 300 * time.Millisecond, HasDelay: true})
	if err != nil || res.Outcome != raftfsm.Updated {
		t.Fatalf("Update of the due time: %+v, %v", res, err)
	}

	got := publishtest.Consume(t, brokers, 2, 10*time.Second, "compacted")
	if r, ok := got.ByID["tomb"]; !ok || r.Kafka.Partition != 2 || r.Kafka.Value != nil || r.Version != 2 {
		t.Fatalf("tomb: %+v; want version 2 on partition 2 with a null value", r.Kafka)
	}
	if r, ok := got.ByID["plain"]; !ok || r.Value() != "v1-plain" {
		t.Fatalf("plain: %+v", r.Kafka)
	}
	if rec, _, err := s.Get(ctx, "tomb"); err != nil || rec.Output != tomb.Output {
		t.Fatalf("Get(tomb) = %+v, %v; want output %+v", rec, err, tomb.Output)
	}
}
