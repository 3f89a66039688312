package raftfsm

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"
)

// recurringHarness applies entries to one FSM, with helpers that read a schedule's state.
type recurringHarness struct {
	t     *testing.T
	f     *FSM
	obs   *pendingObserver
	index uint64
}

func newRecurringHarness(t *testing.T) *recurringHarness {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	t.Cleanup(func() { st.Close() })
	f, obs := newTestFSM(t, st, 2)
	t.Cleanup(f.Close)
	return &recurringHarness{t: t, f: f, obs: obs}
}

func (h *recurringHarness) apply(c Command) interface{} {
	h.t.Helper()
	h.index++
	return h.f.Apply(cmdLog(h.index, c))
}

func (h *recurringHarness) rec(c *Recurring) *RecurringResult {
	h.t.Helper()
	return h.apply(c).(*RecurringResult)
}

// get returns schedule id, failing the test if there is none.
func (h *recurringHarness) get(id string) Schedule {
	h.t.Helper()
	s, ok, err := h.f.GetSchedule(id)
	if err != nil || !ok {
		h.t.Fatalf("GetSchedule(%q): %v, %v", id, ok, err)
	}
	return s
}

// fire marks schedule id's pending occurrence fired at at, and returns the occurrence's
// nominal instant.
func (h *recurringHarness) fire(id string, at time.Time) time.Time {
	h.t.Helper()
	s := h.get(id)
	if s.NextSeq == 0 {
		h.t.Fatalf("schedule %q has no pending occurrence to fire", id)
	}
	ev := h.event(OccurrenceID(id, time.Unix(0, s.Next)))
	res := h.apply(&MarkFired{ProposedAt: at.UnixNano(), DueKnown: true, Entries: []Fired{{Seq: s.NextSeq, FiredAt: at.UnixNano(), Attempts: 1, Due: ev.Due}}})
	if o := res.(*MarkBatchResult).Outcomes[0]; o != Marked {
		h.t.Fatalf("fire %q's occurrence %d: %v", id, s.NextSeq, o)
	}
	return time.Unix(0, s.Next).UTC()
}

func (h *recurringHarness) event(id string) Record {
	h.t.Helper()
	r, ok, err := h.f.Get(id)
	if err != nil || !ok {
		h.t.Fatalf("Get(%q): %v, %v", id, ok, err)
	}
	return r
}

