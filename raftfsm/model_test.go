package raftfsm

import (
	"bytes"
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

// model is the reference the FSM is checked against: the rules of doc.go written as plainly as
// possible, over a map of id → record, with no storage and no batching.
type model struct {
	byID  map[string]*Record
	bySeq map[uint64]*Record
	// expired holds the seqs that named an event once and name none now: expired, renewed
	// or superseded by a next version.
	expired map[uint64]bool
	nextSeq uint64
	stats   Stats
}

func newModel() *model {
	return &model{byID: map[string]*Record{}, bySeq: map[uint64]*Record{}, expired: map[uint64]bool{}, nextSeq: 1}
}

// unknown is the outcome of a mark for a seq the model no longer holds.
func (m *model) unknown(seq uint64) MarkOutcome {
	if m.expired[seq] {
		return WasExpired
	}
	return UnknownSeq
}

// settledAt is when r left Scheduled.
func settledAt(r *Record) int64 {
	return map[State]int64{StateFired: r.FiredAt, StateCancelled: r.CancelledAt, StateDeadLettered: r.DeadLetteredAt}[r.State]
}

// expire removes the settled records that settled before c.Before, oldest first (by time,
// then seq), at most c.Limit.
func (m *model) expire(c *Expire) *ExpireResult {
	var old []*Record
	for _, r := range m.bySeq {
		if r.State != StateScheduled && settledAt(r) < c.Before {
			old = append(old, r)
		}
	}
	slices.SortFunc(old, func(a, b *Record) int {
		return cmp.Or(cmp.Compare(settledAt(a), settledAt(b)), cmp.Compare(a.Seq, b.Seq))
	})
	old = old[:min(len(old), int(c.Limit))]
	for _, r := range old {
		delete(m.byID, r.ID)
		delete(m.bySeq, r.Seq)
		m.expired[r.Seq] = true
		m.stats.Expired++
	}
	return &ExpireResult{Expired: uint32(len(old))}
}

// pendingSeq is the seq of id's event if it is pending, 0 otherwise.
func (m *model) pendingSeq(id string) uint64 {
	if r, ok := m.byID[id]; ok && r.State == StateScheduled {
		return r.Seq
	}
	return 0
}

func (m *model) pendingSeqs() []uint64 {
	var out []uint64
	for seq, r := range m.bySeq {
		if r.State == StateScheduled {
			out = append(out, seq)
		}
	}
	slices.Sort(out)
	return out
}

// apply returns the response the FSM must give for l.
func (m *model) apply(l *raft.Log, c Command) interface{} {
	m.stats.AppliedIndex, m.stats.AppliedTerm = l.Index, l.Term
	switch c := c.(type) {
	case nil:
		return nil
	case *ScheduleBatch:
		res := &ScheduleBatchResult{Results: make([]ScheduleResult, len(c.Events))}
		for i, e := range c.Events {
			version, o := uint64(1), Created
			if e.Replace && e.CheckPending && m.pendingSeq(e.ID) != e.Pending {
				res.Results[i] = ScheduleResult{Outcome: Moved}
				if r, ok := m.byID[e.ID]; ok {
					res.Results[i].Seq, res.Results[i].Due = r.Seq, r.Due
				}
				continue
			}
			if r, ok := m.byID[e.ID]; ok && e.Replace {
				version, o = r.Version+1, Renewed
				if r.State == StateScheduled {
					o = Replaced
					m.stats.Pending--
					m.stats.Replaced++
				} else {
					m.stats.Renewed++
				}
				delete(m.bySeq, r.Seq)
				m.expired[r.Seq] = true
			} else if ok {
				o := Existing
				if r.ContentHash != e.ContentHash {
					o = Conflict
				}
				res.Results[i] = ScheduleResult{Outcome: o, Seq: r.Seq, Due: r.Due}
				continue
			}
			r := &Record{
				Seq: m.nextSeq, ID: e.ID, State: StateScheduled, Due: e.Due, CreatedAt: c.ProposedAt,
				Topic: e.Topic, Key: e.Key, Payload: e.Payload, Headers: e.Headers, ContentHash: e.ContentHash,
				Version: version, Policy: e.Policy, Output: e.Output,
			}
			m.nextSeq++
			m.byID[e.ID], m.bySeq[r.Seq] = r, r
			m.stats.Pending++
			res.Results[i] = ScheduleResult{Outcome: o, Seq: r.Seq, Due: r.Due, Version: version}
		}
		return res
	case *Update:
		res := &UpdateResult{Results: make([]ChangeResult, len(c.Changes))}
		for i, ch := range c.Changes {
			r, ok := m.byID[ch.ID]
			if ch.Fields&ChangeCheckPending != 0 && m.pendingSeq(ch.ID) != ch.Pending {
				res.Results[i] = ChangeResult{Outcome: UpdateMoved}
				if ok {
					res.Results[i].Seq, res.Results[i].Due = r.Seq, r.Due
				}
				continue
			}
			if !ok {
				res.Results[i] = ChangeResult{Outcome: UpdateNotFound}
				continue
			}
			out := ChangeResult{State: r.State, Seq: r.Seq, Due: r.Due, Version: r.Version}
			switch {
			case r.State != StateScheduled:
				out.Outcome = UpdateNotPending
			case ch.IfVersion != 0 && ch.IfVersion != r.Version:
				out.Outcome = VersionMismatch
			default:
				n := *r
				n.Seq, n.Version = m.nextSeq, r.Version+1
				m.nextSeq++
				if ch.Fields&ChangeDue != 0 {
					n.Due = ch.Due
				}
				if ch.Fields&ChangeKey != 0 {
					n.Key = ch.Key
				}
				if ch.Fields&ChangePayload != 0 {
					n.Payload = ch.Payload
				}
				if ch.Fields&ChangeHeaders != 0 {
					n.Headers = ch.Headers
				}
				delete(m.bySeq, r.Seq)
				m.expired[r.Seq] = true
				m.byID[n.ID], m.bySeq[n.Seq] = &n, &n
				m.stats.Replaced++
				out = ChangeResult{Outcome: Updated, State: StateScheduled, Seq: n.Seq, Due: n.Due, Version: n.Version}
			}
			res.Results[i] = out
		}
		return res
	case *Cancel:
		res := &CancelBatchResult{Results: make([]CancelResult, len(c.IDs))}
		for i, id := range c.IDs {
			r, ok := m.byID[id]
			if !ok {
				res.Results[i] = CancelResult{Outcome: NotFound}
				continue
			}
			o := map[State]CancelOutcome{StateCancelled: AlreadyCancelled, StateFired: AlreadyFired, StateDeadLettered: AlreadyDeadLettered}[r.State]
			if r.State == StateScheduled {
				o = Cancelled
				r.State, r.CancelledAt = StateCancelled, c.ProposedAt
				m.stats.Pending--
				m.stats.Cancelled++
			}
			res.Results[i] = CancelResult{Outcome: o, Seq: r.Seq}
		}
		return res
	case *Expire:
		return m.expire(c)
	case *MarkFired:
		res := &MarkBatchResult{Outcomes: make([]MarkOutcome, len(c.Entries))}
		for i, e := range c.Entries {
			r, ok := m.bySeq[e.Seq]
			switch {
			case !ok:
				res.Outcomes[i] = m.unknown(e.Seq)
			case r.State == StateScheduled:
				r.State, r.FiredAt, r.Attempts = StateFired, e.FiredAt, e.Attempts
				m.stats.Pending--
				m.stats.Fired++
				res.Outcomes[i] = Marked
			case r.State == StateFired:
				m.stats.Refired++
				res.Outcomes[i] = WasFired
			case r.State == StateCancelled:
				m.stats.FiredAfterCancel++
				res.Outcomes[i] = WasCancelled
			default:
				res.Outcomes[i] = WasDeadLettered
			}
		}
		return res
	case *MarkDeadLettered:
		res := &MarkBatchResult{Outcomes: make([]MarkOutcome, len(c.Entries))}
		for i, e := range c.Entries {
			r, ok := m.bySeq[e.Seq]
			switch {
			case !ok:
				res.Outcomes[i] = m.unknown(e.Seq)
			case r.State == StateScheduled:
				r.State, r.DeadLetteredAt, r.Attempts = StateDeadLettered, e.At, e.Attempts
				r.LastError, r.DeadLetterTopic = e.Error, e.Topic
				m.stats.Pending--
				m.stats.DeadLettered++
				res.Outcomes[i] = Marked
			default:
				res.Outcomes[i] = map[State]MarkOutcome{StateFired: WasFired, StateCancelled: WasCancelled, StateDeadLettered: WasDeadLettered}[r.State]
			}
		}
		return res
	}
	panic(fmt.Sprintf("model: %T", c))
}

func (m *model) wantStats() Stats {
	s := m.stats
	s.NextSeq = m.nextSeq
	s.Retained = s.Fired + s.Cancelled + s.DeadLettered - s.Expired - s.Renewed
	return s
}

// harness drives one FSM (replaced on restore or reopen) and the model through the same log.
type harness struct {
	t    *testing.T
	g    *gen
	m    *model
	st   *Store
	dir  string
	f    *FSM
	obs  *pendingObserver
	log  []*raft.Log   // log[i] has index i+1
	resp []interface{} // the response the FSM gave for log[i] when first applied
	// walkDue makes List walk in due order under every prefix (Knobs.PrefixScanLimit 0).
	walkDue bool
	// countedChecks counts the forecasts checked against the due index with the due
	// counts loaded.
	countedChecks int
}

func (h *harness) close() {
	h.f.Close()
	if err := h.st.Close(); err != nil {
		h.t.Fatalf("close store: %v", err)
	}
}

func (h *harness) open(dir string) {
	h.dir = dir
	h.st = openTestStore(h.t, dir, StoreOptions{Knobs: Knobs{PrefixScanLimit: func() int {
		if h.walkDue {
			return 0
		}
		return prefixScanLimit
	}}})
	h.f, h.obs = newTestFSM(h.t, h.st, 7)
}

// applyNew appends 1-4 entries and applies them in one ApplyBatch or one at a time.
func (h *harness) applyNew() {
	n := 1 + h.g.rng.IntN(4)
	logs := make([]*raft.Log, n)
	want := make([]interface{}, n)
	for i := range logs {
		var c Command
		logs[i], c = h.g.entry(h.m)
		want[i] = h.m.apply(logs[i], c)
	}
	var got []interface{}
	if h.g.rng.IntN(2) == 0 {
		got = h.f.ApplyBatch(logs)
	} else {
		for _, l := range logs {
			got = append(got, h.f.Apply(l))
		}
	}
	for i := range logs {
		if !reflect.DeepEqual(got[i], want[i]) {
			h.t.Fatalf("entry %d (%s): got %s, want %s", logs[i].Index, describe(logs[i]), show(got[i]), show(want[i]))
		}
	}
	last := logs[n-1]
	if s := h.f.Stats(); s.AppliedIndex != last.Index || s.AppliedTerm != last.Term {
		h.t.Fatalf("after entry %d (%s) term %d: applied index %d term %d", last.Index, last.Type, last.Term, s.AppliedIndex, s.AppliedTerm)
	}
	h.log = append(h.log, logs...)
	h.resp = append(h.resp, got...)
}

// replay feeds already-applied entries again, as raft does on start: every one is skipped,
// nothing changes, nobody is notified.
func (h *harness) replay() {
	if len(h.log) == 0 {
		return
	}
	from := h.g.rng.IntN(len(h.log))
	to := from + 1 + h.g.rng.IntN(min(8, len(h.log)-from))
	before, calls := h.f.Stats(), h.obs.calls
	for i, r := range h.f.ApplyBatch(h.log[from:to]) {
		if r != ErrReplayed {
			h.t.Fatalf("replayed entry %d: got %s, want ErrReplayed", h.log[from+i].Index, show(r))
		}
	}
	if after := h.f.Stats(); after != before || h.obs.calls != calls {
		h.t.Fatalf("replay changed something: stats %+v → %+v, observer calls %d → %d", before, after, calls, h.obs.calls)
	}
}

// snapshotRestore writes a full snapshot stream, keeps applying to the FSM, then restores the
// stream either into a fresh FSM on a fresh store (a new replica) or into the same FSM (a
// follower rolled back to the snapshot, so the restore must wipe everything newer). It then
// sends the entries after the snapshot as raft would: they must give the responses they gave
// the first time.
func (h *harness) snapshotRestore() {
	var buf bytes.Buffer
	at, err := h.f.WriteSnapshot(&buf)
	if err != nil {
		h.t.Fatalf("WriteSnapshot: %v", err)
	}
	if at.AppliedIndex != h.f.AppliedIndex() || at.Shard != h.f.Shard() {
		h.t.Fatalf("WriteSnapshot at %+v, AppliedIndex %d", at, h.f.AppliedIndex())
	}
	for range 1 + h.g.rng.IntN(3) {
		h.applyNew()
	}
	data := buf.Bytes()
	if h.g.rng.IntN(2) == 0 {
		h.close()
		h.open(h.t.TempDir())
	}
	resets := h.obs.resets
	if err := restore(h.f, data); err != nil {
		h.t.Fatalf("Restore: %v", err)
	}
	if h.obs.resets != resets+1 {
		h.t.Fatalf("Restore called Reset %d times, want 1", h.obs.resets-resets)
	}
	if got := h.f.AppliedIndex(); got != at.AppliedIndex {
		h.t.Fatalf("restored AppliedIndex %d, want %d", got, at.AppliedIndex)
	}
	h.reapplyAfter(at.AppliedIndex)
}

// reopen closes and reopens the store in place (a clean restart), then replays the log from a
// random earlier point, as raft with NoSnapshotRestoreOnStart does.
func (h *harness) reopen() {
	at := h.f.AppliedIndex()
	h.close()
	h.open(h.dir)
	if got := h.f.AppliedIndex(); got != at {
		h.t.Fatalf("reopened AppliedIndex %d, want %d", got, at)
	}
	h.reapplyAfter(uint64(h.g.rng.IntN(int(at) + 1)))
}

// reapplyAfter feeds log entries after index from, in random groupings, checking that the
// ones the FSM already has are skipped and the others give their original responses.
func (h *harness) reapplyAfter(from uint64) {
	applied := h.f.AppliedIndex()
	for i := int(from); i < len(h.log); {
		n := min(1+h.g.rng.IntN(4), len(h.log)-i)
		for j, got := range h.f.ApplyBatch(h.log[i : i+n]) {
			l := h.log[i+j]
			want := h.resp[i+j]
			if l.Index <= applied {
				want = ErrReplayed
			}
			if !reflect.DeepEqual(got, want) {
				h.t.Fatalf("re-applied entry %d (%s): got %s, want %s", l.Index, describe(l), show(got), show(want))
			}
		}
		i += n
	}
}

// check compares everything observable with the model.
func (h *harness) check() {
	t, f, m := h.t, h.f, h.m
	t.Helper()
	stats := f.Stats()
	if want := m.wantStats(); stats != want {
		t.Fatalf("Stats:\n got %+v\nwant %+v", stats, want)
	}
	for i := range h.g.ids + 5 { // a few ids never scheduled
		id := fmt.Sprintf("id-%d", i)
		got, found, err := f.Get(id)
		if err != nil {
			t.Fatalf("Get(%q): %v", id, err)
		}
		want, ok := m.byID[id]
		if found != ok {
			t.Fatalf("Get(%q): found=%v, model has it: %v", id, found, ok)
		}
		if ok && !reflect.DeepEqual(got, *want) {
			t.Fatalf("Get(%q):\n got %+v\nwant %+v", id, got, *want)
		}
	}

	h.checkQueries()
	h.checkForecast()

	type pend struct {
		seq uint64
		due int64
		p   Policy
	}
	var want []pend
	for _, seq := range m.pendingSeqs() {
		want = append(want, pend{seq, m.bySeq[seq].Due, m.bySeq[seq].Policy})
	}
	slices.SortFunc(want, func(a, b pend) int { return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.seq, b.seq)) })
	var got []pend
	if err := f.ForEachPending(func(seq uint64, due int64, p Policy) error {
		got = append(got, pend{seq, due, p})
		return nil
	}); err != nil {
		t.Fatalf("ForEachPending: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ForEachPending (due order):\n got %v\nwant %v", got, want)
	}
	if len(h.obs.pending) != len(want) {
		t.Fatalf("observer holds %d pending, model %d", len(h.obs.pending), len(want))
	}
	for _, p := range want {
		if due, ok := h.obs.pending[p.seq]; !ok || due != p.due || h.obs.policy[p.seq] != p.p {
			t.Fatalf("observer: seq %d due %d policy %+v (present %v), model due %d policy %+v", p.seq, due, h.obs.policy[p.seq], ok, p.due, p.p)
		}
	}

	// ReadForFire on a shuffled mix of known, duplicate and unknown seqs, and known seqs
	// under a wrong due time.
	var refs []Ref
	for range 10 {
		seq := h.g.rng.Uint64N(m.nextSeq + 3)
		due := h.g.rng.Int64N(1000)
		if r, ok := m.bySeq[seq]; ok && h.g.rng.IntN(5) > 0 {
			due = r.Due
		}
		refs = append(refs, Ref{seq, due})
	}
	refs = append(refs, refs[0])
	var wantRecs []Record
	for _, r := range refs {
		if rec, ok := m.bySeq[r.Seq]; ok && rec.Due == r.Due && !slices.ContainsFunc(wantRecs, func(w Record) bool { return w.Seq == r.Seq }) {
			wantRecs = append(wantRecs, *rec)
		}
	}
	slices.SortFunc(wantRecs, func(a, b Record) int { return cmp.Or(cmp.Compare(a.Due, b.Due), cmp.Compare(a.Seq, b.Seq)) })
	asked := slices.Clone(refs)
	recs, err := f.ReadForFire(refs, nil)
	if err != nil {
		t.Fatalf("ReadForFire: %v", err)
	}
	if !reflect.DeepEqual(recs, wantRecs) {
		t.Fatalf("ReadForFire(%v):\n got %+v\nwant %+v", asked, recs, wantRecs)
	}
}

