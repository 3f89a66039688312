package raftfsm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// genLog returns n log entries that make sense in order (marks name seqs that exist).
func genLog(seed uint64, n int) []*raft.Log { return genLogFrom(newGen(seed), n) }

// genLogFrom returns n log entries from g.
func genLogFrom(g *gen, n int) []*raft.Log {
	m := newModel()
	logs := make([]*raft.Log, n)
	for i := range logs {
		var c Command
		logs[i], c = g.entry(m)
		m.apply(logs[i], c)
	}
	return logs
}

func cmdLog(index uint64, c Command) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: encode(c)}
}

// TestScheduleCancelMark walks the rules of doc.go once, readably: idempotency within and
// across batches, the cancel outcomes, the mark outcomes and their counters, and the order of
// observer calls.
func TestScheduleCancelMark(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, obs := newTestFSM(t, st, 1)
	defer f.Close()
	var trace []string
	f.obs = tracingObserver{obs, &trace}

	ev := func(id string, due int64, payload string) NewEvent {
		return NewEvent{ID: id, Due: due, Topic: "t", Payload: []byte(payload), ContentHash: ContentHash("t", nil, []byte(payload), nil, 0, 0, false, false, DefaultPolicy, Output{})}
	}
	got := f.ApplyBatch([]*raft.Log{
		cmdLog(1, &ScheduleBatch{ProposedAt: 100, Events: []NewEvent{
			ev("a", 1000, "x"), ev("a", 2000, "x"), ev("b", 500, "y"), ev("a", 1000, "other"),
		}}),
		cmdLog(2, &Cancel{ProposedAt: 200, IDs: []string{"a", "a", "nope"}}),
		cmdLog(3, &ScheduleBatch{ProposedAt: 300, Events: []NewEvent{ev("a", 9999, "x")}}),
		cmdLog(4, &MarkFired{ProposedAt: 400, Entries: []Fired{{Seq: 1, FiredAt: 401, Attempts: 1}, {Seq: 2, FiredAt: 402, Attempts: 2}, {Seq: 2, FiredAt: 403, Attempts: 1}, {Seq: 77}}}),
		cmdLog(5, &MarkDeadLettered{ProposedAt: 500, Entries: []DeadLettered{{Seq: 2, At: 501, Attempts: 9, Error: "e", Topic: "dlq"}}}),
	})
	want := []interface{}{
		&ScheduleBatchResult{Results: []ScheduleResult{{Created, 1, 1000, 1}, {Existing, 1, 1000, 0}, {Created, 2, 500, 1}, {Conflict, 1, 1000, 0}}},
		&CancelBatchResult{Results: []CancelResult{{Cancelled, 1}, {AlreadyCancelled, 1}, {NotFound, 0}}},
		&ScheduleBatchResult{Results: []ScheduleResult{{Existing, 1, 1000, 0}}},
		&MarkBatchResult{Outcomes: []MarkOutcome{WasCancelled, Marked, WasFired, UnknownSeq}},
		&MarkBatchResult{Outcomes: []MarkOutcome{WasFired}},
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("entry %d: got %s, want %s", i+1, show(got[i]), show(want[i]))
		}
	}
	if want := []string{"Scheduled(1,1000)", "Scheduled(2,500)", "Settled(1)", "Settled(2)"}; !slices.Equal(trace, want) {
		t.Errorf("observer calls %v, want %v", trace, want)
	}
	wantStats := Stats{Fired: 1, Cancelled: 1, Refired: 1, FiredAfterCancel: 1, Retained: 2, AppliedIndex: 5, AppliedTerm: 1, NextSeq: 3}
	if s := f.Stats(); s != wantStats {
		t.Errorf("Stats %+v, want %+v", s, wantStats)
	}
	rec, ok, err := f.Get("b")
	wantRec := Record{Seq: 2, ID: "b", State: StateFired, Due: 500, CreatedAt: 100, FiredAt: 402, Attempts: 2, Topic: "t", Payload: []byte("y"), ContentHash: ev("b", 0, "y").ContentHash, Version: 1}
	if err != nil || !ok || !reflect.DeepEqual(rec, wantRec) {
		t.Errorf("Get(b) = %+v, %v, %v; want %+v", rec, ok, err, wantRec)
	}
	// Unknown seq 9, seq 1 under a due it does not have, a duplicate: left out. Due order.
	recs, err := f.ReadForFire([]Ref{{9, 1000}, {1, 1000}, {2, 500}, {1, 999}, {2, 500}}, nil)
	if err != nil || len(recs) != 2 || recs[0].Seq != 2 || recs[0].State != StateFired || recs[1].Seq != 1 || recs[1].State != StateCancelled || recs[1].CancelledAt != 200 {
		t.Errorf("ReadForFire = %+v, %v; want seq 2 (Fired) then seq 1 (Cancelled at 200)", recs, err)
	}
}