// next returns the nominal instant of schedule id's pending occurrence.
func (h *recurringHarness) next(id string) time.Time {
	h.t.Helper()
	s := h.get(id)
	if s.NextSeq == 0 {
		h.t.Fatalf("schedule %q (%v) has no pending occurrence", id, s.State)
	}
	return time.Unix(0, s.Next).UTC()
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func sec(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func everySecond(catchUp CatchUp) Definition {
	return Definition{Cron: "* * * * * *", CatchUp: catchUp, MaxCatchUp: 2, Topic: "t", Payload: []byte("p"),
		Headers: []Header{{Key: "h", Value: []byte("v")}}, Priority: 7}
}

// TestRecurringWalk walks a schedule's life once, readably: each settled occurrence makes the
// next in the same apply; a late fire catches up by the rule; Pause cancels the pending
// occurrence and Resume catches up; Update moves to the new rule; an occurrence cancelled,
// or updated, by its own id keeps the chain; Delete ends it and leaves the occurrences.
func TestRecurringWalk(t *testing.T) {
	h := newRecurringHarness(t)
	create := &Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "r", Hash: 1, Def: everySecond(CatchUpLast)}
	res := h.rec(create)
	if res.Outcome != RecurringCreated || res.Schedule.Version != 1 || res.Schedule.State != ScheduleActive {
		t.Fatalf("Create: %+v", res)
	}
	if got := h.next("r"); !got.Equal(sec(1)) {
		t.Fatalf("first occurrence %v, want %v", got, sec(1))
	}
	ms := strconv.FormatInt(sec(1).UnixMilli(), 10)
	ev := h.event("r@" + ms)
	wantHeaders := []Header{{Key: "h", Value: []byte("v")}, {Key: HeaderRecurringID, Value: []byte("r")}, {Key: HeaderOccurrenceUnix, Value: []byte(ms)}}
	if ev.State != StateScheduled || ev.Due != sec(1).UnixNano() || ev.Topic != "t" || string(ev.Payload) != "p" || !reflect.DeepEqual(ev.Headers, wantHeaders) || ev.Policy != (Policy{Priority: 7}) {
		t.Fatalf("the occurrence's event: %+v", ev)
	}
	if h.obs.pending[ev.Seq] != ev.Due || h.obs.policy[ev.Seq] != ev.Policy {
		t.Fatalf("the observer was not told of the occurrence: %v", h.obs.pending)
	}

	// Re-sent, the Create is recognised; with other content it is refused.
	if res := h.rec(create); res.Outcome != RecurringExisting {
		t.Fatalf("re-sent Create: %v", res.Outcome)
	}
	other := *create
	other.Hash = 2
	if res := h.rec(&other); res.Outcome != RecurringConflict {
		t.Fatalf("Create with other content: %v", res.Outcome)
	}

	// Fired on time: the next is the next second.
	h.fire("r", sec(1.01))
	if got := h.next("r"); !got.Equal(sec(2)) {
		t.Fatalf("after a fire at 1.01: next %v, want %v", got, sec(2))
	}
	// Fired 3.3 s late: the latest missed occurrence (5), not 3 and 4.
	h.fire("r", sec(5.3))
	if got := h.next("r"); !got.Equal(sec(5)) {
		t.Fatalf("after a late fire: next %v, want the latest missed %v", got, sec(5))
	}
	h.fire("r", sec(5.4))
	if s := h.get("r"); s.Occurrences != 3 || !time.Unix(0, s.Next).Equal(sec(6)) {
		t.Fatalf("after three fires: %+v", s)
	}

	// Pause cancels the pending occurrence; a Pause again changes nothing.
	pendingSeq := h.get("r").NextSeq
	if res := h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(5.5).UnixNano(), ID: "r", CheckPending: true, Pending: pendingSeq + 1}); res.Outcome != RecurringMoved {
		t.Fatalf("Pause naming another occurrence: %v", res.Outcome)
	}
	if res := h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(5.5).UnixNano(), ID: "r", CheckPending: true, Pending: pendingSeq}); res.Outcome != RecurringPaused || res.Schedule.State != SchedulePaused || res.Schedule.NextSeq != 0 {
		t.Fatalf("Pause: %+v", res)
	}
	if ev := h.event(OccurrenceID("r", sec(6))); ev.State != StateCancelled || ev.CancelledAt != sec(5.5).UnixNano() {
		t.Fatalf("the paused schedule's occurrence: %+v", ev)
	}
	if res := h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(5.6).UnixNano(), ID: "r"}); res.Outcome != RecurringPaused || res.Schedule.PausedAt != sec(5.5).UnixNano() {
		t.Fatalf("Pause again: %+v", res)
	}
	// Resumed at 9.2: 6 to 9 were missed; the latest of them, 9, happens.
	if res := h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(9.2).UnixNano(), ID: "r"}); res.Outcome != RecurringResumed {
		t.Fatalf("Resume: %v", res.Outcome)
	}
	if got := h.next("r"); !got.Equal(sec(9)) {
		t.Fatalf("after Resume: next %v, want %v", got, sec(9))
	}
	if res := h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(9.2).UnixNano(), ID: "r"}); res.Outcome != RecurringNotPaused {
		t.Fatalf("Resume of an active schedule: %v", res.Outcome)
	}

	// Update: the pending occurrence goes, the new rule applies from the update on.
	upd := &Recurring{Op: RecurringUpdate, ProposedAt: sec(9.3).UnixNano(), ID: "r", IfVersion: 2, Hash: 3, Def: everySecond(CatchUpLast)}
	upd.Def.Cron = "*/10 * * * * *"
	if res := h.rec(upd); res.Outcome != RecurringVersionMismatch {
		t.Fatalf("Update at the wrong version: %v", res.Outcome)
	}
	upd.IfVersion = 1
	if res := h.rec(upd); res.Outcome != RecurringUpdated || res.Schedule.Version != 2 {
		t.Fatalf("Update: %+v", res)
	}
	if ev := h.event(OccurrenceID("r", sec(9))); ev.State != StateCancelled {
		t.Fatalf("the occurrence the update replaced: %v", ev.State)
	}
	if got := h.next("r"); !got.Equal(sec(10)) {
		t.Fatalf("after Update: next %v, want %v", got, sec(10))
	}

	// IfHash names the definition a permission check saw: against another, nothing changes.
	for _, op := range []RecurringOp{RecurringUpdate, RecurringDelete, RecurringPause, RecurringResume} {
		c := &Recurring{Op: op, ProposedAt: sec(9.4).UnixNano(), ID: "r", IfHash: 1}
		if op == RecurringUpdate {
			c.Hash, c.Def = 4, everySecond(CatchUpLast)
		}
		if res := h.rec(c); res.Outcome != RecurringVersionMismatch || res.Schedule.Hash != 3 || res.Schedule.Version != 2 || res.Schedule.State != ScheduleActive {
			t.Fatalf("%v with IfHash of another definition: %+v", op, res)
		}
	}
	if got := h.next("r"); !got.Equal(sec(10)) {
		t.Fatalf("after refused changes: next %v, want %v", got, sec(10))
	}

	// A client cancels one occurrence by its id: the schedule goes on.
	if res := h.apply(&Cancel{ProposedAt: sec(9.5).UnixNano(), IDs: []string{OccurrenceID("r", sec(10))}}).(*CancelBatchResult); res.Results[0].Outcome != Cancelled {
		t.Fatalf("Cancel of an occurrence: %+v", res)
	}
	if got := h.next("r"); !got.Equal(sec(20)) {
		t.Fatalf("after a cancel of one occurrence: next %v, want %v", got, sec(20))
	}
	// A client moves one occurrence by its id: the schedule follows its new version.
	occ := OccurrenceID("r", sec(20))
	if res := h.apply(&Update{ProposedAt: sec(9.6).UnixNano(), Changes: []Change{{ID: occ, Fields: ChangeDue, Due: sec(21).UnixNano()}}}).(*UpdateResult); res.Results[0].Outcome != Updated {
		t.Fatalf("Update of an occurrence: %+v", res)
	}
	if s := h.get("r"); s.NextSeq != h.event(occ).Seq || s.NextDue != sec(21).UnixNano() {
		t.Fatalf("the schedule names seq %d due %d, the moved occurrence is %d due %d", s.NextSeq, s.NextDue, h.event(occ).Seq, sec(21).UnixNano())
	}
	h.fire("r", sec(21))
	if got := h.next("r"); !got.Equal(sec(30)) {
		t.Fatalf("after the moved occurrence fired: next %v, want %v", got, sec(30))
	}

	// Delete: the pending occurrence is cancelled, the schedule gone, the past occurrences
	// still readable.
	if res := h.rec(&Recurring{Op: RecurringDelete, ProposedAt: sec(25).UnixNano(), ID: "r"}); res.Outcome != RecurringDeleted {
		t.Fatalf("Delete: %v", res.Outcome)
	}
	if _, ok, _ := h.f.GetSchedule("r"); ok {
		t.Fatal("the schedule is still there after Delete")
	}
	if ev := h.event(OccurrenceID("r", sec(30))); ev.State != StateCancelled {
		t.Fatalf("the deleted schedule's occurrence: %v", ev.State)
	}
	if ev := h.event(OccurrenceID("r", sec(5))); ev.State != StateFired {
		t.Fatalf("a fired occurrence after Delete: %v", ev.State)
	}
	for _, op := range []RecurringOp{RecurringUpdate, RecurringDelete, RecurringPause, RecurringResume} {
		if res := h.rec(&Recurring{Op: op, ProposedAt: sec(26).UnixNano(), ID: "r", Def: everySecond(CatchUpLast)}); res.Outcome != RecurringNotFound {
			t.Fatalf("%v of a deleted schedule: %v", op, res.Outcome)
		}
	}
	if len(h.obs.pending) != 0 {
		t.Fatalf("events still pending after Delete: %v", h.obs.pending)
	}
}

