package raftfsm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm/recurrence"
)

// TestRecurringRandomHistories applies random histories of recurring operations, fires,
// cancels and updates of occurrences to two replicas: one applying each entry alone, the
// other in batches of random sizes, reopened now and then, restored now and then from a
// snapshot the first took earlier (then given the log after it), and handed now and then a
// batch that panics part way. After every step the first holds the schedule invariants
// (doc.go, invariant 9: an active schedule, and only one, has a pending occurrence, which is
// the event its id names and the one the in-memory map names; that event holds the
// definition's target), both hold in memory exactly the schedules their Pebble holds
// (scheduleCacheMismatch), and at the end both hold byte-identical key spaces.
func TestRecurringRandomHistories(t *testing.T) {
	seed := rand.Uint64() // a new history each run; failures print the seed that replays it
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
	// Some definitions have a target too large to keep in memory (maxCachedTarget).
	payload := func(id string) []byte {
		if rng.IntN(3) == 0 {
			return bytes.Repeat([]byte(id), maxCachedTarget)
		}
		return []byte(id)
	}

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
	var logs []*raft.Log // logs[i] is index i+1
	type snapshot struct {
		index uint64
		data  []byte
	}
	var snaps []snapshot // of a, taken now and then
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
		logs = append(logs, l)
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
			d.Topic, d.Key, d.Payload = "t", []byte("k-"+id), payload(id)
			if rng.IntN(2) == 0 {
				d.Headers = []Header{{Key: "h", Value: []byte(id)}}
			}
			apply(&Recurring{Op: RecurringCreate, ProposedAt: now, ID: id, Hash: DefinitionHash(&d), Def: d})
			return "create " + id
		case x < 22:
			d := rules[rng.IntN(len(rules))]
			d.Topic, d.Payload = "t2", payload(id+"-2")
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
		switch rng.IntN(30) {
		case 0:
			flushB()
			b.Close()
			var err error
			if b, err = NewFSM(stB, 1, nil); err != nil {
				t.Fatal(err)
			}
		case 1:
			snaps = append(snaps, snapshot{index, snapshotBytes(t, a)})
		case 4, 5:
			// Restored from a snapshot of a, maybe an old one, then the log after it.
			if len(snaps) == 0 {
				break
			}
			flushB()
			s := snaps[rng.IntN(len(snaps))]
			if err := restore(b, s.data); err != nil {
				t.Fatal(err)
			}
			trace = append(trace, fmt.Sprintf("restore at %d of %d", s.index, index))
			if why := scheduleCacheMismatch(t, b); why != "" {
				t.Fatalf("seed %d, step %d (%v), the batched replica: %s", seed, i, trace[max(0, len(trace)-5):], why)
			}
			pendingB = slices.Clone(logs[s.index:])
		case 2, 3:
			// The batch so far, then an entry that does not decode: apply panics, and
			// nothing of the batch commits. Raft would stop here; the test takes the
			// batch again, replayed entries and all, as after a restart.
			if len(pendingB) > 0 {
				bad := &raft.Log{Index: index + 1, Term: 1, Type: raft.LogCommand, Data: []byte{0xee}}
				if msg := panicMessage(func() { b.ApplyBatch(append(slices.Clone(pendingB), bad)) }); msg == "" {
					t.Fatal("a batch with an entry that does not decode did not panic")
				}
				trace = append(trace, "abandoned batch")
				if why := scheduleCacheMismatch(t, b); why != "" {
					t.Fatalf("seed %d, step %d (%v), the batched replica: %s", seed, i, trace[max(0, len(trace)-5):], why)
				}
				b.Close()
				var err error
				if b, err = NewFSM(stB, 1, nil); err != nil {
					t.Fatal(err)
				}
				// Some of the batch, then all of it: the first ones are then replayed
				// (ErrReplayed) and must change nothing.
				if n := rng.IntN(len(pendingB) + 1); n > 0 {
					b.ApplyBatch(slices.Clone(pendingB[:n]))
				}
				flushB()
			}
		}
		if why := scheduleCacheMismatch(t, a); why != "" {
			t.Fatalf("seed %d, step %d (%v): %s", seed, i, trace[max(0, len(trace)-5):], why)
		}
		if why := scheduleCacheMismatch(t, b); why != "" {
			t.Fatalf("seed %d, step %d (%v), the batched replica: %s", seed, i, trace[max(0, len(trace)-5):], why)
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
		// Its target is the definition's (the payload unless an Update of the occurrence's
		// id moved it), then the two recurring headers.
		d := &s.Definition
		if ev.Topic != d.Topic || !bytes.Equal(ev.Key, d.Key) || !bytes.Equal(ev.Payload, d.Payload) && string(ev.Payload) != "moved" ||
			len(ev.Headers) != len(d.Headers)+2 || !reflect.DeepEqual(ev.Headers[:len(d.Headers)], d.Headers) && len(d.Headers) > 0 ||
			ev.Headers[len(d.Headers)].Key != HeaderRecurringID || string(ev.Headers[len(d.Headers)].Value) != id {
			return fmt.Sprintf("schedule %s's occurrence %d holds topic %q key %q payload %.20q… headers %d; its definition %q %q %.20q… %d",
				id, ev.Seq, ev.Topic, ev.Key, ev.Payload, len(ev.Headers), d.Topic, d.Key, d.Payload, len(d.Headers))
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

// scheduleCacheMismatch says how f's in-memory schedules (occurrences.scheds) differ from
// the cursors and definitions in its Pebble, or "": each schedule is there with its cursor
// and definition, the definition's target only if small enough, and its parsed rule, if it
// has one yet, is its definition's; and no other schedule is there.
func scheduleCacheMismatch(t testing.TB, f *FSM) string {
	t.Helper()
	stored := map[string]scheduleEntry{}
	it, err := f.db.NewIter(&pebble.IterOptions{LowerBound: appendShardTag(nil, f.shard, tagCursor), UpperBound: appendShardTag(nil, f.shard, tagCursor+1)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		id := string(it.Key()[shardPrefixLen+1:])
		c, err := decodeCursor(it.Value())
		if err != nil {
			t.Fatal(err)
		}
		v, closer, err := f.db.Get(appendDefinitionKey(nil, f.shard, id))
		if err != nil {
			t.Fatalf("schedule %q: definition: %v", id, err)
		}
		d, err := decodeStoredDefinition(v)
		if err != nil {
			t.Fatal(err)
		}
		e := scheduleEntry{cur: c}
		e.setDefinition(d)
		_ = closer.Close() // releases the value; Pebble's Get closers return no error
		stored[id] = e
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(f.occ.scheds) {
		return fmt.Sprintf("%d schedules in memory, %d in Pebble", len(f.occ.scheds), len(stored))
	}
	for id, want := range stored {
		got := f.occ.scheds[id]
		switch {
		case got == nil:
			return fmt.Sprintf("schedule %q is in Pebble, not in memory", id)
		case got.cur != want.cur:
			return fmt.Sprintf("schedule %q's cursor: %+v in memory, %+v in Pebble", id, got.cur, want.cur)
		case got.target != want.target || !reflect.DeepEqual(got.def, want.def):
			return fmt.Sprintf("schedule %q's definition: %s in memory, %s in Pebble", id, defSummary(got), defSummary(&want))
		case got.gone:
			return fmt.Sprintf("schedule %q is gone in memory", id)
		}
		if got.rule != nil {
			r, err := recurrence.Parse(want.def.Spec())
			if err != nil || !reflect.DeepEqual(got.rule, r) {
				return fmt.Sprintf("schedule %q's rule in memory is not its definition's (%v)", id, err)
			}
		}
	}
	return ""
}

func defSummary(e *scheduleEntry) string {
	d := e.def
	return fmt.Sprintf("{%q %v %q %v..%v %v %v %v/%v topic %q key %q payload %d bytes %q… headers %v; target %v}", d.Cron, d.Every, d.TimeZone,
		d.Start, d.End, d.Jitter, d.MaxOccurrences, d.CatchUp, d.MaxCatchUp, d.Topic, d.Key, len(d.Payload), d.Payload[:min(len(d.Payload), 8)], d.Headers, e.target)
}
