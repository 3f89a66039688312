package raftfsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// Retention. A settled event keeps its id, body and status so that a re-send is still
// answered with the original event (invariant 6) and Get still shows the outcome; the leader
// removes it once the retention has passed, with an Expire entry that every replica applies
// identically. The settled-time index (shard|'x'|settledAt|seq, holding the due time, which
// names the body) lists settled events in the order they expire, so the clean-up is a walk
// from its start, and each event's other keys are found from it: the body by due and seq,
// the id inside the body, the status by seq.

// settledEntry is one entry of the settled-time index written in the current batch.
type settledEntry struct {
	at, due int64
	seq     uint64
	gone    bool // expired later in the same batch
}

func (e settledEntry) compare(o settledEntry) int {
	return cmp.Or(cmp.Compare(orderedDue(e.at), orderedDue(o.at)), cmp.Compare(e.seq, o.seq))
}

// expire removes the events settled before c.Before, oldest first, at most c.Limit. It takes
// them from the committed index (from xFrom, past what this batch expired already) and from
// what this batch settled, merged in key order, so that the entry removes the same events
// whether raft hands it to ApplyBatch alone or behind the entries before it.
func (a *applier) expire(c *Expire) *ExpireResult {
	limit := int(c.Limit)
	committed := a.committedExpired(c.Before, limit)
	var fresh []*settledEntry // what this batch settled, not yet removed
	for i := range a.settledNow {
		if e := &a.settledNow[i]; !e.gone && e.at < c.Before {
			fresh = append(fresh, e)
		}
	}
	slices.SortFunc(fresh, func(x, y *settledEntry) int { return x.compare(*y) })
	n := 0
	for len(committed)+len(fresh) > 0 && n < limit {
		if len(fresh) == 0 || (len(committed) > 0 && committed[0].compare(*fresh[0]) < 0) {
			e := committed[0]
			committed = committed[1:]
			a.xFrom = appendSettledKey(a.xFrom[:0], a.f.shard, e.at, e.seq+1)
			a.reclaimed += a.remove(e, true)
		} else {
			fresh[0].gone = true
			a.reclaimed += a.remove(*fresh[0], false)
			fresh = fresh[1:]
		}
		n++
	}
	a.m.expired += uint64(n)
	return &ExpireResult{Expired: uint32(n)}
}

// committedExpired reads up to limit committed settled-index entries before before, from
// xFrom on, leaving out the events a REPLACE removed earlier in this batch (renew): their
// index entries are deleted in this batch, not yet in the committed index.
func (a *applier) committedExpired(before int64, limit int) []settledEntry {
	lo := a.xFrom
	if len(lo) == 0 {
		lo = appendShardTag(nil, a.f.shard, tagSettled)
	}
	hi := appendSettledKey(nil, a.f.shard, before, 0)
	var out []settledEntry
	it := a.iter()
	for ok := it.SeekGE(lo); ok && len(out) < limit && bytes.Compare(it.Key(), hi) < 0; ok = it.Next() {
		at, seq, due, err := parseSettled(it.Key(), it.Value())
		if err != nil {
			a.fatal("%v", err)
		}
		if s, ok := a.statuses[seq]; ok && s.state == 0 {
			continue
		}
		out = append(out, settledEntry{at: at, due: due, seq: seq})
	}
	if err := it.Error(); err != nil {
		a.fatal("read the settled index: %v", err)
	}
	return out
}

// remove deletes one settled event's keys and marks it gone in the overlays, and returns the
// bytes of keys and values it removed. With committed, the settled-index entry is left to
// the range deletion write issues for the index's consumed head (up to xFrom): walks of the
// index from its start then step over one range tombstone instead of one point tombstone per
// event removed so far.
func (a *applier) remove(e settledEntry, committed bool) (reclaimed uint64) {
	bodyKey := appendBodyKey(nil, a.f.shard, e.due, e.seq)
	id, bodyLen, ok := a.bodyID(bodyKey, e.seq)
	if !ok {
		a.fatal("settled event %d (due %d) has no body", e.seq, e.due)
	}
	a.del(bodyKey)
	a.key = appendIDKey(a.key[:0], a.f.shard, id)
	a.del(a.key)
	a.key = appendStatusKey(a.key[:0], a.f.shard, e.seq)
	a.del(a.key)
	if !committed {
		a.key = appendSettledKey(a.key[:0], a.f.shard, e.at, e.seq)
		a.del(a.key)
	}
	a.ids[id] = idRef{}
	a.statuses[e.seq] = status{}
	// The status value is not read for this count: a seek per event for a metric.
	return uint64(len(bodyKey) + bodyLen + shardPrefixLen + 1 + len(id) + idRefLen +
		shardPrefixLen + 9 + dueKeyLen + 8)
}

