package raftfsm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkIngestCPU measures what an applied event costs one replica in total, compaction
// included: b.N entries of 500 new events (64-byte payloads, ids as chimectl bench makes
// them) are applied to Pebble on disk, then the benchmark flushes the memtable, waits for
// compactions to finish and reports the process's CPU time per event and Pebble's write
// amplification. The apply loop alone (BenchmarkApplyScheduleBatch) hides the compactions,
// which run in the background and were 44% of a cluster's ingest CPU. Run it long enough to
// reach the deeper levels:
//
//	go test ./raftfsm -run '^$' -bench IngestCPU -benchtime 4000x
//
// "delay" schedules each event 30 minutes after it arrives, at 100,000 events/s, so due
// times grow with arrival (chimectl bench --delay); "due-at" gives every event a due time in
// the same second, in random order (chimectl bench --due-at --spread 1s).
func BenchmarkIngestCPU(b *testing.B) {
	b.Run("delay", func(b *testing.B) { benchIngest(b, true, 1) })
	b.Run("due-at", func(b *testing.B) { benchIngest(b, false, 1) })
	b.Run("delay-3-shards", func(b *testing.B) { benchIngest(b, true, 3) })
	b.Run("upsert", func(b *testing.B) { benchUpsert(b) })
}

// benchUpsert measures what a batched upsert (a Schedule with Replace of a pending event,
// chimectl bench --update --update-batch 500) costs one replica, compaction included: b.N
// entries of 500 new events are applied and left to settle in Pebble, then b.N entries
// replace each of them once, in the order they were created, and the CPU time of those, of
// the flush and of the compactions they cause is reported per replaced event.
func benchUpsert(b *testing.B) {
	const batch = 500
	st := openTestStore(b, b.TempDir(), StoreOptions{})
	defer st.Close()
	f, err := NewFSM(st, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	prefix := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 10) + "-"
	rnd := rand.New(rand.NewPCG(1, 2))
	entry := func(i int, replace bool) []byte {
		c := &ScheduleBatch{ProposedAt: 1e18 + int64(i)*batch*1e4, Events: make([]NewEvent, batch)}
		for j := range c.Events {
			c.Events[j] = NewEvent{ID: prefix + strconv.Itoa(i*batch+j), Due: 1e18 + 30*6e10 + int64(i*batch+j),
				Topic: "chime-bench", Payload: []byte("updated"), ContentHash: rnd.Uint64(), Replace: replace}
		}
		return AppendScheduleBatch(nil, c)
	}
	index := uint64(0)
	apply := func(data []byte) {
		index++
		f.ApplyBatch([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: data}})
	}
	for i := 0; i < b.N; i++ {
		apply(entry(i, false))
	}
	settle(b, st)
	upserts := make([][]byte, b.N)
	for i := range upserts {
		upserts[i] = entry(i, true)
	}
	before := cpuTime()
	b.ResetTimer()
	for _, data := range upserts {
		apply(data)
	}
	applied := b.Elapsed()
	settle(b, st)
	b.StopTimer()
	if m := f.Stats(); m.Replaced != uint64(b.N*batch) {
		b.Fatalf("replaced %d events, want %d", m.Replaced, b.N*batch)
	}
	events := float64(b.N * batch)
	b.ReportMetric(float64(cpuTime()-before)/events/1e3, "cpu-µs/event")
	b.ReportMetric(events/applied.Seconds(), "applied-events/s")
}

// settle flushes the memtable and waits until the compactions it and earlier flushes
// started have finished: no flush or compaction in progress at three polls in a row,
// 100 ms apart, as Pebble ends a compaction and schedules the next in two steps, between
// which NumInProgress reads 0. A Pebble still busy after settleTimeout fails the
// benchmark rather than hanging it.
func settle(b testing.TB, st *Store) {
	b.Helper()
	const settleTimeout = 5 * time.Minute
	if err := st.db.Flush(); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(settleTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for idle := 0; idle < 3; {
		<-tick.C
		m := st.db.Metrics()
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			idle++
		} else {
			idle = 0
		}
		if idle < 3 && time.Now().After(deadline) {
			b.Fatalf("Pebble not idle within %v: %d compactions, %d flushes in progress",
				settleTimeout, m.Compact.NumInProgress, m.Flush.NumInProgress)
		}
	}
}

