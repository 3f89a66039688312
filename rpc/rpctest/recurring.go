package rpctest

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/raftfsm/recurrence"
	"github.com/chimehq/chime/shard"
)

// The recurring schedules of the in-memory Backend follow raftfsm's
// outcomes (Existing and Conflict by hash, versions, Pause and Resume
// states) and compute each schedule's next occurrence from its rule, with
// the backend's clock. An occurrence becomes an event only as it fires, in
// FireDue or FireUntil (fire.go): until then no event holds it, unlike in the state
// machine, whose pending occurrence is an event Get and List show.

type schedule struct {
	s    raftfsm.Schedule
	hash uint64
	// run counts the missed occurrences fired in a row (catch-up ALL).
	run uint32
}

// Recurring implements rpc.Backend.
func (b *Backend) Recurring(ctx context.Context, rc raftfsm.Recurring, scope shard.Scope) (*raftfsm.RecurringResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Recurring", ID: rc.ID, Recurring: rc})
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if b.schedules == nil {
		b.schedules = make(map[string]*schedule)
	}
	now := b.now()
	cur, found := b.schedules[rc.ID]
	answer := func(o raftfsm.RecurringOutcome) (*raftfsm.RecurringResult, error) {
		res := &raftfsm.RecurringResult{Outcome: o}
		if cur != nil {
			res.Schedule = cur.s
		}
		return res, nil
	}
	switch {
	case !found && rc.Op == raftfsm.RecurringCreate:
	case !found:
		return answer(raftfsm.RecurringNotFound)
	case rc.Op != raftfsm.RecurringCreate && scope != nil && !scope.Permits(rc.ID, cur.s.Definition.Topic):
		return nil, shard.Refuse(scope, rc.ID)
	case rc.Op == raftfsm.RecurringCreate && cur.hash == rc.Hash:
		return answer(raftfsm.RecurringExisting)
	case rc.Op == raftfsm.RecurringCreate:
		return answer(raftfsm.RecurringConflict)
	case rc.IfVersion != 0 && rc.IfVersion != cur.s.Version && (rc.Op == raftfsm.RecurringUpdate || rc.Op == raftfsm.RecurringDelete):
		return answer(raftfsm.RecurringVersionMismatch)
	case rc.Op == raftfsm.RecurringPause && cur.s.State == raftfsm.SchedulePaused:
		return answer(raftfsm.RecurringPaused)
	case rc.Op == raftfsm.RecurringResume && cur.s.State != raftfsm.SchedulePaused:
		return answer(raftfsm.RecurringNotPaused)
	}
	switch rc.Op {
	case raftfsm.RecurringCreate, raftfsm.RecurringUpdate:
		if rc.Def.Every != 0 && rc.Def.Start == 0 {
			rc.Def.Start = now.Truncate(time.Millisecond).UnixNano()
		}
		if cur == nil {
			cur = &schedule{s: raftfsm.Schedule{ID: rc.ID, CreatedAt: now.UnixNano()}}
			b.schedules[rc.ID] = cur
		}
		cur.hash = rc.Hash
		cur.s.Definition = rc.Def
		cur.s.Version++
		cur.s.UpdatedAt = now.UnixNano()
		if cur.s.State != raftfsm.SchedulePaused {
			cur.s.State = raftfsm.ScheduleActive
			next(&cur.s, now)
		}
		if rc.Op == raftfsm.RecurringCreate {
			return answer(raftfsm.RecurringCreated)
		}
		return answer(raftfsm.RecurringUpdated)
	case raftfsm.RecurringDelete:
		delete(b.schedules, rc.ID)
		cur = nil
		return answer(raftfsm.RecurringDeleted)
	case raftfsm.RecurringPause:
		cur.s.State, cur.s.PausedAt = raftfsm.SchedulePaused, now.UnixNano()
		cur.s.Next, cur.s.NextDue, cur.s.NextSeq = 0, 0, 0
		return answer(raftfsm.RecurringPaused)
	default:
		cur.s.State, cur.s.PausedAt = raftfsm.ScheduleActive, 0
		next(&cur.s, now)
		return answer(raftfsm.RecurringResumed)
	}
}

// next sets s's pending occurrence to its rule's first after now, or
// completes it.
func next(s *raftfsm.Schedule, now time.Time) {
	s.Next, s.NextDue, s.NextSeq = 0, 0, 0
	r, err := recurrence.Parse(s.Definition.Spec())
	if err != nil {
		s.State = raftfsm.ScheduleCompleted
		return
	}
	at, ok := r.Next(now)
	if !ok {
		s.State = raftfsm.ScheduleCompleted
		return
	}
	s.Next, s.NextDue, s.NextSeq = at.UnixNano(), at.Add(r.Jitter(s.ID, at)).UnixNano(), 1
}

// GetSchedule implements rpc.Backend.
func (b *Backend) GetSchedule(ctx context.Context, id string, _ bool) (raftfsm.Schedule, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "GetSchedule", ID: id})
	if err := b.check(ctx); err != nil {
		return raftfsm.Schedule{}, false, err
	}
	cur, ok := b.schedules[id]
	if !ok {
		return raftfsm.Schedule{}, false, nil
	}
	return cur.s, true, nil
}

// ListSchedules implements rpc.Backend.
func (b *Backend) ListSchedules(ctx context.Context, prefix, after string, limit int, _ bool) ([]raftfsm.Schedule, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "ListSchedules", ID: prefix})
	if err := b.check(ctx); err != nil {
		return nil, false, err
	}
	var out []raftfsm.Schedule
	for id, cur := range b.schedules {
		if strings.HasPrefix(id, prefix) && id > after {
			out = append(out, cur.s)
		}
	}
	slices.SortFunc(out, func(x, y raftfsm.Schedule) int { return strings.Compare(x.ID, y.ID) })
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}
