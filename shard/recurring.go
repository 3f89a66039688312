package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// Recurring applies c, a Create, Update, Delete, Pause or Resume of one
// recurring schedule, through Raft; the leader sets its time. When an
// Update, Delete or Pause reports success, no record of the occurrence it
// cancelled will be produced from then on, as an Update of that event
// promises: the occurrence was in no fire batch when the change was
// proposed, was kept out of the wheel until it committed, and no produce
// attempt of it is unanswered (ErrFiring, ErrProduceUnknown otherwise, with
// nothing changed).
//
// An outcome the state already decides (an unknown schedule, another
// version, a Pause of a paused schedule) is answered from this leader's
// state under its lease, without an entry.
func (s *Shard) Recurring(ctx context.Context, c raftfsm.Recurring) (*raftfsm.RecurringResult, error) {
	if c.Op == raftfsm.RecurringCreate || c.Op == raftfsm.RecurringResume {
		// Neither removes a pending occurrence, so there is nothing to pin.
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
		case c.IfVersion != 0 && c.IfVersion != sched.Version && c.Op != raftfsm.RecurringPause:
			return answer(raftfsm.RecurringVersionMismatch)
		case c.Op == raftfsm.RecurringPause && sched.State == raftfsm.SchedulePaused:
			return answer(raftfsm.RecurringPaused)
		}
		c.CheckPending, c.Pending = true, sched.NextSeq
		var pinned uint64
		if sched.NextSeq != 0 {
			rec, found, err := s.fsm.Get(raftfsm.OccurrenceID(c.ID, time.Unix(0, sched.Next)))
			switch {
			case err != nil:
				return nil, err
			case !found || rec.Seq != sched.NextSeq:
				return nil, fmt.Errorf("shard %d: schedule %q names occurrence %d, which its event id does not", s.id, c.ID, sched.NextSeq)
			case s.inDoubt(rec):
				return nil, ErrProduceUnknown
			}
			if err := s.firing.pin(rec.Seq, rec.Due, rec.Policy); err != nil {
				return nil, err
			}
			pinned = rec.Seq
		}
		res, err := s.proposeRecurring(ctx, c)
		if pinned != 0 {
			s.firing.unpin(pinned)
		}
		if err != nil || res.Outcome != raftfsm.RecurringMoved {
			return res, err
		}
		if attempt == changeAttempts {
			return nil, ErrChanging
		}
	}
}

func (s *Shard) proposeRecurring(ctx context.Context, c raftfsm.Recurring) (*raftfsm.RecurringResult, error) {
	c.ProposedAt = s.cfg.Now().UnixNano()
	resp, err := s.apply(ctx, raftfsm.AppendRecurring(nil, &c))
	if errors.Is(err, ErrNotLeader) && c.Op != raftfsm.RecurringCreate && c.Op != raftfsm.RecurringPause {
		// The entry may have been appended before leadership went; a retry
		// would apply it again, and these answer differently the second
		// time. A Create (Existing) and a Pause (Paused) answer the same.
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
