package shard

import (
	"time"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// A batch whose produce fails puts its events back into the wheel at a
// retry time (firing.retry: RetryDelay doubling to MaxRetryDelay), because
// every attempt sent into a broker that does not answer may still land
// later, as one more duplicate. Nothing shortened that wait when Kafka came
// back: after a Kafka cut healed, events due meanwhile reached Kafka 21-25 s
// later in fault runs, 49 s later in a 100 s cut. So, while batches fail,
// the firing loop brings one waiting event forward every probeInterval as a
// probe (probeLocked), and the first batch that produces without a failure
// brings every waiting event forward (healLocked) and resets the backoff.

// settleOutcomes records, for the events out of one batch that Publish
// answered with outcomes, which stay in doubt and which are parked (in
// Kafka, unmarked), and returns the events to put back into the wheel and
// how long they wait. marked holds the events whose outcome committed
// through Raft.
func (f *firing) settleOutcomes(out []publish.Record, outcomes []publish.Outcome, marked map[uint64]bool) (map[uint64]bool, time.Duration) {
	unsettled := make(map[uint64]bool, len(out))
	now := f.now().UnixNano()
	failed, produced := false, false
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range out {
		o := &outcomes[i]
		produced = produced || o.Done
		if marked[r.Seq] {
			delete(f.unsure, r.Seq)
			continue
		}
		if o.Done && !o.DeadLettered {
			// In Kafka, its mark not committed: parked until a mark does,
			// in doubt meanwhile. Kafka took it, so it is no failure of
			// Kafka's.
			f.unsure[r.Seq] = now
			f.parked[r.Seq] = raftfsm.Fired{Seq: r.Seq, FiredAt: o.FiredAt, Attempts: o.Attempts, Due: r.Due}
			continue
		}
		// Whatever is not marked goes back, and stays in doubt if it was
		// sent: an unanswered request (of this call, or of an earlier
		// attempt within it) may still land, and a dead-lettered record
		// whose mark did not commit is on that topic already. Neither sent nor done:
		// the lease ran out while the record waited for its turn in the
		// publisher. It never left; fire it again at once, under a fresh
		// lease.
		unsettled[r.Seq] = true
		if o.Sent || o.Done {
			f.unsure[r.Seq] = now
			failed = true
		}
	}
	if !failed {
		if produced && f.failing && now-f.healedAt >= int64(probeInterval) {
			f.healLocked(now)
		}
		return unsettled, 0
	}
	f.failing = true
	f.probeAt = now + int64(probeInterval)
	if len(f.unsure) > unsureSweep {
		for seq, at := range f.unsure {
			if now-at > int64(unsureTTL) {
				delete(f.unsure, seq)
			}
		}
	}
	return unsettled, f.retry.NextBackOff()
}

// healLocked ends a run of failed batches: Kafka took a batch, so every
// event waiting for its retry time is brought back to its due time (it
// fires at once) and the backoff starts over.
func (f *firing) healLocked(now int64) {
	f.failing, f.healedAt = false, now
	f.retry.Reset()
	for seq, due := range f.retrying {
		f.backToDueLocked(seq, due)
	}
	clear(f.retrying)
	f.wake()
}

// backToDueLocked moves event seq, waiting in the wheel for its retry time,
// back to its due time.
func (f *firing) backToDueLocked(seq uint64, due int64) {
	h, ok := f.handles.get(seq)
	if !ok {
		return
	}
	if e, ok := f.wheel.Lookup(h); ok {
		f.wheel.Remove(h)
		f.handles.set(seq, f.wheel.Add(seq, due, e.Priority))
	}
}

// probeLocked, while batches fail and events wait for their retry time,
// brings one of them back to its due time every probeInterval, so that its
// produce tells whether Kafka is back (and heals if it is).
func (f *firing) probeLocked(now int64) {
	if !f.failing || now < f.probeAt || len(f.retrying) == 0 {
		return
	}
	for seq, due := range f.retrying {
		f.backToDueLocked(seq, due)
		delete(f.retrying, seq)
		break
	}
	f.probeAt = now + int64(probeInterval)
}

// adopt parks the events another replica parked (its Shard.Parked) that
// this one's wheel holds at the due time that replica read, and returns how
// many. They leave the wheel, as this replica's own parked events do, and
// stay in doubt until markParked's mark commits. An event held elsewhere
// (in a fire batch, pinned by a change, parked here already) or at another
// due time (the other replica read a version since replaced) is left
// where it is.
func (f *firing) adopt(fired []raftfsm.Fired) int {
	now := f.now().UnixNano()
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, e := range fired {
		h, ok := f.handles.get(e.Seq)
		if !ok {
			continue
		}
		if _, ok := f.parked[e.Seq]; ok {
			continue
		}
		due := f.dueLocked(e.Seq, h)
		if due != e.Due {
			continue
		}
		f.unwheelLocked(e.Seq, h)
		f.parked[e.Seq] = e
		f.unsure[e.Seq] = now
		n++
	}
	return n
}

// dueLocked is the due time of event seq, which the wheel holds at h: the
// time the wheel holds it for, unless that is a retry time, a point of its
// window or a time a rate limit deferred it to.
func (f *firing) dueLocked(seq uint64, h wheel.Handle) int64 {
	if d, ok := f.retrying[seq]; ok {
		return d
	}
	if d, ok := f.spread[seq]; ok {
		return d
	}
	if l, ok := f.limited[seq]; ok {
		return l.due
	}
	e, _ := f.wheel.Lookup(h)
	return e.Due
}

// parkedEvents returns the marks of the parked events.
func (f *firing) parkedEvents() []raftfsm.Fired {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.parked) == 0 {
		return nil
	}
	out := make([]raftfsm.Fired, 0, len(f.parked))
	for _, e := range f.parked {
		out = append(out, e)
	}
	return out
}
