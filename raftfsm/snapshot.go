package raftfsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/golang/snappy"
	"github.com/hashicorp/raft"
)

// Snapshot stream format; see doc.go.
const (
	snapshotMagic    = "chimesnp"
	snapshotRefMagic = "chimeref" // a reference; see FSM.Snapshot
	// snapshotFormat is the format written: 3 holds the current key layout, compressed
	// after the header. Format 2 streams (layout 2, uncompressed, from a leader running the version
	// before) are read too, and converted once restored (upgradeLayout); a format 1 stream
	// is refused.
	snapshotFormat    = 3
	snapshotFormatOld = 2
	snapshotHeaderLen = len(snapshotMagic) + 4 + 4 + 8 + 8

	// Bounds on one frame, enforced on both sides so that Persist never writes a stream
	// Restore would reject, and a corrupt length cannot make Restore allocate gigabytes.
	// Both are far above anything legal (an id is bounded by rpc, a payload by Kafka).
	maxSnapshotKey   = 1 << 20
	maxSnapshotValue = 256 << 20

	// restoreBatchBytes is how much a layout upgrade buffers before committing a Pebble
	// batch.
	restoreBatchBytes = 4 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadSnapshot wraps every reason Restore rejects a stream: wrong magic, format or shard,
// truncation, a bad frame, a checksum mismatch.
var ErrBadSnapshot = errors.New("raftfsm: bad snapshot")

// Snapshot makes what raft keeps as this shard's snapshot: a reference, not a copy. The
// shard's state already lives in Pebble, so the snapshot raft writes after every
// SnapshotThreshold entries only records "Pebble holds the log up to index I". Persist makes
// that true across a crash (it waits for a flush that covers I) before raft may truncate its
// log up to I (doc.go, invariant 4); it runs on raft's snapshot goroutine, so apply goes on
// meanwhile.
// Copying the whole shard instead cost a full write of every pending event each time
// (gigabytes at ten million), so snapshots were rare and a restart replayed the Raft log since
// the last one, which held 1.3 GB of a restarted node's memory in the log's file mapping.
//
// A reference cannot be sent to another replica. The shard owner's snapshot store expands it
// when raft opens it (WriteSnapshot writes the full stream), and raft on a follower stores and
// restores full streams.
//
// The reference records the FSM's applied index, not raft's: raft's snapshot index also
// counts the no-op and barrier entries it applied without the FSM, so after a leader change it
// is past anything Pebble records. At start the owner compares AppliedIndex with the
// reference's (ReadSnapshotHeader), and a reference is never restored over the Pebble it
// names: if Pebble is behind it, the state the reference stands for is lost, and the replica must
// not start on it.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	if f.restoring {
		return nil, fmt.Errorf("%w: shard %d", ErrRestoring, f.shard)
	}
	return refSnapshot{f: f, shard: f.shard, appliedIndex: f.meta.appliedIndex, appliedTerm: f.meta.appliedTerm}, nil
}

// refSnapshot is a snapshot reference: the snapshot header with the reference magic, then the
// CRC-32C of the header.
type refSnapshot struct {
	f                         *FSM
	shard                     uint32
	appliedIndex, appliedTerm uint64
}

// Persist waits until Pebble holds the shard's state up to appliedIndex durably
// (waitDurable), and then writes the reference. Only once Persist returns may raft discard the
// log entries that could re-create that state.
func (r refSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := r.f.waitDurable(r.appliedIndex); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftfsm: shard %d: persist snapshot reference at %d: %w", r.shard, r.appliedIndex, err)
	}
	h := appendSnapshotHeader(nil, snapshotRefMagic, r.shard, r.appliedIndex, r.appliedTerm)
	h = binary.BigEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
	if _, err := sink.Write(h); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftfsm: shard %d: persist snapshot reference at %d: %w", r.shard, r.appliedIndex, err)
	}
	return sink.Close()
}

func (refSnapshot) Release() {}

// waitDurable returns once Pebble holds the shard's state at index or later durably: after
// the flush that makes it so, Pebble's own or, after StoreOptions.SnapshotFlushWait or once
// Stopping is called, one it asks for.
func (f *FSM) waitDurable(index uint64) error {
	timeout := time.NewTimer(f.st.flushWait)
	defer timeout.Stop()
	for {
		next := f.st.nextFlush() // before the check, so that no flush falls between them
		durable, err := f.durableIndex()
		if err != nil {
			return err
		}
		if durable >= index {
			return nil
		}
		select {
		case <-next:
		case <-timeout.C:
			return f.st.flush()
		case <-f.stopping:
			return f.st.flush()
		}
	}
}

