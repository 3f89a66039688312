package shard

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// The tests here drive the firing core on a synctest bubble's clock: the
// real firing loop (firing.run) takes batches out of a 1 ms wheel and
// sleeps between takes, and each batch is fired as fire does it (held until
// due, produced, settled), against a broker the test scripts. Every time.Sleep
// in them advances the bubble's clock; none waits on real time.

// clockRig is a firing core turned by firing.run on the bubble's clock.
type clockRig struct {
	f     *firing
	start time.Time
	// ok says whether the broker takes a record of seq now.
	ok atomic.Pointer[func(seq uint64) bool]

	mu       sync.Mutex
	taken    []attempt // each batch's entries as the loop took them
	attempts []attempt // each produce, in order

	cancel context.CancelFunc
	loop   chan struct{} // closed when run returns
	wg     sync.WaitGroup
}

// attempt is an event taken or produced at a time since the rig started.
type attempt struct {
	seq      uint64
	priority uint8
	at       time.Duration
	ok       bool
	early    bool
}

// newClockRig starts the firing loop of an empty wheel holding every event
// due within an hour, with retry delays tu's and a take of at most max
// events, taken up to lead early. Call it inside the bubble, and stop it
// before the bubble ends.
func newClockRig(t *testing.T, tu Tuning, lead time.Duration, max int, dispatched func()) *clockRig {
	t.Helper()
	tu.Resolution = time.Millisecond
	tu.fill()
	f, err := newFiring(time.Now, &tu)
	if err != nil {
		t.Fatal(err)
	}
	r := &clockRig{f: f, start: time.Now(), loop: make(chan struct{})}
	w, err := wheel.New(r.start.UnixNano(), tu.Resolution)
	if err != nil {
		t.Fatal(err)
	}
	f.replace(newWheelSet(w), r.start.Add(time.Hour).UnixNano())
	r.setBroker(func(uint64) bool { return true })
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.loop)
		f.run(ctx, int64(lead), max, func(int64) {}, func(batches []*fireBatch) bool {
			if dispatched != nil {
				dispatched()
			}
			for _, b := range batches {
				r.mu.Lock()
				for _, e := range b.entries {
					r.taken = append(r.taken, attempt{seq: e.Ref, priority: e.Priority, at: r.since(), early: b.early})
				}
				r.mu.Unlock()
				r.wg.Add(1)
				go r.fire(ctx, b)
			}
			return ctx.Err() == nil
		})
	}()
	return r
}

func (r *clockRig) since() time.Duration { return time.Since(r.start) }

// at is the Unix ns time d after the rig started.
func (r *clockRig) at(d time.Duration) int64 { return r.start.Add(d).UnixNano() }

func (r *clockRig) setBroker(ok func(seq uint64) bool) { r.ok.Store(&ok) }

// fire does what Shard.fire does with a batch, but for the read, the lease
// and the marks: the batch is held until due, its cancelled events dropped,
// the rest produced against the scripted broker, and settled.
func (r *clockRig) fire(ctx context.Context, b *fireBatch) {
	defer r.wg.Done()
	if err := hold(ctx, r.f.now, b.notBefore); err != nil {
		r.f.settleBatch(b, b.all(), 0)
		return
	}
	out := make([]publish.Record, len(b.entries))
	for i, e := range b.entries {
		out[i] = publish.Record{Seq: e.Ref, Due: e.Due}
	}
	out = r.f.dropCancelled(b, out)
	outcomes := make([]publish.Outcome, len(out))
	marked := make(map[uint64]bool)
	ok := *r.ok.Load()
	r.mu.Lock()
	for i, rec := range out {
		done := ok(rec.Seq)
		outcomes[i] = publish.Outcome{Seq: rec.Seq, Sent: true, Done: done}
		if done {
			marked[rec.Seq] = true
		}
		r.attempts = append(r.attempts, attempt{seq: rec.Seq, at: r.since(), ok: done})
	}
	r.mu.Unlock()
	requeue, delay := r.f.settleOutcomes(out, outcomes, marked)
	r.f.settleBatch(b, requeue, delay)
}

// produced returns the produce attempts so far.
func (r *clockRig) produced() []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.attempts)
}

// stop ends the loop and waits for its batches.
func (r *clockRig) stop() {
	r.cancel()
	<-r.loop
	r.wg.Wait()
}

