package raftfsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// Query selects stored events: pending ones and settled ones still retained. Every field
// narrows the selection; the zero Query with Due set to AnyDue selects every event.
type Query struct {
	// Prefix keeps the events whose id starts with it.
	Prefix string
	// Topic keeps the events produced (or to be produced) to it.
	Topic string
	// States keeps the events in one of these states; zero keeps every state.
	States StateSet
	// Due keeps the events due in [Due.From, Due.To).
	Due DueRange
	// Priorities keeps the events of one of these priorities; zero keeps every priority. An
	// event's priority is its Policy's: DefaultPriority for one scheduled without any.
	Priorities PrioritySet
}

// PrioritySet is a set of priorities (0 to MaxPriority), one bit each.
type PrioritySet uint16

// PrioritiesOf returns the set holding ps, which are at most MaxPriority.
func PrioritiesOf(ps ...uint8) PrioritySet {
	var s PrioritySet
	for _, p := range ps {
		s |= 1 << p
	}
	return s
}

// Has reports whether the set holds p; the empty set stands for every priority.
func (s PrioritySet) Has(p uint8) bool { return s == 0 || s&(1<<p) != 0 }

// StateSet is a set of States, one bit each.
type StateSet uint8

// StatesOf returns the set holding states.
func StatesOf(states ...State) StateSet {
	var s StateSet
	for _, st := range states {
		s |= 1 << st
	}
	return s
}

// Has reports whether the set holds st; the empty set stands for every state.
func (s StateSet) Has(st State) bool { return s == 0 || s&(1<<st) != 0 }

// OnlyPending reports whether the set holds Scheduled and no other state.
func (s StateSet) OnlyPending() bool { return s == 1<<StateScheduled }

// DueRange is the half-open range of due times [From, To), in unix ns.
type DueRange struct{ From, To int64 }

// AnyDue holds every due time an event can have.
var AnyDue = DueRange{From: math.MinInt64, To: math.MaxInt64}

func (r DueRange) has(due int64) bool { return due >= r.From && due < r.To }

func (r DueRange) unbounded() bool { return r == AnyDue }

// Matches reports whether rec is selected by q.
func (q *Query) Matches(rec *Record) bool {
	return strings.HasPrefix(rec.ID, q.Prefix) && (q.Topic == "" || rec.Topic == q.Topic) &&
		q.States.Has(rec.State) && q.Due.has(rec.Due) && q.Priorities.Has(rec.Priority)
}

// bodyFiltered reports whether q selects by what only an event's body holds: its topic or
// its priority.
func (q *Query) bodyFiltered() bool { return q.Topic != "" || q.Priorities != 0 }

// Position is a place in the order List returns events in: by due time, then by id. A List
// from a position returns the events after it, so a page that ended at an event continues
// from it, on any replica and after any leader change, whatever was added or removed since.
type Position struct {
	Due int64
	ID  string
}

// Less orders positions as List does.
func (p Position) Less(o Position) bool {
	return p.Due < o.Due || p.Due == o.Due && p.ID < o.ID
}

// Listed is an event as List finds it, before its record is read: what a bulk cancel needs.
type Listed struct {
	Position
	Seq   uint64
	State State
	// Policy is set by markPending, for a pending event.
	Policy Policy
}

// prefixScanLimit is how many id entries List reads under a prefix before it walks the shard
// in due order instead. Under the limit, the matches are gathered from the id index (one entry
// each, holding the due time) and sorted, so a narrow prefix costs its own size whatever the
// shard holds; past it, the prefix is broad enough that a walk in due order meets a page of
// matches soon (with 10M events, a prefix matching more than 1% of them has a match every
// 100 bodies).
const prefixScanLimit = 100_000

