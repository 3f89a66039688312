package shard

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chimehq/chime/raftfsm"
)

// refuseProduce answers a produce request with NotEnoughReplicas on every
// partition: a Kafka cut off from its replicas, refusing every write.
func refuseProduce(kreq kmsg.Request) kmsg.Response {
	req := kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, kerr.NotEnoughReplicas.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// TestHealWakesWaitingEvents cuts Kafka while events fall due, lets their
// batches fail and wait out a retry delay of 30 s, then heals it: every
// event must reach Kafka within a few seconds of the heal, not when the
// delay runs out. (A failed batch's events wait for their retry time; a
// probe while they wait, or any produce that succeeds, brings them back.)
func TestHealWakesWaitingEvents(t *testing.T) {
	const events = 20
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var cut atomic.Bool
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !cut.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return refuseProduce(req), nil, true
	})
	brokers := c.ListenAddrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.RetryDelay, tu.MaxRetryDelay = 30*time.Second, 30*time.Second
	})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	req := func(id string, delay time.Duration) Request {
		r := Request{ID: id, Delay: delay, HasDelay: true, Topic: "heal", Payload: []byte(id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true)
		return r
	}
	// A first record creates the topic and the connections.
	if _, err := s.Schedule(ctx, []Request{req("warm", 0)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := consume(t, brokers, "heal", 1, 10*time.Second); len(got) != 1 {
		t.Fatal("the warm-up record did not arrive")
	}

	cut.Store(true)
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
	waitFor(t, 10*time.Second, "every event failed and waits for its retry", func() bool { return waiting() == events })
	// Stay cut long enough for a probe to fail, so the heal is what ends it.
	before := refused.Load()
	waitFor(t, 5*time.Second, "a probe is refused", func() bool { return refused.Load() > before })
	waitFor(t, 5*time.Second, "the probed event waits again", func() bool { return waiting() == events })

	healed := time.Now()
	cut.Store(false)
	got, _ := consume(t, brokers, "heal", events+1, 15*time.Second)
	var last time.Duration
	for i := range events {
		r, ok := got[fmt.Sprintf("e%d", i)]
		if !ok {
			t.Errorf("e%d did not reach Kafka within 15 s of the heal", i)
			continue
		}
		last = max(last, r.received.Sub(healed))
	}
	t.Logf("%d produce requests refused during the cut; the last event arrived %v after the heal", refused.Load(), last)
	if last > 3*time.Second {
		t.Errorf("the last event arrived %v after the heal, want within 3 s (the retry delay is 30 s)", last)
	}
}