// TestFiringHoldsAnEarlyBatch: the loop takes an event FireLead before it
// is due, and the batch is held until exactly its due time.
func TestFiringHoldsAnEarlyBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lead = 20 * time.Millisecond
		r := newClockRig(t, Tuning{}, lead, 10, nil)
		defer r.stop()
		r.f.scheduled(1, r.at(100*time.Millisecond), raftfsm.DefaultPolicy)
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		taken := slices.Clone(r.taken)
		r.mu.Unlock()
		if len(taken) != 1 || taken[0].at != 80*time.Millisecond || !taken[0].early {
			t.Fatalf("taken %+v, want the event taken early at 80 ms", taken)
		}
		if got := r.produced(); len(got) != 1 || got[0].at != 100*time.Millisecond {
			t.Fatalf("produced %+v, want once at its due time, 100 ms", got)
		}
	})
}

// TestFiringRetriesWithBackoff: an event whose produce keeps failing is
// fired again after RetryDelay, then after twice that, up to MaxRetryDelay,
// never sooner; and once the broker takes it, no more.
func TestFiringRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newClockRig(t, Tuning{RetryDelay: 100 * time.Millisecond, MaxRetryDelay: 400 * time.Millisecond}, 0, 10, nil)
		defer r.stop()
		r.setBroker(func(uint64) bool { return false })
		r.f.scheduled(1, r.at(10*time.Millisecond), raftfsm.DefaultPolicy)
		// Failures come closer together than probeInterval: no probe
		// brings the event back sooner.
		time.Sleep(1200 * time.Millisecond)
		r.setBroker(func(uint64) bool { return true })
		time.Sleep(time.Second)
		synctest.Wait()
		var at []time.Duration
		for _, a := range r.produced() {
			at = append(at, a.at)
		}
		ms := time.Millisecond
		want := []time.Duration{10 * ms, 110 * ms, 310 * ms, 710 * ms, 1110 * ms, 1510 * ms}
		if !slices.Equal(at, want) {
			t.Fatalf("attempts at %v, want %v (delays 100, 200, 400, 400, 400 ms)", at, want)
		}
		if got := r.produced(); !got[len(got)-1].ok {
			t.Fatalf("the last attempt %+v failed", got[len(got)-1])
		}
	})
}

// TestFiringProbesWhileFailing: while batches fail and their events wait out
// a long retry delay, one waiting event is fired every probeInterval, and
// only one.
func TestFiringProbesWhileFailing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newClockRig(t, Tuning{RetryDelay: 30 * time.Second, MaxRetryDelay: 30 * time.Second}, 0, 10, nil)
		defer r.stop()
		r.setBroker(func(uint64) bool { return false })
		for seq := uint64(1); seq <= 5; seq++ {
			r.f.scheduled(seq, r.at(10*time.Millisecond), raftfsm.DefaultPolicy)
		}
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		got := r.produced()
		var probes []time.Duration
		for _, a := range got[min(5, len(got)):] {
			probes = append(probes, a.at)
		}
		p := probeInterval
		if want := []time.Duration{10*time.Millisecond + p, 10*time.Millisecond + 2*p, 10*time.Millisecond + 3*p}; len(got) < 5 || !slices.Equal(probes, want) {
			t.Fatalf("attempts %+v; want the 5 at 10 ms, then one probe at each of %v", got, want)
		}
		r.f.mu.Lock()
		waiting := len(r.f.retrying)
		r.f.mu.Unlock()
		if waiting != 5 {
			t.Fatalf("%d events wait for their retry after a failed probe, want all 5", waiting)
		}
	})
}