// List returns up to limit events selected by q, after the position after (from the start
// when nil), ordered by due time, then by id, with their full records. It reads one
// consistent view of the shard.
func (f *FSM) List(q Query, after *Position, limit int) ([]Record, error) {
	var out []Record
	err := f.list(q, after, limit, func(l Listed, body []byte, st status) error {
		var rec Record
		if err := decodeRecord(l.Seq, bytes.Clone(body), st, &rec); err != nil {
			return fmt.Errorf("raftfsm: shard %d: %w", f.shard, err)
		}
		out = append(out, rec)
		return nil
	})
	return out, err
}

// ListRefs is List without the records: each event's position, seq and state.
func (f *FSM) ListRefs(q Query, after *Position, limit int) ([]Listed, error) {
	var out []Listed
	err := f.list(q, after, limit, func(l Listed, _ []byte, _ status) error {
		out = append(out, l)
		return nil
	})
	return out, err
}

// listView is one consistent view of a shard for a query: an iterator per index, cloned from
// one another so that they see the same state.
type listView struct {
	f                       *FSM
	ids, bodies, due, stats *pebble.Iterator
	key                     []byte
}

func (f *FSM) openList() (*listView, error) {
	v := &listView{f: f}
	var err error
	if v.bodies, err = f.newIter(f.spanStart, f.spanEnd); err != nil {
		return nil, err
	}
	clone := func() (*pebble.Iterator, error) { return v.bodies.Clone(pebble.CloneOptions{}) }
	if v.ids, err = clone(); err == nil {
		if v.due, err = clone(); err == nil {
			v.stats, err = clone()
		}
	}
	if err != nil {
		v.close(&err)
		return nil, err
	}
	return v, nil
}

func (v *listView) close(err *error) {
	for _, it := range []*pebble.Iterator{v.ids, v.bodies, v.due, v.stats} {
		if it != nil {
			closeIter(it, err)
		}
	}
}

// status returns the status of event seq due at due: {Scheduled, due} while its due-index
// key exists, its stored status otherwise.
func (v *listView) status(seq uint64, due int64) (status, error) {
	v.key = appendDueKey(v.key[:0], v.f.shard, due, seq)
	if v.due.SeekPrefixGE(v.key) && bytes.Equal(v.due.Key(), v.key) {
		return status{state: StateScheduled, due: due}, nil
	}
	if err := v.due.Error(); err != nil {
		return status{}, err
	}
	return v.settled(seq)
}

// settled reads the stored status of event seq, which is not pending.
func (v *listView) settled(seq uint64) (status, error) {
	v.key = appendStatusKey(v.key[:0], v.f.shard, seq)
	if !v.stats.SeekGE(v.key) || !bytes.Equal(v.stats.Key(), v.key) {
		if err := v.stats.Error(); err != nil {
			return status{}, err
		}
		return status{}, fmt.Errorf("%w: shard %d: event %d is neither pending nor settled", ErrCorrupt, v.f.shard, seq)
	}
	st, err := decodeStatus(v.stats.Value())
	if err != nil {
		return status{}, fmt.Errorf("raftfsm: shard %d: event %d: %w", v.f.shard, seq, err)
	}
	return st, nil
}