// durableIndex returns the applied index of the shard state that a crash would leave: the
// meta key as the flushed tables hold it, not counting the memtables.
func (f *FSM) durableIndex() (uint64, error) {
	it, err := f.db.NewIter(&pebble.IterOptions{
		OnlyReadGuaranteedDurable: true,
		LowerBound:                f.metaKey,
		UpperBound:                appendShardTag(nil, f.shard, tagMeta+1),
	})
	if err != nil {
		return 0, fmt.Errorf("raftfsm: shard %d: read durable meta: %w", f.shard, err)
	}
	defer func() { _ = it.Close() }() // its error is it.Error, checked below
	if !it.First() {
		return 0, it.Error()
	}
	m, err := decodeMeta(it.Value())
	if err != nil {
		return 0, fmt.Errorf("raftfsm: shard %d: durable meta: %w", f.shard, err)
	}
	return m.appliedIndex, nil
}

// IsSnapshotReference reports whether the stream in r (not consumed) is a snapshot reference
// written by Snapshot rather than a full snapshot stream.
func IsSnapshotReference(r *bufio.Reader) bool {
	magic, err := r.Peek(len(snapshotRefMagic))
	return err == nil && string(magic) == snapshotRefMagic
}

// WriteSnapshot writes the shard's whole current state to w as a full snapshot stream (the
// format Restore reads; see doc.go) and returns its header: the applied index and term it
// reflects, the index at or after that of any reference Snapshot returned before. It reads
// from a Pebble snapshot, so apply goes on meanwhile. The shard's snapshot store calls it to
// expand a reference, and a backup to copy the shard.
func (f *FSM) WriteSnapshot(w io.Writer) (SnapshotHeader, error) {
	f.mu.RLock()
	if f.restoring {
		f.mu.RUnlock()
		return SnapshotHeader{}, fmt.Errorf("%w: shard %d", ErrRestoring, f.shard)
	}
	snap := f.db.NewSnapshot()
	f.mu.RUnlock()
	defer func() { _ = snap.Close() }() // a Pebble snapshot's Close returns no error
	// The header must name the state the snapshot holds, which may be one apply past f.meta
	// (apply commits before it updates f.meta): read it from the snapshot itself.
	m := freshMeta()
	v, closer, err := snap.Get(f.metaKey)
	switch {
	case err == nil:
		m, err = decodeMeta(v)
		_ = closer.Close() // releases v; Pebble's Get closers return no error
		if err != nil {
			return SnapshotHeader{}, fmt.Errorf("raftfsm: shard %d: %w", f.shard, err)
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return SnapshotHeader{}, fmt.Errorf("raftfsm: shard %d: read meta: %w", f.shard, err)
	}
	s := &fsmSnapshot{snap: snap, shard: f.shard, appliedIndex: m.appliedIndex, appliedTerm: m.appliedTerm,
		spanStart: f.spanStart, spanEnd: f.spanEnd}
	if err := s.writeTo(w); err != nil {
		return SnapshotHeader{}, fmt.Errorf("raftfsm: shard %d: write snapshot at %d: %w", f.shard, m.appliedIndex, err)
	}
	return SnapshotHeader{Format: snapshotFormat, Shard: f.shard, AppliedIndex: m.appliedIndex, AppliedTerm: m.appliedTerm}, nil
}

// fsmSnapshot streams a shard's keys from a Pebble snapshot handle.
type fsmSnapshot struct {
	snap                      *pebble.Snapshot
	shard                     uint32
	appliedIndex, appliedTerm uint64
	spanStart, spanEnd        []byte
}

func appendSnapshotHeader(dst []byte, magic string, shard uint32, index, term uint64) []byte {
	dst = append(dst, magic...)
	dst = binary.BigEndian.AppendUint32(dst, snapshotFormat)
	dst = binary.BigEndian.AppendUint32(dst, shard)
	dst = binary.BigEndian.AppendUint64(dst, index)
	return binary.BigEndian.AppendUint64(dst, term)
}

func (s *fsmSnapshot) writeTo(w io.Writer) (err error) {
	var hdr [snapshotHeaderLen]byte
	b := appendSnapshotHeader(hdr[:0], snapshotMagic, s.shard, s.appliedIndex, s.appliedTerm)
	if _, err := w.Write(b); err != nil {
		return err
	}
	// Everything after the header is compressed (snappy's framing format, which checksums
	// each chunk): a shard's bodies, ids and index keys compress to about a third.
	zw := snappy.NewBufferedWriter(w)
	sw := snapWriter{w: zw, crc: crc32.Update(0, castagnoli, b)}
	it, err := s.snap.NewIter(&pebble.IterOptions{LowerBound: s.spanStart, UpperBound: s.spanEnd})
	if err != nil {
		return err
	}
	defer closeIter(it, &err)
	var frames uint64
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()[shardPrefixLen:]
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if len(k) > maxSnapshotKey || len(v) > maxSnapshotValue {
			return fmt.Errorf("key %x: %d-byte key or %d-byte value exceeds the snapshot frame limits", k, len(k), len(v))
		}
		if err := sw.frame(k, v); err != nil {
			return err
		}
		frames++
	}
	if err := it.Error(); err != nil {
		return err
	}
	if err := sw.uvarint(0); err != nil {
		return err
	}
	var tr [8]byte
	binary.BigEndian.PutUint64(tr[:], frames)
	if err := sw.write(tr[:]); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(tr[:4], sw.crc)
	if _, err := sw.w.Write(tr[:4]); err != nil {
		return err
	}
	return zw.Close() // flushes the last chunk; w stays open
}

