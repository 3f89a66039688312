package raftfsm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// TestSnapshotHeaderNamesTheFSMsIndex: a reference records the FSM's applied index, which
// raft's snapshot index passes by the no-op and barrier entries the FSM never sees; a
// reference as the first build with references wrote it reads the same; a damaged reference
// is refused.
func TestSnapshotHeaderNamesTheFSMsIndex(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 7)
	defer f.Close()
	logs := genLog(51, 40)
	f.ApplyBatch(logs)
	last := logs[len(logs)-1]
	// A new leader's no-op: raft applies it, and snapshots at its index, without the FSM.
	noop := &raft.Log{Index: last.Index + 1, Term: last.Term + 1, Type: raft.LogNoop}

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	ref := persist(t, snap)
	h, err := ReadSnapshotHeader(bytes.NewReader(ref))
	if err != nil {
		t.Fatal(err)
	}
	if want := (SnapshotHeader{Reference: true, Format: snapshotFormat, Shard: 7, AppliedIndex: last.Index, AppliedTerm: last.Term}); h != want {
		t.Fatalf("reference header %+v, want %+v (raft's snapshot index would be %d)", h, want, noop.Index)
	}

	full := snapshotBytes(t, f)
	if h, err := ReadSnapshotHeader(bytes.NewReader(full)); err != nil || h.Reference || h.AppliedIndex != last.Index {
		t.Fatalf("full stream header %+v (%v), want a stream at %d", h, err, last.Index)
	}

	// "chimeref", format 2, shard 3, index 1000, term 4, CRC-32C of the header.
	old, _ := hex.DecodeString("6368696d657265660000000200000003" + "00000000000003e8" + "0000000000000004" + "20a7c9c6")
	if h, err := ReadSnapshotHeader(bytes.NewReader(old)); err != nil ||
		h != (SnapshotHeader{Reference: true, Format: 2, Shard: 3, AppliedIndex: 1000, AppliedTerm: 4}) {
		t.Fatalf("older build's reference: %+v (%v)", h, err)
	}

	bad := bytes.Clone(ref)
	bad[20] ^= 1
	if _, err := ReadSnapshotHeader(bytes.NewReader(bad)); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("damaged reference: %v, want ErrBadSnapshot", err)
	}
	if _, err := ReadSnapshotHeader(bytes.NewReader(ref[:30])); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("truncated reference: %v, want ErrBadSnapshot", err)
	}
}

// TestRestoreRefusesCountsTheKeysDoNotBackUp: a stream that arrived intact (its checksum
// verifies) is still refused when its meta's counters disagree with the keys it holds. The
// restored meta sizes what the FSM allocates: the id filter takes 4 bytes per seq below
// nextSeq, so a meta claiming 2^34 events made a restore of a few kilobytes allocate 64 GiB
// (here 2^24: 64 MiB, when the check is missing).
func TestRestoreRefusesCountsTheKeysDoNotBackUp(t *testing.T) {
	srcStore := openTestStore(t, t.TempDir(), StoreOptions{})
	defer srcStore.Close()
	src, _ := newTestFSM(t, srcStore, 2)
	src.ApplyBatch(genLog(31, 80))
	good := snapshotBytes(t, src)

	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 2)
	defer f.Close()
	if err := restore(f, resealed(t, good, func(*meta) {})); err != nil {
		t.Fatalf("the stream re-sealed unchanged is refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*meta)
	}{
		{"next seq of 2^24", func(m *meta) { m.nextSeq = 1 << 24 }},
		{"one pending event more", func(m *meta) { m.pending++ }},
		{"a pending event counted as cancelled", func(m *meta) { m.pending--; m.cancelled++ }},
	} {
		if err := restore(f, resealed(t, good, tc.edit)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", tc.name, err)
		}
	}
}

// resealed returns the full snapshot stream with its meta frame changed by edit, and the
// trailer's checksum computed afresh, as a sender that means harm would.
func resealed(t *testing.T, stream []byte, edit func(*meta)) []byte {
	t.Helper()
	header, frames := splitStream(t, stream)
	for i, f := range frames {
		if f.key[0] == tagMeta {
			m, err := decodeMeta(f.val)
			if err != nil {
				t.Fatal(err)
			}
			edit(&m)
			frames[i].val = m.append(nil)
		}
	}
	return joinStream(t, header, frames)
}

