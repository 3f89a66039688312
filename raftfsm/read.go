package raftfsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
)

// Reads run concurrently with apply. Each read uses one Pebble iterator, which sees a single
// committed state, so a read never mixes the halves of two different applies.

// newIter opens an iterator over [lower, upper), or fails with ErrRestoring. The check and the
// open happen under mu, so an iterator is either opened before a restore starts (and keeps
// seeing the state before it) or not at all.
func (f *FSM) newIter(lower, upper []byte) (*pebble.Iterator, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.restoring {
		return nil, fmt.Errorf("%w: shard %d", ErrRestoring, f.shard)
	}
	it, err := f.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("raftfsm: shard %d: open iterator: %w", f.shard, err)
	}
	return it, nil
}

func closeIter(it *pebble.Iterator, err *error) {
	if cerr := it.Close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// Get returns the event with id, in whatever state it is.
func (f *FSM) Get(id string) (rec Record, found bool, err error) {
	it, err := f.newIter(f.spanStart, f.spanEnd)
	if err != nil {
		return Record{}, false, err
	}
	defer closeIter(it, &err)
	key := appendIDKey(nil, f.shard, id)
	if !it.SeekGE(key) || !bytes.Equal(it.Key(), key) {
		return Record{}, false, it.Error()
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return Record{}, false, err
	}
	ref, err := decodeIDRef(v)
	if err != nil {
		return Record{}, false, fmt.Errorf("raftfsm: shard %d: id %q: %w", f.shard, id, err)
	}
	var kb [dueKeyLen]byte
	if !it.SeekGE(appendBodyKey(kb[:0], f.shard, ref.due, ref.seq)) || !bytes.Equal(it.Key(), kb[:]) {
		if err := it.Error(); err != nil {
			return Record{}, false, err
		}
		return Record{}, false, fmt.Errorf("%w: shard %d: id %q names seq %d due %d, which has no body", ErrCorrupt, f.shard, id, ref.seq, ref.due)
	}
	// The one copy of the event's bytes: the value is iterator memory, valid only until the
	// next move, and the record's Key, Payload and header values alias this copy.
	body := bytes.Clone(it.Value())
	st := status{state: StateScheduled, due: ref.due}
	if !it.SeekGE(appendStatusKey(kb[:0], f.shard, ref.seq)) || !bytes.Equal(it.Key(), kb[:shardPrefixLen+9]) {
		if err := it.Error(); err != nil {
			return Record{}, false, err
		}
	} else if st, err = decodeStatus(it.Value()); err != nil {
		return Record{}, false, fmt.Errorf("raftfsm: shard %d: event %d: %w", f.shard, ref.seq, err)
	}
	if err := decodeRecord(ref.seq, body, st, &rec); err != nil {
		return Record{}, false, fmt.Errorf("raftfsm: shard %d: %w", f.shard, err)
	}
	return rec, true, nil
}

// Ref names an event by its seq and its due time, the two halves of its body's key.
type Ref struct {
	Seq uint64
	Due int64
}

// ReadForFire appends to out the records refs name, in due order (ties by seq), for the
// firing path. Bodies are keyed by due time, so a batch of events that fall due together is
// read from neighbouring keys with forward seeks. A ref whose seq and due name no event is
// left out. Records no longer Scheduled are returned with their state, so the caller skips
// them. It sorts refs in place.
func (f *FSM) ReadForFire(refs []Ref, out []Record) (_ []Record, err error) {
	if len(refs) == 0 {
		return out, nil
	}
	slices.SortFunc(refs, func(a, b Ref) int { return cmp.Or(cmp.Compare(a.Due, b.Due), cmp.Compare(a.Seq, b.Seq)) })
	// Three iterators over one view of the shard, each moving forward only: bodies, the due
	// index (which says whether each is still pending), and statuses for those that are not.
	bodies, err := f.newIter(appendShardTag(nil, f.shard, tagBody), appendShardTag(nil, f.shard, tagBody+1))
	if err != nil {
		return out, err
	}
	defer closeIter(bodies, &err)
	pending, err := bodies.Clone(pebble.CloneOptions{IterOptions: &pebble.IterOptions{
		LowerBound: appendShardTag(nil, f.shard, tagDue), UpperBound: appendShardTag(nil, f.shard, tagDue+1)}})
	if err != nil {
		return out, err
	}
	defer closeIter(pending, &err)
	var statuses *pebble.Iterator
	var bodyKey, dueKey, statusKey, arena []byte
	walkBodies, walkPending := forwardIter{it: bodies}, forwardIter{it: pending}
	// One growth of out, and bodies copied into shared chunks rather than one allocation
	// each: growing out record by record and cloning each body were a fifth of a draining
	// leader's ReadForFire.
	out = slices.Grow(out, len(refs))
	for i, r := range refs {
		if i > 0 && r == refs[i-1] {
			continue
		}
		bodyKey = appendBodyKey(bodyKey[:0], f.shard, r.Due, r.Seq)
		if !walkBodies.seekGE(bodyKey) || !bytes.Equal(bodies.Key(), bodyKey) {
			if err := bodies.Error(); err != nil {
				return out, err
			}
			continue
		}
		v := bodies.Value()
		if cap(arena)-len(arena) < len(v) {
			// Room for the rest of the batch at this body's size, up to 64 KiB: a fire
			// batch of a few events, as most are at a steady rate, allocates little.
			arena = make([]byte, 0, max(len(v), min(64<<10, len(v)*(len(refs)-i))))
		}
		n := len(arena)
		arena = append(arena, v...)
		body := arena[n:len(arena):len(arena)] // records may outlive each other: no append into a neighbour
		st := status{state: StateScheduled, due: r.Due}
		dueKey = appendDueKey(dueKey[:0], f.shard, r.Due, r.Seq)
		if !walkPending.seekGE(dueKey) || !bytes.Equal(pending.Key(), dueKey) {
			if err := pending.Error(); err != nil {
				return out, err
			}
			// Settled since it was scheduled: read the status it was given.
			if statuses == nil {
				statuses, err = bodies.Clone(pebble.CloneOptions{IterOptions: &pebble.IterOptions{
					LowerBound: appendShardTag(nil, f.shard, tagStatus), UpperBound: appendShardTag(nil, f.shard, tagStatus+1)}})
				if err != nil {
					return out, err
				}
				defer closeIter(statuses, &err)
			}
			statusKey = appendStatusKey(statusKey[:0], f.shard, r.Seq)
			if !statuses.SeekGE(statusKey) || !bytes.Equal(statuses.Key(), statusKey) {
				if err := statuses.Error(); err != nil {
					return out, err
				}
				return out, fmt.Errorf("%w: shard %d: event %d is neither pending nor settled", ErrCorrupt, f.shard, r.Seq)
			}
			if st, err = decodeStatus(statuses.Value()); err != nil {
				return out, fmt.Errorf("raftfsm: shard %d: event %d: %w", f.shard, r.Seq, err)
			}
		}
		var rec Record
		if err := decodeRecord(r.Seq, body, st, &rec); err != nil {
			return out, fmt.Errorf("raftfsm: shard %d: %w", f.shard, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// forwardIter positions an iterator at keys asked for in increasing order. A fire batch's
// events are neighbours in key order, so the next key asked for is usually a Next or two away,
// and a Next is far cheaper than a seek, which rebuilds the merging iterator's heap over every
// memtable and level: seeking each key was 18% of a draining cluster's CPU.
type forwardIter struct {
	it             *pebble.Iterator
	started, valid bool
}

// nextsBeforeSeek is how many keys seekGE steps over before it seeks instead.
const nextsBeforeSeek = 8

// seekGE positions the iterator at the first key ≥ key, as SeekGE does, and reports whether
// there is one. key must be greater than every key asked for before.
func (w *forwardIter) seekGE(key []byte) bool {
	if w.started {
		for steps := 0; w.valid && steps < nextsBeforeSeek; steps++ {
			if bytes.Compare(w.it.Key(), key) >= 0 {
				return true
			}
			w.valid = w.it.Next()
		}
		if !w.valid {
			return false // exhausted (or failed; Error says): nothing ≥ an earlier key
		}
	}
	w.started = true
	w.valid = w.it.SeekGE(key)
	return w.valid
}

// ForEachPending calls fn for every pending event in due order (ties by seq), from one
// consistent view of the shard. It stops at, and returns, the first error fn returns. fn must
// not block on the apply goroutine.
func (f *FSM) ForEachPending(fn func(seq uint64, due int64, p Policy) error) error {
	return f.ForEachPendingIn(minDue, maxDue, fn)
}

// minDue and maxDue bound every due time: ForEachPendingIn(minDue, maxDue, fn) visits every
// pending event but one due at maxDue itself, which no event is (the wheel stops at its last
// whole tick before it).
const (
	minDue = math.MinInt64
	maxDue = math.MaxInt64
)

// ForEachPendingIn calls fn for every pending event due in [from, to), in due order (ties by
// seq), from one consistent view of the shard, reading only that part of the due index. It
// stops at, and returns, the first error fn returns. fn must not block on the apply
// goroutine.
func (f *FSM) ForEachPendingIn(from, to int64, fn func(seq uint64, due int64, p Policy) error) (err error) {
	if from >= to {
		return nil
	}
	lower := appendDueKey(nil, f.shard, from, 0)
	upper := appendDueKey(nil, f.shard, to, 0)
	if to == maxDue {
		upper = appendShardTag(nil, f.shard, tagDue+1)
	}
	it, err := f.newIter(lower, upper)
	if err != nil {
		return err
	}
	defer closeIter(it, &err)
	for valid := it.First(); valid; valid = it.Next() {
		due, seq, err := parseDueKey(it.Key())
		if err != nil {
			return err
		}
		p, err := decodeDueValue(it.Value())
		if err != nil {
			return err
		}
		if err := fn(seq, due, p); err != nil {
			return err
		}
	}
	return it.Error()
}

// Stats returns the shard's counters as of AppliedIndex, from memory.
func (f *FSM) Stats() Stats {
	f.mu.RLock()
	m := f.meta
	f.mu.RUnlock()
	return Stats{
		Pending:          m.pending,
		Fired:            m.fired,
		Cancelled:        m.cancelled,
		DeadLettered:     m.deadLettered,
		Refired:          m.refired,
		FiredAfterCancel: m.firedAfterCancel,
		Expired:          m.expired,
		Replaced:         m.replaced,
		Renewed:          m.renewed,
		Retained:         m.retained(),
		AppliedIndex:     m.appliedIndex,
		AppliedTerm:      m.appliedTerm,
		NextSeq:          m.nextSeq,
	}
}

// Digest fingerprints the shard's whole state, as of the applied index it
// returns: xxhash64 over every key and value of the shard, length-prefixed,
// read from one iterator. Replicas that applied the same log hold identical
// key spaces (invariant 1), so equal indexes with different digests mean
// divergence. It reads the whole shard: for checks and tests, not hot paths.
func (f *FSM) Digest() (applied uint64, digest uint64, err error) {
	it, err := f.newIter(f.spanStart, f.spanEnd)
	if err != nil {
		return 0, 0, err
	}
	defer closeIter(it, &err)
	h := xxhash.New()
	var n [binary.MaxVarintLen64]byte

	for valid := it.First(); valid; valid = it.Next() {
		k, v := it.Key(), it.Value()
		if bytes.Equal(k, f.metaKey) {
			m, err := decodeMeta(v)
			if err != nil {
				return 0, 0, err
			}
			applied = m.appliedIndex
		}
		// An xxhash Digest's Write, as any hash.Hash's, never returns an error.
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(k)))])
		_, _ = h.Write(k)
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(v)))])
		_, _ = h.Write(v)
	}
	return applied, h.Sum64(), it.Error()
}