type tracingObserver struct {
	Observer
	trace *[]string
}

func (o tracingObserver) Scheduled(seq uint64, due int64, p Policy) {
	*o.trace = append(*o.trace, fmt.Sprintf("Scheduled(%d,%d)", seq, due))
	o.Observer.Scheduled(seq, due, p)
}

func (o tracingObserver) Settled(seq uint64) {
	*o.trace = append(*o.trace, fmt.Sprintf("Settled(%d)", seq))
	o.Observer.Settled(seq)
}

// TestDeterministicKeySpace: two replicas fed the same log, one entry at a time on one and in
// random batches on the other, give the same responses and byte-identical shard key spaces.
func TestDeterministicKeySpace(t *testing.T) {
	logs := genLog(11, 600)
	a, b, fa, fb := twoReplicas(t, 3)

	var ra, rb []interface{}
	for _, l := range logs {
		ra = append(ra, fa.Apply(l))
	}
	g := newGen(99)
	for i := 0; i < len(logs); {
		n := min(1+g.rng.IntN(16), len(logs)-i)
		rb = append(rb, fb.ApplyBatch(logs[i:i+n])...)
		i += n
	}
	for i := range ra {
		if !reflect.DeepEqual(ra[i], rb[i]) {
			t.Fatalf("entry %d: %s vs %s", i+1, show(ra[i]), show(rb[i]))
		}
	}
	if n := len(dumpShard(t, a, 3)); n < 1000 {
		t.Fatalf("only %d keys: the log is too small to prove much", n)
	}
	sameReplicas(t, "replica A vs B", a, b, fa, fb)
}

// twoReplicas opens two stores, each with an FSM for shard; the stores close when the test ends.
func twoReplicas(t *testing.T, shard uint32) (a, b *Store, fa, fb *FSM) {
	t.Helper()
	a = openTestStore(t, t.TempDir(), StoreOptions{})
	t.Cleanup(func() { a.Close() })
	b = openTestStore(t, t.TempDir(), StoreOptions{})
	t.Cleanup(func() { b.Close() })
	fa, _ = newTestFSM(t, a, shard)
	fb, _ = newTestFSM(t, b, shard)
	return a, b, fa, fb
}

// sameReplicas fails unless the two replicas hold identical key spaces and Stats.
func sameReplicas(t *testing.T, what string, a, b *Store, fa, fb *FSM) {
	t.Helper()
	sameKeySpace(t, what, dumpShard(t, a, fa.Shard()), dumpShard(t, b, fb.Shard()))
	if fa.Stats() != fb.Stats() {
		t.Fatalf("%s: Stats differ: %+v vs %+v", what, fa.Stats(), fb.Stats())
	}
}

// TestMarkFiredDueKnownChangesNothing: a MarkFired that carries due times (settled from the
// in-memory pending set, without reading the events) leaves exactly the key space and results
// of the same MarkFired without them, which reads every event.
func TestMarkFiredDueKnownChangesNothing(t *testing.T) {
	logs := genLog(12, 800)
	a, b, fa, fb := twoReplicas(t, 3)
	withDue := 0
	for i, l := range logs {
		lb := *l
		if l.Type == raft.LogCommand {
			c, err := DecodeCommand(l.Data)
			if err != nil {
				t.Fatal(err)
			}
			if mf, ok := c.(*MarkFired); ok && mf.DueKnown {
				withDue++
				mf.DueKnown = false
				lb.Data = AppendMarkFired(nil, mf)
			}
		}
		ra, rb := fa.Apply(l), fb.Apply(&lb)
		if !reflect.DeepEqual(ra, rb) {
			t.Fatalf("entry %d: %s with due times vs %s without", i+1, show(ra), show(rb))
		}
	}
	if withDue < 50 {
		t.Fatalf("only %d MarkFired entries carried due times", withDue)
	}
	sameReplicas(t, "with due times vs without", a, b, fa, fb)
	awaitPending(t, fa)
	wantPendingSet(t, fa)
	if got, want := fa.pending.set.count(), int(fa.Stats().Pending); got != want {
		t.Fatalf("pending set holds %d events, Stats says %d", got, want)
	}
}

