package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
)

// TestQuiesceBeforeHandover: while events fall due steadily, a leader about
// to hand its shard over quiesces. When quiesce returns, every record it put
// in Kafka has its MarkFired committed (so the next leader will not fire it
// again), and until resume nothing more is produced though events keep
// falling due; after resume every event arrives.
func TestQuiesceBeforeHandover(t *testing.T) {
	brokers := startBroker(t)
	n := openNode(t, t.TempDir(), "", brokers, 1)
	defer n.close()
	s := n.host.shards[0]
	ctx := context.Background()
	const events = 3000
	var reqs []Request
	for i := range events {
		id := fmt.Sprintf("e%d", i)
		// 3,000 events over 3 s: batches are always in flight.
		reqs = append(reqs, Request{ID: id, Delay: 500*time.Millisecond + time.Duration(i)*time.Millisecond, HasDelay: true,
			Topic: "handover", Payload: []byte(id)})
	}
	c := publishtest.Collect(t, brokers, "handover")
	defer c.Close()
	start := time.Now()
	if _, err := s.Schedule(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		time.Sleep(time.Until(start.Add(time.Duration(800+600*round) * time.Millisecond)))
		resume := s.quiesce()
		marked := s.Stats().Fired
		// Nothing is produced while quiesced: what the broker holds after
		// a moment is what it held when quiesce returned.
		time.Sleep(200 * time.Millisecond)
		seen := len(c.Consumed().ByID)
		time.Sleep(300 * time.Millisecond)
		if later := len(c.Consumed().ByID); later != seen {
			t.Errorf("round %d: %d records produced while quiesced", round, later-seen)
		}
		if uint64(seen) != marked {
			t.Errorf("round %d: %d records in Kafka, %d of them marked fired when quiesce returned", round, seen, marked)
		}
		t.Logf("round %d: %d records in Kafka, %d marked", round, seen, marked)
		resume()
	}
	if got := c.WaitIDs(events, 30*time.Second); len(got.ByID) != events {
		t.Fatalf("%d of %d events arrived after resume", len(got.ByID), events)
	}
}