// snapWriter checksums everything it writes.
type snapWriter struct {
	w   io.Writer
	crc uint32
	buf [binary.MaxVarintLen64]byte
}

func (w *snapWriter) write(p []byte) error {
	w.crc = crc32.Update(w.crc, castagnoli, p)
	_, err := w.w.Write(p)
	return err
}

func (w *snapWriter) uvarint(v uint64) error {
	return w.write(w.buf[:binary.PutUvarint(w.buf[:], v)])
}

func (w *snapWriter) frame(k, v []byte) error {
	if err := w.uvarint(uint64(len(k))); err != nil {
		return err
	}
	if err := w.write(k); err != nil {
		return err
	}
	if err := w.uvarint(uint64(len(v))); err != nil {
		return err
	}
	return w.write(v)
}

// Restore replaces the shard's state with the snapshot in rc, or leaves it exactly as it was.
// It first writes the stream's frames into sstables of its own beside Pebble's files,
// checking each frame as it goes (a known tag, keys in strictly increasing order, bounded
// lengths), then the trailer (frame count and checksum) and the meta's counters against the
// keys; only a stream that passes all of that replaces anything, and it does so in one step:
// Pebble ingests the tables and excises the shard's old keys atomically, and a flush makes it
// durable. A refused stream costs the staging files, which are deleted. Other shards' keys
// are never touched. On success it calls Observer.Reset, from which the owner may call
// LoadPending.
//
// A marker from a restore interrupted by the version before (which wiped the shard first)
// is inside the span, so a successful Restore removes it.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer func() { _ = rc.Close() }() // read only: a read error is what matters
	r := snapReader{br: bufio.NewReaderSize(rc, 256<<10)}
	h, err := r.header(f.shard)
	if err != nil {
		return fmt.Errorf("raftfsm: shard %d: restore: %w", f.shard, err)
	}
	if err := f.restoreFrom(&r, h.AppliedIndex, h.AppliedTerm); err != nil {
		return fmt.Errorf("raftfsm: shard %d: restore snapshot at %d: %w", f.shard, h.AppliedIndex, err)
	}
	f.newIDFilter(int(f.meta.pending + f.meta.retained()))
	f.obs.Reset()
	return nil
}

func (f *FSM) restoreFrom(r *snapReader, index, term uint64) error {
	st, err := f.st.newStaging(f.shard)
	if err != nil {
		return err
	}
	defer st.remove()
	if err := stageFrames(r, st, f.shard, index, term); err != nil {
		return err
	}
	if err := st.finish(); err != nil {
		return err
	}
	// Verified: from here the old state goes. Its in-memory mirrors go with it.
	f.stopPending() // rebuilt from the restored state by LoadPending or the next apply
	f.stopIDFilter()
	// Until loadOccurrences rebuilds them, apply reads schedules from Pebble, whichever
	// state a failure below leaves there.
	clear(f.occ.scheds)
	if err := f.st.install(st, f.spanStart, f.spanEnd); err != nil {
		return err
	}
	if err := f.load(); err != nil {
		return err
	}
	if err := f.upgradeLayout(); err != nil {
		return err
	}
	return f.loadOccurrences()
}

// VerifySnapshot reads the full snapshot stream in r to its end and checks it as Restore
// would, without a Pebble to restore into: the header names shard, every frame is well formed
// and in order, the trailer's frame count and checksum match, and the meta's counters agree
// with the keys. It returns the header. A backup is checked this way before it is laid out as
// a new node's data, so that a stream Restore would refuse is refused by name at once, not
// when the node first starts. Memory stays bounded by the largest frame.
func VerifySnapshot(r io.Reader, shard uint32) (SnapshotHeader, error) {
	sr := snapReader{br: bufio.NewReaderSize(r, 256<<10)}
	h, err := sr.header(shard)
	if err != nil {
		return h, err
	}
	return h, stageFrames(&sr, discardFrames{}, shard, h.AppliedIndex, h.AppliedTerm)
}

// SnapshotTarget is the topic an event or a recurring schedule of a full snapshot stream
// produces to, as VerifySnapshotTargets reports it.
type SnapshotTarget struct {
	// ID is the event's id or, when Schedule is set, the recurring schedule's: its
	// definition's topic is the one each occurrence it makes will have.
	ID       string
	Schedule bool
	Topic    string
}

