package shard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/raftmux"
	"github.com/chimehq/chime/shard/snapshot"
)

// boltFixture is what a test writes into a raft-boltdb file, as a build before raft-wal left
// it: its entries and its stable keys.
type boltFixture struct {
	logs                      []*raft.Log
	currentTerm, lastVoteTerm uint64
	lastVoteCand              []byte
	extra                     map[string][]byte // other stable keys, written with Set
}

// newBoltFixture makes entries of every index in ranges, with varied types, data (empty,
// small, a few KiB), extensions and append times.
func newBoltFixture(term uint64, ranges ...[2]uint64) *boltFixture {
	types := []raft.LogType{raft.LogCommand, raft.LogNoop, raft.LogConfiguration, raft.LogBarrier, raft.LogCommand}
	rnd := mathrand.New(mathrand.NewPCG(1, 2))
	f := &boltFixture{currentTerm: term, lastVoteTerm: term - 1, lastVoteCand: []byte("node-2"),
		extra: map[string][]byte{"SomeOtherKey": []byte("kept as bytes")}}
	base := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	for _, r := range ranges {
		for i := r[0]; i <= r[1]; i++ {
			l := &raft.Log{Index: i, Term: 1 + i/50, Type: types[i%uint64(len(types))]}
			switch i % 3 {
			case 1:
				l.Data = []byte(fmt.Sprintf("entry %d", i))
			case 2:
				l.Data = make([]byte, 1000+rnd.IntN(4000))
				for j := range l.Data {
					l.Data[j] = byte(rnd.Uint32())
				}
			}
			if i%4 == 0 {
				l.Extensions = []byte{byte(i), 0xff, byte(i >> 8)}
			}
			if i%5 != 0 {
				l.AppendedAt = base.Add(time.Duration(i) * 1001 * time.Microsecond)
			}
			f.logs = append(f.logs, l)
		}
	}
	return f
}