// TestPendingSetBuiltWhileApplying: until a replica's pending set is built, apply tells
// pending events from Pebble, with exactly the results and key space of a replica whose set
// is loaded; and the set the build hands over, with what apply did meanwhile, equals the due
// index. The build is held while a log of schedules, cancels, marks (with and without due
// times) and expiries is applied, after a reopen, so that it scans a non-empty due index.
func TestPendingSetBuiltWhileApplying(t *testing.T) {
	logs := genLog(13, 1200)
	// A's store holds its builds at release once holding is set, after its first build.
	var holding atomic.Bool
	release := make(chan struct{})
	a := openTestStore(t, t.TempDir(), StoreOptions{Knobs: Knobs{PendingBuild: func(stop <-chan struct{}) {
		if !holding.Load() {
			return
		}
		select {
		case <-release:
		case <-stop:
		}
	}}})
	t.Cleanup(func() { a.Close() })
	b := openTestStore(t, t.TempDir(), StoreOptions{})
	t.Cleanup(func() { b.Close() })
	fa, _ := newTestFSM(t, a, 3)
	fb, _ := newTestFSM(t, b, 3)
	if err := fb.LoadPending(maxDue, nil); err != nil {
		t.Fatal(err)
	}
	awaitPending(t, fb)
	apply := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if ra, rb := fa.Apply(logs[i]), fb.Apply(logs[i]); !reflect.DeepEqual(ra, rb) {
				t.Fatalf("entry %d (pending set loaded on B: %v, on A: %v): %s vs %s", i+1, fb.pending.loaded, fa.pending.loaded, show(ra), show(rb))
			}
		}
	}
	apply(0, 400)

	// Reopen A with its build held, so that it answers from Pebble.
	fa.Close()
	holding.Store(true)
	var once sync.Once
	releaseBuild := func() { once.Do(func() { close(release) }) }
	defer releaseBuild() // before the stores close, which wait for the build
	fa, _ = newTestFSM(t, a, 3)
	t.Cleanup(fa.Close)
	apply(400, 900)
	if fa.pending.loaded {
		t.Fatal("A's pending set loaded while its build was held")
	}
	sameReplicas(t, "A answering from Pebble vs B from its pending set", a, b, fa, fb)

	releaseBuild()
	apply(900, len(logs))
	awaitPending(t, fa)
	wantPendingSet(t, fa)
	sameReplicas(t, "after A's build", a, b, fa, fb)
}