// VerifySnapshotTargets checks the full snapshot stream of shard in r as VerifySnapshot does
// and, in the same pass, calls fn with the topic of each event (settled or pending) and of
// each recurring schedule's definition, in stream order, as it reads them: a restore checks
// them against the topics events may target without reading the stream twice. fn is called
// before the trailer is checked, so what it is told belongs to a stream that may yet be
// refused: it must act on nothing until VerifySnapshotTargets returns nil. An error from fn
// ends the read and is returned as it is. Memory stays bounded by the largest frame.
func VerifySnapshotTargets(r io.Reader, shard uint32, fn func(SnapshotTarget) error) (SnapshotHeader, error) {
	sr := snapReader{br: bufio.NewReaderSize(r, 256<<10)}
	h, err := sr.header(shard)
	if err != nil {
		return h, err
	}
	return h, stageFrames(&sr, targetFrames{fn}, shard, h.AppliedIndex, h.AppliedTerm)
}

// targetFrames hands each body's and definition's topic to fn. stageFrames checks a frame
// (checkFrame) before it gets here, so both decode.
type targetFrames struct{ fn func(SnapshotTarget) error }

func (t targetFrames) set(key, val []byte) error {
	switch k := key[shardPrefixLen:]; k[0] {
	case tagBody:
		id, topic, err := bodyIDTopic(val)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		return t.fn(SnapshotTarget{ID: string(id), Topic: string(topic)})
	case tagDefinition:
		d, err := decodeStoredDefinition(val)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		return t.fn(SnapshotTarget{ID: string(k[1:]), Schedule: true, Topic: d.Topic})
	}
	return nil
}

// SnapshotEvent is one event a full snapshot stream holds, as ForEachSnapshotEvent reports it.
type SnapshotEvent struct {
	ID    string
	Seq   uint64
	State State // StateScheduled for a pending event
	Due   int64 // unix ns
	// Version is the event's version (Record.Version).
	Version uint64
}

// ForEachSnapshotEvent reads the full snapshot stream of shard in r to its end, checking it as
// VerifySnapshot does, and calls fn with each event the stream holds, in id order: what a
// restore of it (a backup's shard file, say) would hold. It also checks that each event's keys
// agree: every body decodes, every id entry names a body that holds that id at that due, and
// every body has exactly one of a due-index key (pending) and a settled status of the same due.
//
// fn is called only once the whole stream has verified, so it never sees an event of a stream
// that is refused (ErrBadSnapshot, as VerifySnapshot). Until then every event's id, seq, due
// and state are held in memory (never a key, payload or header), a few dozen bytes an event.
// An error from fn ends the walk and is returned as it is. It returns the header.
func ForEachSnapshotEvent(r io.Reader, shard uint32, fn func(SnapshotEvent) error) (SnapshotHeader, error) {
	sr := snapReader{br: bufio.NewReaderSize(r, 256<<10)}
	h, err := sr.header(shard)
	if err != nil {
		return h, err
	}
	ev := eventFrames{bySeq: map[uint64]int{}}
	if err := stageFrames(&sr, &ev, shard, h.AppliedIndex, h.AppliedTerm); err != nil {
		return h, err
	}
	if err := ev.complete(); err != nil {
		return h, err
	}
	for _, i := range ev.byID {
		if err := fn(ev.events[i]); err != nil {
			return h, err
		}
	}
	return h, nil
}

// frameSink takes the frames of a stream being checked: a staging directory for Restore,
// nothing for VerifySnapshot, each topic for VerifySnapshotTargets, an index of its events
// for ForEachSnapshotEvent.
type frameSink interface {
	set(key, val []byte) error
}

type discardFrames struct{}

func (discardFrames) set(_, _ []byte) error { return nil }

// eventFrames joins a stream's keys into its events. Frames arrive in key order, so every
// body ('b') comes before the due-index keys ('d'), id entries ('i') and statuses ('s') that
// name it.
type eventFrames struct {
	events []SnapshotEvent
	hasID  []bool
	bySeq  map[uint64]int // seq → index in events
	byID   []int          // indexes in events, in the order of the id entries: id order
}