// write creates path as raft-boltdb does and writes the fixture into it.
func (f *boltFixture) write(t *testing.T, path string) {
	t.Helper()
	b, err := raftboltdb.New(raftboltdb.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := 0; i < len(f.logs); i += 37 {
		if err := b.StoreLogs(f.logs[i:min(i+37, len(f.logs))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetUint64([]byte("CurrentTerm"), f.currentTerm); err != nil {
		t.Fatal(err)
	}
	if err := b.SetUint64([]byte("LastVoteTerm"), f.lastVoteTerm); err != nil {
		t.Fatal(err)
	}
	if err := b.Set([]byte("LastVoteCand"), f.lastVoteCand); err != nil {
		t.Fatal(err)
	}
	for k, v := range f.extra {
		if err := b.Set([]byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
}

// check fails t unless s holds exactly the fixture's entries from index from on, and its
// stable keys.
func (f *boltFixture) check(t *testing.T, s *logStore, from uint64) {
	t.Helper()
	var want []*raft.Log
	for _, l := range f.logs {
		if l.Index >= from {
			want = append(want, l)
		}
	}
	first, last, err := firstLast(s)
	if err != nil {
		t.Fatal(err)
	}
	if first != want[0].Index || last != want[len(want)-1].Index {
		t.Fatalf("the log holds entries %d-%d, want %d-%d", first, last, want[0].Index, want[len(want)-1].Index)
	}
	for _, w := range want {
		var got raft.Log
		if err := s.GetLog(w.Index, &got); err != nil {
			t.Fatalf("entry %d: %v", w.Index, err)
		}
		if got.Index != w.Index || got.Term != w.Term || got.Type != w.Type || !bytes.Equal(got.Data, w.Data) ||
			!bytes.Equal(got.Extensions, w.Extensions) || !got.AppendedAt.Equal(w.AppendedAt) {
			t.Fatalf("entry %d reads back as\n%+v\nwant\n%+v", w.Index, got, *w)
		}
	}
	for k, want := range map[string]uint64{"CurrentTerm": f.currentTerm, "LastVoteTerm": f.lastVoteTerm} {
		if got, err := s.GetUint64([]byte(k)); err != nil || got != want {
			t.Fatalf("%s = %d (%v), want %d", k, got, err, want)
		}
	}
	stable := map[string][]byte{"LastVoteCand": f.lastVoteCand}
	for k, v := range f.extra {
		stable[k] = v
	}
	for k, want := range stable {
		if got, err := s.Get([]byte(k)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s = %q (%v), want %q", k, got, err, want)
		}
	}
}

// openLogStoreT opens dir's log store, and returns what it logged.
func openLogStoreT(t *testing.T, dir string) (*logStore, string) {
	t.Helper()
	var out bytes.Buffer
	s, err := openLogStore(dir, slog.New(slog.NewTextHandler(&out, nil)), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return s, out.String()
}

// wantFiles fails t unless dir holds a wal and neither raft.db nor wal.tmp.
func wantFiles(t *testing.T, dir string) {
	t.Helper()
	if fi, err := os.Stat(filepath.Join(dir, walDirName)); err != nil || !fi.IsDir() {
		t.Fatalf("no wal directory (%v)", err)
	}
	for _, name := range []string{boltLogName, walTmpDirName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s is still there (%v)", name, err)
		}
	}
}

// TestOpenLogStoreMovesABoltLog: a replica directory an older build wrote holds its log and
// term in raft.db; the log store opens it as a raft-wal holding every entry (index, term,
// type, data, extensions, append time) and every stable key, the terms as the numbers they
// were, and raft.db is gone. It stays so once closed and opened again.
func TestOpenLogStoreMovesABoltLog(t *testing.T) {
	dir := t.TempDir()
	f := newBoltFixture(7, [2]uint64{5, 300})
	f.write(t, filepath.Join(dir, boltLogName))

	s, logged := openLogStoreT(t, dir)
	f.check(t, s, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, dir)
	if !strings.Contains(logged, "level=INFO") || !strings.Contains(logged, "entries=296") {
		t.Fatalf("the move logged %q, want an INFO line with entries=296", logged)
	}

	s, logged = openLogStoreT(t, dir)
	defer s.Close()
	f.check(t, s, 0)
	if logged != "" {
		t.Fatalf("opening the moved log again logged %q", logged)
	}
}

// TestOpenLogStoreRedoesAnInterruptedMove: a move a crash cut before the rename left a partial
// wal.tmp (other entries, another term) beside raft.db; the next open starts the move over
// and ends with raft.db's log and keys alone.
func TestOpenLogStoreRedoesAnInterruptedMove(t *testing.T) {
	dir := t.TempDir()
	f := newBoltFixture(7, [2]uint64{5, 300})
	f.write(t, filepath.Join(dir, boltLogName))

	tmp := filepath.Join(dir, walTmpDirName)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	partial, err := openWAL(tmp, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 40; i++ {
		if err := partial.StoreLog(&raft.Log{Index: i, Term: 99, Data: []byte("not raft.db's")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(partial.SetUint64([]byte("CurrentTerm"), 99), partial.Set([]byte("Stray"), []byte("x")), partial.Close()); err != nil {
		t.Fatal(err)
	}

	s, _ := openLogStoreT(t, dir)
	defer s.Close()
	f.check(t, s, 0)
	if v, err := s.Get([]byte("Stray")); err != nil || len(v) != 0 {
		t.Fatalf("a key of the partial copy survived: %q (%v)", v, err)
	}
	wantFiles(t, dir)
}

// TestOpenLogStoreKeepsTheWALOverABoltLog: a move a crash cut after the rename left both a
// whole wal and raft.db; the wal is used as it is, and raft.db removed.
func TestOpenLogStoreKeepsTheWALOverABoltLog(t *testing.T) {
	dir := t.TempDir()
	s, _ := openLogStoreT(t, dir)
	for i := uint64(1); i <= 20; i++ {
		if err := s.StoreLog(&raft.Log{Index: i, Term: 3, Data: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(s.SetUint64([]byte("CurrentTerm"), 3), s.Close()); err != nil {
		t.Fatal(err)
	}
	newBoltFixture(7, [2]uint64{5, 300}).write(t, filepath.Join(dir, boltLogName))

	s, _ = openLogStoreT(t, dir)
	defer s.Close()
	wantFiles(t, dir)
	if first, last, err := firstLast(s); err != nil || first != 1 || last != 20 {
		t.Fatalf("the log holds entries %d-%d (%v), want the wal's 1-20", first, last, err)
	}
	var l raft.Log
	if err := s.GetLog(20, &l); err != nil || l.Term != 3 || !bytes.Equal(l.Data, []byte{20}) {
		t.Fatalf("entry 20 is %+v (%v), want the wal's", l, err)
	}
	if term, err := s.GetUint64([]byte("CurrentTerm")); err != nil || term != 3 {
		t.Fatalf("CurrentTerm = %d (%v), want the wal's 3", term, err)
	}
}

// TestOpenLogStoreDropsEntriesBeforeAGap: raft-boltdb holds a gap where a follower installed
// a snapshot (raft kept its older entries and appended after the snapshot's index); raft-wal
// refuses one, so the move keeps the entries after the last gap, which raft reads, and drops
// those before it, which the snapshot covers.
func TestOpenLogStoreDropsEntriesBeforeAGap(t *testing.T) {
	dir := t.TempDir()
	f := newBoltFixture(9, [2]uint64{1, 40}, [2]uint64{60, 70}, [2]uint64{100, 160})
	f.write(t, filepath.Join(dir, boltLogName))

	s, logged := openLogStoreT(t, dir)
	defer s.Close()
	f.check(t, s, 100)
	wantFiles(t, dir)
	if !strings.Contains(logged, "entries=61") || !strings.Contains(logged, "dropped_before_a_gap=51") {
		t.Fatalf("the move logged %q, want entries=61 and dropped_before_a_gap=51", logged)
	}
}

// TestOpenLogStoreMovesAnEmptyBoltLog: a raft.db with no entries and no keys (a replica that
// opened and never joined) becomes an empty wal.
func TestOpenLogStoreMovesAnEmptyBoltLog(t *testing.T) {
	dir := t.TempDir()
	b, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, boltLogName)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	s, _ := openLogStoreT(t, dir)
	defer s.Close()
	wantFiles(t, dir)
	if first, last, err := firstLast(s); err != nil || first != 0 || last != 0 {
		t.Fatalf("the log holds entries %d-%d (%v), want none", first, last, err)
	}
	if exists, err := raft.HasExistingState(s, s, raft.NewInmemSnapshotStore()); err != nil || exists {
		t.Fatalf("raft finds existing state (%v) in an empty log", err)
	}
}

// TestHasRaftStateCountsEitherLogStore: a directory holds a replica when it holds a wal or an
// older build's raft.db; a wal.tmp alone is no log store.
func TestHasRaftStateCountsEitherLogStore(t *testing.T) {
	for _, c := range []struct {
		name string
		dir  bool
		want bool
	}{{walDirName, true, true}, {boltLogName, false, true}, {walTmpDirName, true, false}} {
		dir := t.TempDir()
		var err error
		if c.dir {
			err = os.Mkdir(filepath.Join(dir, c.name), 0o700)
		} else {
			err = os.WriteFile(filepath.Join(dir, c.name), nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, err := hasRaftState(dir); err != nil || got != c.want {
			t.Fatalf("a directory holding %s has Raft state: %v (%v), want %v", c.name, got, err, c.want)
		}
	}
}

// TestRaftSeesAMonotonicLog: raft-wal refuses a gap in its indexes, and raft knows it only
// through raft.MonotonicLogStore; the log raft is given (the cache over the watched log over
// raft-wal, under snapshot.KeepSnapshotEntry) must still say so, or a follower that installs a
// snapshot over an older log appends after a gap raft-wal refuses.
func TestRaftSeesAMonotonicLog(t *testing.T) {
	s, _ := openLogStoreT(t, t.TempDir())
	defer s.Close()
	w := &watchedLog{LogStore: s, stable: s, after: time.Hour, failed: func(error) {}}
	for _, inner := range []raft.LogStore{s, w} {
		cache, err := raft.NewLogCache(logCacheEntries, inner)
		if err != nil {
			t.Fatal(err)
		}
		if !isMonotonic(snapshot.KeepSnapshotEntry(cache)) {
			t.Fatalf("raft's log over %T does not say it is monotonic", inner)
		}
	}
}

// TestLogStoreHidesCompactedEntries: an entry a compaction removed is not found, as raft
// needs to send a follower behind it a snapshot, though raft-wal still holds it in its
// tail segment.
func TestLogStoreHidesCompactedEntries(t *testing.T) {
	s, _ := openLogStoreT(t, t.TempDir())
	defer s.Close()
	for i := uint64(1); i <= 100; i++ {
		if err := s.StoreLog(&raft.Log{Index: i, Term: 1, Data: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteRange(1, 50); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	for _, i := range []uint64{1, 50} {
		if err := s.GetLog(i, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("entry %d after a compaction up to 50: %+v, %v; want raft.ErrLogNotFound", i, l, err)
		}
	}
	if err := s.GetLog(51, &l); err != nil || l.Data[0] != 51 {
		t.Fatalf("entry 51: %+v, %v", l, err)
	}
}

// TestLogStoreReadsATruncatedTailAfterReopening: a follower whose log disagrees with its
// leader's drops its last entries (raft's DeleteRange from an index to the end), appends the
// leader's, and is then restarted. Every entry must read back after the reopen. raft-wal
// before v0.4.1 marked the truncated segment sealed without writing its index block, and
// every read of it after a restart failed with "sealed segment has no index block", on
// which raft panics at start.
func TestLogStoreReadsATruncatedTailAfterReopening(t *testing.T) {
	dir := t.TempDir()
	s, _ := openLogStoreT(t, dir)
	for i := uint64(1); i <= 100; i++ {
		if err := s.StoreLog(&raft.Log{Index: i, Term: 1, Data: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteRange(91, 100); err != nil {
		t.Fatal(err)
	}
	for i := uint64(91); i <= 95; i++ {
		if err := s.StoreLog(&raft.Log{Index: i, Term: 2, Data: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, _ = openLogStoreT(t, dir)
	defer s.Close()
	if last, err := s.LastIndex(); err != nil || last != 95 {
		t.Fatalf("last index after reopening: %d, %v; want 95", last, err)
	}
	var l raft.Log
	for i := uint64(1); i <= 95; i++ {
		wantTerm := uint64(1)
		if i > 90 {
			wantTerm = 2
		}
		if err := s.GetLog(i, &l); err != nil || l.Term != wantTerm || l.Data[0] != byte(i) {
			t.Fatalf("entry %d after reopening: %+v, %v; want term %d", i, l, err, wantTerm)
		}
	}
}

// TestFollowerWithALogInstallsASnapshot: a follower that holds a log and comes back after
// the leader compacted its log past it is sent a snapshot, and then takes the entries after
// the snapshot's index. raft-wal refuses a gap, so raft must drop the follower's older
// entries when it installs the snapshot, which it does only for a log that says it is
// monotonic.
func TestFollowerWithALogInstallsASnapshot(t *testing.T) {
	pub, err := publish.New(publish.Config{Brokers: startBroker(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	tune := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, SnapshotThreshold: 8, TrailingLogs: 4}
	a := openSnapReplica(t, "a", true, tune, pub, replicaOptions{StoreOptions: raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait}})
	waitFor(t, 10*time.Second, "a leads", a.s.IsLeader)

	// b keeps its Pebble and raft port across its restart.
	bdir := t.TempDir()
	st, err := raftfsm.OpenStore(filepath.Join(bdir, "pebble"), raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := raftmux.New(ln, nil, nil)
	defer mux.Close()
	openB := func() *Shard {
		t.Helper()
		layer, err := mux.Layer(0)
		if err != nil {
			t.Fatal(err)
		}
		installs, err := mux.Layer(InstallLayerID(0))
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(Config{ID: 0, NodeID: "b", Dir: filepath.Join(bdir, "shard"), Store: st, Layer: layer,
			InstallLayer: installs, Publisher: pub, Tuning: tune})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	b := openB()
	if err := a.s.Raft().AddNonvoter("b", raft.ServerAddress(ln.Addr().String()), 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	scheduleFor(t, a.s, 0, 20, 0)
	waitFor(t, 10*time.Second, "b catches up", func() bool { return b.AppliedIndex() >= a.s.AppliedIndex() })
	bLast, err := b.logs.LastIndex()
	if err != nil || bLast == 0 {
		t.Fatalf("b's log ends at %d (%v)", bLast, err)
	}
	// The leader may open the copy for b while b is down and send it on once b is back,
	// so the count is taken before b closes.
	sent := a.s.InstallsSent()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	scheduleFor(t, a.s, 20, 80, 0)
	if err := a.s.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	scheduleFor(t, a.s, 80, 90, 0)
	if first, err := a.s.logs.FirstIndex(); err != nil || first <= bLast+1 {
		t.Fatalf("the leader's log starts at %d (%v), b's ends at %d: the test did not reach its case", first, err, bLast)
	}

	b = openB()
	defer b.Close()
	waitFor(t, 20*time.Second, "b catches up again", func() bool { return b.AppliedIndex() >= a.s.AppliedIndex() })
	if a.s.InstallsSent() == sent {
		t.Fatal("b caught up without a snapshot: the test did not reach its case")
	}
	scheduleFor(t, a.s, 90, 100, 0)
	waitFor(t, 10*time.Second, "b takes entries after the snapshot", func() bool { return b.AppliedIndex() >= a.s.AppliedIndex() })
	if got := b.Stats().Pending; got != 100 {
		t.Fatalf("b holds %d pending events, want 100", got)
	}
}

// TestShardOpensAReplicaWrittenByRaftBoltdb: a replica whose Raft log and term an older build
// wrote in raft.db opens on raft-wal and goes on where it was: the same term or later, every
// entry, replayed into a Pebble that a power cut set back, so its events come from the moved
// log; new entries follow, and survive another restart.
func TestShardOpensAReplicaWrittenByRaftBoltdb(t *testing.T) {
	r := newCrashRig(t)
	s := r.mustOpen(true)
	r.schedule(s, 0, 30)
	term, last := s.Raft().CurrentTerm(), s.Raft().LastIndex()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	walToBolt(t, r.dir)
	r.cut()
	fsm, err := raftfsm.NewFSM(r.st, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	pebbleHeld := fsm.AppliedIndex()
	fsm.Close()
	if pebbleHeld >= last {
		t.Fatalf("Pebble holds the log up to %d after the cut, the log ends at %d: the test needs the log replayed", pebbleHeld, last)
	}

	s = r.mustOpen(false)
	wantFiles(t, r.dir)
	if got := s.Raft().LastIndex(); got < last {
		t.Fatalf("raft's log ends at %d, was at %d before the move", got, last)
	}
	waitFor(t, 10*time.Second, "the replica leads", s.IsLeader)
	if got := s.Raft().CurrentTerm(); got <= term {
		t.Fatalf("the replica is at term %d, was at %d: its term was not moved", got, term)
	}
	// Get answers under a lease, after a barrier: once every entry before it is applied.
	getAll := func(s *Shard, n int) {
		t.Helper()
		for i := range n {
			if _, ok, err := s.Get(context.Background(), fmt.Sprintf("e%d", i)); err != nil || !ok {
				t.Fatalf("event e%d: found %v (%v)", i, ok, err)
			}
		}
		if got := s.Stats().Pending; got != uint64(n) {
			t.Fatalf("%d pending events, want %d", got, n)
		}
	}
	getAll(s, 30)
	r.schedule(s, 30, 40)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	r.cut()
	s = r.mustOpen(false)
	defer s.Close()
	waitFor(t, 10*time.Second, "the replica leads", s.IsLeader)
	getAll(s, 40)
}

// walToBolt rewrites the replica directory dir as a build before raft-wal left it: its
// log and raft's stable keys in raft.db, and no wal.
func walToBolt(t *testing.T, dir string) {
	t.Helper()
	w, err := openWAL(filepath.Join(dir, walDirName), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, boltLogName)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	first, last, err := firstLast(w)
	if err != nil || last == 0 {
		t.Fatalf("the wal holds entries %d-%d (%v)", first, last, err)
	}
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if err := b.StoreLog(&l); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"CurrentTerm", "LastVoteTerm"} {
		v, err := w.GetUint64([]byte(k))
		if err == nil {
			err = b.SetUint64([]byte(k), v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	v, err := w.Get([]byte("LastVoteCand"))
	if err == nil {
		err = b.Set([]byte("LastVoteCand"), v)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(w.Close(), os.RemoveAll(filepath.Join(dir, walDirName))); err != nil {
		t.Fatal(err)
	}
}
