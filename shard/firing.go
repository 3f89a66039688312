package shard

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// never is the end of time in Unix ns.
const never = 1<<63 - 1

// firing is a replica's timing wheel and the state of firing from it. Its
// mutex is taken by the raft apply goroutine (through observer), the firing
// loop, fire batches and Cancel; each holds it only for in-memory work, and
// takes no other lock while holding it. Methods named *Locked need it held.
//
// It reads time only from now, the injected clock, which the firing loop
// (run) advances it by: take is given the time, and retry and probe times
// (settleOutcomes, settleBatch) are read from the same clock. No timer of
// its own fires but run's sleep, so a test under testing/synctest, with
// time.Now as the clock, drives hold, retry, probe and heal exactly.
type firing struct {
	now func() time.Time // the shard's clock (Config.Now)
	res int64            // the wheel's resolution, ns

	// kick wakes the firing loop (buffered, one slot; no lock needed).
	kick chan struct{}

	mu sync.Mutex // guards every field below

	// wheelSet is the wheel, the handles of its events by seq, and the due
	// times of those it holds at the point of their window (spread).
	wheelSet
	inflight map[uint64]*fireBatch // events taken out of the wheel and not yet settled here
	// retrying holds the due time of every event the wheel holds at a later
	// retry time (settleBatch), by seq. The wheel keeps one time per event,
	// and the firing path needs the due time: it is half of the body's key.
	retrying map[uint64]int64
	// limited holds every event a topic rate limit put back into the wheel
	// (deferLocked), by seq: its due time, and whether it holds a slot of
	// the limit at the time the wheel holds it for.
	limited map[uint64]limitedEvent
	// unsure holds, with the time it was noted, every event a produce
	// attempt of which ended without the record being marked fired (a
	// timeout, a lost leadership): the request may still reach the broker
	// later, so this leader cannot promise that a cancel stops it. Only
	// marking the event fired clears it; entries of cancelled events
	// expire after unsureTTL.
	unsure map[uint64]int64
	// fenceUntil: unfired events due by then may have been handed to Kafka
	// by an earlier leader (see Tuning.ClockSkewBound). It is the end of
	// time until the firing loop has passed its barrier.
	fenceUntil int64
	// lastLimited is the limitedDone of the batch taken last (fireBatch).
	lastLimited chan struct{}
	// retry sets how long events of a failed batch wait (Tuning.RetryDelay,
	// doubling to MaxRetryDelay, no jitter); failing is set from the first
	// failed batch until heal.
	retry   backoff.ExponentialBackOff
	failing bool
	// probeAt: while failing, no probe before this (Unix ns); healedAt:
	// the last heal. A heal follows another only after probeInterval, so
	// that while some partitions take records and others fail, the events
	// of the failing ones are not brought back after every success.
	probeAt, healedAt int64
	// sleepUntil is when the firing loop next wakes (Unix ns); an event due
	// earlier kicks it.
	sleepUntil int64

	// The near horizon: the wheel holds the events due before until, about
	// Tuning.WheelHorizon ahead of now, and the rest wait in Pebble's due
	// index until the loader (horizonLoop) moves until past them. Every
	// pending event due before until is in the wheel, in a fire batch or
	// waiting to retry; the observer adds a new event only if it is due
	// before until. A load first moves until (beginLoad), so that what is
	// applied from then on reaches the wheel through the observer, then
	// reads the range from Pebble and adds what the wheel does not hold yet
	// (addLoaded). While it runs (loading), gone collects the events
	// settled meanwhile, so that a read made before one settled does not
	// bring it back. gen counts the wheels rebuilt from Pebble (replace):
	// a load begun on an older one stops.
	until   int64
	loading bool
	gone    map[uint64]struct{}
	gen     uint64

	// pinned holds the pending events this leader is changing (Update, or
	// a Schedule with Replace), by seq, with their due time and policy. A pinned event
	// is in neither the wheel nor a fire batch, so no batch reads the
	// version the change supersedes; the change names the seq it pinned,
	// and the FSM refuses it if that is no longer the event's. It leaves
	// the set when the change is applied (settled) or given up (unpin).
	pinned map[uint64]pinnedEvent

	// parked holds the events whose records Kafka acknowledged and whose
	// MarkFired did not commit (leadership went, or the mark timed out),
	// by seq, with what the mark says. They are in Kafka: firing one again
	// would only duplicate it, as a loss fault showed when a leader that
	// lost its leadership and won it back produced again what its failed
	// marks had named. So a parked event is in neither the wheel nor a fire
	// batch, and this replica, as leader, marks it again (markParked)
	// before it fires anything, and from then on until the mark commits.
	// It leaves the set when it settles (a mark of this node's or another
	// leader's, or a cancel). Another leader, not knowing, fires it again.
	parked map[uint64]raftfsm.Fired
}