func (e *eventFrames) set(key, val []byte) error {
	k := key[shardPrefixLen:]
	switch k[0] {
	case tagBody:
		if len(key) != dueKeyLen {
			return fmt.Errorf("%w: body key %x is not a due and a seq", ErrBadSnapshot, k)
		}
		due, seq := int64(binary.BigEndian.Uint64(k[1:])^1<<63), binary.BigEndian.Uint64(k[9:])
		var rec Record
		if err := decodeRecord(seq, val, status{}, &rec); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		e.bySeq[seq] = len(e.events)
		e.events = append(e.events, SnapshotEvent{ID: rec.ID, Seq: seq, Due: due, Version: rec.Version})
		e.hasID = append(e.hasID, false)
	case tagDue:
		due, seq, err := parseDueKey(key)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		return e.settle(seq, due, StateScheduled, "due-index key")
	case tagID:
		ref, err := decodeIDRef(val)
		if err != nil {
			return fmt.Errorf("%w: id %q: %v", ErrBadSnapshot, k[1:], err)
		}
		i, ok := e.bySeq[ref.seq]
		if !ok || e.events[i].ID != string(k[1:]) || e.events[i].Due != ref.due {
			return fmt.Errorf("%w: id %q names seq %d due %d, which no body of that id holds", ErrBadSnapshot, k[1:], ref.seq, ref.due)
		}
		e.hasID[i] = true
		e.byID = append(e.byID, i)
	case tagStatus:
		if len(k) != 1+8 {
			return fmt.Errorf("%w: status key %x is not a seq", ErrBadSnapshot, k)
		}
		seq := binary.BigEndian.Uint64(k[1:])
		s, err := decodeStatus(val)
		if err != nil {
			return fmt.Errorf("%w: seq %d: %v", ErrBadSnapshot, seq, err)
		}
		if s.state == StateScheduled {
			return fmt.Errorf("%w: seq %d: a status says Scheduled; only a settled event has one", ErrBadSnapshot, seq)
		}
		return e.settle(seq, s.due, s.state, "status")
	}
	return nil
}

// settle gives the event of seq its state, from its due-index key or its status (what).
func (e *eventFrames) settle(seq uint64, due int64, st State, what string) error {
	i, ok := e.bySeq[seq]
	switch {
	case !ok:
		return fmt.Errorf("%w: seq %d: a %s and no body", ErrBadSnapshot, seq, what)
	case e.events[i].Due != due:
		return fmt.Errorf("%w: seq %d: its %s says due %d, its body's key %d", ErrBadSnapshot, seq, what, due, e.events[i].Due)
	case e.events[i].State != 0:
		return fmt.Errorf("%w: seq %d: both a due-index key and a status", ErrBadSnapshot, seq)
	}
	e.events[i].State = st
	return nil
}

// complete checks that every body had its id entry and a state. (Two bodies of one seq leave
// the first without either: bySeq names the second.)
func (e *eventFrames) complete() error {
	for i, ev := range e.events {
		switch {
		case !e.hasID[i]:
			return fmt.Errorf("%w: seq %d (id %q) has no id entry", ErrBadSnapshot, ev.Seq, ev.ID)
		case ev.State == 0:
			return fmt.Errorf("%w: seq %d (id %q) has neither a due-index key nor a status", ErrBadSnapshot, ev.Seq, ev.ID)
		}
	}
	return nil
}

// stageFrames reads every frame of r into st, checks the trailer and the meta frame against
// index and term, and the meta's counters against the keys.
func stageFrames(r *snapReader, st frameSink, shard uint32, index, term uint64) error {
	key := binary.BigEndian.AppendUint32(nil, shard) // every frame's key goes after this
	var prev, val []byte
	var frames uint64
	var m meta
	var perTag [256]uint64
	var maxSeq uint64 // the highest seq a key names
	var scheds scheduleFrames
	sawMeta := false
	for {
		var last bool
		var err error
		if key, val, last, err = r.frame(key, val, frames); err != nil {
			return err
		}
		if last {
			break
		}
		if frames > 0 && bytes.Compare(key, prev) <= 0 {
			return fmt.Errorf("%w: frame %d: key %x does not follow %x", ErrBadSnapshot, frames, key[shardPrefixLen:], prev[shardPrefixLen:])
		}
		prev = append(prev[:0], key...)
		if key[shardPrefixLen] == tagMeta {
			if m, err = checkMetaFrame(key, val, frames, index, term); err != nil {
				return err
			}
			sawMeta = true
		} else {
			seq, err := checkFrame(key, val)
			if err == nil {
				err = scheds.frame(key[shardPrefixLen:], seq)
			}
			if err != nil {
				return fmt.Errorf("%w: frame %d: key %x: %v", ErrBadSnapshot, frames, key[shardPrefixLen:], err)
			}
			maxSeq = max(maxSeq, seq)
		}
		perTag[key[shardPrefixLen]]++
		if err := st.set(key, val); err != nil {
			return err
		}
		frames++
	}
	if err := r.trailer(frames); err != nil {
		return err
	}
	if err := scheds.complete(); err != nil {
		return err
	}
	switch {
	case !sawMeta && index != 0:
		return fmt.Errorf("%w: no meta key in a snapshot at index %d", ErrBadSnapshot, index)
	case !sawMeta && frames != 0:
		// A shard holds a meta key from its first apply on: keys without one would be
		// restored under fresh counters that do not count them, and seqs handed out again.
		return fmt.Errorf("%w: %d keys and no meta key", ErrBadSnapshot, frames)
	case sawMeta && maxSeq >= m.nextSeq:
		return fmt.Errorf("%w: a key names seq %d, and the meta's next seq is %d: seqs would be handed out again", ErrBadSnapshot, maxSeq, m.nextSeq)
	case sawMeta:
		return checkMetaCounts(&m, &perTag)
	}
	return nil
}

