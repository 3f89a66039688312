package shard

import (
	"context"
	"errors"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// Every pending event due before the horizon is somewhere in the firing: in
// the wheel, in a fire batch, pinned by a change, or parked (in Kafka, its
// mark not yet committed). One that is in none of
// them is never fired, and nothing else would notice: its shard goes on
// firing the rest on time. A fault run found one, an occurrence of a
// recurring schedule that its predecessor's MarkFired created on a leader
// that fired its other events on time, unfired 17 s later, when a Pause
// cancelled it; the path that dropped it is not known. So the leader checks,
// every sweepInterval, the events that have been overdue for between
// sweepAge and sweepAge+sweepWindow, and puts back into the wheel one that
// two checks in a row found in no part of the firing (the first may have
// read it just before its MarkFired committed, or just after its creation
// committed and before the apply handed it to the wheel), counting it in
// chime_fire_orphans_total and logging it as an error: a few seconds late
// rather than never fired, and a bug to find. An event lost after it has
// been overdue for longer than that (in a backlog) is not looked for: the
// read starts at the window, because below it the due index holds the
// deletions of every event fired since the last compaction, which a read
// from the start would step over one by one, every time.
const (
	sweepInterval = 2 * time.Second
	// sweepAge: only events due longer ago than this are checked; a
	// healthy leader has none, save a backlog it is draining.
	sweepAge = 2 * time.Second
	// sweepWindow: how far past sweepAge an event is checked, so that
	// every sweep sees what the one before saw but what has moved on.
	sweepWindow = 3 * sweepInterval
	// sweepLimit bounds the events one check reads: the oldest, which in
	// a backlog are what the leader fires first.
	sweepLimit = 256
)

// OrphanMessage is the log message of an event the sweep put back: what the
// fault tests count in a node's log.
const OrphanMessage = "an overdue pending event was in no part of the firing (not in the wheel, a fire batch or a change); put back into the wheel to fire now"

// errSweepFull stops a sweep's read at sweepLimit events.
var errSweepFull = errors.New("sweep: read enough")

// sweepLoop marks the parked events again, once the firing loop has asked
// the other replicas for theirs (asked is closed), and every sweepInterval,
// and checks for orphaned events, until ctx ends. Parked events are out of
// the wheel, so the firing need not wait for their marks.
func (s *Shard) sweepLoop(ctx context.Context, asked <-chan struct{}) {
	select {
	case <-asked:
	case <-ctx.Done():
		return
	}
	s.markParked()
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	var suspects map[uint64]bool // found in no part of the firing by the last check
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.markParked()
		var err error
		if suspects, err = s.sweep(suspects); err != nil {
			s.logger.Warn("looking for overdue events the firing does not hold", "err", err)
		}
	}
}

// sweep reads the oldest events overdue by between sweepAge and
// sweepAge+sweepWindow, puts back into the wheel those that suspects (the
// last sweep's finds) also holds, and returns the rest of this sweep's finds.
func (s *Shard) sweep(suspects map[uint64]bool) (map[uint64]bool, error) {
	var overdue []loaded
	before := s.cfg.Now().Add(-sweepAge).UnixNano()
	err := s.fsm.ForEachPendingIn(before-int64(sweepWindow), before, func(seq uint64, due int64, p raftfsm.Policy) error {
		if len(overdue) == sweepLimit {
			return errSweepFull
		}
		overdue = append(overdue, loaded{seq, due, p})
		return nil
	})
	if err != nil && !errors.Is(err, errSweepFull) {
		return nil, err
	}
	found, placed := s.firing.sweep(overdue, suspects)
	for _, e := range placed {
		s.metrics.Orphans.Inc()
		s.logger.Error(OrphanMessage,
			"seq", e.seq, "due", time.Unix(0, e.due).UTC(), "late", time.Duration(s.cfg.Now().UnixNano()-e.due).Round(time.Millisecond))
	}
	return found, nil
}

// sweep looks up each of the overdue pending events read from the FSM. Those
// in no part of the firing that suspects holds too are placed back in the
// wheel and returned as placed; the others in no part of it are returned
// as found.
func (f *firing) sweep(overdue []loaded, suspects map[uint64]bool) (found map[uint64]bool, placed []loaded) {
	f.mu.Lock()
	for _, e := range overdue {
		if f.holdsLocked(e.seq) {
			continue
		}
		if !suspects[e.seq] {
			if found == nil {
				found = make(map[uint64]bool)
			}
			found[e.seq] = true
			continue
		}
		f.place(e.seq, e.due, e.p)
		placed = append(placed, e)
	}
	f.mu.Unlock()
	if len(placed) > 0 {
		f.wake()
	}
	return found, placed
}
