package shard

import (
	"context"
	"errors"
	"fmt"
	"math"
	mathrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/raftmux"
	"github.com/hashicorp/raft"
)

// TestFollowerCatchesUpFromAnExpandedSnapshot: the leader's snapshots are
// references and its log is truncated behind them, so a new replica can only
// be brought up by a snapshot: the reference is expanded into the full shard,
// sent, restored, and the replica then holds exactly the leader's state. It
// is sent on the install layer, or, to a node of the version before, inside
// raft's request.
func TestFollowerCatchesUpFromAnExpandedSnapshot(t *testing.T) {
	for _, oldFollower := range []bool{false, true} {
		t.Run(fmt.Sprintf("follower without install layer=%v", oldFollower), func(t *testing.T) {
			followerCatchesUp(t, oldFollower)
		})
	}
}

func followerCatchesUp(t *testing.T, oldFollower bool) {
	pub, err := publish.New(publish.Config{Brokers: startBroker(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	tune := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, SnapshotThreshold: 8, TrailingLogs: 4}
	open := func(name string, bootstrap bool) snapReplica {
		return openSnapReplica(t, name, bootstrap, tune, pub, replicaOptions{
			StoreOptions: raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait}, noInstallLayer: oldFollower && !bootstrap,
			knobs: Knobs{ExpansionReuse: 200 * time.Millisecond}})
	}
	schedule := func(s *Shard, from, to int) { scheduleFor(t, s, from, to, 0) }

	a := open("a", true)
	waitFor(t, 10*time.Second, "a leads", a.s.IsLeader)
	schedule(a.s, 0, 60)
	if err := a.s.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	schedule(a.s, 60, 70) // entries after the snapshot, sent from the log
	if first, err := a.s.logs.FirstIndex(); err != nil || first < 50 {
		t.Fatalf("the leader's log starts at %d (%v): not truncated behind the snapshot", first, err)
	}

	b := open("b", false)
	if err := a.s.Raft().AddVoter("b", raft.ServerAddress(b.addr), 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "b catches up", func() bool { return b.s.AppliedIndex() >= a.s.AppliedIndex() })
	ia, da, err := a.s.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ib, db, err := b.s.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if ia != ib || da != db {
		t.Fatalf("leader at %d digest %x, new replica at %d digest %x", ia, da, ib, db)
	}
	if got := b.s.Stats().Pending; got != 70 {
		t.Fatalf("new replica holds %d pending events, want 70", got)
	}
	metas, err := raft.NewFileSnapshotStore(b.dir, 2, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if list, err := metas.List(); err != nil || len(list) == 0 {
		t.Fatalf("the new replica holds no snapshot (%v): it was not brought up by one", err)
	}
	// raft closes the expansion it sent once the follower has answered the
	// install, which can be after the follower has applied it and reports
	// itself caught up; it is deleted Knobs.ExpansionReuse after.
	waitFor(t, 5*time.Second, "no expansion is left behind", func() bool {
		left, _ := filepath.Glob(filepath.Join(a.dir, "expand-*"))
		return len(left) == 0
	})
	if left, _ := filepath.Glob(filepath.Join(b.dir, "install-*")); len(left) > 0 {
		t.Fatalf("the new replica kept %s after installing it", left)
	}
}

// snapReplica is a replica of shard 0 with its own Pebble and TCP raft
// transport, for tests of what replicas send each other.
type snapReplica struct {
	s    *Shard
	dir  string // the shard's raft directory
	addr string
}

// replicaOptions are a test replica's store options, whether it lacks an
// install layer, as a node of the version before does, and its knobs.
type replicaOptions struct {
	raftfsm.StoreOptions
	noInstallLayer bool
	knobs          Knobs
}

func openSnapReplica(t *testing.T, name string, bootstrap bool, tune Tuning, pub *publish.Publisher, opts replicaOptions) snapReplica {
	t.Helper()
	dir := t.TempDir()
	st, err := raftfsm.OpenStore(filepath.Join(dir, "pebble"), opts.StoreOptions)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := raftmux.New(ln, nil, nil)
	layer, err := mux.Layer(0)
	if err != nil {
		t.Fatal(err)
	}
	var installs raft.StreamLayer
	if !opts.noInstallLayer {
		if installs, err = mux.Layer(InstallLayerID(0)); err != nil {
			t.Fatal(err)
		}
	}
	r := snapReplica{dir: filepath.Join(dir, "shard"), addr: ln.Addr().String()}
	var voters []raft.Server
	if bootstrap {
		voters = []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(name), Address: raft.ServerAddress(r.addr)}}
	}
	r.s, err = Open(Config{ID: 0, NodeID: name, Dir: r.dir, Store: st, Layer: layer, InstallLayer: installs,
		Publisher: pub, Bootstrap: voters, Tuning: tune, Knobs: opts.knobs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // teardown, as a deferred Close
		_ = r.s.Close()
		_ = mux.Close()
		_ = st.Close()
	})
	return r
}

