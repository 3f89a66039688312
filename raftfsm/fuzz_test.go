package raftfsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/bits"
	"reflect"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The decoders of stored values and of snapshot streams read bytes another replica, a
// backup file or a damaged disk may hand them. Each must answer an error, never panic:
// apply turns a decode error into its own panic (invariant 2: a replica that cannot read its
// state must stop rather than diverge), but Get, List, a backup's verification and a restore
// must be able to refuse bad bytes and go on.

// FuzzDecodeStored: the id entry, meta, status, body, recurring definition and cursor
// decoders never panic, checkBody (what Restore checks a body with) answers as decodeBody
// does, and what they accept re-encodes to bytes that decode to the same value (one format,
// read and written alike). Not to the same bytes: the varint decoder accepts an overlong encoding of a number
// (0x80 0x00 for 0), which no encoder here writes; that is harmless, since every replica
// reads it as the same number.
func FuzzDecodeStored(f *testing.F) {
	ev := NewEvent{ID: "order-42", Topic: "t", Key: []byte("k"), Payload: []byte("p"),
		Headers: []Header{{Key: "h", Value: []byte("v")}}, ContentHash: 7}
	m := freshMeta()
	m.appliedIndex, m.pending, m.fired = 9, 3, 2
	st := status{state: StateFired, due: 5, firedAt: 6, attempts: 1}
	for _, b := range [][]byte{
		idRef{seq: 1, hash: 2, due: -3}.append(nil),
		m.append(nil),
		st.append(nil),
		appendBody(nil, &ev, 10, 1),
		appendBody(nil, &ev, 10, 7),
		appendBody(nil, &NewEvent{ID: "z", Topic: "t", Policy: DefaultPolicy, Output: Output{Partition: 3, HasPartition: true, Tombstone: true}}, 10, 1),
		appendStoredDefinition(nil, &Definition{Cron: "@daily", TimeZone: "Europe/Paris", CatchUp: CatchUpLast, Topic: "t",
			Payload: []byte("p"), Headers: []Header{{Key: "h", Value: []byte("v")}}}),
		(&cursor{state: ScheduleActive, version: 2, hash: 3, createdAt: 4, updatedAt: 5, after: 6, pendingSeq: 7, pendingAt: 8, pendingDue: 10, count: 9}).append(nil),
		(&cursor{state: SchedulePaused, version: 1, pausedAt: -1}).append(nil),
		{}, {formatV2}, {formatV1, 0xff, 0xff, 0xff, 0xff, 0x0f},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeIDRef(b); err == nil && !bytes.Equal(r.append(nil), b) {
			t.Fatalf("id entry %x decodes to %+v, which encodes to %x", b, r, r.append(nil))
		} else if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("id entry: error not ErrCorrupt: %v", err)
		}
		if m, err := decodeMeta(b); err == nil {
			if d, err := decodeMeta(m.append(nil)); err != nil || d != m && b[0] == layoutV4 {
				t.Fatalf("meta %x decodes to %+v; re-encoded, to %+v, %v", b, m, d, err)
			}
		}
		if s, err := decodeStatus(b); err == nil {
			if d, err := decodeStatus(s.append(nil)); err != nil || d != s {
				t.Fatalf("status %x decodes to %+v; re-encoded, to %+v, %v", b, s, d, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("status: error not ErrCorrupt: %v", err)
		}
		e, err := decodeBody(b)
		if err == nil {
			again := appendBody(nil, &e.NewEvent, e.createdAt, e.version)
			d, err := decodeBody(again)
			if err != nil || !reflect.DeepEqual(d, e) {
				t.Fatalf("body %x decodes to %+v; re-encoded, to %+v, %v", b, e, d, err)
			}
		}
		if cerr := checkBody(b); (cerr == nil) != (err == nil) || err != nil && cerr.Error() != err.Error() {
			t.Fatalf("body %x: decodeBody says %v, checkBody %v", b, err, cerr)
		}
		_, _, _ = bodyIDTopic(b) // must not panic; what it returns for b is not checked here
		all := Query{Priorities: 1<<(MaxPriority+1) - 1}
		if _, ok, merr := all.matchBody(b); err == nil {
			// A body that decodes has its priority found where decodeBody found it.
			this, others := Query{Priorities: PrioritiesOf(e.Priority)}, Query{Priorities: all.Priorities &^ PrioritiesOf(e.Priority)}
			id, ok, merr := this.matchBody(b)
			if _, not, oerr := others.matchBody(b); merr != nil || !ok || string(id) != e.ID || oerr != nil || not {
				t.Fatalf("body %x of priority %d: matchBody says %v, %v for it and %v, %v for the others", b, e.Priority, ok, merr, not, oerr)
			}
		} else if merr == nil && !ok {
			t.Fatalf("body %x: matchBody refuses it with every priority and no error", b)
		}
		if d, err := decodeStoredDefinition(b); err == nil {
			if again, err := decodeStoredDefinition(appendStoredDefinition(nil, &d)); err != nil || !reflect.DeepEqual(again, d) {
				t.Fatalf("definition %x decodes to %+v; re-encoded, to %+v, %v", b, d, again, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("definition: error not ErrCorrupt: %v", err)
		}
		if c, err := decodeCursor(b); err == nil {
			if again, err := decodeCursor(c.append(nil)); err != nil || again != c {
				t.Fatalf("cursor %x decodes to %+v; re-encoded, to %+v, %v", b, c, again, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cursor: error not ErrCorrupt: %v", err)
		}
	})
}

// FuzzSnapshotStream: a snapshot stream, as a peer sends it and a backup stores it, is
// verified, verified with its topics read, read event by event and its header read, and none
// of these panics on any bytes; each refuses with ErrBadSnapshot, VerifySnapshotTargets
// refuses exactly what VerifySnapshot refuses, a stream ForEachSnapshotEvent reads verifies,
// and all agree on the header of a stream that verifies. The seeds are real streams of a small
// shard, so mutations reach every part of the format.
func FuzzSnapshotStream(f *testing.F) {
	// The seeds are made before fuzzing starts, and the Store closed: Pebble's background
	// goroutines would add coverage of their own to every input, and every input would look
	// new (and be minimized, for a minute each).
	func() {
		st := openTestStore(f, f.TempDir(), StoreOptions{})
		defer st.Close()
		fsm, _ := newTestFSM(f, st, 1)
		defer fsm.Close()
		f.Add(snapshotBytes(f, fsm))
		g := newGen(3)
		m := newModel()
		for range 40 {
			l, c := g.entry(m)
			fsm.Apply(l)
			m.apply(l, c)
		}
		f.Add(snapshotBytes(f, fsm))
	}()
	f.Add([]byte("chimesnp"))
	f.Fuzz(func(t *testing.T, b []byte) {
		vh, verr := VerifySnapshot(bytes.NewReader(b), 1)
		fh, ferr := ForEachSnapshotEvent(bytes.NewReader(b), 1, func(SnapshotEvent) error { return nil })
		rh, rerr := ReadSnapshotHeader(bytes.NewReader(b))
		th, terr := VerifySnapshotTargets(bytes.NewReader(b), 1, func(SnapshotTarget) error { return nil })
		if (terr == nil) != (verr == nil) || terr == nil && th != vh {
			t.Fatalf("VerifySnapshotTargets says %v (header %+v), VerifySnapshot %v (header %+v)", terr, th, verr, vh)
		}
		for _, err := range []error{verr, ferr, rerr, terr} {
			if err != nil && !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("error not ErrBadSnapshot: %v", err)
			}
		}
		switch {
		case ferr == nil && verr != nil:
			t.Fatalf("ForEachSnapshotEvent reads a stream VerifySnapshot refuses: %v", verr)
		case verr == nil && (rerr != nil || rh != vh || ferr == nil && fh != vh):
			t.Fatalf("headers: VerifySnapshot %+v, ReadSnapshotHeader %+v (%v), ForEachSnapshotEvent %+v", vh, rh, rerr, fh)
		}
	})
}

// FuzzDecodeIndexKeys: the due-index and settled-index entries (parseDueKey, parseSettled)
// never panic, refuse with ErrCorrupt, and what they accept is exactly what the encoders
// write for the shard in the key's prefix: the same bytes, since both are fixed-size.
func FuzzDecodeIndexKeys(f *testing.F) {
	var due8 [8]byte
	binary.BigEndian.PutUint64(due8[:], uint64(1<<40))
	f.Add(appendDueKey(nil, 3, -5, 9), []byte(nil))
	f.Add(appendSettledKey(nil, 3, 1<<40, 9), due8[:])
	f.Add(appendBodyKey(nil, 3, 7, 9), due8[:7])
	f.Add([]byte{0, 0, 0, 3, tagDue}, []byte{})
	f.Fuzz(func(t *testing.T, k, v []byte) {
		if due, seq, err := parseDueKey(k); err == nil {
			if again := appendDueKey(nil, binary.BigEndian.Uint32(k), due, seq); !bytes.Equal(again, k) {
				t.Fatalf("due key %x parses to due %d seq %d, which encode to %x", k, due, seq, again)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("due key: error not ErrCorrupt: %v", err)
		}
		if at, seq, due, err := parseSettled(k, v); err == nil {
			again := appendSettledKey(nil, binary.BigEndian.Uint32(k), at, seq)
			if !bytes.Equal(again, k) || int64(binary.BigEndian.Uint64(v)) != due || len(v) != 8 {
				t.Fatalf("settled entry %x = %x parses to at %d seq %d due %d, which encode to %x", k, v, at, seq, due, again)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("settled entry: error not ErrCorrupt: %v", err)
		}
	})
}

// FuzzSnapshotRestore: the frames of a snapshot stream, sealed with a correct trailer
// (frame count, CRC-32C) and compressed as a sender would, so that mutations get past the
// checksum, which stops almost every mutation of FuzzSnapshotStream, to the checks made after
// it. The first input byte picks the format (bit 0: format 2, else 3); the rest is frames as
// the stream holds them (uvarint key length, key without the shard prefix, uvarint value
// length, value), read up to the first that does not parse. The header names the applied
// index and term of the first meta frame that decodes, as a real stream does.
//
// Checked: VerifySnapshot, which makes Restore's checks (the same function, stageFrames, with
// another sink), refuses with ErrBadSnapshot, and what it passes is a state the shard's reads
// and apply can decode: every key and value decodes by its tag, the meta's counters agree
// with the keys (doc.go, invariant 5) and every seq is below the next seq (invariant 7: a
// seq is never reused). Then, but in a fuzzing worker, Restore takes the stream and lays out
// exactly its frames (or, for layout 2, their conversion, which must pass the same checks),
// the FSM's counters are the stored meta's, and the shard streams again to a stream that
// verifies. A fuzzing worker leaves Restore out: in an instrumented build its Pebble work
// (staging tables, ingest, flush) costs tens of milliseconds an input, against about one for
// the rest, and the minimization of each new input runs it thousands of times. Every seed
// and committed input goes through Restore in go test.
func FuzzSnapshotRestore(f *testing.F) {
	st := openTestStore(f, f.TempDir(), StoreOptions{FS: vfs.NewMem()})
	src, err := NewFSM(st, 1, nopObserver{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{0}, framesOf(f, snapshotBytes(f, src))...))
	src.ApplyBatch(genLog(71, 6)) // every kind of key, in 1.2 KB
	stream := snapshotBytes(f, src)
	f.Add(append([]byte{0}, framesOf(f, stream)...))
	src.Close()
	// Streams the checks after the checksum refuse: keys without a meta key; counters that
	// agree with the keys only modulo 2^64 (a next seq of 1, which hands seq 1 out again; more
	// expired and renewed than settled).
	f.Add(append([]byte{0}, editedFrames(f, stream, nil)...))
	f.Add(append([]byte{0}, editedFrames(f, stream, func(m *meta) {
		m.replaced -= m.nextSeq - 1
		m.nextSeq = 1
	})...))
	f.Add(append([]byte{0}, editedFrames(f, stream, func(m *meta) { m.expired += 1 << 63; m.renewed += 1 << 63 })...))
	old, err := NewFSM(st, 3, nopObserver{})
	if err != nil {
		f.Fatal(err)
	}
	old.ApplyBatch(logWithoutExpire(72, 6))
	l2 := layout2Frames(f, snapshotBytes(f, old))
	f.Add(append([]byte{1}, l2...))
	old.Close()
	// A layout 2 stream with a status key shorter than a seq: Restore's conversion to layout
	// 3 (upgradeLayout) sliced it, after the swap, and panicked.
	f.Add(append([]byte{1}, shortStatusKey(l2)...))

	worker := fuzzWorker()
	var dst *FSM
	if worker {
		if err := st.Close(); err != nil { // no Pebble goroutines while fuzzing
			f.Fatal(err)
		}
	} else {
		defer st.Close()
		if dst, err = NewFSM(st, 2, nopObserver{}); err != nil {
			f.Fatal(err)
		}
		defer dst.Close()
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		format := uint32(snapshotFormat)
		if b[0]&1 == 1 {
			format = snapshotFormatOld
		}
		frames := fuzzFrames(b[1:])
		var index, term uint64
		for _, fr := range frames {
			if len(fr.key) == 1 && fr.key[0] == tagMeta {
				if m, err := decodeMeta(fr.val); err == nil {
					index, term = m.appliedIndex, m.appliedTerm
					break
				}
			}
		}
		header := appendSnapshotHeader(nil, snapshotMagic, 2, index, term)
		binary.BigEndian.PutUint32(header[len(snapshotMagic):], format)
		stream := joinStream(t, header, frames)

		if _, err := VerifySnapshot(bytes.NewReader(stream), 2); err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("VerifySnapshot refuses with %v, not ErrBadSnapshot", err)
			}
			return
		}
		sent := make([]kv, len(frames))
		for i, fr := range frames {
			sent[i] = kv{append([]byte{0, 0, 0, 2}, fr.key...), fr.val}
		}
		m := checkShardKeys(t, sent)
		if worker {
			return
		}
		if err := restore(dst, stream); err != nil {
			t.Fatalf("VerifySnapshot passes the stream, Restore refuses it: %v", err)
		}
		keys := dumpShard(t, st, 2)
		if m.layout != layoutV2 {
			sameKeySpace(t, "restored", sent, keys)
		}
		if m = checkShardKeys(t, keys); dst.Stats() != m.stats() {
			t.Fatalf("restored: counters %+v, the stored meta's %+v", dst.Stats(), m.stats())
		}
		if _, err := VerifySnapshot(bytes.NewReader(snapshotBytes(t, dst)), 2); err != nil {
			t.Fatalf("the restored shard streams to a stream that does not verify: %v", err)
		}
	})
}

// fuzzWorker reports whether this process is a fuzzing worker (go test -fuzz), rather than
// a run of the seed corpus.
func fuzzWorker() bool {
	w := flag.Lookup("test.fuzzworker")
	return w != nil && w.Value.String() == "true"
}

// stats is what FSM.Stats reports for m.
func (m meta) stats() Stats {
	return Stats{Pending: m.pending, Fired: m.fired, Cancelled: m.cancelled, DeadLettered: m.deadLettered,
		Refired: m.refired, FiredAfterCancel: m.firedAfterCancel, Expired: m.expired, Replaced: m.replaced,
		Renewed: m.renewed, Retained: m.retained(), AppliedIndex: m.appliedIndex, AppliedTerm: m.appliedTerm, NextSeq: m.nextSeq}
}

// checkShardKeys fails unless keys (a whole shard's, in order) are a state the FSM can read
// and apply to, and returns its meta (a fresh one when there are no keys).
func checkShardKeys(t *testing.T, keys []kv) meta {
	t.Helper()
	m := freshMeta()
	var perTag [256]uint64
	maxSeq := uint64(0)
	for _, e := range keys {
		k := e.k[shardPrefixLen:]
		perTag[k[0]]++
		var err error
		switch k[0] {
		case tagMeta:
			if len(k) != 1 {
				err = fmt.Errorf("not the meta key")
			} else {
				m, err = decodeMeta(e.v)
			}
		case tagDue:
			var seq uint64
			if _, seq, err = parseDueKey(e.k); err == nil {
				_, err = decodeDueValue(e.v)
			}
			maxSeq = max(maxSeq, seq)
		case tagSettled:
			var seq uint64
			_, seq, _, err = parseSettled(e.k, e.v)
			maxSeq = max(maxSeq, seq)
		case tagBody:
			if len(e.k) != dueKeyLen {
				err = fmt.Errorf("not a due and a seq")
			} else {
				maxSeq = max(maxSeq, binary.BigEndian.Uint64(k[9:]))
				_, err = decodeBody(e.v)
			}
		case tagStatus:
			if len(k) != 1+8 {
				err = fmt.Errorf("not a seq")
			} else {
				maxSeq = max(maxSeq, binary.BigEndian.Uint64(k[1:]))
				var st status
				if st, err = decodeStatus(e.v); err == nil && st.state == StateScheduled {
					err = fmt.Errorf("a status of a pending event")
				}
			}
		case tagID:
			var r idRef
			r, err = decodeIDRef(e.v)
			maxSeq = max(maxSeq, r.seq)
		default:
			err = fmt.Errorf("unknown tag")
		}
		if err != nil {
			t.Fatalf("key %x = %x: %v", e.k, e.v, err)
		}
	}
	settled, c1 := bits.Add64(m.fired, m.cancelled, 0)
	settled, c2 := bits.Add64(settled, m.deadLettered, 0)
	retained, settledKeys := m.retained(), perTag[tagSettled]
	if m.layout == layoutV2 {
		settledKeys = retained // layout 2 has no settled-time index
	}
	switch {
	case c1|c2 != 0 || m.expired > settled || m.renewed > settled-m.expired:
		t.Fatalf("meta %+v: more expired and renewed than settled", m)
	case perTag[tagDue] != m.pending || perTag[tagStatus] != retained || settledKeys != retained:
		t.Fatalf("meta %+v; the shard holds %d due-index, %d status and %d settled-index keys",
			m, perTag[tagDue], perTag[tagStatus], perTag[tagSettled])
	case perTag[tagID] != perTag[tagBody] || perTag[tagID] != m.pending+retained:
		t.Fatalf("meta %+v; the shard holds %d id entries and %d bodies", m, perTag[tagID], perTag[tagBody])
	case len(keys) > 0 && (perTag[tagMeta] != 1 || m.nextSeq <= maxSeq):
		t.Fatalf("meta %+v (of %d meta keys); the shard holds seq %d", m, perTag[tagMeta], maxSeq)
	}
	return m
}

// framesOf returns the frames of a full stream as FuzzSnapshotRestore reads them.
func framesOf(t testing.TB, stream []byte) []byte {
	return editedFrames(t, stream, func(*meta) {})
}

// editedFrames returns the frames of a full stream as FuzzSnapshotRestore reads them, with
// the meta changed by edit, or left out when edit is nil.
func editedFrames(t testing.TB, stream []byte, edit func(*meta)) []byte {
	_, frames := splitStream(t, stream)
	var out []byte
	for _, fr := range frames {
		if fr.key[0] == tagMeta {
			if edit == nil {
				continue
			}
			m, err := decodeMeta(fr.val)
			if err != nil {
				t.Fatal(err)
			}
			edit(&m)
			fr.val = m.append(nil)
		}
		out = binary.AppendUvarint(out, uint64(len(fr.key)))
		out = append(out, fr.key...)
		out = binary.AppendUvarint(out, uint64(len(fr.val)))
		out = append(out, fr.val...)
	}
	return out
}

// shortStatusKey returns frames (as FuzzSnapshotRestore reads them) with the key of the
// first status cut to 3 bytes of its seq, in key order.
func shortStatusKey(b []byte) []byte {
	frames := fuzzFrames(b)
	for i, fr := range frames {
		if fr.key[0] == tagStatus {
			frames[i].key = fr.key[:4]
			break
		}
	}
	slices.SortFunc(frames, func(a, b frame) int { return bytes.Compare(a.key, b.key) })
	var out []byte
	for _, fr := range frames {
		out = binary.AppendUvarint(out, uint64(len(fr.key)))
		out = append(out, fr.key...)
		out = binary.AppendUvarint(out, uint64(len(fr.val)))
		out = append(out, fr.val...)
	}
	return out
}

// fuzzFrames reads frames from b up to the first that does not parse or has an empty key.
func fuzzFrames(b []byte) []frame {
	var frames []frame
	next := func() ([]byte, bool) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return nil, false
		}
		v := b[w : w+int(n)]
		b = b[w+int(n):]
		return v, true
	}
	for {
		k, ok := next()
		if !ok || len(k) == 0 {
			return frames
		}
		v, ok := next()
		if !ok {
			return frames
		}
		frames = append(frames, frame{k, v})
	}
}

// layout2Frames returns the frames of a format 3 stream of a shard that expired nothing as a
// leader of the version before retention sent them (in format 2): no settled-time index, a
// layout 2 meta.
func layout2Frames(t testing.TB, stream []byte) []byte {
	_, frames := splitStream(t, stream)
	var out []byte
	for _, fr := range frames {
		switch fr.key[0] {
		case tagSettled:
			continue
		case tagMeta:
			fr.val = append([]byte{layoutV2}, fr.val[1:metaLenV2]...)
		}
		out = binary.AppendUvarint(out, uint64(len(fr.key)))
		out = append(out, fr.key...)
		out = binary.AppendUvarint(out, uint64(len(fr.val)))
		out = append(out, fr.val...)
	}
	return out
}