// TestRestoreLeavesOtherShardsUntouched: with several shards in one Store, including the
// first and the last possible shard ids, restoring one changes exactly that shard's keys.
func TestRestoreLeavesOtherShardsUntouched(t *testing.T) {
	shards := []uint32{0, 1, 2, math.MaxUint32}
	node := openTestStore(t, t.TempDir(), StoreOptions{})
	defer node.Close()
	other := openTestStore(t, t.TempDir(), StoreOptions{})
	defer other.Close()

	fsms := map[uint32]*FSM{}
	for i, s := range shards {
		fsms[s], _ = newTestFSM(t, node, s)
		fsms[s].ApplyBatch(genLog(uint64(i), 150))
	}
	before := map[uint32][]kv{}
	stats := map[uint32]Stats{}
	for _, s := range shards {
		before[s], stats[s] = dumpShard(t, node, s), fsms[s].Stats()
	}

	for i, s := range []uint32{1, math.MaxUint32} {
		src, _ := newTestFSM(t, other, s)
		src.ApplyBatch(genLog(uint64(100+i), 80))
		if err := restore(fsms[s], snapshotBytes(t, src)); err != nil {
			t.Fatalf("restore shard %d: %v", s, err)
		}
		sameKeySpace(t, fmt.Sprintf("restored shard %d vs its source", s), dumpShard(t, node, s), dumpShard(t, other, s))
		if fsms[s].Stats() != src.Stats() {
			t.Fatalf("shard %d: restored Stats %+v, source %+v", s, fsms[s].Stats(), src.Stats())
		}
	}
	for _, s := range []uint32{0, 2} {
		sameKeySpace(t, fmt.Sprintf("untouched shard %d", s), before[s], dumpShard(t, node, s))
		if fsms[s].Stats() != stats[s] {
			t.Fatalf("shard %d Stats changed: %+v → %+v", s, stats[s], fsms[s].Stats())
		}
	}

	// A snapshot of one shard offered to another is refused before anything is touched.
	err := restore(fsms[2], snapshotBytes(t, fsms[0]))
	if !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), "snapshot of shard 0") {
		t.Fatalf("restore of shard 0's snapshot into shard 2: %v", err)
	}
	if fsms[2].NeedsRestore() {
		t.Fatal("a refused header left the restore marker")
	}
	sameKeySpace(t, "shard 2 after a refused restore", before[2], dumpShard(t, node, 2))
}

// TestReopenSkipsReplayedEntries: after a clean restart the applied index, counters and
// records are as before, and raft's replay of the log changes nothing and notifies nobody.
func TestReopenSkipsReplayedEntries(t *testing.T) {
	dir := t.TempDir()
	logs := genLog(5, 300)
	st := openTestStore(t, dir, StoreOptions{})
	f, _ := newTestFSM(t, st, 9)
	f.ApplyBatch(logs[:200])
	stats, keys := f.Stats(), dumpShard(t, st, 9)
	f.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openTestStore(t, dir, StoreOptions{})
	defer st.Close()
	f, obs := newTestFSM(t, st, 9)
	if f.AppliedIndex() != 200 || f.Stats() != stats {
		t.Fatalf("after reopen: AppliedIndex %d, Stats %+v; want 200, %+v", f.AppliedIndex(), f.Stats(), stats)
	}
	if uint64(len(obs.pending)) != stats.Pending {
		t.Fatalf("rebuilt pending set has %d events, Stats says %d", len(obs.pending), stats.Pending)
	}
	for i, r := range f.ApplyBatch(logs[:200]) {
		if r != ErrReplayed {
			t.Fatalf("replayed entry %d: %s", i+1, show(r))
		}
	}
	// A replayed entry is not even decoded: garbage at an applied index is skipped.
	if r := f.Apply(&raft.Log{Index: 7, Type: raft.LogCommand, Data: []byte{0xee}}); r != ErrReplayed {
		t.Fatalf("garbage at applied index 7: %s", show(r))
	}
	if obs.calls != 0 {
		t.Fatalf("replay notified the observer %d times", obs.calls)
	}
	sameKeySpace(t, "after replay", keys, dumpShard(t, st, 9))

	// Raft's batch may straddle the applied index: the old part is skipped, the rest applies.
	rs := f.ApplyBatch(logs[190:300])
	for i, r := range rs {
		if replayed := r == ErrReplayed; replayed != (i < 10) {
			t.Fatalf("entry %d: %s", 191+i, show(r))
		}
	}
	if f.AppliedIndex() != 300 {
		t.Fatalf("AppliedIndex %d, want 300", f.AppliedIndex())
	}
}

