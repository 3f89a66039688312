package raftfsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// The decoders of stored values and of snapshot streams read bytes another replica, a
// backup file or a damaged disk may hand them. Each must answer an error, never panic:
// apply turns a decode error into its own panic (invariant 2: a replica that cannot read its
// state must stop rather than diverge), but Get, List, a backup's verification and a restore
// must be able to refuse bad bytes and go on.

// FuzzDecodeStored: the id entry, meta, status and body decoders never panic, and what they
// accept re-encodes to bytes that decode to the same value (one format, read and written
// alike). Not to the same bytes: the varint decoder accepts an overlong encoding of a number
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
		if e, err := decodeBody(b); err == nil {
			again := appendBody(nil, &e.NewEvent, e.createdAt, e.version)
			d, err := decodeBody(again)
			if err != nil || !reflect.DeepEqual(d, e) {
				t.Fatalf("body %x decodes to %+v; re-encoded, to %+v, %v", b, e, d, err)
			}
		}
		bodyIDTopic(b)
	})
}

// FuzzSnapshotStream: a snapshot stream, as a peer sends it and a backup stores it, is
// verified, read event by event and its header read, and none of these panics on any bytes;
// each refuses with ErrBadSnapshot, a stream ForEachSnapshotEvent reads verifies, and the
// three agree on the header of a stream that verifies. The seeds are real streams of a small
// shard, so mutations reach every part of the format.
func FuzzSnapshotStream(f *testing.F) {
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
	f.Add([]byte("chimesnp"))
	f.Fuzz(func(t *testing.T, b []byte) {
		vh, verr := VerifySnapshot(bytes.NewReader(b), 1)
		fh, ferr := ForEachSnapshotEvent(bytes.NewReader(b), 1, func(SnapshotEvent) error { return nil })
		rh, rerr := ReadSnapshotHeader(bytes.NewReader(b))
		for _, err := range []error{verr, ferr, rerr} {
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