// TestVerifySnapshotRefusesWhatRestoreRefuses: VerifySnapshot, which checks a backup before it
// becomes a node's data, passes the stream Restore takes and refuses, with ErrBadSnapshot,
// each stream Restore refuses: corrupt, truncated, for another shard, re-sealed with frames
// out of order or with counters the keys do not back up.
func TestVerifySnapshotRefusesWhatRestoreRefuses(t *testing.T) {
	srcStore := openTestStore(t, t.TempDir(), StoreOptions{})
	defer srcStore.Close()
	src, _ := newTestFSM(t, srcStore, 2)
	src.ApplyBatch(genLog(41, 90))
	good := snapshotBytes(t, src)

	h, err := VerifySnapshot(bytes.NewReader(good), 2)
	if err != nil {
		t.Fatalf("VerifySnapshot of a good stream: %v", err)
	}
	if want := (SnapshotHeader{Format: snapshotFormat, Shard: 2, AppliedIndex: src.AppliedIndex(), AppliedTerm: src.Stats().AppliedTerm}); h != want {
		t.Fatalf("header %+v, want %+v", h, want)
	}
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 2)
	defer f.Close()
	flipped := slices.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	for _, tc := range []struct {
		name  string
		data  []byte
		shard uint32
	}{
		{"a flipped byte", flipped, 2},
		{"truncated in the frames", good[:len(good)/3], 2},
		{"truncated before the checksum", good[:len(good)-4], 2},
		{"trailing garbage", append(slices.Clone(good), 0), 2},
		{"empty", nil, 2},
		{"another shard's", good, 3},
		{"frames out of order", swappedFrames(t, good), 2},
		{"one pending event more", resealed(t, good, func(m *meta) { m.pending++ }), 2},
	} {
		_, verr := VerifySnapshot(bytes.NewReader(tc.data), tc.shard)
		if !errors.Is(verr, ErrBadSnapshot) {
			t.Errorf("%s: VerifySnapshot says %v, want ErrBadSnapshot", tc.name, verr)
		}
		if tc.shard == 2 {
			if rerr := restore(f, tc.data); !errors.Is(rerr, ErrBadSnapshot) {
				t.Errorf("%s: Restore says %v: the case does not test what Restore refuses", tc.name, rerr)
			}
		}
	}
}