// TestCrashAfterSnapshot: a crash loses Pebble writes that were never flushed, but never
// those at or below the index of a snapshot raft persisted (Persist flushes first). Re-applying the
// log from wherever Pebble stands gives the same key space as a replica that never crashed.
func TestCrashAfterSnapshot(t *testing.T) {
	logs := genLog(8, 400)
	fs := vfs.NewCrashableMem()
	st := openTestStore(t, "db", StoreOptions{FS: fs})
	f, _ := newTestFSM(t, st, 4)
	// Small batches, as raft delivers them: one huge batch would get a memtable of its own,
	// flushed, and hide the loss this test is about.
	applyInChunks := func(f *FSM, logs []*raft.Log) {
		for len(logs) > 0 {
			n := min(4, len(logs))
			f.ApplyBatch(logs[:n])
			logs = logs[n:]
		}
	}
	applyInChunks(f, logs[:150])
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Raft applies more while it persists the snapshot, and truncates its log only after.
	applyInChunks(f, logs[150:200])
	persist(t, snap)
	applyInChunks(f, logs[200:])
	want := dumpShard(t, st, 4)
	// The power cut: keep exactly what was synced.
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	f.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openTestStore(t, "db", StoreOptions{FS: crashed})
	defer st.Close()
	f, obs := newTestFSM(t, st, 4)
	at := f.AppliedIndex()
	if at < 150 {
		t.Fatalf("after the crash AppliedIndex is %d, below the snapshot index 150 that raft may have truncated to", at)
	}
	if at == 400 {
		t.Fatalf("the crash lost nothing: this test no longer shows that unsynced applies are lost and replayed")
	}
	// Raft replays everything after its snapshot.
	applyInChunks(f, logs[150:])
	sameKeySpace(t, "crashed and replayed vs never crashed", want, dumpShard(t, st, 4))
	if uint64(len(obs.pending)) != f.Stats().Pending {
		t.Fatalf("observer holds %d pending, Stats says %d", len(obs.pending), f.Stats().Pending)
	}
}

// TestRestoreRejectsCorruptSnapshot: any damaged byte, truncation, trailing garbage or
// frame out of order makes Restore fail, and a failed restore leaves the replica exactly as
// it was: the same keys, the same Stats, reads and applies working, across a restart, and no
// staging files behind.
func TestRestoreRejectsCorruptSnapshot(t *testing.T) {
	srcStore := openTestStore(t, t.TempDir(), StoreOptions{})
	defer srcStore.Close()
	src, _ := newTestFSM(t, srcStore, 2)
	src.ApplyBatch(genLog(21, 120))
	good := snapshotBytes(t, src)

	dir := t.TempDir()
	st := openTestStore(t, dir, StoreOptions{})
	f, _ := newTestFSM(t, st, 2)
	f.ApplyBatch(genLog(22, 50)) // state the restore must replace
	before, beforeStats := dumpShard(t, st, 2), f.Stats()
	unchanged := func(what string) {
		t.Helper()
		if f.NeedsRestore() {
			t.Fatalf("%s: NeedsRestore after a refused restore", what)
		}
		sameKeySpace(t, what, before, dumpShard(t, st, 2))
		if f.Stats() != beforeStats {
			t.Fatalf("%s: Stats %+v, want %+v", what, f.Stats(), beforeStats)
		}
		if _, _, err := f.Get("id-1"); err != nil {
			t.Fatalf("%s: Get: %v", what, err)
		}
	}

	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 0x40
	if err := restore(f, bad); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("restore of a corrupt snapshot: %v, want ErrBadSnapshot", err)
	}
	unchanged("a corrupt snapshot")

	f.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openTestStore(t, dir, StoreOptions{})
	defer st.Close()
	f, obs := newTestFSM(t, st, 2)
	unchanged("a corrupt snapshot, then a restart")

	header := snapshotHeaderLen
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"truncated in the header", good[:10]},
		{"truncated in the frames", good[:len(good)/3]},
		{"truncated before the checksum", good[:len(good)-4]},
		{"trailing garbage", append(slices.Clone(good), 0)},
		{"empty", nil},
		{"frames out of order", swappedFrames(t, good)},
	} {
		if err := restore(f, tc.data); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", tc.name, err)
		}
		unchanged(tc.name)
	}
	// Every byte matters: flip each in turn (all of header and trailer, a sample between).
	// -short flips every fourth byte of header and trailer and about 4 between. A flip
	// inside the compressed body may leave the data as it was (a copy from another offset of
	// a run of equal bytes): then the restore must hold exactly the source's keys. Those
	// restores go to another replica, so f stays as it was.
	other := openTestStore(t, t.TempDir(), StoreOptions{})
	defer other.Close()
	fo, _ := newTestFSM(t, other, 2)
	want := dumpShard(t, srcStore, 2)
	g := newGen(3)
	between := len(good) / 40
	if testing.Short() {
		between = len(good) / 4
	}
	harmless := 0
	for pos := range len(good) {
		edge := pos < header || pos >= len(good)-16
		if edge && testing.Short() && pos%4 != 0 || !edge && g.rng.IntN(between) != 0 {
			continue
		}
		bad := slices.Clone(good)
		bad[pos] ^= 1 << g.rng.IntN(8)
		err := restore(fo, bad)
		switch {
		case err == nil && pos < header:
			t.Fatalf("flipping a bit of header byte %d went unnoticed", pos)
		case err == nil:
			sameKeySpace(t, fmt.Sprintf("a flip at byte %d that changed nothing", pos), want, dumpShard(t, other, 2))
			harmless++
		case pos < header && !errors.Is(err, ErrBadSnapshot):
			t.Fatalf("byte %d: %v", pos, err)
		}
	}
	if harmless > 5 {
		t.Errorf("%d flips went unnoticed: compressed data is not checked", harmless)
	}
	if names, _ := os.ReadDir(filepath.Join(dir)); slices.ContainsFunc(names, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), stagingPrefix) }) {
		t.Fatalf("refused restores left staging directories: %v", names)
	}

	if err := restore(f, good); err != nil {
		t.Fatalf("good restore after failures: %v", err)
	}
	sameKeySpace(t, "restored vs source", dumpShard(t, srcStore, 2), dumpShard(t, st, 2))
	if f.Stats() != src.Stats() || uint64(len(obs.pending)) != src.Stats().Pending {
		t.Fatalf("after restore Stats %+v (observer %d pending), source %+v", f.Stats(), len(obs.pending), src.Stats())
	}
	if _, _, err := f.Get("id-1"); err != nil {
		t.Fatalf("Get after restore: %v", err)
	}
}

