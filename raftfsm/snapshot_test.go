package raftfsm

import (
	"bytes"
	"encoding/hex"
	"errors"
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
	if want := (SnapshotHeader{Reference: true, Shard: 7, AppliedIndex: last.Index, AppliedTerm: last.Term}); h != want {
		t.Fatalf("reference header %+v, want %+v (raft's snapshot index would be %d)", h, want, noop.Index)
	}

	full := snapshotBytes(t, f)
	if h, err := ReadSnapshotHeader(bytes.NewReader(full)); err != nil || h.Reference || h.AppliedIndex != last.Index {
		t.Fatalf("full stream header %+v (%v), want a stream at %d", h, err, last.Index)
	}

	// "chimeref", format 2, shard 3, index 1000, term 4, CRC-32C of the header.
	old, _ := hex.DecodeString("6368696d657265660000000200000003" + "00000000000003e8" + "0000000000000004" + "20a7c9c6")
	if h, err := ReadSnapshotHeader(bytes.NewReader(old)); err != nil ||
		h != (SnapshotHeader{Reference: true, Shard: 3, AppliedIndex: 1000, AppliedTerm: 4}) {
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
