package rpctest

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/raftfsm/recurrence"
)

// Firing on demand. A test fires what is due by a time of its choosing:
// FireDue fires it all at that time, as a scheduler that was held up until
// then would (late, and recurring schedules catching up), and FireUntil
// fires each at its own due time, as a scheduler that is never late would
// (chimetest's Fake steps its virtual clock with it). Both fire every
// pending event and every active recurring schedule's occurrence due by
// then, in order of due time, then id. An occurrence is created as it fires
// (no event holds it before, unlike in raftfsm), with the id, headers and
// version raftfsm gives it, and its schedule moves on to the next
// occurrence by the state machine's rules: MaxOccurrences, End, and the
// catch-up policy for occurrences already due when one fires.

// FireDue fires everything due at or before now, at now, and returns the
// records fired in the order they fired (due time, then id). A pending
// event moves to Fired with one attempt, as a MarkFired would; each active
// recurring schedule fires every occurrence due by now that its catch-up
// policy produces, each a Fired event carrying the chime-recurring-id and
// chime-occurrence-unix-ms headers after the schedule's own. The records
// returned are copies.
func (b *Backend) FireDue(now time.Time) []raftfsm.Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	at := now.UnixNano()
	return b.fire(at, func(int64) int64 { return at })
}

// FireUntil is FireDue as a scheduler that is never late fires: each event
// and occurrence due by until fires at its own due time, or at the
// backend's clock's now when that is later (it was due already), so a
// recurring schedule produces each of its occurrences in turn, none missed.
// It does not move the clock: the caller sets it to until.
func (b *Backend) FireUntil(until time.Time) []raftfsm.Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	from := b.now().UnixNano()
	return b.fire(until.UnixNano(), func(due int64) int64 { return max(due, from) })
}

// fire fires what is due by until, each at firedAt(its due time), in order
// of due time, then id. Called with b.mu held.
func (b *Backend) fire(until int64, firedAt func(due int64) int64) []raftfsm.Record {
	var due []*raftfsm.Record
	for _, rec := range b.events {
		if rec.State == raftfsm.StateScheduled && rec.Due <= until {
			due = append(due, rec)
		}
	}
	slices.SortFunc(due, byDueThenID)
	var out []raftfsm.Record
	for {
		// The next to fire: the earliest pending event left, or an earlier
		// occurrence (a schedule's next occurrence may be due by until too).
		var rec *raftfsm.Record
		if s := b.dueSchedule(until); s != nil && (len(due) == 0 || compareDue(s.s.NextDue, s.occurrenceID(), due[0].Due, due[0].ID) < 0) {
			rec = s.occurrence()
			rec.Seq, rec.CreatedAt = b.nextSeq, firedAt(rec.Due)
			b.nextSeq++
			if old, ok := b.events[rec.ID]; ok {
				// An event a client made with the occurrence's id: the
				// occurrence takes its place, as a Replace would in raftfsm.
				rec.Version = old.Version + 1
				due = slices.DeleteFunc(due, func(r *raftfsm.Record) bool { return r == old })
			}
			b.events[rec.ID] = rec
			s.advance(time.Unix(0, rec.CreatedAt))
		} else if len(due) > 0 {
			rec, due = due[0], due[1:]
		} else {
			return out
		}
		rec.State, rec.FiredAt, rec.Attempts = raftfsm.StateFired, firedAt(rec.Due), 1
		out = append(out, clone(rec))
	}
}

// dueSchedule returns the active schedule whose next occurrence is the
// earliest due at or before at (by due time, then the occurrence's id), or
// nil. Called with b.mu held.
func (b *Backend) dueSchedule(at int64) *schedule {
	var first *schedule
	for _, s := range b.schedules {
		if s.s.State != raftfsm.ScheduleActive || s.s.NextSeq == 0 || s.s.NextDue > at {
			continue
		}
		if first == nil || compareDue(s.s.NextDue, s.occurrenceID(), first.s.NextDue, first.occurrenceID()) < 0 {
			first = s
		}
	}
	return first
}

func byDueThenID(x, y *raftfsm.Record) int { return compareDue(x.Due, x.ID, y.Due, y.ID) }

func compareDue(xDue int64, xID string, yDue int64, yID string) int {
	return cmp.Or(cmp.Compare(xDue, yDue), strings.Compare(xID, yID))
}

// occurrenceID is the event id of s's pending occurrence.
func (s *schedule) occurrenceID() string { return raftfsm.OccurrenceID(s.s.ID, time.Unix(0, s.s.Next)) }

// occurrence is the event of s's pending occurrence, as raftfsm's
// materialise makes it, pending.
func (s *schedule) occurrence() *raftfsm.Record {
	return s.occurrenceAt(time.Unix(0, s.s.Next), s.s.NextDue)
}

// occurrenceAt is the event of s's occurrence at nominal instant next, due
// at due, pending.
func (s *schedule) occurrenceAt(next time.Time, due int64) *raftfsm.Record {
	d := &s.s.Definition
	ms := strconv.FormatInt(next.UnixMilli(), 10)
	rec := &raftfsm.Record{
		ID:      raftfsm.OccurrenceID(s.s.ID, next),
		State:   raftfsm.StateScheduled,
		Due:     due,
		Topic:   d.Topic,
		Key:     slices.Clone(d.Key),
		Payload: slices.Clone(d.Payload),
		Version: 1,
	}
	rec.Priority = d.Priority
	for _, h := range d.Headers {
		rec.Headers = append(rec.Headers, raftfsm.Header{Key: h.Key, Value: slices.Clone(h.Value)})
	}
	rec.Headers = append(rec.Headers,
		raftfsm.Header{Key: raftfsm.HeaderRecurringID, Value: []byte(s.s.ID)},
		raftfsm.Header{Key: raftfsm.HeaderOccurrenceUnix, Value: []byte(ms)})
	rec.ContentHash = raftfsm.ContentHash(rec.Topic, rec.Key, rec.Payload, rec.Headers, rec.Due, 0, true, false, rec.Policy, rec.Output)
	return rec
}

// advance moves s past its pending occurrence, which settled at now, to the
// next one, as raftfsm's occurred and materialise do: the next occurrence
// after the one that settled, unless that too is due by now, when the
// schedule's catch-up policy says which missed occurrence comes next.
func (s *schedule) advance(now time.Time) {
	sc, d := &s.s, &s.s.Definition
	after := time.Unix(0, sc.Next)
	sc.Occurrences++
	sc.Next, sc.NextDue, sc.NextSeq = 0, 0, 0
	complete := func() { sc.State, s.run = raftfsm.ScheduleCompleted, 0 }
	if d.MaxOccurrences != 0 && sc.Occurrences >= d.MaxOccurrences {
		complete()
		return
	}
	r, err := recurrence.Parse(d.Spec())
	if err != nil {
		complete()
		return
	}
	next, ok := r.Next(after)
	if ok && !next.After(now) {
		switch d.CatchUp {
		case raftfsm.CatchUpSkip:
			next, ok = r.Next(now)
			s.run = 0
		case raftfsm.CatchUpLast:
			if latest, lok := r.Latest(now); lok && latest.After(next) {
				next = latest
			}
			s.run = 0
		case raftfsm.CatchUpAll:
			if s.run >= d.MaxCatchUp {
				next, ok = r.Next(now)
				s.run = 0
			} else {
				s.run++
			}
		}
	} else {
		s.run = 0
	}
	if !ok {
		complete()
		return
	}
	sc.Next, sc.NextDue, sc.NextSeq = next.UnixNano(), next.Add(r.Jitter(sc.ID, next)).UnixNano(), 1
}