type pinnedEvent struct {
	due int64
	p   raftfsm.Policy
}

type limitedEvent struct {
	due      int64
	reserved bool
}

// wheelSet is a wheel with what names its events: their handles, and the due
// times of those it holds later than due.
type wheelSet struct {
	wheel   *wheel.Wheel
	handles handleTable // pending events in the wheel, by seq
	// spread holds the due time of every event with a window that the wheel
	// holds at the point of its window it fires at (see place), by seq.
	spread map[uint64]int64
}

// newWheelSet returns an empty wheel set around w.
func newWheelSet(w *wheel.Wheel) *wheelSet {
	return &wheelSet{wheel: w, spread: make(map[uint64]int64)}
}

// place adds pending event seq, due at due, to the wheel at the time it
// fires: its due time, or for an event with a window, a point of
// [due, due+window) fixed by its seq (the same on every replica, since the
// log assigns seqs), so that the events of a burst due at one time with a
// window reach Kafka as an even flow across it rather than at once.
func (ws *wheelSet) place(seq uint64, due int64, p raftfsm.Policy) {
	at := spreadAt(seq, due, p.Window)
	ws.handles.set(seq, ws.wheel.Add(seq, at, p.Priority))
	if at != due {
		ws.spread[seq] = due
	}
}

// spreadAt is the point of [due, due+window) at which event seq fires.
func spreadAt(seq uint64, due, window int64) int64 {
	if window <= 0 {
		return due
	}
	// splitmix64's finaliser: neighbouring seqs land far apart.
	z := seq + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	off := int64(z % uint64(window))
	if due > math.MaxInt64-off {
		return math.MaxInt64
	}
	return due + off
}

func newFiring(now func() time.Time, t *Tuning) (*firing, error) {
	w, err := wheel.New(now().UnixNano(), t.Resolution)
	if err != nil {
		return nil, err
	}
	return &firing{
		now: now, res: int64(t.Resolution), kick: make(chan struct{}, 1),
		wheelSet: *newWheelSet(w), inflight: make(map[uint64]*fireBatch),
		retrying: make(map[uint64]int64), unsure: make(map[uint64]int64),
		limited: make(map[uint64]limitedEvent), gone: make(map[uint64]struct{}),
		fenceUntil: never, sleepUntil: never,
		pinned: make(map[uint64]pinnedEvent), parked: make(map[uint64]raftfsm.Fired),
		retry: backoff.ExponentialBackOff{
			InitialInterval: t.RetryDelay, MaxInterval: t.MaxRetryDelay, Multiplier: 2,
		},
	}, nil
}

func (f *firing) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// sleep waits d (at most an hour), a kick or the end of ctx, which it
// reports as false: the firing loop's wait between takes, until the time
// take returned or until the wheel changed since take read it.
func (f *firing) sleep(ctx context.Context, timer *time.Timer, d time.Duration) bool {
	// Reset and Stop leave no stale tick in timer.C (Go 1.23's timers), so
	// a kick needs no drain of it.
	timer.Reset(min(max(d, 0), time.Hour))
	select {
	case <-timer.C:
	case <-f.kick:
		timer.Stop()
	case <-ctx.Done():
		return false
	}
	return true
}