// swappedFrames returns the stream with its second and third frames swapped and the
// checksum recomputed, as a sender that means harm would.
func swappedFrames(t *testing.T, stream []byte) []byte {
	t.Helper()
	header, frames := splitStream(t, stream)
	frames[1], frames[2] = frames[2], frames[1]
	return joinStream(t, header, frames)
}

// TestOldRestoreMarker: a restore marker the version before left (it wiped the shard
// first, and a crash interrupted it) makes the shard refuse reads, snapshots and applies
// until a restore succeeds; the successful one removes it.
func TestOldRestoreMarker(t *testing.T) {
	srcStore := openTestStore(t, t.TempDir(), StoreOptions{})
	defer srcStore.Close()
	src, _ := newTestFSM(t, srcStore, 2)
	src.ApplyBatch(genLog(23, 80))
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	if err := st.db.Set(appendShardTag(nil, 2, tagRestoring), nil, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	f, _ := newTestFSM(t, st, 2)
	checkRestoring(t, f)
	if err := restore(f, snapshotBytes(t, src)); err != nil {
		t.Fatal(err)
	}
	if f.NeedsRestore() {
		t.Fatal("NeedsRestore after a good restore")
	}
	sameKeySpace(t, "restored over a marker", dumpShard(t, srcStore, 2), dumpShard(t, st, 2))
}

func checkRestoring(t *testing.T, f *FSM) {
	t.Helper()
	if !f.NeedsRestore() {
		t.Fatal("NeedsRestore is false over a restore marker")
	}
	if _, _, err := f.Get("id-1"); !errors.Is(err, ErrRestoring) {
		t.Fatalf("Get during an unfinished restore: %v, want ErrRestoring", err)
	}
	if err := f.ForEachPending(func(uint64, int64, Policy) error { return nil }); !errors.Is(err, ErrRestoring) {
		t.Fatalf("ForEachPending during an unfinished restore: %v, want ErrRestoring", err)
	}
	if _, err := f.Snapshot(); !errors.Is(err, ErrRestoring) {
		t.Fatalf("Snapshot during an unfinished restore: %v, want ErrRestoring", err)
	}
	msg := panicMessage(func() { f.Apply(cmdLog(f.AppliedIndex()+1, &Cancel{IDs: []string{"x"}})) })
	if !strings.Contains(msg, "unfinished restore") {
		t.Fatalf("Apply during an unfinished restore: panic %q", msg)
	}
}

func panicMessage(fn func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	fn()
	return ""
}

// TestApplyPanicsOnUndecodableEntry: design invariant 5; nothing of the batch is committed.
func TestApplyPanicsOnUndecodableEntry(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, obs := newTestFSM(t, st, 1)
	for _, data := range [][]byte{nil, {0xee, 1, 2}, {byte(TypeCancel), 0, 5, 1}} {
		msg := panicMessage(func() {
			f.ApplyBatch([]*raft.Log{
				cmdLog(1, &ScheduleBatch{Events: []NewEvent{{ID: "a"}}}),
				{Index: 2, Term: 1, Type: raft.LogCommand, Data: data},
			})
		})
		if !strings.Contains(msg, "log entry 2 (term 1) cannot be applied") || !strings.Contains(msg, ErrMalformedCommand.Error()) {
			t.Fatalf("data %x: panic %q", data, msg)
		}
	}
	if f.AppliedIndex() != 0 || obs.calls != 0 || len(dumpShard(t, st, 1)) != 0 {
		t.Fatalf("a panicking batch left traces: applied %d, observer calls %d", f.AppliedIndex(), obs.calls)
	}
}

func TestNewFSMRefusesSecondOpen(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 1)
	if _, err := NewFSM(st, 1, nil); !errors.Is(err, ErrShardOpen) {
		t.Fatalf("second NewFSM for shard 1: %v, want ErrShardOpen", err)
	}
	f.Close()
	g, err := NewFSM(st, 1, nil)
	if err != nil {
		t.Fatalf("NewFSM after Close: %v", err)
	}
	g.Close()
}

