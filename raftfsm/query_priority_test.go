package raftfsm

import (
	"slices"
	"testing"
)

// TestQueryByPriority lists, counts and walks pending events by priority over bodies of every
// format: an event scheduled without a priority is selected by DefaultPriority, whether its
// body is the first version (format 1) or a later one (format 2), and a priority written in a
// format 3 or 4 body (after the key, payload and headers) is found past them.
func TestQueryByPriority(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 1)
	defer f.Close()
	i := uint64(0)
	apply := func(c Command) {
		t.Helper()
		i++
		if err, ok := f.Apply(cmdLog(i, c)).(error); ok {
			t.Fatalf("apply %T: %v", c, err)
		}
	}
	headers := []Header{{Key: "h", Value: []byte("v")}}
	apply(&ScheduleBatch{ProposedAt: 1, Events: []NewEvent{
		{ID: "a/default", Due: 100, Topic: "pay", Payload: []byte("x"), Policy: DefaultPolicy},
		{ID: "a/p9", Due: 200, Topic: "pay", Key: []byte("k"), Payload: []byte("xyz"), Headers: headers, Policy: Policy{Priority: 9}},
		{ID: "a/p9-other", Due: 300, Topic: "other", Policy: Policy{Priority: 9}},
		{ID: "a/p0", Due: 400, Topic: "pay", Policy: Policy{Priority: 0, Window: 1e9}},
		{ID: "a/p9-part", Due: 500, Topic: "pay", Payload: []byte("p"), Headers: headers, Policy: Policy{Priority: 9}, Output: Output{Partition: 3, HasPartition: true}},
		{ID: "a/default-v2", Due: 600, Topic: "pay", Policy: DefaultPolicy},
		{ID: "b/default", Due: 700, Topic: "pay", Policy: DefaultPolicy},
	}})
	apply(&Update{ProposedAt: 2, Changes: []Change{{ID: "a/default-v2", Fields: ChangePayload, Payload: []byte("second")}}})
	apply(&Cancel{ProposedAt: 3, IDs: []string{"a/p9"}})
	if rec, ok, err := f.Get("a/default-v2"); err != nil || !ok || rec.Version != 2 || rec.Priority != DefaultPriority {
		t.Fatalf("Get(a/default-v2) = %+v, %v, %v; want version 2 of priority %d", rec, ok, err, DefaultPriority)
	}
	if rec, ok, err := f.Get("a/p9"); err != nil || !ok || rec.State != StateCancelled {
		t.Fatalf("Get(a/p9) = %+v, %v, %v; want it cancelled", rec, ok, err)
	}

	pending := StatesOf(StateScheduled)
	for _, c := range []struct {
		q    Query
		want []string
	}{
		{Query{Priorities: PrioritiesOf(DefaultPriority)}, []string{"a/default", "a/default-v2", "b/default"}},
		{Query{Priorities: PrioritiesOf(9)}, []string{"a/p9", "a/p9-other", "a/p9-part"}},
		{Query{Priorities: PrioritiesOf(9), Topic: "pay"}, []string{"a/p9", "a/p9-part"}},
		{Query{Priorities: PrioritiesOf(9), Topic: "pay", States: pending}, []string{"a/p9-part"}},
		{Query{Priorities: PrioritiesOf(9), States: pending}, []string{"a/p9-other", "a/p9-part"}},
		{Query{Priorities: PrioritiesOf(0, DefaultPriority), States: pending}, []string{"a/default", "a/p0", "a/default-v2", "b/default"}},
		{Query{Priorities: PrioritiesOf(0, 9), Prefix: "a/"}, []string{"a/p9", "a/p9-other", "a/p0", "a/p9-part"}},
		{Query{Priorities: PrioritiesOf(1, 2, 3)}, nil},
		{Query{}, []string{"a/default", "a/p9", "a/p9-other", "a/p0", "a/p9-part", "a/default-v2", "b/default"}},
	} {
		for _, prefix := range []string{c.q.Prefix, "a/"} {
			q, want := c.q, c.want
			q.Prefix, q.Due = prefix, AnyDue
			if prefix != "" {
				want = slices.DeleteFunc(slices.Clone(want), func(id string) bool { return id[:2] != prefix })
			}
			recs, err := f.List(q, nil, 100)
			if err != nil {
				t.Fatalf("List(%+v): %v", q, err)
			}
			var got []string
			for _, r := range recs {
				got = append(got, r.ID)
				if !q.Matches(&r) {
					t.Fatalf("List(%+v) returned %+v, which the query does not match", q, r)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("List(%+v) = %v, want %v", q, got, want)
			}
			if n, err := f.Count(q); err != nil || n != uint64(len(want)) {
				t.Fatalf("Count(%+v) = %d, %v; want %d", q, n, err, len(want))
			}
			// Count of pending events in a due range reads the due index alone.
			ranged := q
			ranged.Due = DueRange{From: 0, To: 650}
			ranged.States = pending
			var wantRanged []string
			for _, r := range recs {
				if r.State == StateScheduled && r.Due < 650 {
					wantRanged = append(wantRanged, r.ID)
				}
			}
			if n, err := f.Count(ranged); err != nil || n != uint64(len(wantRanged)) {
				t.Fatalf("Count(%+v) = %d, %v; want %d (%v)", ranged, n, err, len(wantRanged), wantRanged)
			}
			if prefix == "" {
				continue
			}
			// What a bulk cancel by prefix walks: the pending ones, by id.
			refs, err := f.PendingUnder(q, "", 100)
			if err != nil {
				t.Fatalf("PendingUnder(%+v): %v", q, err)
			}
			var gotPending, wantPending []string
			for _, l := range refs {
				gotPending = append(gotPending, l.ID)
			}
			for _, r := range recs {
				if r.State == StateScheduled {
					wantPending = append(wantPending, r.ID)
				}
			}
			slices.Sort(wantPending)
			if !slices.Equal(gotPending, wantPending) {
				t.Fatalf("PendingUnder(%+v) = %v, want %v", q, gotPending, wantPending)
			}
		}
	}
}
