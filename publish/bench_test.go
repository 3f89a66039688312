package publish_test

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
)

// benchRecords returns n records of valueSize random bytes with distinct
// ids (the keys), spread over the topic's partitions.
func benchRecords(n, valueSize int, topic string, seq *atomic.Uint64) []publish.Record {
	rng := rand.New(rand.NewPCG(seq.Load(), 7))
	recs := make([]publish.Record, n)
	now := time.Now().UnixNano()
	for i := range recs {
		s := seq.Add(1)
		v := make([]byte, valueSize)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		recs[i] = publish.Record{Seq: s, ID: fmt.Sprintf("bench-%d", s), Topic: topic, Value: v, Due: now}
	}
	return recs
}

func benchPublish(b *testing.B, callers, batch int) {
	c := publishtest.NewBroker(b, kfake.DefaultNumPartitions(8))
	p := newPublisher(b, c, publish.Config{})
	var seq atomic.Uint64
	// Warm up: create the topic and the connections outside the timing.
	for _, o := range p.Publish(b.Context(), benchRecords(10, 200, "bench", &seq)) {
		if !o.Done {
			b.Fatalf("warm-up outcome %+v", o)
		}
	}
	b.ReportAllocs()
	b.SetBytes(int64(batch * 200))
	b.SetParallelism(callers)
	b.ResetTimer()
	start := time.Now()
	var published atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		recs := benchRecords(batch, 200, "bench", &seq)
		for pb.Next() {
			for _, o := range p.Publish(b.Context(), recs) {
				if !o.Done {
					b.Errorf("outcome %+v", o)
					return
				}
			}
			published.Add(int64(len(recs)))
		}
	})
	b.ReportMetric(float64(published.Load())/time.Since(start).Seconds(), "records/s")
}

// BenchmarkPublish measures records/s for Publish calls of 1000 records of
// 200 B into kfake (8 partitions, one broker), with one caller and with
// several concurrent callers sharing the Writer: parallelism=n runs
// n x GOMAXPROCS callers (testing.B.SetParallelism).
func BenchmarkPublish(b *testing.B) {
	b.Run("batch=1000/parallelism=1", func(b *testing.B) { benchPublish(b, 1, 1000) })
	b.Run("batch=1000/parallelism=8", func(b *testing.B) { benchPublish(b, 8, 1000) })
	// One record per call: the latency of a lone event, one round trip.
	b.Run("batch=1/parallelism=1", func(b *testing.B) { benchPublish(b, 1, 1) })
}