// drainKick forgets a kick the next take will see anyway: it comes before
// that take reads the wheel. A kick after this, during the take or before
// the sleep, stays and ends the sleep at once; draining it in sleep lost the
// wake-up of a retry requeued between take and sleep, which then waited for
// the next event or probe (up to an hour).
func (f *firing) drainKick() {
	select {
	case <-f.kick:
	default:
	}
}

// replace swaps in a wheel rebuilt from Pebble, which holds every pending
// event due before until.
func (f *firing) replace(ws *wheelSet, until int64) {
	f.mu.Lock()
	out := func(seq uint64) {
		if h, ok := ws.handles.take(seq); ok {
			ws.wheel.Remove(h)
			delete(ws.spread, seq)
		}
	}
	for seq := range f.pinned {
		out(seq)
	}
	for seq := range f.parked {
		out(seq)
	}
	f.wheelSet, f.until = *ws, until
	clear(f.retrying)
	clear(f.limited)
	f.gen++
	f.loading = false
	clear(f.gone)
	f.mu.Unlock()
	f.wake()
}

// scheduled adds a newly applied event to the wheel if it falls due before
// the horizon; the loader adds a later one when the horizon reaches it.
func (f *firing) scheduled(seq uint64, due int64, p raftfsm.Policy) {
	f.mu.Lock()
	wake := f.scheduledLocked(seq, due, p)
	f.mu.Unlock()
	if wake {
		f.wake()
	}
}

// scheduledLocked is scheduled with f.mu held; it reports whether the
// firing loop must wake.
func (f *firing) scheduledLocked(seq uint64, due int64, p raftfsm.Policy) (wake bool) {
	if due >= f.until {
		return false
	}
	f.place(seq, due, p)
	return due < f.sleepUntil
}

// beginLoad moves the horizon to until and returns where the load must
// start reading and the wheel it loads into; ok is false if the horizon is
// there already.
func (f *firing) beginLoad(until int64) (from int64, gen uint64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if until <= f.until {
		return 0, 0, false
	}
	from, f.until, f.loading = f.until, until, true
	return from, f.gen, true
}

// addLoaded adds events read from Pebble by a load into wheel gen, leaving
// out those the wheel already holds (the observer added them, or a retry
// put them back), those in a fire batch, and those settled since the load
// began. It reports false if the wheel was rebuilt since, which ends the
// load.
func (f *firing) addLoaded(gen uint64, es []loaded) bool {
	f.mu.Lock()
	if gen != f.gen {
		f.mu.Unlock()
		return false
	}
	wake := false
	for _, e := range es {
		if _, ok := f.gone[e.seq]; ok || f.holdsLocked(e.seq) {
			continue
		}
		f.place(e.seq, e.due, e.p)
		wake = wake || e.due < f.sleepUntil
	}
	f.mu.Unlock()
	if wake {
		f.wake()
	}
	return true
}

// holdsLocked reports whether pending event seq is in some part of the
// firing: the wheel, a fire batch, pinned by a change, or parked. Called
// with f.mu held.
func (f *firing) holdsLocked(seq uint64) bool {
	if _, ok := f.handles.get(seq); ok || f.inflight[seq] != nil {
		return true
	}
	if _, ok := f.pinned[seq]; ok {
		return true
	}
	_, ok := f.parked[seq]
	return ok
}

// endLoad ends the load into wheel gen.
func (f *firing) endLoad(gen uint64) {
	f.mu.Lock()
	if gen == f.gen {
		f.loading = false
		clear(f.gone)
	}
	f.mu.Unlock()
}

// current reports whether gen is the wheel in use.
func (f *firing) current(gen uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return gen == f.gen
}

