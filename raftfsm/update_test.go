package raftfsm

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
)

// TestUpdateMakesTheNextVersion walks Update and Replace once, readably: an update is the
// event's next version under a new seq, which the firing path's old seq no longer names; a
// condition on the version is checked; a settled event is not updated; Replace supersedes a
// pending event and renews a settled one.
func TestUpdateMakesTheNextVersion(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, obs := newTestFSM(t, st, 3)
	defer f.Close()
	var trace []string
	f.obs = tracingObserver{obs, &trace}
	g := newGen(1)
	i := uint64(0)
	apply := func(c Command) interface{} {
		t.Helper()
		i++
		return f.Apply(cmdLog(i, c))
	}
	a := g.event("a", 0)
	a.Due = 1000
	apply(&ScheduleBatch{ProposedAt: 10, Events: []NewEvent{a}})

	got := apply(&Update{ProposedAt: 20, Changes: []Change{
		{ID: "a", IfVersion: 1, Fields: ChangeDue | ChangePayload, Due: 500, Payload: []byte("new")},
		{ID: "a", IfVersion: 1, Fields: ChangeDue, Due: 7},
		{ID: "nope", Fields: ChangeDue, Due: 7},
	}})
	want := &UpdateResult{Results: []ChangeResult{
		{Outcome: Updated, State: StateScheduled, Seq: 2, Due: 500, Version: 2},
		{Outcome: VersionMismatch, State: StateScheduled, Seq: 2, Due: 500, Version: 2},
		{Outcome: UpdateNotFound},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Update: got %s, want %s", show(got), show(want))
	}
	rec, _, err := f.Get("a")
	if err != nil || rec.Seq != 2 || rec.Version != 2 || rec.Due != 500 || string(rec.Payload) != "new" ||
		!bytes.Equal(rec.Key, a.Key) || rec.Topic != a.Topic || rec.CreatedAt != 10 || rec.ContentHash != a.ContentHash {
		t.Fatalf("Get after the update: %+v, %v", rec, err)
	}
	// The firing path read seq 1 before the update; its mark finds nothing to settle.
	if got := apply(&MarkFired{ProposedAt: 30, DueKnown: true, Entries: []Fired{{Seq: 1, FiredAt: 30, Due: 1000}}}); !reflect.DeepEqual(got, &MarkBatchResult{Outcomes: []MarkOutcome{WasExpired}}) {
		t.Fatalf("mark of the superseded seq: %s", show(got))
	}
	if recs, err := f.ReadForFire([]Ref{{Seq: 1, Due: 1000}, {Seq: 2, Due: 500}}, nil); err != nil || len(recs) != 1 || recs[0].Seq != 2 || recs[0].Version != 2 {
		t.Fatalf("ReadForFire: %+v, %v", recs, err)
	}
	// A re-send of the Schedule that created it is still that event.
	if got := apply(&ScheduleBatch{ProposedAt: 40, Events: []NewEvent{a}}).(*ScheduleBatchResult); got.Results[0] != (ScheduleResult{Outcome: Existing, Seq: 2, Due: 500}) {
		t.Fatalf("re-send after the update: %+v", got.Results[0])
	}

	// Replace of the pending event: its version 3, content and creation time the request's.
	b := g.event("a", 1)
	b.Due, b.Replace = 900, true
	if got := apply(&ScheduleBatch{ProposedAt: 50, Events: []NewEvent{b}}).(*ScheduleBatchResult); got.Results[0] != (ScheduleResult{Outcome: Replaced, Seq: 3, Due: 900, Version: 3}) {
		t.Fatalf("Replace of a pending event: %+v", got.Results[0])
	}
	apply(&MarkFired{ProposedAt: 60, DueKnown: true, Entries: []Fired{{Seq: 3, FiredAt: 60, Due: 900}}})
	if got := apply(&Update{ProposedAt: 70, Changes: []Change{{ID: "a", Fields: ChangeDue, Due: 1}}}); !reflect.DeepEqual(got, &UpdateResult{Results: []ChangeResult{{Outcome: UpdateNotPending, State: StateFired, Seq: 3, Due: 900, Version: 3}}}) {
		t.Fatalf("Update of a fired event: %s", show(got))
	}
	// Replace of the fired event renews it.
	b.Due = 2000
	if got := apply(&ScheduleBatch{ProposedAt: 80, Events: []NewEvent{b}}).(*ScheduleBatchResult); got.Results[0] != (ScheduleResult{Outcome: Renewed, Seq: 4, Due: 2000, Version: 4}) {
		t.Fatalf("Replace of a fired event: %+v", got.Results[0])
	}
	if rec, _, _ := f.Get("a"); rec.State != StateScheduled || rec.Seq != 4 || rec.CreatedAt != 80 || rec.FiredAt != 0 {
		t.Fatalf("Get after the renewal: %+v", rec)
	}
	s := f.Stats()
	if s.Pending != 1 || s.Fired != 1 || s.Replaced != 2 || s.Renewed != 1 || s.Retained != 0 || s.NextSeq != 5 {
		t.Fatalf("Stats: %+v", s)
	}
	if n := countTags(t, st, 3); n[tagBody] != 1 || n[tagID] != 1 || n[tagDue] != 1 || n[tagStatus] != 0 || n[tagSettled] != 0 {
		t.Fatalf("keys by tag: %v; want the one pending event's", n)
	}
	wantTrace := []string{"Scheduled(1,1000)", "Settled(1)", "Scheduled(2,500)", "Settled(2)", "Scheduled(3,900)", "Settled(3)", "Scheduled(4,2000)"}
	if !reflect.DeepEqual(trace, wantTrace) {
		t.Fatalf("observer: %v, want %v", trace, wantTrace)
	}
}

// TestRenewedEventIsNotExpiredAgain: a Replace that renews a settled event deletes its
// settled-index entry in its batch, so an Expire later in the same batch, which walks the
// committed index, must not remove it again: that would delete the id of the new version.
// Both orders of settling are covered: settled before the batch, and in it.
func TestRenewedEventIsNotExpiredAgain(t *testing.T) {
	for _, settledInBatch := range []bool{false, true} {
		st := openTestStore(t, t.TempDir(), StoreOptions{})
		f, _ := newTestFSM(t, st, 3)
		g := newGen(2)
		a := g.event("a", 0)
		a.Due = 1000
		mark := &MarkFired{ProposedAt: 100, DueKnown: true, Entries: []Fired{{Seq: 1, FiredAt: 100, Due: 1000}}}
		renew := a
		renew.Replace, renew.Due = true, 5000
		logs := []*raft.Log{
			cmdLog(1, &ScheduleBatch{ProposedAt: 10, Events: []NewEvent{a}}),
			cmdLog(2, mark),
			cmdLog(3, &ScheduleBatch{ProposedAt: 200, Events: []NewEvent{renew}}),
			cmdLog(4, &Expire{Before: 150, Limit: 10}),
		}
		split := 2
		if settledInBatch {
			split = 1
		}
		f.ApplyBatch(logs[:split])
		out := f.ApplyBatch(logs[split:])
		if r := out[len(out)-1].(*ExpireResult); r.Expired != 0 {
			t.Errorf("settled in the batch %v: Expire removed %d, want 0 (the renewed event is gone already)", settledInBatch, r.Expired)
		}
		rec, found, err := f.Get("a")
		if err != nil || !found || rec.State != StateScheduled || rec.Version != 2 {
			t.Errorf("settled in the batch %v: Get(a) = %+v, %v, %v; want version 2 pending", settledInBatch, rec, found, err)
		}
		if s := f.Stats(); s.Expired != 0 || s.Renewed != 1 || s.Retained != 0 {
			t.Errorf("settled in the batch %v: stats %+v", settledInBatch, s)
		}
		f.Close()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
