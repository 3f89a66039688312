package raftfsm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"
)

const benchBatch = 256

func benchSchedule(seq int, proposedAt int64) *ScheduleBatch {
	c := &ScheduleBatch{ProposedAt: proposedAt, Events: make([]NewEvent, benchBatch)}
	payload := make([]byte, 200)
	for j := range c.Events {
		id := fmt.Sprintf("evt-%012d", seq*benchBatch+j)
		c.Events[j] = NewEvent{
			ID: id, Due: proposedAt + int64(j)*1e6, Topic: "reminders", Key: []byte(id), Payload: payload,
			Headers:     []Header{{Key: "source", Value: []byte("bench")}},
			ContentHash: uint64(seq*benchBatch + j),
		}
	}
	return c
}

// openBenchFSM opens shard 1 in a store on disk with no observer, both closed when b ends.
func openBenchFSM(b *testing.B) (*Store, *FSM) {
	st := openTestStore(b, b.TempDir(), StoreOptions{})
	f, err := NewFSM(st, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		f.Close()
		st.Close()
	})
	return st, f
}

// BenchmarkApplyScheduleBatch: one log entry of 256 new events with 200-byte payloads per
// iteration, through ApplyBatch into Pebble on disk (NoSync, as in production).
func BenchmarkApplyScheduleBatch(b *testing.B) {
	_, f := openBenchFSM(b)
	logs := make([]*raft.Log, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		logs[0] = &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: AppendScheduleBatch(nil, benchSchedule(i, 1e18))}
		b.StartTimer()
		res := f.ApplyBatch(logs)[0].(*ScheduleBatchResult)
		if res.Results[benchBatch-1].Outcome != Created {
			b.Fatalf("entry %d: %+v", i+1, res.Results[benchBatch-1])
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkApplyMarkFired: the other half of every event's life, 256 MarkFired entries per
// log entry, carrying the due times the leader read (TypeMarkFiredDue), as the shard sends
// them: apply settles each pending event from the in-memory pending set without reading it,
// and writes only its small status and the due-index deletion, not the payload again.
func BenchmarkApplyMarkFired(b *testing.B) {
	_, f := openBenchFSM(b)
	index := uint64(0)
	apply := func(data []byte) interface{} {
		index++
		return f.ApplyBatch([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: data}})[0]
	}
	for i := range b.N {
		apply(AppendScheduleBatch(nil, benchSchedule(i, 1e18)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		// As a leader marks them: in the order the fire batch read them (by due time),
		// which is not seq order, each at the time Kafka acknowledged its partition's
		// batch, which interleaves.
		c := &MarkFired{ProposedAt: 2e18, DueKnown: true, Entries: make([]Fired, benchBatch)}
		for j := range c.Entries {
			c.Entries[j] = Fired{Seq: uint64(i*benchBatch + j + 1), FiredAt: 2e18 + int64(j%7)*1e6, Attempts: 1, Due: 1e18 + int64(j)*1e6}
		}
		rand.New(rand.NewPCG(uint64(i), 1)).Shuffle(len(c.Entries), func(x, y int) { c.Entries[x], c.Entries[y] = c.Entries[y], c.Entries[x] })
		data := AppendMarkFired(nil, c)
		b.StartTimer()
		if res := apply(data).(*MarkBatchResult); res.Outcomes[0] != Marked {
			b.Fatalf("entry %d: %v", index, res.Outcomes[0])
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "events/s")
}
