package raftfsm

import (
	"reflect"
	"strconv"
	"testing"
	"time"
)

// fireEvent marks event id fired at at.
func (h *recurringHarness) fireEvent(id string, at time.Time) {
	h.t.Helper()
	ev := h.event(id)
	res := h.apply(&MarkFired{ProposedAt: at.UnixNano(), DueKnown: true, Entries: []Fired{{Seq: ev.Seq, FiredAt: at.UnixNano(), Attempts: 1, Due: ev.Due}}})
	if o := res.(*MarkBatchResult).Outcomes[0]; o != Marked {
		h.t.Fatalf("fire %q (%d): %v", id, ev.Seq, o)
	}
}

// sameSchedule fails unless schedule id's state, version, pending occurrence and count are
// those of want.
func (h *recurringHarness) sameSchedule(what, id string, want Schedule) {
	h.t.Helper()
	got := h.get(id)
	if got.State != want.State || got.Version != want.Version || got.Next != want.Next || got.NextDue != want.NextDue ||
		got.NextSeq != want.NextSeq || got.Occurrences != want.Occurrences {
		h.t.Fatalf("%s moved schedule %q:\n got %+v\nwant %+v", what, id, got, want)
	}
}

// TestRecurringTrigger: a triggered occurrence is an ordinary event with the occurrence's id
// and headers, due at its time or the entry's, whichever is later; a retry with the same
// time finds it; its settling (fired, or cancelled by id) neither moves the schedule nor
// counts; it works on a paused schedule and leaves it paused, and is refused for a
// completed or unknown one with nothing stored.
func TestRecurringTrigger(t *testing.T) {
	h := newRecurringHarness(t)
	def := everySecond(CatchUpLast)
	def.MaxOccurrences = 3
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "r", Hash: 1, Def: def})
	before := h.get("r")

	at := sec(0.7071)
	trig := &Recurring{Op: RecurringTrigger, ProposedAt: sec(0.72).UnixNano(), ID: "r", At: time.UnixMilli(at.UnixMilli()).UnixNano()}
	res := h.rec(trig)
	ms := strconv.FormatInt(at.UnixMilli(), 10)
	if res.Outcome != RecurringTriggered || res.Existing != 0 || !reflect.DeepEqual(res.Created, []int64{sec(0.707).UnixNano()}) || res.Due != sec(0.72).UnixNano() {
		t.Fatalf("Trigger: %+v", res)
	}
	ev := h.event("r@" + ms)
	wantHeaders := []Header{{Key: "h", Value: []byte("v")}, {Key: HeaderRecurringID, Value: []byte("r")}, {Key: HeaderOccurrenceUnix, Value: []byte(ms)}}
	if ev.State != StateScheduled || ev.Due != sec(0.72).UnixNano() || ev.Topic != "t" || string(ev.Payload) != "p" || !reflect.DeepEqual(ev.Headers, wantHeaders) || ev.Policy != (Policy{Priority: 7}) {
		t.Fatalf("the triggered event: %+v", ev)
	}
	h.sameSchedule("Trigger", "r", before)

	// A retry, later, with the same time: the same occurrence, nothing more.
	pending := h.f.Stats().Pending
	retry := *trig
	retry.ProposedAt = sec(0.9).UnixNano()
	if res := h.rec(&retry); res.Outcome != RecurringTriggered || res.Existing != 1 || res.Created != nil || res.Due != ev.Due {
		t.Fatalf("retried Trigger: %+v", res)
	}
	if got := h.f.Stats().Pending; got != pending {
		t.Fatalf("retried Trigger: %d pending, want %d", got, pending)
	}

	// Its settling moves nothing: not fired, not cancelled by id.
	h.fireEvent("r@"+ms, sec(0.73))
	h.sameSchedule("the triggered occurrence's fire", "r", before)
	res = h.rec(&Recurring{Op: RecurringTrigger, ProposedAt: sec(0.8).UnixNano(), ID: "r", At: sec(0.8).UnixNano()})
	if res.Outcome != RecurringTriggered || len(res.Created) != 1 {
		t.Fatalf("second Trigger: %+v", res)
	}
	second := OccurrenceID("r", sec(0.8))
	if c := h.apply(&Cancel{ProposedAt: sec(0.81).UnixNano(), IDs: []string{second}}).(*CancelBatchResult); c.Results[0].Outcome != Cancelled {
		t.Fatalf("Cancel of the triggered occurrence: %v", c.Results[0].Outcome)
	}
	h.sameSchedule("the triggered occurrence's cancel", "r", before)

	// The schedule's own sequence goes on, and triggered occurrences do not count towards
	// MaxOccurrences.
	if got := h.fire("r", sec(1)); !got.Equal(sec(1)) {
		t.Fatalf("fired %v, want the pending 1 s", got)
	}
	if s := h.get("r"); s.Occurrences != 1 || !h.next("r").Equal(sec(2)) {
		t.Fatalf("after the schedule's own fire: %+v", s)
	}

	// A time ahead of the entry's: due then, never before.
	if res := h.rec(&Recurring{Op: RecurringTrigger, ProposedAt: sec(1.1).UnixNano(), ID: "r", At: sec(1.5).UnixNano()}); res.Due != sec(1.5).UnixNano() {
		t.Fatalf("Trigger at 1.5 proposed at 1.1: due %v, want 1.5", time.Unix(0, res.Due).Sub(t0))
	}
	// The pending occurrence's own instant names it: existing, nothing made.
	pending = h.f.Stats().Pending
	if res := h.rec(&Recurring{Op: RecurringTrigger, ProposedAt: sec(1.2).UnixNano(), ID: "r", At: sec(2).UnixNano()}); res.Existing != 1 || res.Created != nil || res.Due != sec(2).UnixNano() {
		t.Fatalf("Trigger at the pending occurrence's instant: %+v", res)
	}
	if got := h.f.Stats().Pending; got != pending {
		t.Fatalf("Trigger at the pending instant: %d pending, want %d", got, pending)
	}

	// Paused: the trigger happens, and the schedule stays paused.
	h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(1.3).UnixNano(), ID: "r"})
	paused := h.get("r")
	if res := h.rec(&Recurring{Op: RecurringTrigger, ProposedAt: sec(1.4).UnixNano(), ID: "r", At: sec(1.4).UnixNano()}); res.Outcome != RecurringTriggered || len(res.Created) != 1 {
		t.Fatalf("Trigger of a paused schedule: %+v", res)
	}
	h.sameSchedule("Trigger of a paused schedule", "r", paused)
	h.fireEvent(OccurrenceID("r", sec(1.4)), sec(1.41))
	h.sameSchedule("the fire of a paused schedule's trigger", "r", paused)

	// Completed or unknown: refused, nothing stored.
	h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(1.45).UnixNano(), ID: "r"})
	h.fire("r", sec(2))
	h.fire("r", sec(3))
	if s := h.get("r"); s.State != ScheduleCompleted || s.Occurrences != 3 {
		t.Fatalf("after three of its own occurrences and four triggers: %+v, want completed at 3", s)
	}
	pending = h.f.Stats().Pending
	if res := h.rec(&Recurring{Op: RecurringTrigger, ProposedAt: sec(4).UnixNano(), ID: "r", At: sec(4).UnixNano()}); res.Outcome != RecurringCompletedState {
		t.Fatalf("Trigger of a completed schedule: %+v", res)
	}
	if res := h.rec(&Recurring{Op: RecurringTrigger, ProposedAt: sec(4).UnixNano(), ID: "nope", At: sec(4).UnixNano()}); res.Outcome != RecurringNotFound {
		t.Fatalf("Trigger of an unknown schedule: %+v", res)
	}
	if got := h.f.Stats().Pending; got != pending {
		t.Fatalf("refused Triggers: %d pending, want %d", got, pending)
	}
	if _, ok, _ := h.f.Get(OccurrenceID("r", sec(4))); ok {
		t.Fatal("a refused Trigger stored its occurrence")
	}
}

