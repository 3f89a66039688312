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
	// leave 500-1000 records unmarked; the stall threshold and the marks in
	// flight at the cut 50-150.
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

// TestMarkStallFollowsCommits: an entry in flight counts as stuck after
// markStall while marks commit quickly, and only after several times their
// usual time while they commit slowly (a drained backlog's large marks).
func TestMarkStallFollowsCommits(t *testing.T) {
	var f markFlight
	if got := f.stallAfter(); got != markStall {
		t.Fatalf("before any commit: stuck after %v, want %v", got, markStall)
	}
	for range 20 {
		f.observe(5 * time.Millisecond)
	}
	if got := f.stallAfter(); got != markStall {
		t.Errorf("after 5 ms commits: stuck after %v, want %v", got, markStall)
	}
	for i := range 20 {
		f.observe(time.Duration(200+50*(i%3)) * time.Millisecond)
	}
	if got := f.stallAfter(); got < 300*time.Millisecond || got > time.Second {
		t.Errorf("after 200-300 ms commits: stuck after %v, want 300 ms to 1 s", got)
	}
	// A commit answered with an error teaches nothing.
	before := f.stallAfter()
	f.begin()
	f.since = f.since.Add(-time.Minute)
	if f.stalled() == nil {
		t.Error("an entry a minute old does not count as stuck")
	}
	f.end(false)
	if got := f.stallAfter(); got != before {
		t.Errorf("an entry answered with an error moved the threshold from %v to %v", before, got)
	}
	if f.stalled() != nil {
		t.Error("stuck with no entry in flight")
	}
}
