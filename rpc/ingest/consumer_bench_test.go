package ingest

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc"
)

// okAPI takes every event, answering as the request path does (a result
// per event), and keeps nothing: what BenchmarkApply measures is the
// consumer's own work on a partition's records.
type okAPI struct {
	chimev1.UnimplementedSchedulerServer
}

func (okAPI) BatchSchedule(_ context.Context, in *chimev1.BatchScheduleRequest) (*chimev1.BatchScheduleResponse, error) {
	res := make([]chimev1.ScheduleResult, len(in.GetEvents()))
	out := &chimev1.BatchScheduleResponse{Results: make([]*chimev1.ScheduleResult, len(res))}
	for i, ev := range in.GetEvents() {
		res[i].Id = ev.GetId()
		out.Results[i] = &res[i]
	}
	return out, nil
}

// BenchmarkApply applies one poll's worth of a partition's records in
// Chime's format, shaped as chimectl bench --api topic produces them: a
// key, a 64-byte value, chime-delay and chime-topic.
func BenchmarkApply(b *testing.B) {
	const topic = "chime.schedule"
	dec, err := NewDecoder("chime", DecodeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	c := &Consumer{
		cfg:     Config{API: okAPI{}, MaxBatch: 10000},
		sources: map[string]*source{topic: {Source: Source{Topic: topic, Format: "chime"}, dec: dec}},
		log:     slog.New(slog.DiscardHandler),
		m:       NewMetrics(),
	}
	payload := make([]byte, 64)
	recs := make([]*kgo.Record, maxPoll)
	for i := range recs {
		recs[i] = &kgo.Record{
			Topic: topic, Partition: 1, Offset: int64(1_000_000 + i),
			Key: []byte("b1764412345-" + strconv.Itoa(i)), Value: payload,
			Headers: []kgo.RecordHeader{
				{Key: HeaderDelay, Value: []byte("30m")},
				{Key: HeaderTargetTopic, Value: []byte("chime-bench")},
			},
		}
	}
	ctx := rpc.IngestContext(context.Background(), false)
	b.ReportAllocs()
	for b.Loop() {
		if last := c.apply(ctx, recs); last != recs[len(recs)-1] {
			b.Fatalf("applied up to %v, not every record", last)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}