// benchIngest applies entries to shards FSMs in one store in turn, as a node holding
// replicas of several shards does.
func benchIngest(b *testing.B, delay bool, shards int) {
	const batch = 500
	st := openTestStore(b, b.TempDir(), StoreOptions{})
	defer st.Close()
	fsms := make([]*FSM, shards)
	for i := range fsms {
		f, err := NewFSM(st, uint32(i), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		fsms[i] = f
	}
	payload := make([]byte, 64)
	prefix := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 10) + "-"
	rnd := rand.New(rand.NewPCG(1, 2))
	entries := make([][]byte, b.N)
	for i := range entries {
		c := &ScheduleBatch{ProposedAt: 1e18, Events: make([]NewEvent, batch)}
		if delay {
			c.ProposedAt += int64(i) * batch * 1e4 // 100,000 events/s
		}
		for j := range c.Events {
			n := i*batch + j
			due := c.ProposedAt + 30*6e10 + rnd.Int64N(1e9)
			if delay {
				due = c.ProposedAt + 30*6e10 + int64(j)
			}
			c.Events[j] = NewEvent{ID: prefix + strconv.Itoa(n), Due: due,
				Topic: "chime-bench", Payload: payload, ContentHash: rnd.Uint64()}
		}
		entries[i] = AppendScheduleBatch(nil, c)
	}
	before := cpuTime()
	b.ResetTimer()
	for i, data := range entries {
		fsms[i%shards].ApplyBatch([]*raft.Log{{Index: uint64(i/shards + 1), Term: 1, Type: raft.LogCommand, Data: data}})
	}
	applied := b.Elapsed()
	// The memtable's flush is part of the cost, and the compactions it and the earlier
	// flushes started.
	settle(b, st)
	b.StopTimer()
	events := float64(b.N * batch)
	m := st.db.Metrics()
	b.ReportMetric(float64(cpuTime()-before)/events/1e3, "cpu-µs/event")
	b.ReportMetric(events/applied.Seconds(), "applied-events/s")
	var compacted uint64
	for _, l := range m.Levels {
		compacted += l.TableBytesCompacted
	}
	b.ReportMetric(float64(compacted)/float64(m.Levels[0].TableBytesFlushed), "compacted/flushed")
	if testing.Verbose() && b.N > 1 {
		fmt.Printf("%d events; flushed %d MiB, compacted %d MiB, WAL %d MiB\n%s\n", int(events),
			m.Levels[0].TableBytesFlushed>>20, compacted>>20, m.WAL.BytesWritten>>20, m)
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(fmt.Sprintf("getrusage: %v", err))
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReadForFire reads fire batches the way a draining backlog does: 1,000,000 events
// scheduled in order with due times spread over one second, so that a batch of the 1,024
// earliest-due events names seqs scattered over the whole shard. The state is flushed to
// sstables first, as it is after a long wait.
func BenchmarkReadForFire(b *testing.B) {
	const events, batch = 1_000_000, 1024
	st, f := openBenchFSM(b)
	payload := make([]byte, 64)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range events / 500 {
		c := &ScheduleBatch{ProposedAt: 1e18, Events: make([]NewEvent, 500)}
		for j := range c.Events {
			c.Events[j] = NewEvent{ID: "bench-" + strconv.Itoa(i*500+j), Due: 1e18 + rnd.Int64N(1e9),
				Topic: "chime-bench", Payload: payload, ContentHash: rnd.Uint64()}
		}
		f.ApplyBatch([]*raft.Log{{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: AppendScheduleBatch(nil, c)}})
	}
	if err := st.db.Flush(); err != nil {
		b.Fatal(err)
	}
	var order []Ref
	if err := f.ForEachPending(func(seq uint64, due int64, _ Policy) error { order = append(order, Ref{seq, due}); return nil }); err != nil {
		b.Fatal(err)
	}
	var recs []Record
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		from := (i * batch) % (events - batch)
		refs := slices.Clone(order[from : from+batch])
		var err error
		recs, err = f.ReadForFire(refs, recs[:0])
		if err != nil || len(recs) != batch {
			b.Fatalf("read %d of %d: %v", len(recs), batch, err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}
