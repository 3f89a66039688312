package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
)

// TestCutLeaderStopsProducing: a leader cut off from its follower but not
// from Kafka stops producing once its MarkFired has gone uncommitted for
// markStall, not when its lease (here 1 s) runs out. Every record it
// produces without a committed mark is fired again by the next leader, so
// what it produces after the cut is the duplicates the cut costs.
func TestCutLeaderStopsProducing(t *testing.T) {
	brokers := startBroker(t)
	const heartbeat = 2 * time.Second
	leader, _, trans := openPair(t, brokers, heartbeat)
	const (
		events = 4000
		every  = time.Millisecond
	)
	var reqs []Request
	for i := range events {
		id := fmt.Sprintf("e%d", i)
		reqs = append(reqs, Request{ID: id, Delay: 500*time.Millisecond + time.Duration(i)*every, HasDelay: true,
			Topic: "cut", Payload: []byte(id)})
	}
	c := publishtest.Collect(t, brokers, "cut")
	defer c.Close()
	start := time.Now()
	if _, err := leader.Schedule(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	for _, tr := range trans {
		tr.DisconnectAll()
	}
	cut := time.Now()
	// Past the lease and the leader's step-down: it produces no more.
	time.Sleep(heartbeat)
	inKafka, marked := len(c.Consumed().ByID), leader.Stats().Fired
	unmarked := inKafka - int(marked)
	t.Logf("%d records in Kafka, %d marked fired: %d produced without a committed mark", inKafka, marked, unmarked)
	if inKafka < 500 {
		t.Fatalf("only %d records in Kafka before the cut: the test did not fire steadily", inKafka)
	}
	// At one event a millisecond, producing to the end of the lease would
	// leave 500-1000 records unmarked; markStall and the marks in flight
	// at the cut about 150.
	if limit := int(heartbeat / 2 / every * 2 / 5); unmarked > limit {
		t.Errorf("%d records produced without a committed mark after the cut %v ago; want at most %d", unmarked, time.Since(cut).Round(time.Millisecond), limit)
	}
	// Whole again, so that the replicas close promptly.
	for a, tr := range trans {
		for b, peer := range trans {
			if a != b {
				tr.Connect(peer.LocalAddr(), peer)
			}
		}
	}
}