// Pending is what PendingOf finds for one id: whether a pending event is bound to it, and
// that event's seq and due time.
type Pending struct {
	Pending bool
	Seq     uint64
	Due     int64
	Policy  Policy // of a pending one
}

// PendingOf looks up ids, from one consistent view of the shard, and reports for each (in
// the order given) the pending event bound to it, if any. It reads the id entries in key
// order, a forward walk, so a batch of neighbouring ids costs a few steps each rather than a
// seek from the top of every level, and checks the due index as a bulk cancel does
// (markPending).
func (f *FSM) PendingOf(ids []string) (_ []Pending, err error) {
	ix := make([]int, len(ids))
	for i := range ix {
		ix[i] = i
	}
	slices.SortFunc(ix, func(a, b int) int { return cmp.Compare(ids[a], ids[b]) })
	v, err := f.openList()
	if err != nil {
		return nil, err
	}
	defer v.close(&err)
	walk := forwardIter{it: v.ids}
	found := make([]Listed, len(ids)) // by position in ids; Seq 0 where no entry
	var key []byte
	for _, i := range ix {
		key = appendIDKey(key[:0], f.shard, ids[i])
		if !walk.seekGE(key) || !bytes.Equal(v.ids.Key(), key) {
			if err := v.ids.Error(); err != nil {
				return nil, err
			}
			continue
		}
		ref, err := decodeIDRef(v.ids.Value())
		if err != nil {
			return nil, fmt.Errorf("raftfsm: shard %d: id %q: %w", f.shard, ids[i], err)
		}
		found[i] = Listed{Position: Position{Due: ref.due}, Seq: ref.seq}
	}
	if err := v.markPending(found); err != nil {
		return nil, err
	}
	out := make([]Pending, len(ids))
	for i, l := range found {
		if l.Seq != 0 {
			out[i] = Pending{Pending: l.State == StateScheduled, Seq: l.Seq, Due: l.Due, Policy: l.Policy}
		}
	}
	return out, nil
}