func TestDropShardRemovesOnlyThatShard(t *testing.T) {
	st, err := OpenStore(t.TempDir(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, shard := range []uint32{1, 2} {
		f, err := NewFSM(st, shard, nil)
		if err != nil {
			t.Fatal(err)
		}
		cmd := ScheduleBatch{ProposedAt: 1, Events: []NewEvent{{ID: "a", Due: 5, Topic: "t", ContentHash: 9}}}
		f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: AppendScheduleBatch(nil, &cmd)})
		if shard == 1 {
			if err := st.DropShard(1); err == nil {
				t.Fatal("DropShard of a shard with an open FSM succeeded")
			}
		}
		f.Close()
	}
	if err := st.DropShard(1); err != nil {
		t.Fatal(err)
	}
	for shard, want := range map[uint32]bool{1: false, 2: true} {
		f, err := NewFSM(st, shard, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, found, err := f.Get("a")
		if err != nil || found != want {
			t.Fatalf("shard %d after dropping shard 1: found=%v err=%v, want found=%v", shard, found, err, want)
		}
		if want == false && f.AppliedIndex() != 0 {
			t.Fatalf("dropped shard kept applied index %d", f.AppliedIndex())
		}
		f.Close()
	}
}

func TestDigestMatchesAcrossReplicasAndSeesChanges(t *testing.T) {
	var fsms []*FSM
	for range 2 {
		st, err := OpenStore(t.TempDir(), StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		f, err := NewFSM(st, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fsms = append(fsms, f)
	}
	sched := AppendScheduleBatch(nil, &ScheduleBatch{ProposedAt: 1, Events: []NewEvent{
		{ID: "a", Due: 5, Topic: "t", ContentHash: 1}, {ID: "b", Due: 6, Topic: "t", ContentHash: 2}}})
	for _, f := range fsms {
		f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: sched})
	}
	i0, d0, err := fsms[0].Digest()
	i1, d1, err1 := fsms[1].Digest()
	if err != nil || err1 != nil || i0 != 1 || i1 != 1 || d0 != d1 {
		t.Fatalf("replicas at the same index: (%d %x %v) vs (%d %x %v)", i0, d0, err, i1, d1, err1)
	}
	cancel := AppendCancel(nil, &Cancel{ProposedAt: 2, IDs: []string{"a"}})
	fsms[1].Apply(&raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: cancel})
	i1, d1, _ = fsms[1].Digest()
	if i1 != 2 || d1 == d0 {
		t.Fatalf("after a cancel: index %d digest %x; want index 2 and a new digest", i1, d1)
	}
}