// horizon returns the number of events in the wheel and the end of the
// range it holds every pending event of (Unix ns).
func (f *firing) horizon() (events int, until int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wheel.Len(), f.until
}

// settled takes an event that was cancelled or marked out of the wheel, or
// out of the fire batch that holds it.
func (f *firing) settled(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settledLocked(seq)
}

// settledLocked is settled with f.mu held.
func (f *firing) settledLocked(seq uint64) {
	delete(f.pinned, seq)
	delete(f.parked, seq)
	if f.loading {
		f.gone[seq] = struct{}{}
	}
	if h, ok := f.handles.take(seq); ok {
		f.wheel.Remove(h)
		delete(f.retrying, seq)
		delete(f.spread, seq)
		delete(f.limited, seq)
		return
	}
	if b := f.inflight[seq]; b != nil && !b.sending {
		// A fire batch holds it, reading it or waiting for its due time
		// (Tuning.FireLead). Until the batch starts to produce, a cancel
		// keeps the event out of it (dropCancelled), as it would if the
		// event were still in the wheel. (Once it produces, the batch's own
		// MarkFired lands here for every event; there is nothing to mark.)
		if b.cancelled == nil {
			b.cancelled = make(map[uint64]bool)
		}
		b.cancelled[seq] = true
	}
}

// pin takes pending event seq, due at due with policy p, out of the wheel
// for a change (see pinned). It fails with ErrFiring if a fire batch holds
// the event, and with ErrChanging if another change of it is under way.
func (f *firing) pin(seq uint64, due int64, p raftfsm.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inflight[seq] != nil {
		return ErrFiring
	}
	if _, ok := f.pinned[seq]; ok {
		return ErrChanging
	}
	if h, ok := f.handles.get(seq); ok {
		// A retried event goes back at its due time, not its retry time,
		// which the wheel does not say: it is then retried at once.
		f.unwheelLocked(seq, h)
	}
	f.pinned[seq] = pinnedEvent{due, p}
	return nil
}

// unwheelLocked takes event seq, which the wheel holds at h, out of the
// wheel with what the wheel set keeps of it (its retry, window point or
// rate-limit deferral). Called with f.mu held.
func (f *firing) unwheelLocked(seq uint64, h wheel.Handle) {
	f.wheel.Remove(h)
	f.handles.delete(seq)
	delete(f.retrying, seq)
	delete(f.spread, seq)
	delete(f.limited, seq)
}

// unpin puts a pinned event back where it was, if it is still pinned: the
// change was refused or its outcome is unknown (an entry applied later takes
// the event out again through settled).
func (f *firing) unpin(seq uint64) {
	f.mu.Lock()
	pe, ok := f.pinned[seq]
	delete(f.pinned, seq)
	back := ok && pe.due < f.until
	if back {
		f.place(seq, pe.due, pe.p)
	}
	wake := back && pe.due < f.sleepUntil
	f.mu.Unlock()
	if wake {
		f.wake()
	}
}

// setFence sets fenceUntil (never: no fence is known).
func (f *firing) setFence(until int64) {
	f.mu.Lock()
	f.fenceUntil = until
	f.mu.Unlock()
}

// doubt returns whether seq has an unanswered produce of this leader's, and
// the fence.
func (f *firing) doubt(seq uint64) (unsure bool, fence int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, unsure = f.unsure[seq]
	return unsure, f.fenceUntil
}

// producing returns the batch a cancel of seq must wait for: the one that
// holds seq, unless it has not begun to produce and has marked seq
// cancelled.
func (f *firing) producing(seq uint64) *fireBatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.inflight[seq]
	if b != nil && !b.sending && b.cancelled[seq] {
		return nil
	}
	return b
}