// TestRecurringCatchUp checks each catch-up mode after a fire 3.5 s late, and after a pause.
func TestRecurringCatchUp(t *testing.T) {
	for _, c := range []struct {
		mode      CatchUp
		afterLate []float64 // the next occurrences, each fired at 4.5 + 0.1 per step
		resumed   float64   // the first occurrence after a pause from 10.5 to 14.2, with 10 pending
	}{
		{CatchUpSkip, []float64{5, 6}, 15},
		{CatchUpLast, []float64{4, 5}, 14},
		// MaxCatchUp 2: two missed occurrences in a row, then the future; after the pause,
		// the first missed, 10, which the pause cancelled.
		{CatchUpAll, []float64{2, 3, 5}, 10},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			h := newRecurringHarness(t)
			h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "r", Hash: 1, Def: everySecond(c.mode)})
			at := 4.5
			for _, want := range c.afterLate {
				h.fire("r", sec(at))
				at += 0.1
				if got := h.next("r"); !got.Equal(sec(want)) {
					t.Fatalf("fired at %.1f: next %v, want %v", at-0.1, got, sec(want))
				}
			}
			for h.next("r").Before(sec(10)) {
				h.fire("r", h.next("r"))
			}
			h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(10.5).UnixNano(), ID: "r"})
			h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(14.2).UnixNano(), ID: "r"})
			if got := h.next("r"); !got.Equal(sec(c.resumed)) {
				t.Fatalf("resumed at 14.2: next %v, want %v", got, sec(c.resumed))
			}
		})
	}
}

