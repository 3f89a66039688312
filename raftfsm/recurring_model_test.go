package raftfsm

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestRecurringRandomHistories applies random histories of recurring operations, fires,
// cancels and updates of occurrences to two replicas: one applying each entry alone, the
// other in batches of random sizes and reopened now and then. After every step the first
// holds the schedule invariants (doc.go, invariant 9: an active schedule, and only one, has
// a pending occurrence, which is the event its id names and the one the in-memory map
// names), and at the end both hold byte-identical key spaces.
func TestRecurringRandomHistories(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	for round := range 8 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			recurringHistory(t, seed+uint64(round))
		})
	}
}

func recurringHistory(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	stA := openTestStore(t, t.TempDir(), StoreOptions{})
	defer stA.Close()
	a, _ := newTestFSM(t, stA, 1)
	defer func() { a.Close() }()
	dirB := t.TempDir()
	stB := openTestStore(t, dirB, StoreOptions{})
	b, _ := newTestFSM(t, stB, 1)
	defer func() { b.Close(); stB.Close() }()

	ids := []string{"s0", "s1", "s2", "s3"}
	rules := []Definition{
		{Cron: "*/2 * * * * *", TimeZone: "Europe/Paris", CatchUp: CatchUpAll, MaxCatchUp: 3},
		{Cron: "* * * * * *", TimeZone: "Australia/Lord_Howe", CatchUp: CatchUpLast},
		{Every: int64(1500 * time.Millisecond), CatchUp: CatchUpSkip},
		{Cron: "*/3 * * * * *", CatchUp: CatchUpAll, MaxCatchUp: 1000, MaxOccurrences: 4},
		{Cron: "* * * * * *", CatchUp: CatchUpLast, End: t0.Add(20 * time.Second).UnixNano()},
	}
	now := t0.UnixNano()
	var index uint64
	var pendingB []*raft.Log
	flushB := func() {
		if len(pendingB) > 0 {
			b.ApplyBatch(pendingB)
			pendingB = nil
		}
	}
	apply := func(c Command) interface{} {
		index++
		l := cmdLog(index, c)
		res := a.Apply(l)
		pendingB = append(pendingB, cmdLog(index, c))
		if rng.IntN(3) == 0 {
			flushB()
		}
		return res
	}
	step := func() string {
		now += rng.Int64N(int64(3 * time.Second))
		id := ids[rng.IntN(len(ids))]
		s, found, err := a.GetSchedule(id)
		if err != nil {
			t.Fatal(err)
		}
		switch x := rng.IntN(100); {
		case x < 15:
			d := rules[rng.IntN(len(rules))]
			d.Topic, d.Payload = "t", []byte(id)
			apply(&Recurring{Op: RecurringCreate, ProposedAt: now, ID: id, Hash: DefinitionHash(&d), Def: d})
			return "create " + id
		case x < 22:
			d := rules[rng.IntN(len(rules))]
			d.Topic = "t2"
			apply(&Recurring{Op: RecurringUpdate, ProposedAt: now, ID: id, Hash: DefinitionHash(&d), Def: d, CheckPending: rng.IntN(2) == 0, Pending: s.NextSeq})
			return "update " + id
		case x < 26:
			apply(&Recurring{Op: RecurringDelete, ProposedAt: now, ID: id})
			return "delete " + id
		case x < 34:
			apply(&Recurring{Op: RecurringPause, ProposedAt: now, ID: id, CheckPending: true, Pending: s.NextSeq})
			return "pause " + id
		case x < 42:
			apply(&Recurring{Op: RecurringResume, ProposedAt: now, ID: id})
			return "resume " + id
		case !found || s.NextSeq == 0:
			return "nothing for " + id
		case x < 80:
			// The leader fires the pending occurrence, once it is due (late, at times).
			now = max(now, s.NextDue) + rng.Int64N(int64(2*time.Second))
			apply(&MarkFired{ProposedAt: now, DueKnown: true, Entries: []Fired{{Seq: s.NextSeq, FiredAt: now, Attempts: 1, Due: s.NextDue}}})
			return "fire " + id
		case x < 85:
			apply(&MarkDeadLettered{ProposedAt: now, DueKnown: true, Entries: []DeadLettered{{Seq: s.NextSeq, At: now, Attempts: 3, Error: "x", Topic: "dlq", Due: s.NextDue}}})
			return "dead-letter " + id
		case x < 92:
			apply(&Cancel{ProposedAt: now, IDs: []string{OccurrenceID(id, time.Unix(0, s.Next))}})
			return "cancel occurrence of " + id
		default:
			apply(&Update{ProposedAt: now, Changes: []Change{{ID: OccurrenceID(id, time.Unix(0, s.Next)), Fields: ChangeDue | ChangePayload,
				Due: s.NextDue + rng.Int64N(int64(time.Second)), Payload: []byte("moved")}}})
			return "move occurrence of " + id
		}
	}
	var trace []string
	for i := range 300 {
		trace = append(trace, step())
		if why := scheduleInvariants(a, ids); why != "" {
			t.Fatalf("seed %d, step %d (%v): %s", seed, i, trace[max(0, len(trace)-5):], why)
		}
		if rng.IntN(40) == 0 {
			flushB()
			b.Close()
			var err error
			if b, err = NewFSM(stB, 1, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	flushB()
	if why := scheduleInvariants(b, ids); why != "" {
		t.Fatalf("seed %d: the batched, reopened replica: %s", seed, why)
	}
	sameKeySpace(t, fmt.Sprintf("seed %d: one entry at a time vs batched and reopened", seed), dumpShard(t, stA, 1), dumpShard(t, stB, 1))
}

// scheduleInvariants says how f breaks invariant 9 for the schedules ids, or "".
func scheduleInvariants(f *FSM, ids []string) string {
	want := map[uint64]string{}
	for _, id := range ids {
		s, found, err := f.GetSchedule(id)
		if err != nil {
			return err.Error()
		}
		if !found {
			continue
		}
		if (s.NextSeq != 0) != (s.State == ScheduleActive) {
			return fmt.Sprintf("schedule %s is %v with pending occurrence %d", id, s.State, s.NextSeq)
		}
		if s.NextSeq == 0 {
			continue
		}
		want[s.NextSeq] = id
		ev, ok, err := f.Get(OccurrenceID(id, time.Unix(0, s.Next)))
		switch {
		case err != nil:
			return err.Error()
		case !ok || ev.Seq != s.NextSeq || ev.State != StateScheduled || ev.Due != s.NextDue:
			return fmt.Sprintf("schedule %s names occurrence %d due %d; its event is %v seq %d %v due %d", id, s.NextSeq, s.NextDue, ok, ev.Seq, ev.State, ev.Due)
		}
	}
	if len(want) != len(f.occ.bySeq) {
		return fmt.Sprintf("the occurrence map holds %v, the cursors %v", f.occ.bySeq, want)
	}
	for seq, id := range want {
		if f.occ.bySeq[seq] != id {
			return fmt.Sprintf("the occurrence map holds %v, the cursors %v", f.occ.bySeq, want)
		}
	}
	return ""
}