// run is the firing loop's turn of the wheel: it advances the firing state
// by its clock (f.now, the shard's), taking what falls due out of the wheel
// (take) and handing the batches to dispatch, and between takes it sleeps
// until the time take returned or a kick. It returns when ctx ends or
// dispatch reports false. Everything here happens at a time the clock gives
// it, so under testing/synctest, with time.Now as the clock, a test drives
// it exactly.
func (f *firing) run(ctx context.Context, lead int64, max int, onTime func(late int64), dispatch func([]*fireBatch) bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var (
		due     []wheel.Entry
		batches []*fireBatch
		wakeAt  int64
	)
	for {
		f.drainKick()
		now := f.now().UnixNano()
		due, batches, wakeAt = f.take(now, lead, max, due, batches[:0], onTime)
		if len(batches) > 0 {
			ok := dispatch(batches)
			clear(batches)
			if !ok {
				return
			}
			continue
		}
		if !f.sleep(ctx, timer, time.Duration(wakeAt-now)) {
			return
		}
	}
}

// take turns what the wheel holds due into fire batches appended to out
// (see takeBatchesLocked), and returns them and when the firing loop should
// next look, by the shard's clock. What is due by now comes first, at most
// max events, highest priority first (wheel.Ready): a leader that is behind
// (after an outage, in a burst, under a rate limit) fires the due events of
// higher priority before the others, however long they have waited. Only
// when nothing is due does it advance the wheel to now+lead, to take what
// falls due within FireLead early, in due order; unless that is a burst (a
// full take), which it takes tick by tick, by priority (takeBurstLocked).
func (f *firing) take(now, lead int64, max int, due []wheel.Entry, out []*fireBatch, onTime func(late int64)) ([]wheel.Entry, []*fireBatch, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probeLocked(now)
	if due = f.wheel.Ready(now, due[:0], max); len(due) == 0 {
		due = f.wheel.Advance(now+lead, due, max)
		if max > 0 && len(due) >= max {
			due = f.takeBurstLocked(due, max)
		}
	}
	out = f.takeBatchesLocked(due, now, out, onTime)
	next := int64(never)
	switch {
	case len(out) > 0:
		f.sleepUntil = now
		return due, out, now
	default:
		if n, ok := f.wheel.NextDue(); ok {
			next = n
		}
		f.sleepUntil = next
	}
	wakeAt := next - lead
	if next == never {
		wakeAt = never
	}
	if f.failing && len(f.retrying) > 0 {
		wakeAt = min(wakeAt, f.probeAt)
	}
	return due, out, wakeAt
}

// takeBurstLocked is given a full take of entries not yet due (in due
// order), more than one batch holds: a burst, whose entries must go by
// priority once due rather than in due order. It puts them back and takes,
// by priority, at most max of those due by the tick of the first (all
// within one tick of each other, so a batch of them is held no longer than
// one tick beyond its earliest). Those it leaves wait, found due, for the
// next take (wheel.Ready), which holds them until due as it does these.
func (f *firing) takeBurstLocked(due []wheel.Entry, max int) []wheel.Entry {
	for _, e := range due {
		f.handles.set(e.Ref, f.wheel.Add(e.Ref, e.Due, e.Priority))
	}
	tick := int64(math.MaxInt64)
	if d := due[0].Due; d <= math.MaxInt64-f.res {
		tick = (d + f.res - 1) / f.res * f.res // the tick boundary at or after it
	}
	return f.wheel.Ready(tick, due[:0], max)
}

