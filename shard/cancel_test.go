package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// TestCancelWhileProduceUnanswered cuts the broker off while events fire and
// cancels them (before, around and after their due time, twice each, from
// two callers at once). The produce requests sent during the cut reach the
// broker after it heals. No event a cancel reported as cancelled without
// qualification may have a record.
func TestCancelWhileProduceUnanswered(t *testing.T) {
	if testing.Short() {
		t.Skip("TestCancelWhileProduceUnanswered: 12 s, 8 of them watching for records that must not come; runs without -short")
	}
	b := publishtest.NewBroker(t, kfake.DefaultNumPartitions(1))
	brokers := b.Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1)
	defer n.close()
	ctx := context.Background()

	req := func(id string, delay time.Duration) Request {
		r := Request{ID: id, Delay: delay, HasDelay: true, Topic: "cut", Payload: []byte("p-" + id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		return r
	}
	// A first record creates the topic and the connections.
	if _, err := n.host.Schedule(ctx, []Request{req("warm", 0)}); err != nil {
		t.Fatal(err)
	}
	if got := publishtest.Consume(t, brokers, 1, 30*time.Second, "cut"); len(got.ByID) != 1 {
		t.Fatal("the warm-up record did not arrive")
	}

	b.Hold()
	const events = 150
	var reqs []Request
	for i := range events {
		reqs = append(reqs, req(fmt.Sprintf("e%d", i), time.Duration(50+i*10)*time.Millisecond))
	}
	if _, err := n.host.Schedule(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	type answer struct {
		id  string
		out raftfsm.CancelOutcome
		err error
	}
	answers := make(chan answer, 4*events)
	var wg sync.WaitGroup
	for i, r := range reqs {
		// Cancel from -100 ms to +1.5 s around the due time, spread finely:
		// before the first attempt, during it, as it gives up, and between
		// retries.
		at := time.Duration(50+i*10)*time.Millisecond + time.Duration(i*53%1600)*time.Millisecond - 100*time.Millisecond
		for range 2 {
			wg.Go(func() {
				// Left a sleep: the cancel is timed against live produces to a real
				// broker, which no synctest bubble can hold; there is no event to await.
				time.Sleep(time.Until(start.Add(at)))
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				res, err := n.host.Cancel(cctx, r.ID, nil)
				answers <- answer{r.ID, res.Outcome, err}
				// A later cancel must not forget what an earlier one said. Left a
				// sleep: it is meant to come 300 ms later in the produce's life.
				time.Sleep(300 * time.Millisecond)
				res, err = n.host.Cancel(cctx, r.ID, nil)
				answers <- answer{r.ID, res.Outcome, err}
			})
		}
	}
	wg.Wait()
	close(answers)
	b.Release()

	acked := map[string]bool{}
	unsure := 0
	for a := range answers {
		switch {
		case a.err == nil && (a.out == raftfsm.Cancelled || a.out == raftfsm.AlreadyCancelled):
			acked[a.id] = true
		case errors.Is(a.err, ErrCancelUnsure), errors.Is(a.err, ErrProduceUnknown):
			unsure++
		case a.err != nil:
			t.Errorf("cancel %s: %v", a.id, a.err)
		}
	}
	got := publishtest.Consume(t, brokers, events+1, 8*time.Second, "cut").ByID
	for id := range got {
		if acked[id] {
			t.Errorf("%s: a cancel reported it cancelled, and its record reached Kafka afterwards", id)
		}
	}
	t.Logf("%d events: %d cancels acknowledged, %d answered unsure, %d records after the heal", events, len(acked), unsure, len(got)-1)
	if unsure == 0 {
		t.Error("no cancel was answered unsure: the cut did not hold any produce back")
	}
}

// TestInDoubtAfterLeaderChange pins down which events a new leader cannot
// promise to cancel: its predecessor may have produced any unfired event due
// by the time this leader began firing plus the clock skew bound, unless it
// was cancelled well before it fell due.
func TestInDoubtAfterLeaderChange(t *testing.T) {
	const sec = int64(time.Second)
	s := &Shard{firing: &firing{unsure: map[uint64]int64{7: 1}}, tune: Tuning{ClockSkewBound: time.Second}}
	s.firing.fenceUntil = 100 * sec // began firing at 99 s
	for _, c := range []struct {
		name string
		rec  raftfsm.Record
		want bool
	}{
		{"scheduled, due before the leader began", raftfsm.Record{Seq: 1, State: raftfsm.StateScheduled, Due: 50 * sec}, true},
		{"scheduled, due within the skew bound", raftfsm.Record{Seq: 1, State: raftfsm.StateScheduled, Due: 100 * sec}, true},
		{"scheduled, due after the fence", raftfsm.Record{Seq: 1, State: raftfsm.StateScheduled, Due: 100*sec + 1}, false},
		{"cancelled around its due time", raftfsm.Record{Seq: 1, State: raftfsm.StateCancelled, Due: 50 * sec, CancelledAt: 50*sec - sec/2}, true},
		{"cancelled well before its due time", raftfsm.Record{Seq: 1, State: raftfsm.StateCancelled, Due: 50 * sec, CancelledAt: 40 * sec}, false},
		{"fired", raftfsm.Record{Seq: 1, State: raftfsm.StateFired, Due: 50 * sec}, false},
		{"this leader's unanswered produce", raftfsm.Record{Seq: 7, State: raftfsm.StateCancelled, Due: 200 * sec, CancelledAt: 10 * sec}, true},
	} {
		if got := s.inDoubt(c.rec); got != c.want {
			t.Errorf("%s: inDoubt %v, want %v", c.name, got, c.want)
		}
	}
	s.firing.fenceUntil = never // not yet past the barrier: everything due is in doubt
	if !s.inDoubt(raftfsm.Record{Seq: 2, State: raftfsm.StateScheduled, Due: 1 << 62}) {
		t.Error("before the barrier, a scheduled event is not in doubt")
	}
}

// TestRetriedEventsFire puts an event back into the wheel the way a failed
// produce attempt does (settle with a retry delay), later than its due time,
// and expects it produced at the retry. The wheel holds a retried event under
// its retry time, but the firing path must read it under its due time, which
// is half of its body's key: read under the retry time, it was not found and
// was dropped.
func TestRetriedEventsFire(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1)
	defer n.close()
	s := n.host.Replica(0)
	r := Request{ID: "retried", Delay: 300 * time.Millisecond, HasDelay: true, Topic: "retry", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	res, err := n.host.Schedule(context.Background(), []Request{r})
	if err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("Schedule: %v %+v", err, res)
	}
	seq, due := res[0].Seq, res[0].Due

	// Take it out of the wheel as the firing loop does, and settle it as a
	// failed attempt: back in the wheel, 700 ms after its due time.
	f := s.firing
	f.mu.Lock()
	h, ok := f.handles.get(seq)
	if !ok {
		f.mu.Unlock()
		t.Fatal("the event is not in the wheel (fired already?)")
	}
	f.wheel.Remove(h)
	f.handles.delete(seq)
	b := &fireBatch{entries: []wheel.Entry{{Ref: seq, Due: due}}, done: make(chan struct{})}
	f.inflight[seq] = b
	f.mu.Unlock()
	f.settleBatch(b, b.all(), time.Until(time.Unix(0, due))+700*time.Millisecond)

	got := publishtest.Consume(t, brokers, 1, 30*time.Second, "retry")
	if _, ok := got.ByID[r.ID]; !ok {
		t.Fatal("the retried event was never produced")
	}
}

// TestEarlyBatchHeldAndCancellable: a batch taken out of the wheel before its
// due time (Tuning.FireLead) is produced no sooner than it is due, and an
// event cancelled while its batch is held is not produced.
func TestEarlyBatchHeldAndCancellable(t *testing.T) {
	const lead = 400 * time.Millisecond
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.FireLead = lead
		tu.ClockSkewBound = 10 * time.Millisecond // no predecessor to fence off
	})
	defer n.close()
	s := n.host.Replica(0)
	var reqs []Request
	for _, id := range []string{"kept", "cancelled"} {
		r := Request{ID: id, Delay: 700 * time.Millisecond, HasDelay: true, Topic: "lead", Payload: []byte(id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		reqs = append(reqs, r)
	}
	res, err := n.host.Schedule(context.Background(), reqs)
	if err != nil || res[0].Outcome != raftfsm.Created || res[1].Outcome != raftfsm.Created {
		t.Fatalf("Schedule: %v %+v", err, res)
	}
	due := time.Unix(0, res[1].Due)

	waitInFlight(t, s, res[1].Seq)
	if left := time.Until(due); left < lead/4 {
		t.Fatalf("taken %v before its due time, want about %v", left, lead)
	}
	c, err := s.Cancel(context.Background(), "cancelled", nil)
	if err != nil || c.Outcome != raftfsm.Cancelled {
		t.Fatalf("Cancel of an event held in an early batch: %v %+v", err, c)
	}

	// The cancelled event must not show up: read until 3 s past the due time.
	got := publishtest.Consume(t, brokers, 2, time.Until(due.Add(3*time.Second)), "lead").ByID
	k, ok := got["kept"]
	if !ok {
		t.Fatal("the kept event was never produced")
	}
	if k.HeaderErr != nil || k.Fired.Before(k.Due) {
		t.Errorf("fired at %v, before its due time %v (%v)", k.Fired, k.Due, k.HeaderErr)
	}
	if _, ok := got["cancelled"]; ok {
		t.Error("the event cancelled while its batch was held was produced")
	}
}