// scheduleFrames checks a stream's recurring schedules: every cursor has a definition and
// every definition a cursor, and the occurrence a cursor names pending is a pending event (a
// due-index key), of no other cursor. Frames arrive in key order: cursors ('C'), then
// definitions ('R'), then the due index ('d').
type scheduleFrames struct {
	ids     []string          // the cursors' schedule ids, in order
	defs    int               // definitions seen
	pending map[uint64]string // pending occurrence seq → schedule id, until its due-index key
}

func (s *scheduleFrames) frame(k []byte, seq uint64) error {
	switch k[0] {
	case tagCursor:
		id := string(k[1:])
		s.ids = append(s.ids, id)
		if seq != 0 {
			if s.pending == nil {
				s.pending = make(map[uint64]string)
			}
			if other, dup := s.pending[seq]; dup {
				return fmt.Errorf("schedules %q and %q both name occurrence %d", other, id, seq)
			}
			s.pending[seq] = id
		}
	case tagDefinition:
		if s.defs >= len(s.ids) || s.ids[s.defs] != string(k[1:]) {
			return fmt.Errorf("schedule %q has a definition and no cursor", k[1:])
		}
		s.defs++
	case tagDue:
		delete(s.pending, seq)
	}
	return nil
}

func (s *scheduleFrames) complete() error {
	if s.defs != len(s.ids) {
		return fmt.Errorf("%w: schedule %q has a cursor and no definition", ErrBadSnapshot, s.ids[s.defs])
	}
	for seq, id := range s.pending {
		return fmt.Errorf("%w: schedule %q names occurrence %d, which is not pending", ErrBadSnapshot, id, seq)
	}
	return nil
}

// checkFrame checks that a frame other than the meta is one the shard can read back: its key
// has its tag's shape and its value decodes (a pending event has no status). It returns the
// seq the frame names. Restore checks this before anything changes, so that a stream that
// passes cannot make a later read fail or an apply stop the replica (an apply that cannot
// decode what it reads panics; see doc.go, invariant 2).
func checkFrame(key, val []byte) (seq uint64, err error) {
	k := key[shardPrefixLen:]
	switch k[0] {
	case tagBody:
		if len(key) != dueKeyLen {
			return 0, errors.New("a body key is a due and a seq")
		}
		if err := checkBody(val); err != nil {
			return 0, fmt.Errorf("body: %w", err)
		}
		return binary.BigEndian.Uint64(k[9:]), nil
	case tagDue:
		_, seq, err := parseDueKey(key)
		if err == nil {
			_, err = decodeDueValue(val)
		}
		return seq, err
	case tagSettled:
		_, seq, _, err := parseSettled(key, val)
		return seq, err
	case tagStatus:
		if len(k) != 1+8 {
			return 0, errors.New("a status key is a seq")
		}
		s, err := decodeStatus(val)
		if err == nil && s.state == StateScheduled {
			err = errors.New("a status says Scheduled; only a settled event has one")
		}
		return binary.BigEndian.Uint64(k[1:]), err
	case tagID:
		r, err := decodeIDRef(val)
		return r.seq, err
	case tagCursor:
		if len(k) < 2 {
			return 0, errors.New("a cursor key names a schedule")
		}
		c, err := decodeCursor(val)
		return c.pendingSeq, err
	case tagDefinition:
		if len(k) < 2 {
			return 0, errors.New("a definition key names a schedule")
		}
		_, err := decodeStoredDefinition(val)
		return 0, err
	}
	return 0, fmt.Errorf("no known tag") // frame refuses these before
}

