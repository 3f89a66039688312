package raftfsm

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkForecast: a forecast of the month ahead (60 minutes, 24 hours and
// 31 days) of a shard holding n pending events due over that month, as
// Forecast answers it from the due counts (forecast), and as the 115 Counts
// of a due range it took without them (count), each of which walks the due
// index over its range. CHIME_FORECAST_BENCH_N sets n (default 100,000 and
// 1,000,000).
func BenchmarkForecast(b *testing.B) {
	sizes := []int{100_000, 1_000_000}
	if v := os.Getenv("CHIME_FORECAST_BENCH_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		sizes = []int{n}
	}
	const now = int64(1_899_999_960) * 1e9 // a whole minute
	month := int64(31 * 24 * time.Hour)
	series := []DueSeries{
		{Start: now, Step: int64(time.Minute), Count: 60},
		{Start: now, Step: int64(time.Hour), Count: 24},
		{Start: now, Step: int64(24 * time.Hour), Count: 31},
	}
	for _, n := range sizes {
		_, f := openBenchFSM(b)
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		payload := make([]byte, 200)
		var index uint64
		for done := 0; done < n; {
			c := &ScheduleBatch{ProposedAt: now}
			for j := 0; j < benchBatch && done < n; j++ {
				id := fmt.Sprintf("evt-%012d", done)
				c.Events = append(c.Events, NewEvent{ID: id, Due: now + rng.Int64N(month), Topic: "reminders", Payload: payload, ContentHash: uint64(done)})
				done++
			}
			index++
			f.ApplyBatch([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: AppendScheduleBatch(nil, c)}})
		}
		if err := f.LoadPending(maxDue, nil); err != nil {
			b.Fatal(err)
		}
		awaitPending(b, f)
		want, err := f.Forecast(series)
		if err != nil || want.Pending != uint64(n) {
			b.Fatalf("forecast of %d events: %+v %v", n, want.Pending, err)
		}
		b.Run(fmt.Sprintf("forecast/n=%d", n), func(b *testing.B) {
			for range b.N {
				if _, err := f.Forecast(series); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("count/n=%d", n), func(b *testing.B) {
			for range b.N {
				for i, s := range series {
					for j := range s.Count {
						from := s.Start + int64(j)*s.Step
						got, err := f.Count(Query{States: StatesOf(StateScheduled), Due: DueRange{From: from, To: from + s.Step}})
						if err != nil || got != want.Counts[i][j] {
							b.Fatalf("count of series %d range %d: %d %v, forecast %d", i, j, got, err, want.Counts[i][j])
						}
					}
				}
			}
		})
	}
}

// BenchmarkDueCountsApply: what the due counts add to an apply, per event:
// noting the due time of each event a batch of benchBatch creates (spread
// over a second, as BenchmarkApplyScheduleBatch's are, or over a month) and
// taking the notes in when the batch commits, with other events pending in
// every hour.
func BenchmarkDueCountsApply(b *testing.B) {
	for _, spread := range []time.Duration{time.Second, 31 * 24 * time.Hour} {
		b.Run("spread="+spread.String(), func(b *testing.B) {
			st := openTestStore(b, b.TempDir(), StoreOptions{})
			b.Cleanup(func() { st.Close() })
			f, err := NewFSM(st, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(f.Close)
			rng := rand.New(rand.NewPCG(1, 2))
			const from = int64(1_899_999_960) * 1e9
			dues := make([]int64, benchBatch)
			for i := range dues {
				dues[i] = from + rng.Int64N(int64(spread))
			}
			// Other events pending in every hour of the spread, as a shard's are: the
			// batches' changes never empty a page.
			for at := from; at < from+int64(spread)+int64(time.Hour); at += int64(time.Hour) {
				f.dues.add(at, 1)
			}
			b.ResetTimer()
			for i := range b.N {
				delta := int64(1)
				if i%2 == 1 {
					delta = -1 // settle what the last batch created
				}
				for _, due := range dues {
					f.pending.deltas = noteDue(f.pending.deltas, due, delta)
				}
				f.mu.Lock()
				f.takeDueDeltas()
				f.mu.Unlock()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/event")
		})
	}
}