// TestRecurringBackfill: a backfill creates the rule's instants in [From, To) that have no
// event, due at the entry's time with the nominal instant in their header; a retry finds
// them; a fired one is existing, a cancelled one is made anew; it is refused with nothing
// stored past the pending occurrence, over its limits, or for a completed schedule; its
// occurrences settling moves nothing; and a paused schedule's Resume catches up only after
// its range.
func TestRecurringBackfill(t *testing.T) {
	h := newRecurringHarness(t)
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "r", Hash: 1, Def: everySecond(CatchUpSkip)})
	h.fire("r", sec(4.5)) // late: 2, 3 and 4 are skipped
	if got := h.next("r"); !got.Equal(sec(5)) {
		t.Fatalf("after a late fire: next %v, want 5 s", got)
	}
	before := h.get("r")
	backfill := func(at, from, to float64) *Recurring {
		return &Recurring{Op: RecurringBackfill, ProposedAt: sec(at).UnixNano(), ID: "r", From: sec(from).UnixNano(), To: sec(to).UnixNano(), Limit: 1000, LimitBytes: 1 << 20}
	}

	// Refused, nothing stored: past the pending occurrence (5; 6 is the schedule's to
	// make), over the count, over the bytes.
	pending := h.f.Stats().Pending
	for _, c := range []struct {
		cmd  *Recurring
		want RecurringOutcome
	}{
		{backfill(4.6, 0, 6.5), RecurringBeyondPending},
		{&Recurring{Op: RecurringBackfill, ProposedAt: sec(4.6).UnixNano(), ID: "r", From: 0, To: sec(4.6).UnixNano(), Limit: 3, LimitBytes: 1 << 20}, RecurringTooMany},
		{&Recurring{Op: RecurringBackfill, ProposedAt: sec(4.6).UnixNano(), ID: "r", From: 0, To: sec(4.6).UnixNano(), Limit: 1000, LimitBytes: 10}, RecurringTooMany},
	} {
		if res := h.rec(c.cmd); res.Outcome != c.want || res.Error == "" || res.Created != nil {
			t.Fatalf("Backfill [%v, %v) limit %d/%d B: %+v, want %v", time.Unix(0, c.cmd.From).Sub(t0), time.Unix(0, c.cmd.To).Sub(t0), c.cmd.Limit, c.cmd.LimitBytes, res, c.want)
		}
	}
	if got := h.f.Stats().Pending; got != pending {
		t.Fatalf("refused Backfills: %d pending, want %d", got, pending)
	}
	h.sameSchedule("refused Backfills", "r", before)

	// [0.5, 5): 1 fired already; 2, 3 and 4 are made, due now, named by their nominal instant.
	res := h.rec(backfill(4.6, 0.5, 5))
	if want := []int64{sec(2).UnixNano(), sec(3).UnixNano(), sec(4).UnixNano()}; res.Outcome != RecurringBackfilled || res.Existing != 1 || !reflect.DeepEqual(res.Created, want) {
		t.Fatalf("Backfill [0.5, 5): %+v", res)
	}
	for _, s := range []float64{2, 3, 4} {
		ms := strconv.FormatInt(sec(s).UnixMilli(), 10)
		ev := h.event("r@" + ms)
		if ev.State != StateScheduled || ev.Due != sec(4.6).UnixNano() || ev.Headers[2].Key != HeaderOccurrenceUnix || string(ev.Headers[2].Value) != ms {
			t.Fatalf("backfilled %v s: %+v", s, ev)
		}
	}
	h.sameSchedule("Backfill", "r", before)

	// Retried: all existing, nothing more.
	pending = h.f.Stats().Pending
	if res := h.rec(backfill(4.7, 0.5, 5)); res.Outcome != RecurringBackfilled || res.Existing != 4 || res.Created != nil {
		t.Fatalf("retried Backfill: %+v", res)
	}
	if got := h.f.Stats().Pending; got != pending {
		t.Fatalf("retried Backfill: %d pending, want %d", got, pending)
	}
	// A range ending at the pending occurrence's instant, inclusive, is allowed: it finds it.
	if res := h.rec(backfill(4.7, 4, 5.5)); res.Outcome != RecurringBackfilled || res.Existing != 2 {
		t.Fatalf("Backfill [4, 5.5) with 5 pending: %+v", res)
	}

	// Their settling moves nothing.
	for _, s := range []float64{2, 3, 4} {
		h.fireEvent(OccurrenceID("r", sec(s)), sec(4.8))
	}
	h.sameSchedule("the backfilled occurrences' fires", "r", before)
	if got := h.fire("r", sec(5)); !got.Equal(sec(5)) || h.get("r").Occurrences != 2 {
		t.Fatalf("the schedule's own next: %v, %+v", got, h.get("r"))
	}

	// Paused: what the pause cancelled is made anew, and Resume (catch-up all) goes on after
	// the range instead of replaying it.
	def := everySecond(CatchUpAll)
	def.MaxCatchUp = 100
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "p", Hash: 1, Def: def})
	h.fire("p", sec(1))
	// The pause answers, and a read says, where a Resume would start: the cancelled 2.
	if res := h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(1.5).UnixNano(), ID: "p"}); res.Schedule.ResumesFrom != sec(2).UnixNano() {
		t.Fatalf("Pause: resumes from %v, want 2 s", time.Unix(0, res.Schedule.ResumesFrom).Sub(t0))
	}
	if ev := h.event(OccurrenceID("p", sec(2))); ev.State != StateCancelled {
		t.Fatalf("the paused occurrence: %v", ev.State)
	}
	if s := h.get("p"); s.ResumesFrom != sec(2).UnixNano() {
		t.Fatalf("paused: read resumes from %v, want 2 s", time.Unix(0, s.ResumesFrom).Sub(t0))
	}
	res = h.rec(&Recurring{Op: RecurringBackfill, ProposedAt: sec(6.5).UnixNano(), ID: "p", From: sec(1.5).UnixNano(), To: sec(6).UnixNano(), Limit: 1000, LimitBytes: 1 << 20})
	if want := []int64{sec(2).UnixNano(), sec(3).UnixNano(), sec(4).UnixNano(), sec(5).UnixNano()}; res.Outcome != RecurringBackfilled || res.Existing != 0 || !reflect.DeepEqual(res.Created, want) {
		t.Fatalf("Backfill of the paused stretch: %+v", res)
	}
	if ev := h.event(OccurrenceID("p", sec(2))); ev.State != StateScheduled || ev.Version != 2 {
		t.Fatalf("the cancelled occurrence, backfilled: %v version %d, want pending version 2", ev.State, ev.Version)
	}
	if s := h.get("p"); s.State != SchedulePaused || s.NextSeq != 0 || s.Occurrences != 1 || s.ResumesFrom != sec(6).UnixNano() {
		t.Fatalf("Backfill of a paused schedule: %+v", s)
	}
	if res := h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(7.5).UnixNano(), ID: "p"}); res.Schedule.ResumesFrom != 0 {
		t.Fatalf("Resume: still resumes from %v", time.Unix(0, res.Schedule.ResumesFrom).Sub(t0))
	}
	if got := h.next("p"); !got.Equal(sec(6)) {
		t.Fatalf("resumed after a backfill of [1.5, 6): next %v, want 6 s (not 2 again)", got)
	}

	// Completed or unknown: refused.
	def = everySecond(CatchUpLast)
	def.MaxOccurrences = 1
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "done", Hash: 1, Def: def})
	h.fire("done", sec(1))
	if res := h.rec(&Recurring{Op: RecurringBackfill, ProposedAt: sec(9).UnixNano(), ID: "done", From: 0, To: sec(9).UnixNano(), Limit: 1000, LimitBytes: 1 << 20}); res.Outcome != RecurringCompletedState || res.Created != nil {
		t.Fatalf("Backfill of a completed schedule: %+v", res)
	}
	if res := h.rec(&Recurring{Op: RecurringBackfill, ProposedAt: sec(9).UnixNano(), ID: "nope", From: 0, To: sec(9).UnixNano(), Limit: 1000, LimitBytes: 1 << 20}); res.Outcome != RecurringNotFound {
		t.Fatalf("Backfill of an unknown schedule: %+v", res)
	}
}