// bodyID reads the id out of the body under key: committed, or created in this batch (then
// its length is not known, and counts as 0).
func (a *applier) bodyID(key []byte, seq uint64) (id string, n int, ok bool) {
	if v, found := a.get(key); found {
		d := decoder{b: v}
		d.byte1("format")
		id = d.str("id")
		if d.err != nil {
			a.fatal("event %d: %v: body: %v", seq, ErrCorrupt, d.err)
		}
		return id, len(v), true
	}
	for id, ref := range a.ids { // created in this batch: rare, so a scan
		if ref.seq == seq {
			return id, 0, true
		}
	}
	return "", 0, false
}

// ReclaimedBytes is the size of the keys and values Expire has removed on this replica
// since the FSM opened. It is a measure, not state (an event created in the same batch that
// removes it counts without its body), so it is kept apart from Stats.
func (f *FSM) ReclaimedBytes() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.reclaimed
}

// OldestSettled returns when the longest-retained settled event settled (unix ns); ok is
// false when no settled event is stored. The leader proposes Expire only when it is past
// the retention, and the clean-up lag is measured from it.
func (f *FSM) OldestSettled() (at int64, ok bool, err error) {
	lo := appendShardTag(nil, f.shard, tagSettled)
	it, err := f.newIter(lo, appendShardTag(nil, f.shard, tagSettled+1))
	if err != nil {
		return 0, false, err
	}
	defer closeIter(it, &err)
	if !it.First() {
		return 0, false, it.Error()
	}
	at, _, _, err = parseSettled(it.Key(), it.Value())
	return at, err == nil, err
}

// upgradeLayout converts a shard stored in key layout 2 to layout 3: it writes the
// settled-time index from the statuses, in batches, and the meta in layout 3 with the last
// one. A crash part way leaves the meta in layout 2, and the next open starts again (the
// entries it writes are the same). Every replica derives the same entries from the same
// state, so their key spaces stay identical. Called before raft applies anything: from
// NewFSM, and by Restore after a layout 2 stream.
func (f *FSM) upgradeLayout() error {
	if f.meta.layout >= layoutV3 || f.restoring {
		return nil
	}
	lo, hi := appendShardTag(nil, f.shard, tagStatus), appendShardTag(nil, f.shard, tagStatus+1)
	it, err := f.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	// Close's error is the iterator's, it.Error, checked after the loop; a
	// batch's Close fails only for one closed twice.
	defer func() { _ = it.Close() }()
	b := f.db.NewBatch()
	defer func() { _ = b.Close() }()
	var key []byte
	var due [8]byte
	for ok := it.First(); ok; ok = it.Next() {
		s, err := decodeStatus(it.Value())
		if err != nil {
			return fmt.Errorf("raftfsm: shard %d: upgrading to key layout 3: %w", f.shard, err)
		}
		seq := binary.BigEndian.Uint64(it.Key()[shardPrefixLen+1:])
		key = appendSettledKey(key[:0], f.shard, s.settledAt(), seq)
		binary.BigEndian.PutUint64(due[:], uint64(s.due))
		if err := b.Set(key, due[:], nil); err != nil {
			return err
		}
		if b.Len() > restoreBatchBytes {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			_ = b.Close() // committed; fails only for a batch closed twice
			b = f.db.NewBatch()
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	m := f.meta
	m.layout = layoutV4
	if err := b.Set(appendShardTag(nil, f.shard, tagMeta), m.append(nil), nil); err != nil {
		return err
	}
	// Pebble has no WAL and flushes memtables in order: a crash keeps a prefix of these
	// batches and of the applies after them, so a layout 3 meta never survives without the
	// index before it.
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	f.mu.Lock()
	f.meta = m
	f.mu.Unlock()
	return nil
}
