package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// Recurring applies c, a Create, Update, Delete, Pause, Resume, Trigger or
// Backfill of one recurring schedule, through Raft; the leader sets its
// time. When an Update, Delete or Pause reports success, no record of the
// occurrence it cancelled will be produced from then on, as an Update of
// that event promises: the occurrence was in no fire batch when the change
// was proposed, was kept out of the wheel until it committed, and no
// produce attempt of it is unanswered (ErrFiring, ErrProduceUnknown
// otherwise, with nothing changed).
//
// scope is what the caller's credential may act on (nil: anything). For any
// operation but Create, the schedule as stored must be in it: checked in
// the leased read that precedes the proposal, whose definition the entry
// then names (IfHash), so the state machine applies it only to what was
// checked. An outcome the state already decides (an unknown schedule, one
// outside scope, another version, a Pause of a paused schedule, a Resume of
// an active one, a Trigger or Backfill of a completed one) is answered from
// that read, without an entry. A Trigger or a Backfill removes no
// occurrence: it pins nothing, and its entry creates its events from the
// definition the entry finds, not from this read.
func (s *Shard) Recurring(ctx context.Context, c raftfsm.Recurring, scope Scope) (*raftfsm.RecurringResult, error) {
	if c.Op == raftfsm.RecurringCreate {
		// A Create changes nothing stored; the caller checked the new
		// definition's topic, and a Conflict names a schedule only to a
		// caller who may see it.
		return s.proposeRecurring(ctx, c)
	}
	for attempt := 1; ; attempt++ {
		if err := s.readable(ctx); err != nil {
			return nil, err
		}
		sched, found, err := s.fsm.GetSchedule(c.ID)
		if err != nil {
			return nil, err
		}
		answer := func(o raftfsm.RecurringOutcome) (*raftfsm.RecurringResult, error) {
			return &raftfsm.RecurringResult{Outcome: o, Schedule: sched}, nil
		}
		switch {
		case !found:
			return answer(raftfsm.RecurringNotFound)
		case !permitsSchedule(scope, &sched):
			return nil, Refuse(scope, c.ID)
		case c.IfVersion != 0 && c.IfVersion != sched.Version && (c.Op == raftfsm.RecurringUpdate || c.Op == raftfsm.RecurringDelete):
			return answer(raftfsm.RecurringVersionMismatch)
		case c.Op == raftfsm.RecurringPause && sched.State == raftfsm.SchedulePaused:
			return answer(raftfsm.RecurringPaused)
		case c.Op == raftfsm.RecurringResume && sched.State != raftfsm.SchedulePaused:
			return answer(raftfsm.RecurringNotPaused)
		case (c.Op == raftfsm.RecurringTrigger || c.Op == raftfsm.RecurringBackfill) && sched.State == raftfsm.ScheduleCompleted:
			return answer(raftfsm.RecurringCompletedState)
		}
		if scope != nil {
			c.IfHash = sched.Hash
		}
		var pinned uint64
		if removesOccurrence(c.Op) {
			c.CheckPending, c.Pending = true, sched.NextSeq
			if pinned, err = s.pinOccurrence(c.ID, &sched); err != nil {
				return nil, err
			}
		}
		if hook := s.cfg.Knobs.RecurringRead; hook != nil {
			hook()
		}
		res, err := s.proposeRecurring(ctx, c)
		if pinned != 0 {
			s.firing.unpin(pinned)
		}
		switch {
		case err != nil:
			return nil, err
		case res.Outcome == raftfsm.RecurringVersionMismatch && !permitsSchedule(scope, &res.Schedule):
			// Deleted and created again outside scope since the read: the
			// caller learns no more of it than of any other such schedule.
			return nil, Refuse(scope, c.ID)
		case res.Outcome != raftfsm.RecurringMoved:
			return res, nil
		case attempt == changeAttempts:
			return nil, ErrChanging
		}
	}
}

// removesOccurrence reports whether op cancels the schedule's pending
// occurrence (Update, Delete, Pause), which must then be out of every fire
// batch when it applies. Resume, Trigger and Backfill leave it pending.
func removesOccurrence(op raftfsm.RecurringOp) bool {
	return op == raftfsm.RecurringUpdate || op == raftfsm.RecurringDelete || op == raftfsm.RecurringPause
}

// Retryable reports whether an entry of op, which may have been appended
// before leadership went (or reached a leader that then went), answers the
// same when applied a second time, so that it may be proposed again: a
// Create (Existing), a Pause (Paused), a Trigger and a Backfill (what the
// first made counts as existing).
func Retryable(op raftfsm.RecurringOp) bool {
	switch op {
	case raftfsm.RecurringCreate, raftfsm.RecurringPause, raftfsm.RecurringTrigger, raftfsm.RecurringBackfill:
		return true
	}
	return false
}

// pinOccurrence keeps sched's pending occurrence, if it has one, out of
// any fire batch until unpinned, returning its seq (0: none pending).
func (s *Shard) pinOccurrence(id string, sched *raftfsm.Schedule) (uint64, error) {
	if sched.NextSeq == 0 {
		return 0, nil
	}
	rec, found, err := s.fsm.Get(raftfsm.OccurrenceID(id, time.Unix(0, sched.Next)))
	switch {
	case err != nil:
		return 0, err
	case !found || rec.Seq != sched.NextSeq:
		return 0, fmt.Errorf("shard %d: schedule %q names occurrence %d, which its event id does not", s.id, id, sched.NextSeq)
	case s.inDoubt(rec):
		return 0, ErrProduceUnknown
	}
	if err := s.firing.pin(rec.Seq, rec.Due, rec.Policy); err != nil {
		return 0, err
	}
	return rec.Seq, nil
}

// permitsSchedule reports whether scope (nil: anything) may act on sched.
func permitsSchedule(scope Scope, sched *raftfsm.Schedule) bool {
	return scope == nil || scope.Permits(sched.ID, sched.Definition.Topic)
}

func (s *Shard) proposeRecurring(ctx context.Context, c raftfsm.Recurring) (*raftfsm.RecurringResult, error) {
	c.ProposedAt = s.cfg.Now().UnixNano()
	resp, err := s.apply(ctx, raftfsm.AppendRecurring(nil, &c))
	if (errors.Is(err, ErrNotLeader) || errors.Is(err, ErrStopped)) && !Retryable(c.Op) {
		// The entry may have been appended before leadership went (or the
		// replica closed under it); a retry would apply it again, and these
		// answer differently the second time.
		return nil, fmt.Errorf("%w (%v)", ErrChangeUnknown, err)
	}
	if err != nil {
		return nil, err
	}
	res, ok := resp.(*raftfsm.RecurringResult)
	if !ok {
		return nil, fmt.Errorf("shard %d: unexpected recurring response %T", s.id, resp)
	}
	return res, nil
}

// GetSchedule reads one recurring schedule, linearizably unless staleOK.
func (s *Shard) GetSchedule(ctx context.Context, id string, staleOK bool) (raftfsm.Schedule, bool, error) {
	if err := s.queryable(ctx, staleOK); err != nil {
		return raftfsm.Schedule{}, false, err
	}
	return s.fsm.GetSchedule(id)
}

// ListSchedules returns up to limit of this shard's schedules whose id
// starts with prefix, after the id after, in id order, linearizably unless
// staleOK; more says others follow.
func (s *Shard) ListSchedules(ctx context.Context, prefix, after string, limit int, staleOK bool) ([]raftfsm.Schedule, bool, error) {
	if err := s.queryable(ctx, staleOK); err != nil {
		return nil, false, err
	}
	return s.fsm.ListSchedules(prefix, after, limit)
}