// takeBatchesLocked turns entries just taken out of the wheel (all due by
// now, or in due order and due by now+FireLead) into fire batches, marks
// them in flight and appends them to out. Entries due by now make one batch, sent at once. The
// rest are taken early, up to FireLead before they fall due, so that their
// read, their wait for a firing slot and the firing loop's own wake-up are
// done before the due time and cannot make them late. They are grouped by
// wheel tick, and each group is held after its read until its last entry is
// due (fireBatch.notBefore). onTime gets how late a batch due by now is.
func (f *firing) takeBatchesLocked(due []wheel.Entry, now int64, out []*fireBatch, onTime func(late int64)) []*fireBatch {
	for len(due) > 0 {
		n := 1
		if due[0].Due <= now {
			for n < len(due) && due[n].Due <= now {
				n++
			}
		} else {
			for n < len(due) && due[n].Due-due[0].Due < f.res {
				n++
			}
		}
		b := &fireBatch{entries: slices.Clone(due[:n]), done: make(chan struct{}),
			afterLimited: f.lastLimited, limitedDone: make(chan struct{})}
		f.lastLimited = b.limitedDone
		earliest := due[0].Due
		for i, e := range b.entries {
			earliest = min(earliest, e.Due)
			b.notBefore = max(b.notBefore, e.Due)
			f.handles.delete(e.Ref)
			f.inflight[e.Ref] = b
			if d, ok := f.retrying[e.Ref]; ok {
				b.entries[i].Due = d
				delete(f.retrying, e.Ref)
			} else if d, ok := f.spread[e.Ref]; ok {
				b.entries[i].Due = d
				delete(f.spread, e.Ref)
			} else if l, ok := f.limited[e.Ref]; ok {
				b.entries[i].Due = l.due
				delete(f.limited, e.Ref)
				if b.limited == nil {
					b.limited = make(map[uint64]bool)
				}
				b.limited[e.Ref] = l.reserved
			}
		}
		if b.early = b.notBefore > now; !b.early {
			onTime(now - earliest)
		}
		out = append(out, b)
		due = due[n:]
	}
	return out
}

// deferral is a record a topic rate limit holds back: it goes back into the
// wheel until at, holding a slot of the limit then if reserved.
type deferral struct {
	seq      uint64
	at       int64
	reserved bool
}

// deferLocked takes the deferred events out of batch b, which is producing
// the rest, and puts them back into the wheel at their time, with their
// priority; they keep their place in the horizon and stay pending. One
// whose cancel was applied while b held it stays in b, which produces it
// no more than the others it dropped, and settles it.
func (f *firing) deferLocked(b *fireBatch, ds []deferral) {
	at := make(map[uint64]deferral, len(ds))
	for _, d := range ds {
		at[d.seq] = d
	}
	kept := b.entries[:0]
	for _, e := range b.entries {
		d, ok := at[e.Ref]
		if !ok || b.cancelled[e.Ref] {
			kept = append(kept, e)
			continue
		}
		delete(f.inflight, e.Ref)
		f.handles.set(e.Ref, f.wheel.Add(e.Ref, max(d.at, e.Due), e.Priority))
		f.limited[e.Ref] = limitedEvent{due: e.Due, reserved: d.reserved}
	}
	clear(b.entries[len(kept):])
	b.entries = kept
}

// dropCancelled marks b as producing and removes from out the events whose
// cancel was applied while b held them: from here on a cancel waits for b.
func (f *firing) dropCancelled(b *fireBatch, out []publish.Record) []publish.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	b.sending = true
	if len(b.cancelled) > 0 {
		out = slices.DeleteFunc(out, func(r publish.Record) bool { return b.cancelled[r.Seq] })
	}
	return out
}

// settleBatch ends a batch: entries in requeue go back into the wheel, due
// no sooner than delay from now; the rest are dropped from the in-flight
// set.
func (f *firing) settleBatch(b *fireBatch, requeue map[uint64]bool, delay time.Duration) {
	retryAt := f.now().UnixNano() + int64(delay)
	f.mu.Lock()
	for _, e := range b.entries {
		delete(f.inflight, e.Ref)
		if requeue[e.Ref] {
			f.handles.set(e.Ref, f.wheel.Add(e.Ref, max(e.Due, retryAt), e.Priority))
			if retryAt > e.Due {
				f.retrying[e.Ref] = e.Due
			}
		}
	}
	f.mu.Unlock()
	close(b.done)
	if len(requeue) > 0 {
		f.wake()
	}
}