// checkMetaCounts checks the meta's counters against the keys the stream
// held (perTag counts them by tag), by invariant 5, by every stored event
// keeping its id and body, and by seqs being dense: a checksum only says the
// stream arrived as sent, and the restored meta sizes what the FSM allocates
// (the id filter is sized by nextSeq).
func checkMetaCounts(m *meta, perTag *[256]uint64) error {
	// The sums below must not wrap: counters that add up only modulo 2^64 would pass the
	// comparisons with the keys (a next seq of 1 over a stream holding seq 1, say).
	settled, c1 := bits.Add64(m.fired, m.cancelled, 0)
	settled, c2 := bits.Add64(settled, m.deadLettered, 0)
	gone, c3 := bits.Add64(m.expired, m.renewed, 0)
	created, c4 := bits.Add64(m.pending, settled, 0)
	created, c5 := bits.Add64(created, m.replaced, 0)
	if c1|c2|c3|c4|c5 != 0 || created == math.MaxUint64 {
		return fmt.Errorf("%w: meta counters %+v overflow", ErrBadSnapshot, *m)
	}
	retained := m.retained()
	events := perTag[tagID]
	switch {
	case gone > settled:
		return fmt.Errorf("%w: meta counts %d expired and %d renewed events of %d settled", ErrBadSnapshot, m.expired, m.renewed, settled)
	case m.pending != perTag[tagDue]:
		return fmt.Errorf("%w: meta counts %d pending events, the stream holds %d due-index keys", ErrBadSnapshot, m.pending, perTag[tagDue])
	case retained != perTag[tagStatus]:
		return fmt.Errorf("%w: meta counts %d retained settled events, the stream holds %d status keys", ErrBadSnapshot, retained, perTag[tagStatus])
	case m.layout >= layoutV3 && retained != perTag[tagSettled]:
		return fmt.Errorf("%w: meta counts %d retained settled events, the stream holds %d settled-index keys", ErrBadSnapshot, retained, perTag[tagSettled])
	case m.layout == layoutV2 && perTag[tagSettled] != 0:
		return fmt.Errorf("%w: a key layout 2 stream holds %d settled-index keys", ErrBadSnapshot, perTag[tagSettled])
	case perTag[tagBody] != events || m.pending+retained != events:
		return fmt.Errorf("%w: the stream holds %d id keys and %d bodies for %d pending and %d retained settled events",
			ErrBadSnapshot, events, perTag[tagBody], m.pending, retained)
	case m.nextSeq != created+1:
		return fmt.Errorf("%w: meta's next seq is %d, and it counts %d events created", ErrBadSnapshot, m.nextSeq, created)
	}
	return nil
}

// frame reads the next frame of the stream into key (after the shard prefix it already
// holds) and val, reusing their storage; last is set at the end of the frames. A key with no
// known tag is refused.
func (r *snapReader) frame(key, val []byte, frames uint64) (_, _ []byte, last bool, err error) {
	n, err := r.length(maxSnapshotKey)
	if err != nil || n == 0 {
		return key, val, n == 0, err
	}
	if key, err = r.read(key[:shardPrefixLen], n); err != nil {
		return key, val, false, err
	}
	switch key[shardPrefixLen] {
	case tagBody, tagDue, tagID, tagMeta, tagStatus, tagSettled, tagCursor, tagDefinition:
	default:
		return key, val, false, fmt.Errorf("%w: frame %d: key %x has no known tag", ErrBadSnapshot, frames, key[shardPrefixLen:])
	}
	if n, err = r.length(maxSnapshotValue); err != nil {
		return key, val, false, err
	}
	val, err = r.read(val[:0], n)
	return key, val, false, err
}