// TestRecurringPauseResumeKeepsTheCatchUpRun: pausing and resuming part way through a
// catch-up does not start the run again, so a schedule replays at most MaxCatchUp of one
// stretch of missed occurrences however often it is paused.
func TestRecurringPauseResumeKeepsTheCatchUpRun(t *testing.T) {
	h := newRecurringHarness(t)
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "r", Hash: 1, Def: everySecond(CatchUpAll)})
	h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(0.6).UnixNano(), ID: "r"})
	h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(20.2).UnixNano(), ID: "r"})
	// MaxCatchUp 2: 1 and 2 of the twenty missed, then the future, however the resumes fall.
	var replayed []time.Time
	at := 20.3
	for h.next("r").Before(sec(20)) {
		replayed = append(replayed, h.next("r"))
		h.fire("r", sec(at))
		h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(at + 0.01).UnixNano(), ID: "r"})
		h.rec(&Recurring{Op: RecurringResume, ProposedAt: sec(at + 0.02).UnixNano(), ID: "r"})
		at += 0.1
		if len(replayed) > 2 {
			t.Fatalf("replayed %v: more than MaxCatchUp 2 of one stretch of missed occurrences", replayed)
		}
	}
	if got := h.next("r"); !got.Equal(sec(21)) {
		t.Fatalf("after the catch-up: next %v, want %v", got, sec(21))
	}
}

// TestRecurringCompletes checks that a schedule stops at MaxOccurrences and at End, and that
// an Update can give it occurrences again.
func TestRecurringCompletes(t *testing.T) {
	h := newRecurringHarness(t)
	def := everySecond(CatchUpLast)
	def.MaxOccurrences = 2
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "max", Hash: 1, Def: def})
	h.fire("max", sec(1))
	h.fire("max", sec(2))
	if s := h.get("max"); s.State != ScheduleCompleted || s.NextSeq != 0 || s.Occurrences != 2 {
		t.Fatalf("after MaxOccurrences: %+v", s)
	}
	def = everySecond(CatchUpLast)
	def.End = sec(3).UnixNano()
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(1.5).UnixNano(), ID: "end", Hash: 1, Def: def})
	h.fire("end", sec(2))
	h.fire("end", sec(3))
	if s := h.get("end"); s.State != ScheduleCompleted || s.NextSeq != 0 {
		t.Fatalf("after End: %+v", s)
	}
	def.End = sec(10).UnixNano()
	if res := h.rec(&Recurring{Op: RecurringUpdate, ProposedAt: sec(3.5).UnixNano(), ID: "end", Hash: 2, Def: def}); res.Schedule.State != ScheduleActive {
		t.Fatalf("Update of a completed schedule: %+v", res.Schedule)
	}
	if got := h.next("end"); !got.Equal(sec(4)) {
		t.Fatalf("after the update: next %v, want %v", got, sec(4))
	}
	// An every rule without a start is anchored at its creation, to the millisecond.
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(7.0123456).UnixNano(), ID: "every", Hash: 1,
		Def: Definition{Every: int64(90 * time.Second), CatchUp: CatchUpLast, Topic: "t"}})
	if got, want := h.next("every"), sec(7.012).Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("every: first occurrence %v, want %v", got, want)
	}
	// A rule this build cannot parse changes nothing.
	bad := everySecond(CatchUpLast)
	bad.TimeZone = "Nowhere/Land"
	if res := h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(8).UnixNano(), ID: "bad", Hash: 1, Def: bad}); res.Outcome != RecurringInvalid || res.Error == "" {
		t.Fatalf("Create with an unknown zone: %+v", res)
	}
	if _, ok, _ := h.f.GetSchedule("bad"); ok {
		t.Fatal("an invalid Create stored a schedule")
	}
}