// TestSnapshotIsAReference: what raft keeps after Snapshot is a reference to the replica's
// own state, tiny whatever the shard holds; Restore refuses it without touching anything, and
// WriteSnapshot gives the full stream that a reference stands for.
func TestSnapshotIsAReference(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, _ := newTestFSM(t, st, 2)
	logs := genLog(5, 300)
	for _, l := range logs {
		f.Apply(l)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	ref := persist(t, snap)
	if !IsSnapshotReference(bufio.NewReader(bytes.NewReader(ref))) || len(ref) > 64 {
		t.Fatalf("Snapshot persisted %d bytes, not a reference", len(ref))
	}
	before := dumpShard(t, st, 2)
	if err := restore(f, ref); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("Restore of a reference: %v, want ErrBadSnapshot", err)
	}
	if f.NeedsRestore() {
		t.Fatal("a refused reference left the shard needing a restore")
	}
	sameKeySpace(t, "after refusing a reference", before, dumpShard(t, st, 2))

	full := snapshotBytes(t, f)
	if IsSnapshotReference(bufio.NewReader(bytes.NewReader(full))) {
		t.Fatal("WriteSnapshot wrote a reference")
	}
	other := openTestStore(t, t.TempDir(), StoreOptions{})
	defer other.Close()
	g, _ := newTestFSM(t, other, 2)
	if err := restore(g, full); err != nil {
		t.Fatal(err)
	}
	sameKeySpace(t, "restored from WriteSnapshot", before, dumpShard(t, other, 2))
	if g.AppliedIndex() != f.AppliedIndex() {
		t.Fatalf("restored AppliedIndex %d, want %d", g.AppliedIndex(), f.AppliedIndex())
	}
}

// TestOldLayoutRefused: a shard stored in key layout 1 (meta byte 1) is refused by name, not
// read as if it were layout 2.
func TestOldLayoutRefused(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir, StoreOptions{})
	defer st.Close()
	m := freshMeta()
	v := m.append(nil)[:metaLenV2] // layout 1's meta had nine counters
	v[0] = 1
	if err := st.db.Set(appendShardTag(nil, 4, tagMeta), v, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFSM(st, 4, nil); !errors.Is(err, ErrOldLayout) {
		t.Fatalf("NewFSM over a layout 1 shard: %v, want ErrOldLayout", err)
	}
}

// batchTracer is a BatchObserver that records the order of its calls.
type batchTracer struct {
	tracingObserver
}

func (o batchTracer) BeginNotes() { *o.trace = append(*o.trace, "Begin") }
func (o batchTracer) EndNotes()   { *o.trace = append(*o.trace, "End") }

// TestBatchObserverBracketsEachApply: a BatchObserver hears BeginNotes and
// EndNotes around the calls of each applied batch, and neither for a batch
// that makes none.
func TestBatchObserverBracketsEachApply(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	f, obs := newTestFSM(t, st, 1)
	defer f.Close()
	var trace []string
	f.obs = batchTracer{tracingObserver{obs, &trace}}
	ev := func(id string, due int64) NewEvent {
		return NewEvent{ID: id, Due: due, Topic: "t", Policy: DefaultPolicy, ContentHash: ContentHash("t", nil, nil, nil, 0, 0, false, false, DefaultPolicy, Output{})}
	}
	f.ApplyBatch([]*raft.Log{
		cmdLog(1, &ScheduleBatch{ProposedAt: 1, Events: []NewEvent{ev("a", 10), ev("b", 20)}}),
		cmdLog(2, &Cancel{ProposedAt: 2, IDs: []string{"a"}}),
	})
	f.ApplyBatch([]*raft.Log{cmdLog(3, &Cancel{ProposedAt: 3, IDs: []string{"nope"}})})
	if want := []string{"Begin", "Scheduled(1,10)", "Scheduled(2,20)", "Settled(1)", "End"}; !slices.Equal(trace, want) {
		t.Fatalf("observer calls %v, want %v", trace, want)
	}
}
