package client_test

import (
	"context"
	"iter"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// nopScheduler answers every ScheduleBatch at once: what is left of a
// Batcher's cost is its own.
type nopScheduler struct{ client.Scheduler }

func (nopScheduler) ScheduleBatch(_ context.Context, evs []client.Event, _ ...client.ScheduleOption) ([]client.Result, error) {
	res := make([]client.Result, len(evs))
	for i := range evs {
		res[i] = client.Result{ID: evs[i].ID, Version: 1}
	}
	return res, nil
}

func (nopScheduler) List(context.Context, client.Filter) iter.Seq2[client.Event, error] { return nil }

// BenchmarkBatcher: the client-side cost of one event added to a Batcher
// by 64 goroutines and answered, against a client.Scheduler that costs nothing.
func BenchmarkBatcher(b *testing.B) {
	bt := client.NewBatcher(nopScheduler{}, client.BatcherConfig{})
	defer bt.Close()
	ctx := context.Background()
	ev := client.Event{ID: "x", Topic: "t", Payload: make([]byte, 64)}
	b.ReportAllocs()
	var wg sync.WaitGroup
	per := b.N/64 + 1
	b.ResetTimer()
	for range 64 {
		wg.Go(func() {
			ps := make(chan *client.Pending, 256)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for p := range ps {
					_, _ = p.Wait(ctx) // the benchmark times the calls; their outcomes are the fake's
				}
			}()
			for range per {
				ps <- bt.Add(ctx, ev, client.In(time.Hour))
			}
			close(ps)
			<-done
		})
	}
	wg.Wait()
}

// BenchmarkSchedule: one Schedule through the client against the same call
// on the raw stub of the client's own connection, to an in-process server
// on loopback: the difference is the client's cost per call (options,
// retry loop, error mapping).
func BenchmarkSchedule(b *testing.B) {
	h := newHarness(b)
	c := h.dial(b, client.WithLeaderRouting(false))
	ctx := context.Background()
	b.Run("client", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, err := c.Schedule(ctx, client.Event{ID: "c-" + strconv.Itoa(i), Topic: "t", Payload: []byte("x")}, client.In(time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("grpc", func(b *testing.B) {
		b.ReportAllocs()
		raw := chimev1.NewSchedulerClient(c.Conn())
		for i := range b.N {
			if _, err := raw.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "g-" + strconv.Itoa(i), Topic: "t", Payload: []byte("x"), Delay: durationpb.New(time.Hour)}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
