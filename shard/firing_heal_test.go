package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestHealWakesWaitingEvents cuts Kafka while events fall due, lets their
// batches fail and wait out a retry delay of 30 s, then heals it: every
// event must reach Kafka within a few seconds of the heal, not when the
// delay runs out. (A failed batch's events wait for their retry time; a
// probe while they wait, or any produce that succeeds, brings them back.)
func TestHealWakesWaitingEvents(t *testing.T) {
	const events = 20
	b := publishtest.NewBroker(t, kfake.DefaultNumPartitions(1))
	brokers := b.Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.RetryDelay, tu.MaxRetryDelay = 30*time.Second, 30*time.Second
	})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	req := func(id string, delay time.Duration) Request {
		r := Request{ID: id, Delay: delay, HasDelay: true, Topic: "heal", Payload: []byte(id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		return r
	}
	// A first record creates the topic and the connections.
	if _, err := s.Schedule(ctx, []Request{req("warm", 0)}); err != nil {
		t.Fatal(err)
	}
	if got := publishtest.Consume(t, brokers, 1, 30*time.Second, "heal"); len(got.ByID) != 1 {
		t.Fatal("the warm-up record did not arrive")
	}

	b.RefuseProduce(kerr.NotEnoughReplicas.Code)
	var reqs []Request
	for i := range events {
		reqs = append(reqs, req(fmt.Sprintf("e%d", i), time.Duration(50+10*i)*time.Millisecond))
	}
	if _, err := s.Schedule(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		s.firing.mu.Lock()
		defer s.firing.mu.Unlock()
		return len(s.firing.retrying)
	}
	publishtest.WaitFor(t, 30*time.Second, "every event failed and waits for its retry", func() bool { return waiting() == events })
	// Stay cut long enough for a probe to fail, so the heal is what ends it.
	before := b.Refused()
	publishtest.WaitFor(t, 30*time.Second, "a probe is refused", func() bool { return b.Refused() > before })
	publishtest.WaitFor(t, 30*time.Second, "the probed event waits again", func() bool { return waiting() == events })

	healed := time.Now()
	b.AcceptProduce()
	got := publishtest.Consume(t, brokers, events+1, 15*time.Second, "heal").ByID
	var last time.Duration
	for i := range events {
		r, ok := got[fmt.Sprintf("e%d", i)]
		if !ok {
			t.Errorf("e%d did not reach Kafka within 15 s of the heal", i)
			continue
		}
		last = max(last, r.Received.Sub(healed))
	}
	t.Logf("%d produce requests refused during the cut; the last event arrived %v after the heal", b.Refused(), last)
	// Well under the 30 s retry delay, with room for a loaded machine.
	if last > 10*time.Second {
		t.Errorf("the last event arrived %v after the heal, want within 10 s (the retry delay is 30 s)", last)
	}
}