// TestForEachSnapshotEventReportsWhatTheShardHolds: ForEachSnapshotEvent reports exactly the
// events the model holds after a log with every command (expired events gone), with their
// seq, due and state, in id order; and it refuses, calling fn for nothing, a stream
// VerifySnapshot refuses and one whose keys disagree about an event although its counts and
// checksum are right.
func TestForEachSnapshotEventReportsWhatTheShardHolds(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 5)
	defer f.Close()
	g, m := newGen(61), newModel()
	logs := make([]*raft.Log, 400)
	for i := range logs {
		var c Command
		logs[i], c = g.entry(m)
		m.apply(logs[i], c)
	}
	f.ApplyBatch(logs)
	good := snapshotBytes(t, f)

	var got []SnapshotEvent
	h, err := ForEachSnapshotEvent(bytes.NewReader(good), 5, func(e SnapshotEvent) error {
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatalf("ForEachSnapshotEvent of a good stream: %v", err)
	}
	if h.Shard != 5 || h.AppliedIndex != f.AppliedIndex() {
		t.Errorf("header %+v, want shard 5 at %d", h, f.AppliedIndex())
	}
	var want []SnapshotEvent
	states := map[State]int{}
	for _, r := range m.byID {
		want = append(want, SnapshotEvent{ID: r.ID, Seq: r.Seq, State: r.State, Due: r.Due, Version: r.Version})
		states[r.State]++
	}
	slices.SortFunc(want, func(a, b SnapshotEvent) int { return strings.Compare(a.ID, b.ID) })
	if !slices.Equal(got, want) {
		t.Fatalf("events %d:\n%v\nwant %d:\n%v", len(got), got, len(want), want)
	}
	if len(states) != 4 || m.stats.Expired == 0 {
		t.Fatalf("the log leaves states %v and %d expired: not every case is looked at", states, m.stats.Expired)
	}

	// An error from fn ends the walk, as it is.
	stop := errors.New("stop")
	calls := 0
	if _, err := ForEachSnapshotEvent(bytes.NewReader(good), 5, func(SnapshotEvent) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("fn's error: %v after %d calls, want it after 1", err, calls)
	}

	// Frames that each check as VerifySnapshot checks them, but disagree about an event.
	header, frames := splitStream(t, good)
	// edited re-seals the stream after edit changed the values of its frames.
	edited := func(edit func(fs []frame)) []byte {
		fs := slices.Clone(frames)
		edit(fs)
		return joinStream(t, header, fs)
	}
	first := func(fs []frame, tag byte) int {
		for i, fr := range fs {
			if fr.key[0] == tag {
				return i
			}
		}
		t.Fatalf("no frame with tag %c", tag)
		return 0
	}
	idsSwapped := edited(func(fs []frame) { // each of two ids names the other's event
		i := first(fs, tagID)
		fs[i].val, fs[i+1].val = fs[i+1].val, fs[i].val
	})
	idOfAnotherDue := edited(func(fs []frame) {
		i := first(fs, tagID)
		ref, _ := decodeIDRef(fs[i].val)
		ref.due++
		fs[i].val = ref.append(nil)
	})
	statusOfAnotherDue := edited(func(fs []frame) {
		i := first(fs, tagStatus)
		s, _ := decodeStatus(fs[i].val)
		s.due++
		fs[i].val = s.append(nil)
	})
	statusScheduled := edited(func(fs []frame) {
		i := first(fs, tagStatus)
		s, _ := decodeStatus(fs[i].val)
		s.state = StateScheduled
		fs[i].val = s.append(nil)
	})
	// At index 0 a stream needs no meta key, but then it may hold no other key either: one
	// without the meta's counts to back its keys up is refused by VerifySnapshot too.
	index0 := slices.Clone(header)
	clear(index0[len(snapshotMagic)+8:])
	body := frames[first(frames, tagBody)]
	seq := binary.BigEndian.Uint64(body.key[9:])
	var idEntry, state frame // of body's event: its id entry, its due-index key or status
	for _, fr := range frames {
		ref, err := decodeIDRef(fr.val)
		switch {
		case fr.key[0] == tagID && err == nil && ref.seq == seq:
			idEntry = fr
		case fr.key[0] == tagDue && binary.BigEndian.Uint64(fr.key[9:]) == seq,
			fr.key[0] == tagStatus && binary.BigEndian.Uint64(fr.key[1:]) == seq:
			state = fr
		}
	}
	noID := joinStream(t, index0, []frame{body, state})
	noState := joinStream(t, index0, []frame{body, idEntry})
	flipped := slices.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	for _, tc := range []struct {
		name     string
		data     []byte
		verifies bool // VerifySnapshot passes it: only the join refuses it
	}{
		{"a flipped byte", flipped, false},
		{"truncated in the frames", good[:len(good)/3], false},
		{"truncated before the checksum", good[:len(good)-4], false},
		{"one pending event more", resealed(t, good, func(m *meta) { m.pending++ }), false},
		{"two ids naming each other's event", idsSwapped, true},
		{"an id entry of another due", idOfAnotherDue, true},
		{"a status of another due", statusOfAnotherDue, true},
		{"a status that says Scheduled", statusScheduled, false},
		{"an event without its id entry, at index 0", noID, false},
		{"an event without a state, at index 0", noState, false},
	} {
		calls := 0
		_, err := ForEachSnapshotEvent(bytes.NewReader(tc.data), 5, func(SnapshotEvent) error { calls++; return nil })
		if !errors.Is(err, ErrBadSnapshot) || calls != 0 {
			t.Errorf("%s: %v after %d calls of fn, want ErrBadSnapshot and none", tc.name, err, calls)
		}
		if _, verr := VerifySnapshot(bytes.NewReader(tc.data), 5); (verr == nil) != tc.verifies {
			t.Errorf("%s: VerifySnapshot says %v", tc.name, verr)
		}
	}
	if _, err := ForEachSnapshotEvent(bytes.NewReader(good), 6, func(SnapshotEvent) error { return nil }); !errors.Is(err, ErrBadSnapshot) {
		t.Errorf("another shard's stream: %v, want ErrBadSnapshot", err)
	}
}