// scheduleFor schedules events e<from>..e<to-1>, an hour out, one entry
// each, with payloads of size random bytes (one byte when 0).
func scheduleFor(t *testing.T, s *Shard, from, to, size int) {
	t.Helper()
	for i := from; i < to; i++ {
		payload := []byte("p")
		if size > 0 {
			payload = make([]byte, size)
			_, _ = mathrand.NewChaCha8([32]byte{byte(i), byte(i >> 8)}).Read(payload)
		}
		r := Request{ID: fmt.Sprintf("e%d", i), Delay: time.Hour, HasDelay: true, Topic: "snap", Payload: payload}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		if _, err := s.Schedule(context.Background(), []Request{r}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOneCopyWhileSnapshotsAreTaken: a new replica is sent one copy of the
// shard, though raft compacted its log up to the latest snapshot's own index
// and the leader takes another snapshot while the copy is sent. Once the
// follower installed a copy that is no longer the latest snapshot, raft asks
// the log for the entry at the copy's index; were it gone, raft would send
// the follower a second copy.
func TestOneCopyWhileSnapshotsAreTaken(t *testing.T) {
	pub, err := publish.New(publish.Config{Brokers: startBroker(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// No snapshots but the test's; the snapshot's own entry is compacted when
	// one entry follows it; a copy of ~130 KiB takes seconds to write and send.
	tune := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, SnapshotThreshold: 1 << 30, TrailingLogs: 1, InstallRate: 64 << 10}
	// A reference waits up to a second for a Pebble flush: entries arrive meanwhile.
	a := openSnapReplica(t, "a", true, tune, pub, replicaOptions{StoreOptions: raftfsm.StoreOptions{SnapshotFlushWait: time.Second}})
	waitFor(t, 10*time.Second, "a leads", a.s.IsLeader)
	const payload = 1 << 10 // random bytes: the copy does not compress
	scheduleFor(t, a.s, 0, 100, payload)
	snapped := make(chan error, 1)
	go func() { snapped <- a.s.Raft().Snapshot().Error() }()
	// raft creates the snapshot's directory (<name>.tmp) just before the
	// reference's Persist starts waiting for the flush.
	waitFor(t, 10*time.Second, "the snapshot is being persisted", func() bool {
		tmp, _ := filepath.Glob(filepath.Join(a.dir, "snapshots", "*.tmp"))
		return len(tmp) > 0
	})
	scheduleFor(t, a.s, 100, 110, payload)
	if err := <-snapped; err != nil {
		t.Fatal(err)
	}
	metas, err := raft.NewFileSnapshotStore(a.dir, 2, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	list, err := metas.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("no snapshot on the leader (%v)", err)
	}
	if first, err := a.s.logs.FirstIndex(); err != nil || first < list[0].Index {
		t.Fatalf("the leader's log starts at %d (%v), its latest snapshot is at %d: the test did not reach its case", first, err, list[0].Index)
	}

	b := openSnapReplica(t, "b", false, tune, pub, replicaOptions{StoreOptions: raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait}})
	added := make(chan error, 1)
	// A nonvoter, as a new replica joins: the leader goes on committing.
	go func() { added <- a.s.Raft().AddNonvoter("b", raft.ServerAddress(b.addr), 0, 30*time.Second).Error() }()
	waitFor(t, 10*time.Second, "the leader writes a copy", func() bool {
		open, _ := filepath.Glob(filepath.Join(a.dir, "expand-*"))
		return len(open) > 0
	})
	scheduleFor(t, a.s, 110, 120, payload)
	if err := a.s.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(a.dir, "expand-*")); len(left) == 0 {
		t.Fatal("the copy was sent before the leader's second snapshot: the test did not reach its case")
	}
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "b catches up", func() bool { return b.s.AppliedIndex() >= a.s.AppliedIndex() })
	if got := a.s.InstallsSent(); got != 1 {
		t.Fatalf("the leader sent %d copies of the shard, want 1", got)
	}
	if got := b.s.Stats().Pending; got != 120 {
		t.Fatalf("new replica holds %d pending events, want 120", got)
	}
}

// TestRestartAfterASnapshotAtANoOpKeepsPebble: raft's snapshot index counts the no-op entry
// a new leader appends, which no FSM sees, so a snapshot taken just after a leader change is
// at an index past the FSM's applied one. Pebble still holds everything the snapshot stands
// for, so the next start (after a power cut, which keeps only what Pebble synced) must use
// it as it is, not restore the snapshot over it: that expands the whole shard into a file and
// rewrites it into Pebble.
func TestRestartAfterASnapshotAtANoOpKeepsPebble(t *testing.T) {
	r := newCrashRig(t)
	s := r.mustOpen(true)
	r.schedule(s, 0, 20)
	if err := s.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = r.mustOpen(false)
	waitFor(t, 10*time.Second, "the shard has a leader", s.IsLeader)
	// raft counts the no-op applied before its FSM goroutine has seen it, and
	// a snapshot asked for in between is "nothing new": ask until it is new.
	waitFor(t, 10*time.Second, "a snapshot at the new leader's no-op", func() bool {
		if s.Raft().AppliedIndex() <= s.AppliedIndex() {
			return false
		}
		err := s.Raft().Snapshot().Error()
		if errors.Is(err, raft.ErrNothingNewToSnapshot) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})
	applied := s.AppliedIndex()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(r.dir, 2, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	metas, err := snaps.List()
	if err != nil || len(metas) == 0 || metas[0].Index <= applied {
		t.Fatalf("latest snapshot %v (%v) is not past the FSM's applied index %d: the test did not reach its case", metas, err, applied)
	}

	r.cut()
	before := r.tables()
	s = r.mustOpen(false)
	defer s.Close()
	waitFor(t, 10*time.Second, "the shard has a leader", s.IsLeader)
	if added := slices.DeleteFunc(r.tables(), func(n string) bool { return slices.Contains(before, n) }); len(added) > 0 {
		t.Fatalf("the restart wrote %d Pebble tables (%s...) beside the %d it had: it restored the shard from its own snapshot",
			len(added), added[0], len(before))
	}
	if got := s.Stats().Pending; got != 20 {
		t.Fatalf("the restarted replica holds %d pending events, want 20", got)
	}
}

// TestInstallResumesAfterACut: a copy whose send is cut midway is sent
// again from where it was cut, not from the start: the leader keeps the
// copy, and the follower what it received of it.
func TestInstallResumesAfterACut(t *testing.T) {
	pub, err := publish.New(publish.Config{Brokers: startBroker(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// A copy of ~130 KiB of random payloads, sent at 256 KiB/s.
	tune := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, SnapshotThreshold: 8, TrailingLogs: 4, InstallRate: 256 << 10}
	opts := replicaOptions{StoreOptions: raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait}}
	// The leader's first send of a copy is cut after a third of it.
	var cutAt atomic.Int64 // where the first send was cut; 0 until then
	leader := opts
	leader.knobs.InstallSend = func(sent, size int64) error {
		if cutAt.Load() == 0 && sent >= size/3 && sent < size {
			cutAt.Store(sent)
			return errors.New("cut by the test")
		}
		return nil
	}
	a := openSnapReplica(t, "a", true, tune, pub, leader)
	waitFor(t, 10*time.Second, "a leads", a.s.IsLeader)
	scheduleFor(t, a.s, 0, 120, 1<<10)
	if err := a.s.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}

	b := openSnapReplica(t, "b", false, tune, pub, opts)
	if err := a.s.Raft().AddNonvoter("b", raft.ServerAddress(b.addr), 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "b catches up", func() bool { return b.s.AppliedIndex() >= a.s.AppliedIndex() })
	if cutAt.Load() == 0 {
		t.Fatal("no send was cut: the test did not reach its case")
	}
	if got := b.s.Stats().Pending; got != 120 {
		t.Fatalf("new replica holds %d pending events, want 120", got)
	}
	metas, err := raft.NewFileSnapshotStore(b.dir, 2, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	list, err := metas.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("the new replica holds no snapshot (%v)", err)
	}
	size := list[0].Size
	sent := int64(a.s.InstallBytesSent())
	if sends := a.s.InstallsSent(); sends != 2 {
		t.Fatalf("the leader opened its copy %d times, want 2 (the cut send and the rest)", sends)
	}
	// Cut after a third or more, the rest is the rest: a send from the
	// start would make it at least one and a third copies.
	if sent > size+size/8 {
		t.Fatalf("the leader sent %d bytes of a %d-byte copy cut at %d: it sent it again from the start", sent, size, cutAt.Load())
	}
}

// TestTrailingLogsReachRaft: the snapshot store keeps raft's whole log while
// a copy is sent through setTrailingLogs, which changes raft's own
// TrailingLogs (package snapshot's TestLogKeptWhileAnInstallIsSent pins
// when it is called).
func TestTrailingLogsReachRaft(t *testing.T) {
	r := newCrashRig(t)
	s := r.mustOpen(true)
	defer s.Close()
	trailing := func() uint64 { return s.raft.ReloadableConfig().TrailingLogs }
	want := s.tune.TrailingLogs
	if got := trailing(); got != want {
		t.Fatalf("TrailingLogs %d at start, want %d", got, want)
	}
	s.setTrailingLogs(math.MaxUint64)
	if got := trailing(); got != math.MaxUint64 {
		t.Fatalf("TrailingLogs %d kept for a copy, want all", got)
	}
	s.setTrailingLogs(want)
	if got := trailing(); got != want {
		t.Fatalf("TrailingLogs %d after a copy, want %d", got, want)
	}
}
