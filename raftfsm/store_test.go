package raftfsm

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// TestTablesEndAtRegionBoundaries: with two shards' events, cancels and marks in one memtable,
// a flush writes no table whose keys cross from one (shard, tag) region into another, so a
// table of new keys at the end of a region never covers the whole of the next one below it.
func TestTablesEndAtRegionBoundaries(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	for shard := uint32(1); shard <= 2; shard++ {
		f, _ := newTestFSM(t, st, shard)
		defer f.Close()
		for _, l := range genLog(uint64(shard), 300) {
			f.Apply(l)
		}
	}
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	levels, err := st.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	regions := map[string]bool{}
	for level, tables := range levels {
		for _, tb := range tables {
			lo, hi := tb.Smallest.UserKey, tb.Largest.UserKey
			if len(lo) <= shardPrefixLen || len(hi) <= shardPrefixLen {
				t.Fatalf("L%d table %s: bounds %x..%x are shorter than a shard and a tag", level, tb.FileNum, lo, hi)
			}
			if !bytes.Equal(lo[:shardPrefixLen+1], hi[:shardPrefixLen+1]) {
				t.Fatalf("L%d table %s spans regions: %x..%x", level, tb.FileNum, lo, hi)
			}
			regions[string(lo[:shardPrefixLen+1])] = true
		}
	}
	// Two shards, each with bodies, due index, ids, meta and statuses.
	if len(regions) < 10 {
		t.Fatalf("tables cover %d regions, want at least 10: the log is too small to prove much", len(regions))
	}
}

// TestPowerCutKeepsWhatRaftCannotRecreate: Pebble runs without a WAL, so a power cut keeps
// only what was flushed, and raft re-applies the rest from its log. What no log re-creates
// must be flushed before it is relied on: a finished restore (raft drops its log behind the
// snapshot) and a dropped shard; and a refused restore must leave nothing to rely on.
func TestPowerCutKeepsWhatRaftCannotRecreate(t *testing.T) {
	srcStore := openTestStore(t, t.TempDir(), StoreOptions{})
	defer srcStore.Close()
	src, _ := newTestFSM(t, srcStore, 2)
	src.ApplyBatch(genLog(31, 120))
	good := snapshotBytes(t, src)
	want := dumpShard(t, srcStore, 2)

	fs := vfs.NewCrashableMem()
	st := openTestStore(t, "db", StoreOptions{FS: fs})
	// cut keeps what fs holds synced, closes the live store and opens one on what was kept.
	cut := func(fsms ...*FSM) {
		t.Helper()
		crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		for _, f := range fsms {
			f.Close()
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		fs = crashed
		st = openTestStore(t, "db", StoreOptions{FS: fs})
	}
	defer func() { st.Close() }()

	f, _ := newTestFSM(t, st, 2)
	f.ApplyBatch(genLog(32, 50))
	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 0x40
	if err := restore(f, bad); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("restore of a corrupt snapshot: %v, want ErrBadSnapshot", err)
	}
	cut(f)
	f, _ = newTestFSM(t, st, 2)
	if f.NeedsRestore() {
		t.Fatal("after a refused restore and a power cut, the shard needs a restore")
	}
	if kvs := dumpShard(t, st, 2); len(kvs) != 0 && f.AppliedIndex() == 0 {
		t.Fatalf("a refused restore left %d keys behind", len(kvs))
	}

	if err := restore(f, good); err != nil {
		t.Fatal(err)
	}
	cut(f)
	f, _ = newTestFSM(t, st, 2)
	if f.NeedsRestore() {
		t.Fatal("after a power cut, a finished restore is unfinished again")
	}
	sameKeySpace(t, "restored, then a power cut", want, dumpShard(t, st, 2))

	f.Close()
	if err := st.DropShard(2); err != nil {
		t.Fatal(err)
	}
	cut()
	if kvs := dumpShard(t, st, 2); len(kvs) != 0 {
		t.Fatalf("after a power cut, a dropped shard has %d keys again", len(kvs))
	}
}

// TestPersistWaitsForPebblesFlush: a snapshot persist returns once Pebble's own next flush
// has made the snapshot's state durable, and makes no flush of its own; once Stopping is
// called it flushes at once.
func TestPersistWaitsForPebblesFlush(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{SnapshotFlushWait: time.Hour})
	defer st.Close()
	f, _ := newTestFSM(t, st, 3)
	defer f.Close()
	logs := genLog(41, 300)

	persisted := func(snap raft.FSMSnapshot) <-chan []byte {
		done := make(chan []byte, 1)
		go func() { done <- persist(t, snap) }()
		return done
	}
	f.ApplyBatch(logs[:100])
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	f.ApplyBatch(logs[100:200])
	done := persisted(snap)
	select {
	case <-done:
		t.Fatal("Persist returned before anything was flushed")
	case <-time.After(100 * time.Millisecond):
	}
	flushes := st.db.Metrics().Flush.Count
	if err := st.db.Flush(); err != nil { // Pebble's own, as when a memtable fills
		t.Fatal(err)
	}
	<-done
	if n := st.db.Metrics().Flush.Count - flushes; n != 1 {
		t.Fatalf("%d flushes while Persist waited, want only Pebble's own", n)
	}
	if d, err := f.durableIndex(); err != nil || d < 100 {
		t.Fatalf("durable index %d (%v) after Persist of a snapshot at 100", d, err)
	}

	f.ApplyBatch(logs[200:])
	snap, err = f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	done = persisted(snap)
	f.Stopping()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Persist still waits for a flush after Stopping")
	}
	if d, err := f.durableIndex(); err != nil || d < 300 {
		t.Fatalf("durable index %d (%v) after Stopping and Persist of a snapshot at 300", d, err)
	}
}
