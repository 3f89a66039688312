package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

func ExampleNewBatcher() {
	// In production the Scheduler is a *client.Client from Dial; here it is
	// a Fake, on a virtual clock.
	fake := chimetest.NewFake()
	defer fake.Close()
	b := client.NewBatcher(fake, client.BatcherConfig{}) // Linger 5ms, MaxEvents 500, MaxPending 10000
	defer b.Close()

	// Add is called once per event, from any number of goroutines (here
	// one); the events travel in batches of up to MaxEvents.
	ctx := context.Background()
	var pending []*client.Pending
	for i := range 1200 {
		ev := client.Event{ID: fmt.Sprintf("cart-%d", i), Topic: "carts.abandoned"}
		pending = append(pending, b.Add(ctx, ev, client.In(24*time.Hour)))
	}
	scheduled := 0
	for _, p := range pending {
		if _, err := p.Wait(ctx); err != nil {
			log.Printf("not scheduled: %v", err) // this event's own error
			continue
		}
		scheduled++
	}
	fmt.Println("scheduled:", scheduled)
	fmt.Println("fired a day later:", len(fake.Advance(24*time.Hour)))
	// Output:
	// scheduled: 1200
	// fired a day later: 1200
}

func ExampleParseFired() {
	// The headers of a record Chime produced, as a franz-go consumer reads
	// them (kgo.Record.Headers); kafka-go's []kafka.Header work as well.
	headers := []kgo.RecordHeader{
		{Key: "trace", Value: []byte("4bf92f35")},
		{Key: "chime-id", Value: []byte("order-42")},
		{Key: "chime-due-unix-ms", Value: []byte("1893574800000")},
		{Key: "chime-fired-unix-ms", Value: []byte("1893574800012")},
		{Key: "chime-attempt", Value: []byte("1")},
		{Key: "chime-version", Value: []byte("2")},
	}
	dedup := client.NewDeduper(100_000)
	for range 2 { // the same record twice: delivery is at least once
		f, err := client.ParseFired(headers)
		if err != nil {
			log.Print(err) // not a Chime record
			continue
		}
		if dedup.Seen(f) {
			fmt.Println("dropped a copy of", f.ID)
			continue
		}
		fmt.Printf("%s (version %d) due %s, sent %v late\n", f.ID, f.Version, f.Due.UTC().Format(time.RFC3339), f.Late())
	}
	// Output:
	// order-42 (version 2) due 2030-01-02T09:00:00Z, sent 12ms late
	// dropped a copy of order-42
}
