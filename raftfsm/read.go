package raftfsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
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
	found, err = f.readEvent(it, ref.seq, &rec)
	if err == nil && !found {
		err = fmt.Errorf("%w: shard %d: id %q names seq %d, which has no event", ErrCorrupt, f.shard, id, ref.seq)
	}
	return rec, found, err
}

// readEvent positions it at seq's body and reads body and status into rec.
func (f *FSM) readEvent(it *pebble.Iterator, seq uint64, rec *Record) (found bool, err error) {
	var kb [shardPrefixLen + 1 + 8 + 1]byte
	bodyKey := appendEventKey(kb[:0], f.shard, seq, partBody)
	if !it.SeekGE(bodyKey) || !bytes.Equal(it.Key(), bodyKey) {
		return false, it.Error()
	}
	body, err := it.ValueAndErr()
	if err != nil {
		return false, err
	}
	// The one copy of the event's bytes: body is iterator memory, valid only until Next, and
	// the record's Key, Payload and header values alias this copy.
	body = bytes.Clone(body)
	statusKey := bodyKey
	statusKey[len(statusKey)-1] = partStatus
	if !it.Next() || !bytes.Equal(it.Key(), statusKey) {
		if err := it.Error(); err != nil {
			return false, err
		}
		return false, fmt.Errorf("%w: shard %d: event %d has a body but no status", ErrCorrupt, f.shard, seq)
	}
	st, err := it.ValueAndErr()
	if err != nil {
		return false, err
	}
	if err := decodeRecord(seq, body, st, rec); err != nil {
		return false, fmt.Errorf("raftfsm: shard %d: %w", f.shard, err)
	}
	return true, nil
}

// ReadForFire appends to out the records of seqs, for the firing path: one iterator and one
// seek per seq, in seq order. It sorts seqs in place. Records no longer Scheduled are returned
// with their state, so the caller skips them; seqs with no event are left out.
func (f *FSM) ReadForFire(seqs []uint64, out []Record) (_ []Record, err error) {
	if len(seqs) == 0 {
		return out, nil
	}
	slices.Sort(seqs)
	lower := appendShardTag(nil, f.shard, tagEvent)
	upper := appendShardTag(nil, f.shard, tagEvent+1)
	it, err := f.newIter(lower, upper)
	if err != nil {
		return out, err
	}
	defer closeIter(it, &err)
	for i, seq := range seqs {
		if i > 0 && seq == seqs[i-1] {
			continue
		}
		var rec Record
		found, err := f.readEvent(it, seq, &rec)
		if err != nil {
			return out, err
		}
		if found {
			out = append(out, rec)
		}
	}
	return out, nil
}

// ForEachPending calls fn for every pending event in due order (ties by seq), from one
// consistent view of the shard. It stops at, and returns, the first error fn returns. fn must
// not block on the apply goroutine.
func (f *FSM) ForEachPending(fn func(seq uint64, due int64) error) (err error) {
	it, err := f.newIter(appendShardTag(nil, f.shard, tagDue), appendShardTag(nil, f.shard, tagDue+1))
	if err != nil {
		return err
	}
	defer closeIter(it, &err)
	for valid := it.First(); valid; valid = it.Next() {
		due, seq, err := parseDueKey(it.Key())
		if err != nil {
			return err
		}
		if err := fn(seq, due); err != nil {
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
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(k)))])
		h.Write(k)
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(v)))])
		h.Write(v)
	}
	return applied, h.Sum64(), it.Error()
}