// body returns the body of event seq due at due, valid until the next call.
func (v *listView) body(seq uint64, due int64) ([]byte, error) {
	v.key = appendBodyKey(v.key[:0], v.f.shard, due, seq)
	if !v.bodies.SeekGE(v.key) || !bytes.Equal(v.bodies.Key(), v.key) {
		if err := v.bodies.Error(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: shard %d: event %d due %d has no body", ErrCorrupt, v.f.shard, seq, due)
	}
	return v.bodies.Value(), nil
}

// prefixRange bounds the id iterator to the id entries starting with prefix.
func (v *listView) prefixRange(prefix string) {
	v.ids.SetBounds(idPrefixSpan(v.f.shard, prefix))
}

// idPrefixSpan returns [lower, upper) covering the id entries of shard whose id starts with
// prefix.
func idPrefixSpan(shard uint32, prefix string) (lower, upper []byte) {
	lower = appendIDKey(nil, shard, prefix)
	if upper = prefixEnd(lower); upper == nil {
		upper = appendShardTag(nil, shard, tagID+1)
	}
	return lower, upper
}

// broadPrefix reports whether the sstables say that the id index holds more than twice
// scanLimit (prefixScanLimit) entries under prefix, so that List walks in due order at once
// instead of reading scanLimit entries first to learn it. It is an estimate from the share of
// the id index's bytes under the prefix (memtables are not counted), and only saves time: a
// prefix it does not call broad is still given up after scanLimit entries.
func (f *FSM) broadPrefix(prefix string, scanLimit int) bool {
	ids := f.Stats()
	n := ids.Pending + ids.Retained
	if n <= uint64(2*scanLimit) {
		return false
	}
	under, err := f.db.EstimateDiskUsage(idPrefixSpan(f.shard, prefix))
	if err != nil || under == 0 {
		return false
	}
	all, err := f.db.EstimateDiskUsage(appendShardTag(nil, f.shard, tagID), appendShardTag(nil, f.shard, tagID+1))
	if err != nil || all == 0 {
		return false
	}
	return float64(under)/float64(all)*float64(n) > float64(2*scanLimit)
}

// prefixEnd returns the least key greater than every key starting with p, or nil when p is
// all 0xff.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// list calls emit with each of the first limit events q selects after after, in order, with
// the body (valid only during the call) and status it read.
func (f *FSM) list(q Query, after *Position, limit int, emit func(Listed, []byte, status) error) (err error) {
	if limit <= 0 {
		return nil
	}
	v, err := f.openList()
	if err != nil {
		return err
	}
	defer v.close(&err)
	scanLimit := prefixScanLimit
	if k := f.st.knobs.PrefixScanLimit; k != nil {
		scanLimit = k()
	}
	if q.Prefix != "" && !f.broadPrefix(q.Prefix, scanLimit) {
		refs, complete, err := v.prefixRefs(q, after, scanLimit)
		if err != nil {
			return err
		}
		if complete {
			return v.emitRefs(q, refs, limit, emit)
		}
	}
	return v.walkDue(q, after, limit, emit)
}

// prefixRefs gathers the positions and seqs of the id entries under q.Prefix due in q.Due and
// after after, in order; complete is false when there were more than scanLimit entries.
func (v *listView) prefixRefs(q Query, after *Position, scanLimit int) (refs []Listed, complete bool, err error) {
	v.prefixRange(q.Prefix)
	n := 0
	for valid := v.ids.First(); valid; valid = v.ids.Next() {
		if n++; n > scanLimit {
			return nil, false, nil
		}
		ref, err := decodeIDRef(v.ids.Value())
		if err != nil {
			return nil, false, fmt.Errorf("raftfsm: shard %d: id %q: %w", v.f.shard, v.ids.Key()[shardPrefixLen+1:], err)
		}
		if !q.Due.has(ref.due) {
			continue
		}
		p := Position{Due: ref.due, ID: string(v.ids.Key()[shardPrefixLen+1:])}
		if after != nil && !after.Less(p) {
			continue
		}
		refs = append(refs, Listed{Position: p, Seq: ref.seq})
	}
	if err := v.ids.Error(); err != nil {
		return nil, false, err
	}
	slices.SortFunc(refs, func(a, b Listed) int {
		return cmp.Or(cmp.Compare(a.Due, b.Due), strings.Compare(a.ID, b.ID))
	})
	return refs, true, nil
}

// emitRefs reads each of refs (in order) until limit of them match q's states, topic and
// priorities.
func (v *listView) emitRefs(q Query, refs []Listed, limit int, emit func(Listed, []byte, status) error) error {
	n := 0
	for _, l := range refs {
		st, err := v.status(l.Seq, l.Due)
		if err != nil {
			return err
		}
		if !q.States.Has(st.state) {
			continue
		}
		b, err := v.body(l.Seq, l.Due)
		if err != nil {
			return err
		}
		if q.bodyFiltered() {
			if _, ok, err := q.matchBody(b); err != nil {
				return fmt.Errorf("%w: shard %d: event %d: %v", ErrCorrupt, v.f.shard, l.Seq, err)
			} else if !ok {
				continue
			}
		}
		l.State = st.state
		if err := emit(l, b, st); err != nil {
			return err
		}
		if n++; n == limit {
			return nil
		}
	}
	return nil
}

// walkDue walks the bodies in due order from q's range (or after's due time) and emits the
// first limit that q selects. Bodies are ordered by due time, then seq, so the events due at
// the same instant as the last one taken are all read, and sorted by id, before it stops.
func (v *listView) walkDue(q Query, after *Position, limit int, emit func(Listed, []byte, status) error) error {
	type taken struct {
		Listed
		body []byte
		st   status
	}
	var out []taken
	err := v.scanDue(q, after, func(l Listed, b []byte, st status) bool {
		if len(out) >= limit && l.Due > out[len(out)-1].Due {
			return false
		}
		out = append(out, taken{Listed: l, body: bytes.Clone(b), st: st})
		return true
	})
	if err != nil {
		return err
	}
	slices.SortStableFunc(out, func(a, b taken) int {
		return cmp.Or(cmp.Compare(a.Due, b.Due), strings.Compare(a.ID, b.ID))
	})
	for i := range min(limit, len(out)) {
		if err := emit(out[i].Listed, out[i].body, out[i].st); err != nil {
			return err
		}
	}
	return nil
}

// scanDue calls fn with each event q selects after after, in the order of the bodies (due
// time, then seq), until fn returns false. The body is valid only during the call.
func (v *listView) scanDue(q Query, after *Position, fn func(Listed, []byte, status) bool) error {
	from := q.Due.From
	if after != nil && after.Due > from {
		from = after.Due
	}
	if from >= q.Due.To {
		return nil
	}
	upper := appendShardTag(nil, v.f.shard, tagBody+1)
	if q.Due.To != math.MaxInt64 {
		upper = appendBodyKey(nil, v.f.shard, q.Due.To, 0)
	}
	v.bodies.SetBounds(appendBodyKey(nil, v.f.shard, from, 0), upper)
	v.due.SetBounds(appendShardTag(nil, v.f.shard, tagDue), appendShardTag(nil, v.f.shard, tagDue+1))
	pending := forwardIter{it: v.due}
	prefix := []byte(q.Prefix)
	var dueKey []byte
	for valid := v.bodies.First(); valid; valid = v.bodies.Next() {
		k := v.bodies.Key()
		due, seq := int64(binary.BigEndian.Uint64(k[shardPrefixLen+1:])^1<<63), binary.BigEndian.Uint64(k[shardPrefixLen+9:])
		b := v.bodies.Value()
		id, ok, err := q.matchBody(b)
		if err != nil {
			return fmt.Errorf("%w: shard %d: event %d: %v", ErrCorrupt, v.f.shard, seq, err)
		}
		if !ok || !bytes.HasPrefix(id, prefix) {
			continue
		}
		if after != nil && due == after.Due && string(id) <= after.ID {
			continue
		}
		st := status{state: StateScheduled, due: due}
		dueKey = appendDueKey(dueKey[:0], v.f.shard, due, seq)
		if !pending.seekGE(dueKey) || !bytes.Equal(v.due.Key(), dueKey) {
			if err := v.due.Error(); err != nil {
				return err
			}
			if st, err = v.settled(seq); err != nil {
				return err
			}
		}
		if !q.States.Has(st.state) {
			continue
		}
		if !fn(Listed{Position: Position{Due: due, ID: string(id)}, Seq: seq, State: st.state}, b, st) {
			return nil
		}
	}
	return v.bodies.Error()
}

// bodyIDTopic reads an event's id and topic from its body without decoding the rest.
func bodyIDTopic(b []byte) (id, topic []byte, err error) {
	d := decoder{b: b}
	d.bodyFormat()
	id = d.bytes("id")
	d.varint("createdAt")
	topic = d.bytes("topic")
	return id, topic, d.err
}

// matchBody reads an event's id from its body and reports whether q's topic and priorities
// select it, decoding no more than that: the id and topic head the body; the priority, only
// when q names priorities, is in a format 3 or 4 body's tail, reached by skipping the key,
// payload and headers by their lengths (a body of format 1 or 2 has DefaultPriority).
func (q *Query) matchBody(b []byte) (id []byte, ok bool, err error) {
	d := decoder{b: b}
	format := d.bodyFormat()
	id = d.bytes("id")
	d.varint("createdAt")
	topic := d.bytes("topic")
	switch {
	case d.err != nil:
		return nil, false, d.err
	case q.Topic != "" && string(topic) != q.Topic:
		return id, false, nil
	case q.Priorities == 0:
		return id, true, nil
	}
	if format < formatV3 {
		return id, q.Priorities.Has(DefaultPriority), nil
	}
	d.skipContent()
	_, p, _ := d.bodyTail(format)
	if d.err != nil {
		return nil, false, d.err
	}
	return id, q.Priorities.Has(p.Priority), nil
}

// Count returns how many events q selects, from one consistent view of the shard. Its cost
// is the part of the shard it reads: the counters alone for a query by state (pending, or
// every state), the id index under a prefix (and each match's state or body when the query
// names states, a topic or priorities), the due index for pending events in a due range (and
// each one's policy there when the query names priorities), and the bodies otherwise.
func (f *FSM) Count(q Query) (n uint64, err error) {
	if q.Prefix == "" && !q.bodyFiltered() && q.Due.unbounded() {
		st := f.Stats()
		switch q.States {
		case 0:
			return st.Pending + st.Retained, nil
		case StatesOf(StateScheduled):
			return st.Pending, nil
		}
	}
	v, err := f.openList()
	if err != nil {
		return 0, err
	}
	defer v.close(&err)
	switch {
	case q.Prefix != "":
		return v.countPrefix(q)
	case q.Topic == "" && q.States.OnlyPending():
		return v.countPending(q.Due, q.Priorities)
	}
	err = v.scanDue(q, nil, func(Listed, []byte, status) bool { n++; return true })
	return n, err
}

func (v *listView) countPrefix(q Query) (n uint64, err error) {
	v.prefixRange(q.Prefix)
	plain := !q.bodyFiltered() && q.States == 0
	for valid := v.ids.First(); valid; valid = v.ids.Next() {
		if plain && q.Due.unbounded() {
			n++
			continue
		}
		ref, err := decodeIDRef(v.ids.Value())
		if err != nil {
			return 0, fmt.Errorf("raftfsm: shard %d: id %q: %w", v.f.shard, v.ids.Key()[shardPrefixLen+1:], err)
		}
		if !q.Due.has(ref.due) {
			continue
		}
		if !plain {
			st, err := v.status(ref.seq, ref.due)
			if err != nil {
				return 0, err
			}
			if !q.States.Has(st.state) {
				continue
			}
			if q.bodyFiltered() {
				b, err := v.body(ref.seq, ref.due)
				if err != nil {
					return 0, err
				}
				if _, ok, err := q.matchBody(b); err != nil {
					return 0, fmt.Errorf("%w: shard %d: event %d: %v", ErrCorrupt, v.f.shard, ref.seq, err)
				} else if !ok {
					continue
				}
			}
		}
		n++
	}
	return n, v.ids.Error()
}

// countPending counts the pending events due in r whose priority ps holds, from the due
// index alone: a due-index value holds the event's policy.
func (v *listView) countPending(r DueRange, ps PrioritySet) (n uint64, err error) {
	upper := appendShardTag(nil, v.f.shard, tagDue+1)
	if r.To != math.MaxInt64 {
		upper = appendDueKey(nil, v.f.shard, r.To, 0)
	}
	v.due.SetBounds(appendDueKey(nil, v.f.shard, r.From, 0), upper)
	for valid := v.due.First(); valid; valid = v.due.Next() {
		if ps != 0 {
			p, err := decodeDueValue(v.due.Value())
			if err != nil {
				return 0, fmt.Errorf("raftfsm: shard %d: %w", v.f.shard, err)
			}
			if !ps.Has(p.Priority) {
				continue
			}
		}
		n++
	}
	return n, v.due.Error()
}

// PendingUnder returns up to limit pending events whose id starts with q.Prefix and comes
// after afterID (from the first when afterID is ""), in id order, that q's due range and
// topic and priorities select (q.States is ignored: only pending events are returned). It is what a bulk
// cancel by prefix walks: the id index in key order, which needs no bodies, and the due
// index for each candidate, so that a step costs its own matches however many events of the
// prefix were cancelled before it, where a walk in due order would read every body between
// one step's matches and the next.
func (f *FSM) PendingUnder(q Query, afterID string, limit int) (out []Listed, err error) {
	if limit <= 0 {
		return nil, nil
	}
	v, err := f.openList()
	if err != nil {
		return nil, err
	}
	defer v.close(&err)
	v.prefixRange(q.Prefix)
	valid := v.ids.First()
	if afterID != "" {
		valid = v.ids.SeekGE(appendIDKey(nil, f.shard, afterID+"\x00"))
	}
	cands := make([]Listed, 0, limit)
	for valid && len(out) < limit {
		cands = cands[:0]
		for ; valid && len(cands) < limit; valid = v.ids.Next() {
			ref, err := decodeIDRef(v.ids.Value())
			if err != nil {
				return nil, fmt.Errorf("raftfsm: shard %d: id %q: %w", f.shard, v.ids.Key()[shardPrefixLen+1:], err)
			}
			if q.Due.has(ref.due) {
				cands = append(cands, Listed{Position: Position{Due: ref.due, ID: string(v.ids.Key()[shardPrefixLen+1:])}, Seq: ref.seq})
			}
		}
		if err := v.ids.Error(); err != nil {
			return nil, err
		}
		if err := v.markPending(cands); err != nil {
			return nil, err
		}
		for _, c := range cands {
			if c.State != StateScheduled || len(out) == limit {
				continue
			}
			if !q.Priorities.Has(c.Policy.Priority) {
				// markPending read a pending event's policy from the due index.
				continue
			}
			if q.Topic != "" {
				b, err := v.body(c.Seq, c.Due)
				if err != nil {
					return nil, err
				}
				if _, topic, err := bodyIDTopic(b); err != nil {
					return nil, fmt.Errorf("%w: shard %d: event %d: %v", ErrCorrupt, f.shard, c.Seq, err)
				} else if string(topic) != q.Topic {
					continue
				}
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// markPending sets State (and Policy) on those of ls that are pending, reading the due index
// in due order. An entry with Seq 0 names no event (seqs start at 1) and is left alone.
func (v *listView) markPending(ls []Listed) error {
	ix := make([]int, len(ls))
	for i := range ix {
		ix[i] = i
	}
	slices.SortFunc(ix, func(a, b int) int {
		return cmp.Or(cmp.Compare(ls[a].Due, ls[b].Due), cmp.Compare(ls[a].Seq, ls[b].Seq))
	})
	for _, i := range ix {
		if ls[i].Seq == 0 {
			continue
		}
		v.key = appendDueKey(v.key[:0], v.f.shard, ls[i].Due, ls[i].Seq)
		// A point lookup: the sstables' bloom filters answer most misses without a
		// read, and the keys come in increasing order, which lets Pebble continue each
		// level's search from the last.
		if v.due.SeekPrefixGE(v.key) && bytes.Equal(v.due.Key(), v.key) {
			p, err := decodeDueValue(v.due.Value())
			if err != nil {
				return err
			}
			ls[i].State, ls[i].Policy = StateScheduled, p
		} else if err := v.due.Error(); err != nil {
			return err
		}
	}
	return nil
}