// TestFiringHealBringsBackEveryWaitingEvent: the first probe the broker
// takes brings every event waiting for its retry back at once, and the
// backoff starts over.
func TestFiringHealBringsBackEveryWaitingEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const retry = 10 * time.Second
		r := newClockRig(t, Tuning{RetryDelay: retry, MaxRetryDelay: 4 * retry}, 0, 10, nil)
		defer r.stop()
		r.setBroker(func(uint64) bool { return false })
		for seq := uint64(1); seq <= 5; seq++ {
			r.f.scheduled(seq, r.at(10*time.Millisecond), raftfsm.DefaultPolicy)
		}
		time.Sleep(1500 * time.Millisecond) // a first probe fails at 1.01 s
		r.setBroker(func(uint64) bool { return true })
		time.Sleep(time.Second) // the second, at 2.01 s, is taken
		synctest.Wait()
		healedAt := 10*time.Millisecond + 2*probeInterval
		done := map[uint64]time.Duration{}
		for _, a := range r.produced() {
			if a.ok {
				done[a.seq] = a.at
			}
		}
		if len(done) != 5 {
			t.Fatalf("%d of 5 events produced by %v: %+v", len(done), r.since(), r.produced())
		}
		for seq, at := range done {
			if at != healedAt {
				t.Errorf("event %d produced at %v, want all at the heal, %v", seq, at, healedAt)
			}
		}
		r.f.mu.Lock()
		defer r.f.mu.Unlock()
		if r.f.failing || len(r.f.retrying) != 0 {
			t.Fatalf("after the heal: failing %v, %d waiting", r.f.failing, len(r.f.retrying))
		}
		if next := r.f.retry.NextBackOff(); next != retry {
			t.Fatalf("the next failure waits %v, want the backoff started over at %v", next, retry)
		}
	})
}

// TestFiringTakesByPriorityWhenBehind: events that fell due while the loop
// could not dispatch (its firing slots held by a broker that does not
// answer) are taken highest priority first once it can, whatever their due
// times, in takes of at most a batch.
func TestFiringTakesByPriorityWhenBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var first sync.Once
		r := newClockRig(t, Tuning{}, 0, 7, func() { first.Do(func() { <-gate }) })
		defer r.stop()
		r.f.scheduled(1, r.at(time.Millisecond), raftfsm.Policy{Priority: 0})
		time.Sleep(10 * time.Millisecond) // the loop is stuck dispatching seq 1
		for i := range 40 {
			// Priority falls as the due time rises, and rises again.
			p := uint8((i*7 + 3) % 10)
			r.f.scheduled(uint64(100+i), r.at(20*time.Millisecond+time.Duration(i)*5*time.Millisecond), raftfsm.Policy{Priority: p})
		}
		time.Sleep(time.Second)
		close(gate)
		synctest.Wait()
		r.mu.Lock()
		taken := slices.Clone(r.taken)
		r.mu.Unlock()
		if len(taken) != 41 || taken[0].seq != 1 {
			t.Fatalf("took %d events (%+v), want seq 1 then the 40", len(taken), taken)
		}
		var ps []uint8
		for _, a := range taken[1:] {
			ps = append(ps, a.priority)
			if a.at != time.Second+10*time.Millisecond {
				t.Fatalf("event %d taken at %v, want once the loop could dispatch", a.seq, a.at)
			}
		}
		if !slices.IsSortedFunc(ps, func(a, b uint8) int { return int(b) - int(a) }) {
			t.Fatalf("priorities in the order taken: %v, want highest first", ps)
		}
	})
}

// TestLeaseRunsOutWithoutAQuorum: a leader whose followers stop answering
// hands out its lease until less than leaseMargin of it is left, never a
// deadline past the lease length after it last asked a quorum that
// answered; a batch that asks then waits for the renewal, which times out
// at the lease length, and gets its error.
func TestLeaseRunsOutWithoutAQuorum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			length = 100 * time.Millisecond
			quorum = 10 * time.Millisecond
		)
		var cut atomic.Bool
		l := newLease(length, time.Now, func(timeout time.Duration) error {
			if cut.Load() {
				time.Sleep(timeout) // a Barrier no quorum answers
				return errors.New("barrier timed out")
			}
			time.Sleep(quorum)
			return nil
		})
		defer l.end()
		ctx := context.Background()
		start := time.Now()
		d, err := l.deadline(ctx)
		if err != nil || !d.Equal(start.Add(length)) {
			t.Fatalf("first lease: %v, %v; want +%v", d.Sub(start), err, length)
		}
		cut.Store(true)
		time.Sleep(60*time.Millisecond - time.Since(start))
		if d, err := l.deadline(ctx); err != nil || !d.Equal(start.Add(length)) {
			t.Fatalf("at +60ms: %v, %v; want the lease asked at 0, to +%v", d.Sub(start), err, length)
		}
		time.Sleep(80*time.Millisecond - time.Since(start))
		d, err = l.deadline(ctx)
		// The renewal started at +60 ms times out a lease length later.
		if err == nil || time.Since(start) != 60*time.Millisecond+length {
			t.Fatalf("at +80ms, less than the margin left: deadline +%v, %v at +%v; want an error at +%v",
				d.Sub(start), err, time.Since(start), 60*time.Millisecond+length)
		}
	})
}