// TestModel drives random logs through the FSM and the reference model and compares every
// response, and regularly every record, the counters, the pending index and the observer's
// view; along the way it replays applied entries, restarts the store, and moves the shard to
// a fresh store by snapshot and restore.
func TestModel(t *testing.T) {
	seeds, steps := 6, 400
	if testing.Short() {
		seeds, steps = 2, 200
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			h := &harness{t: t, g: newGen(uint64(seed)), m: newModel()}
			h.open(t.TempDir())
			defer h.close()
			restores, reopens := 0, 0
			for step := range steps {
				switch r := h.g.rng.IntN(100); {
				case r < 2:
					h.snapshotRestore()
					restores++
				case r < 4:
					h.reopen()
					reopens++
				case r < 10:
					h.replay()
				default:
					h.applyNew()
				}
				if step%50 == 49 {
					h.check()
				}
			}
			h.check()
			// The run must have exercised what it claims to, or it proves little.
			s := h.f.Stats()
			if s.Pending == 0 || s.Fired == 0 || s.Cancelled == 0 || s.DeadLettered == 0 || s.Refired == 0 || s.FiredAfterCancel == 0 || s.Expired == 0 || s.Retained == 0 ||
				s.Replaced == 0 || s.Renewed == 0 {
				t.Errorf("weak run, some outcome never happened: %+v", s)
			}
			if h.countedChecks == 0 {
				t.Errorf("weak run: no forecast was answered from the due counts")
			}
			t.Logf("%d entries, %d restores, %d reopens, stats %+v", len(h.log), restores, reopens, s)
		})
	}
}

func describe(l *raft.Log) string {
	if l.Type != raft.LogCommand {
		return l.Type.String()
	}
	c, err := DecodeCommand(l.Data)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%+v", c)
}

func show(v interface{}) string {
	switch v := v.(type) {
	case *ScheduleBatchResult:
		return fmt.Sprintf("%+v", *v)
	case *CancelBatchResult:
		return fmt.Sprintf("%+v", *v)
	case *MarkBatchResult:
		return fmt.Sprintf("%+v", *v)
	case *ExpireResult:
		return fmt.Sprintf("%+v", *v)
	case *UpdateResult:
		return fmt.Sprintf("%+v", *v)
	}
	return fmt.Sprintf("%#v", v)
}
