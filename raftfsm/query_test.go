package raftfsm

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// checkQueries compares List, ListRefs and Count with the model for queries of every kind:
// by prefix (narrow, broad, none), topic, states, priorities and due range, paged in small pages, each
// through both of List's ways of finding matches (the id index under a prefix, and the walk
// in due order).
func (h *harness) checkQueries() {
	t, f, m := h.t, h.f, h.m
	t.Helper()
	var all []*Record
	for _, rec := range m.byID {
		all = append(all, rec)
	}
	slices.SortFunc(all, func(a, b *Record) int { return cmp.Or(cmp.Compare(a.Due, b.Due), strings.Compare(a.ID, b.ID)) })
	// PendingOf, for every id the run used, a few it never did, and a repeat.
	var names []string
	for i := range h.g.ids + 3 {
		names = append(names, fmt.Sprintf("id-%d", (i*7)%(h.g.ids+3)))
	}
	names = append(names, names[0])
	got, err := f.PendingOf(names)
	if err != nil {
		t.Fatalf("PendingOf: %v", err)
	}
	for i, id := range names {
		var want Pending
		if rec, ok := m.byID[id]; ok {
			want = Pending{Pending: rec.State == StateScheduled, Seq: rec.Seq, Due: rec.Due}
			if want.Pending {
				want.Policy = rec.Policy
			}
		}
		if got[i] != want {
			t.Fatalf("PendingOf(%q) = %+v, want %+v", id, got[i], want)
		}
	}

	// An rng of its own, so that checking does not change the run it checks.
	rng := rand.New(rand.NewPCG(uint64(len(h.log)), 7))
	for range 12 {
		q := Query{Prefix: []string{"", "id-", "id-1", "id-2", "id-13", "nope"}[rng.IntN(6)], Due: AnyDue}
		if rng.IntN(3) == 0 {
			q.Topic = fmt.Sprintf("topic-%d", rng.IntN(3))
		}
		if rng.IntN(2) == 0 {
			q.States = StateSet(rng.IntN(16)) << 1
		}
		if rng.IntN(3) == 0 {
			q.Priorities = PrioritySet(rng.IntN(1 << (MaxPriority + 1)))
		}
		if rng.IntN(2) == 0 && len(all) > 0 {
			a, b := all[rng.IntN(len(all))].Due, all[rng.IntN(len(all))].Due
			q.Due = DueRange{From: min(a, b), To: max(a, b) + int64(rng.IntN(2))}
		}
		var want []Record
		for _, rec := range all {
			if q.Matches(rec) {
				want = append(want, *rec)
			}
		}
		if n, err := f.Count(q); err != nil || n != uint64(len(want)) {
			t.Fatalf("Count(%+v) = %d, %v; the model has %d", q, n, err, len(want))
		}
		if q.Prefix != "" {
			// PendingUnder: the pending ones, by id, in pages.
			var wantIDs, gotIDs []string
			pq := q
			pq.States = 0
			for _, rec := range all {
				if pq.Matches(rec) && rec.State == StateScheduled {
					wantIDs = append(wantIDs, rec.ID)
				}
			}
			slices.Sort(wantIDs)
			after, limit := "", 1+rng.IntN(4)
			for {
				page, err := f.PendingUnder(q, after, limit)
				if err != nil {
					t.Fatalf("PendingUnder(%+v, %q, %d): %v", q, after, limit, err)
				}
				for _, l := range page {
					gotIDs = append(gotIDs, l.ID)
					if rec := m.byID[l.ID]; rec.Seq != l.Seq || rec.Due != l.Due || l.State != StateScheduled {
						t.Fatalf("PendingUnder(%+v): %+v, the model has %+v", q, l, rec)
					}
				}
				if len(gotIDs) > len(wantIDs) || len(page) < limit {
					break
				}
				after = page[len(page)-1].ID
			}
			if !slices.Equal(gotIDs, wantIDs) {
				t.Fatalf("PendingUnder(%+v) in pages of %d:\n got %v\nwant %v", q, limit, gotIDs, wantIDs)
			}
		}
		for _, walkDue := range []bool{false, true} {
			h.walkDue = walkDue
			var got []Record
			var after *Position
			limit := 1 + rng.IntN(7)
			for {
				page, err := f.List(q, after, limit)
				if err != nil {
					t.Fatalf("List(%+v, %v, %d): %v", q, after, limit, err)
				}
				refs, err := f.ListRefs(q, after, limit)
				if err != nil || len(refs) != len(page) {
					t.Fatalf("ListRefs(%+v, %v, %d): %d refs, %v; List had %d", q, after, limit, len(refs), err, len(page))
				}
				for i, r := range refs {
					if r.ID != page[i].ID || r.Due != page[i].Due || r.Seq != page[i].Seq || r.State != page[i].State {
						t.Fatalf("ListRefs(%+v): %+v where List has %+v", q, r, page[i])
					}
				}
				got = append(got, page...)
				if len(got) > len(want) {
					t.Fatalf("List(%+v) in pages of %d, walking in due order %v: %d events and counting, want %d\n got %v\nwant %v",
						q, limit, walkDue, len(got), len(want), ids(got), ids(want))
				}
				if len(page) < limit {
					break
				}
				after = &Position{Due: page[len(page)-1].Due, ID: page[len(page)-1].ID}
			}
			h.walkDue = false
			if len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
				t.Fatalf("List(%+v) in pages of %d, walking in due order %v: got %d events, want %d\n got %v\nwant %v",
					q, limit, walkDue, len(got), len(want), ids(got), ids(want))
			}
		}
	}
}

func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = fmt.Sprintf("%s@%d/%s", r.ID, r.Due, r.State)
	}
	return out
}

func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct{ in, want []byte }{
		{[]byte("ab"), []byte("ac")},
		{[]byte{'a', 0xff}, []byte("b")},
		{[]byte{0xff, 0xff}, nil},
	} {
		if got := prefixEnd(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("prefixEnd(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
