package raftfsm

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

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
		if err := st.Close(); err != nil {
			b.Error(err)
		}
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

// fifoObserver queues the events apply schedules, in the order it schedules them.
type fifoObserver struct{ queue []Ref }

func (o *fifoObserver) Scheduled(seq uint64, due int64, _ Policy) {
	o.queue = append(o.queue, Ref{Seq: seq, Due: due})
}
func (*fifoObserver) Settled(uint64) {}
func (*fifoObserver) Reset()         {}

// benchSchedules is how many recurring schedules BenchmarkApplyMarkFiredRecurring cycles
// through, as in BENCHMARKS.md's recurring run (per cluster there; one shard here).
const benchSchedules = 10_000

// BenchmarkApplyMarkFiredRecurring: 10,000 schedules every second, their phases spread over
// the second, and per iteration one MarkFired entry of the 256 earliest pending occurrences,
// as a leader marks them. Each settled occurrence makes apply move its schedule's cursor and
// create the next occurrence (applier.occurred), which is what this measures on top of
// BenchmarkApplyMarkFired.
func BenchmarkApplyMarkFiredRecurring(b *testing.B) {
	st := openTestStore(b, b.TempDir(), StoreOptions{})
	obs := &fifoObserver{}
	f, err := NewFSM(st, 1, obs)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		f.Close()
		if err := st.Close(); err != nil {
			b.Error(err)
		}
	})
	index := uint64(0)
	var logs []*raft.Log
	flush := func() {
		f.ApplyBatch(logs)
		logs = logs[:0]
	}
	payload := make([]byte, 200)
	for i := range benchSchedules {
		d := Definition{Every: int64(time.Second), Start: t0.Add(time.Second + time.Duration(i%1000)*time.Millisecond).UnixNano(),
			CatchUp: CatchUpLast, Topic: "reminders", Key: []byte(fmt.Sprintf("key-%d", i)), Payload: payload,
			Headers: []Header{{Key: "source", Value: []byte("bench")}}}
		index++
		logs = append(logs, &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: AppendRecurring(nil, &Recurring{
			Op: RecurringCreate, ProposedAt: t0.UnixNano(), ID: fmt.Sprintf("sched-%06d", i), Hash: DefinitionHash(&d), Def: d})})
		if len(logs) == benchBatch {
			flush()
		}
	}
	flush()
	if len(obs.queue) != benchSchedules {
		b.Fatalf("%d occurrences pending, want %d", len(obs.queue), benchSchedules)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		c := &MarkFired{DueKnown: true, Entries: make([]Fired, benchBatch)}
		for j, r := range obs.queue[:benchBatch] {
			c.Entries[j] = Fired{Seq: r.Seq, FiredAt: r.Due + 1e6, Attempts: 1, Due: r.Due}
			c.ProposedAt = max(c.ProposedAt, r.Due+1e6)
		}
		obs.queue = append(obs.queue[:0], obs.queue[benchBatch:]...)
		index++
		logs := []*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: AppendMarkFired(nil, c)}}
		b.StartTimer()
		res := f.ApplyBatch(logs)[0].(*MarkBatchResult)
		if res.Outcomes[0] != Marked || res.Outcomes[benchBatch-1] != Marked {
			b.Fatalf("entry %d: %v", index, res.Outcomes)
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "occurrences/s")
}