// TestRecurringAcrossRestartAndSnapshot checks that the chain continues on a replica that
// reopened its FSM and on one restored from a snapshot, and that both hold byte-identical key
// spaces to a replica that applied the same entries.
func TestRecurringAcrossRestartAndSnapshot(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir, StoreOptions{})
	f, _ := newTestFSM(t, st, 2)
	h := &recurringHarness{t: t, f: f}
	var log []*Recurring
	for i, id := range []string{"a", "b", "c"} {
		c := &Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: id, Hash: uint64(i), Def: everySecond(CatchUpAll)}
		log = append(log, c)
		h.rec(c)
	}
	h.fire("a", sec(1))
	h.rec(&Recurring{Op: RecurringPause, ProposedAt: sec(1.5).UnixNano(), ID: "c"})
	snap := snapshotBytes(t, f)
	f.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openTestStore(t, dir, StoreOptions{})
	defer st.Close()
	f, _ = newTestFSM(t, st, 2)
	defer f.Close()
	h.f = f
	h.fire("a", sec(2))
	h.fire("b", sec(2))
	if got := h.next("a"); !got.Equal(sec(3)) {
		t.Fatalf("after a restart: next %v, want %v", got, sec(3))
	}

	st2 := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st2.Close()
	f2, _ := newTestFSM(t, st2, 2)
	defer f2.Close()
	if err := restore(f2, snap); err != nil {
		t.Fatal(err)
	}
	h2 := &recurringHarness{t: t, f: f2, index: f2.AppliedIndex()}
	h2.fire("a", sec(2))
	h2.fire("b", sec(2))
	sameKeySpace(t, "restored, then the same entries", dumpShard(t, st, 2), dumpShard(t, st2, 2))
	_ = log
}

// TestRestoreRefusesBrokenSchedules plants in a good stream a schedule with no definition,
// a definition with no cursor, a cursor naming an event that is not pending, and two cursors
// naming one occurrence: Restore and VerifySnapshot refuse each, and take the good stream.
func TestRestoreRefusesBrokenSchedules(t *testing.T) {
	h := newRecurringHarness(t)
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "a", Hash: 1, Def: everySecond(CatchUpLast)})
	h.rec(&Recurring{Op: RecurringCreate, ProposedAt: sec(0.5).UnixNano(), ID: "b", Hash: 1, Def: everySecond(CatchUpLast)})
	h.fire("a", sec(1))
	good := snapshotBytes(t, h.f)
	header, frames := splitStream(t, good)
	find := func(tag byte, id string) int {
		for i, f := range frames {
			if f.key[0] == tag && string(f.key[1:]) == id {
				return i
			}
		}
		t.Fatalf("no frame %c%s", tag, id)
		return -1
	}
	without := func(i int) []frame { return append(slices.Clone(frames[:i]), frames[i+1:]...) }
	with := func(i int, f frame) []frame { fs := slices.Clone(frames); fs[i] = f; return fs }
	curB := find(tagCursor, "b")
	c, err := decodeCursor(frames[curB].val)
	if err != nil {
		t.Fatal(err)
	}
	firedSeq := h.event(OccurrenceID("a", sec(1))).Seq
	notPending, samePending := c, c
	notPending.pendingSeq = firedSeq
	samePending.pendingSeq = h.get("a").NextSeq

	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 2)
	defer f.Close()
	for _, tc := range []struct {
		name   string
		frames []frame
	}{
		{"a cursor without its definition", without(find(tagDefinition, "b"))},
		{"a definition without its cursor", without(curB)},
		{"a cursor naming a fired event", with(curB, frame{frames[curB].key, notPending.append(nil)})},
		{"two cursors naming one occurrence", with(curB, frame{frames[curB].key, samePending.append(nil)})},
		{"a cursor that does not decode", with(curB, frame{frames[curB].key, []byte{formatV1, 9}})},
		{"a definition that does not decode", with(find(tagDefinition, "a"), frame{frames[find(tagDefinition, "a")].key, []byte{formatV1}})},
	} {
		data := joinStream(t, header, tc.frames)
		if _, err := VerifySnapshot(bytes.NewReader(data), 2); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: VerifySnapshot says %v, want ErrBadSnapshot", tc.name, err)
		}
		if err := restore(f, data); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: Restore says %v, want ErrBadSnapshot", tc.name, err)
		}
	}
	if err := restore(f, joinStream(t, header, frames)); err != nil {
		t.Fatalf("the good stream, split and joined: %v", err)
	}
}