// checkMetaFrame checks that a meta frame is the meta key and names the snapshot's index and
// term, and returns the meta.
func checkMetaFrame(key, val []byte, frames, index, term uint64) (meta, error) {
	if len(key) != shardPrefixLen+1 {
		return meta{}, fmt.Errorf("%w: frame %d: key %x is not the meta key", ErrBadSnapshot, frames, key[shardPrefixLen:])
	}
	m, err := decodeMeta(val)
	if err != nil {
		return meta{}, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if m.appliedIndex != index || m.appliedTerm != term {
		return meta{}, fmt.Errorf("%w: header says index %d term %d, meta says %d, %d", ErrBadSnapshot, index, term, m.appliedIndex, m.appliedTerm)
	}
	return m, nil
}

// snapReader checksums everything it reads, up to the checksum itself.
type snapReader struct {
	br  *bufio.Reader
	crc uint32
}

func truncated(err error) error {
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: truncated", ErrBadSnapshot)
	case errors.Is(err, snappy.ErrCorrupt) || errors.Is(err, snappy.ErrUnsupported):
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	return err
}

// read appends n bytes to dst. It grows dst as bytes arrive, so a corrupt length costs at
// most what the stream really holds.
func (r *snapReader) read(dst []byte, n uint64) ([]byte, error) {
	start := len(dst)
	for rem := n; rem > 0; {
		c := int(min(rem, 1<<20))
		l := len(dst)
		dst = slices.Grow(dst, c)[:l+c]
		if _, err := io.ReadFull(r.br, dst[l:]); err != nil {
			return dst, truncated(err)
		}
		rem -= uint64(c)
	}
	r.crc = crc32.Update(r.crc, castagnoli, dst[start:])
	return dst, nil
}

// length reads a uvarint frame length no greater than limit.
func (r *snapReader) length(limit uint64) (uint64, error) {
	var buf [binary.MaxVarintLen64]byte
	for i := range buf {
		c, err := r.br.ReadByte()
		if err != nil {
			return 0, truncated(err)
		}
		buf[i] = c
		if c < 0x80 {
			r.crc = crc32.Update(r.crc, castagnoli, buf[:i+1])
			v, n := binary.Uvarint(buf[:i+1])
			if n <= 0 {
				break
			}
			if v > limit {
				return 0, fmt.Errorf("%w: frame length %d exceeds %d", ErrBadSnapshot, v, limit)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: overlong varint", ErrBadSnapshot)
}

// header reads and checks the header of a full stream of shard, and makes r read the body
// after it.
func (r *snapReader) header(shard uint32) (SnapshotHeader, error) {
	b, err := r.read(make([]byte, 0, snapshotHeaderLen), uint64(snapshotHeaderLen))
	if err != nil {
		return SnapshotHeader{}, err
	}
	h, err := parseSnapshotHeader(b)
	switch {
	case err != nil:
		return h, err
	case h.Reference:
		return h, fmt.Errorf("%w: a snapshot reference, which only names an index of this replica's own state; the shard's snapshot store expands references into full streams", ErrBadSnapshot)
	case h.Shard != shard:
		return h, fmt.Errorf("%w: snapshot of shard %d", ErrBadSnapshot, h.Shard)
	}
	if h.Format >= snapshotFormat {
		r.br = bufio.NewReaderSize(snappy.NewReader(r.br), 256<<10)
	}
	return h, nil
}

// SnapshotHeader is what the header of a snapshot says: a reference (FSM.Snapshot) or a full
// stream (WriteSnapshot).
type SnapshotHeader struct {
	// Reference: the snapshot names a state of this replica's own Pebble and holds no data.
	Reference bool
	// Format is the stream's format version (a reference's is not checked).
	Format uint32
	Shard  uint32
	// AppliedIndex and AppliedTerm are the FSM's: the last log entry the state holds. raft's
	// index for the same snapshot (raft.SnapshotMeta.Index) may be higher, by the no-op and
	// barrier entries raft applied after it, which no FSM sees.
	AppliedIndex, AppliedTerm uint64
}

// ReadSnapshotHeader reads the header of the snapshot in r, and for a reference (which is
// nothing more) checks its checksum. Every reference written since references exist has this
// header, so a reference an older build kept reads the same.
func ReadSnapshotHeader(r io.Reader) (SnapshotHeader, error) {
	b := make([]byte, snapshotHeaderLen+4)
	if _, err := io.ReadFull(r, b[:snapshotHeaderLen]); err != nil {
		return SnapshotHeader{}, truncated(err)
	}
	h, err := parseSnapshotHeader(b[:snapshotHeaderLen])
	if err != nil || !h.Reference {
		return h, err
	}
	if _, err := io.ReadFull(r, b[snapshotHeaderLen:]); err != nil {
		return SnapshotHeader{}, truncated(err)
	}
	if got, want := binary.BigEndian.Uint32(b[snapshotHeaderLen:]), crc32.Checksum(b[:snapshotHeaderLen], castagnoli); got != want {
		return SnapshotHeader{}, fmt.Errorf("%w: reference checksum %08x, computed %08x", ErrBadSnapshot, got, want)
	}
	return h, nil
}

// parseSnapshotHeader parses the snapshotHeaderLen bytes of a header. A full stream must be in
// the format this build reads; a reference's format is not checked, since it carries no data
// (NewFSM checks the layout of the Pebble state it names).
func parseSnapshotHeader(b []byte) (SnapshotHeader, error) {
	var h SnapshotHeader
	switch string(b[:len(snapshotMagic)]) {
	case snapshotRefMagic:
		h.Reference = true
	case snapshotMagic:
	default:
		return h, fmt.Errorf("%w: not a chime shard snapshot", ErrBadSnapshot)
	}
	b = b[len(snapshotMagic):]
	h.Format = binary.BigEndian.Uint32(b)
	if h.Format != snapshotFormat && h.Format != snapshotFormatOld && !h.Reference {
		return h, fmt.Errorf("%w: format %d, this build reads %d and %d", ErrBadSnapshot, h.Format, snapshotFormatOld, snapshotFormat)
	}
	h.Shard = binary.BigEndian.Uint32(b[4:])
	h.AppliedIndex, h.AppliedTerm = binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
	return h, nil
}

// trailer checks the frame count and the checksum, and that nothing follows.
func (r *snapReader) trailer(frames uint64) error {
	var tr [8]byte
	if _, err := r.read(tr[:0], 8); err != nil {
		return err
	}
	if n := binary.BigEndian.Uint64(tr[:]); n != frames {
		return fmt.Errorf("%w: trailer counts %d frames, read %d", ErrBadSnapshot, n, frames)
	}
	want := r.crc
	if _, err := io.ReadFull(r.br, tr[:4]); err != nil {
		return truncated(err)
	}
	if got := binary.BigEndian.Uint32(tr[:4]); got != want {
		return fmt.Errorf("%w: checksum %08x, computed %08x", ErrBadSnapshot, got, want)
	}
	if _, err := r.br.ReadByte(); err != io.EOF {
		if err == nil {
			return fmt.Errorf("%w: bytes after the trailer", ErrBadSnapshot)
		}
		return truncated(err)
	}
	return nil
}
