package rpctest

import (
	"context"
	"slices"
	"strconv"
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
	case (rc.Op == raftfsm.RecurringTrigger || rc.Op == raftfsm.RecurringBackfill) && cur.s.State == raftfsm.ScheduleCompleted:
		return answer(raftfsm.RecurringCompletedState)
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
		cur.s.State, cur.s.PausedAt, cur.s.ResumesFrom = raftfsm.SchedulePaused, now.UnixNano(), cur.s.Next
		cur.s.Next, cur.s.NextDue, cur.s.NextSeq = 0, 0, 0
		return answer(raftfsm.RecurringPaused)
	case raftfsm.RecurringTrigger:
		res, _ := answer(raftfsm.RecurringTriggered)
		at := time.Unix(0, rc.At)
		if ok, due := b.occurrenceExists(cur, at); ok {
			res.Existing, res.Due = 1, due
			return res, nil
		}
		rec := b.addOccurrence(cur, at, max(rc.At, now.UnixNano()), now)
		res.Created, res.Due = []int64{at.UnixMilli() * int64(time.Millisecond)}, rec.Due
		return res, nil
	case raftfsm.RecurringBackfill:
		return b.backfill(cur, rc, now)
	default:
		cur.s.State, cur.s.PausedAt, cur.s.ResumesFrom = raftfsm.ScheduleActive, 0, 0
		next(&cur.s, now)
		return answer(raftfsm.RecurringResumed)
	}
}

// occurrenceExists reports whether schedule cur's occurrence at at has an
// event, or is cur's pending occurrence (which has none here until it
// fires), and its due time. Called with b.mu held.
func (b *Backend) occurrenceExists(cur *schedule, at time.Time) (bool, int64) {
	id := raftfsm.OccurrenceID(cur.s.ID, at)
	if rec, ok := b.events[id]; ok {
		return true, rec.Due
	}
	if cur.s.NextSeq != 0 && cur.occurrenceID() == id {
		return true, cur.s.NextDue
	}
	return false, 0
}

// addOccurrence stores schedule cur's occurrence at at, due at due, as a
// pending event outside its sequence, as raftfsm's trigger and backfill
// make it. Called with b.mu held.
func (b *Backend) addOccurrence(cur *schedule, at time.Time, due int64, now time.Time) *raftfsm.Record {
	rec := cur.occurrenceAt(at, due)
	rec.Seq, rec.CreatedAt = b.nextSeq, now.UnixNano()
	b.nextSeq++
	b.events[rec.ID] = rec
	return rec
}

// backfill follows raftfsm's: the rule's nominal times in [From, To), at
// most Limit of them and none after the pending occurrence, each created
// unless its event exists and is not cancelled. LimitBytes is not weighed here. Called with b.mu
// held.
func (b *Backend) backfill(cur *schedule, rc raftfsm.Recurring, now time.Time) (*raftfsm.RecurringResult, error) {
	res := &raftfsm.RecurringResult{Outcome: raftfsm.RecurringBackfilled, Schedule: cur.s}
	r, err := recurrence.Parse(cur.s.Definition.Spec())
	if err != nil {
		res.Outcome, res.Error = raftfsm.RecurringInvalid, err.Error()
		return res, nil
	}
	var times []time.Time
	to := time.Unix(0, rc.To)
	for t, ok := r.Next(time.Unix(0, rc.From-1)); ok && t.Before(to); t, ok = r.Next(t) {
		switch {
		case len(times) == int(rc.Limit):
			res.Outcome, res.Error = raftfsm.RecurringTooMany, "the range holds more than "+strconv.Itoa(int(rc.Limit))+" occurrences of the rule"
			return res, nil
		case cur.s.State == raftfsm.ScheduleActive && cur.s.NextSeq != 0 && t.UnixNano() > cur.s.Next:
			res.Outcome, res.Error = raftfsm.RecurringBeyondPending, "the range holds "+t.UTC().Format(time.RFC3339Nano)+", after the pending occurrence"
			return res, nil
		}
		times = append(times, t)
	}
	for _, t := range times {
		if rec, ok := b.events[raftfsm.OccurrenceID(cur.s.ID, t)]; ok && rec.State == raftfsm.StateCancelled {
			// Made anew, as raftfsm's backfill renews a cancelled occurrence.
			delete(b.events, rec.ID)
		}
		if ok, _ := b.occurrenceExists(cur, t); ok {
			res.Existing++
			continue
		}
		b.addOccurrence(cur, t, max(t.UnixNano(), now.UnixNano()), now)
		res.Created = append(res.Created, t.UnixNano())
	}
	return res, nil
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
