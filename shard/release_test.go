package shard

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/raftmux"
)

// crashRig is one node's disks for a crash test: Pebble on a crashable in-memory filesystem,
// which a power cut reduces to what was synced, and the shard's Raft directory on the real
// one, which the test changes only by the steps it runs before the cut.
type crashRig struct {
	t    *testing.T
	fs   *vfs.MemFS
	st   *raftfsm.Store
	mux  *raftmux.Mux
	addr string
	dir  string // the shard's Raft directory
	// Optional: what the shard fires through, its tuning and its knobs.
	pub   Publisher
	tune  func(*Tuning)
	knobs Knobs
}

func newCrashRig(t *testing.T) *crashRig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &crashRig{t: t, fs: vfs.NewCrashableMem(), mux: raftmux.New(ln, nil, nil), addr: ln.Addr().String(),
		dir: filepath.Join(t.TempDir(), "shard-0000")}
	r.st = r.openStore()
	t.Cleanup(func() { // teardown, as a deferred Close
		_ = r.mux.Close()
		_ = r.st.Close()
	})
	return r
}

func (r *crashRig) openStore() *raftfsm.Store {
	r.t.Helper()
	st, err := raftfsm.OpenStore("db", raftfsm.StoreOptions{FS: r.fs, SnapshotFlushWait: testFlushWait})
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// cut is a power cut: Pebble keeps what it had synced and is reopened on it.
func (r *crashRig) cut() {
	r.t.Helper()
	crashed := r.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	if err := r.st.Close(); err != nil {
		r.t.Fatal(err)
	}
	r.fs = crashed
	r.st = r.openStore()
}

// open opens shard 0 on the rig as the host does, as the only voter with bootstrap.
func (r *crashRig) open(bootstrap bool) (*Shard, error) {
	r.t.Helper()
	layer, err := r.mux.Layer(0)
	if err != nil {
		r.t.Fatal(err)
	}
	var voters []raft.Server
	if bootstrap {
		voters = []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: raft.ServerAddress(r.addr)}}
	}
	tune := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond}
	if r.tune != nil {
		r.tune(&tune)
	}
	s, err := Open(Config{ID: 0, NodeID: "n1", Dir: r.dir, Store: r.st, Layer: layer, Bootstrap: voters,
		Publisher: r.pub, Tuning: tune, Knobs: r.knobs})
	if err != nil {
		_ = layer.Close() // as the host does: Open's error is the one returned
	}
	return s, err
}

func (r *crashRig) mustOpen(bootstrap bool) *Shard {
	r.t.Helper()
	s, err := r.open(bootstrap)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

func (r *crashRig) schedule(s *Shard, from, to int) {
	r.t.Helper()
	waitFor(r.t, 10*time.Second, "the shard has a leader", s.IsLeader)
	for i := from; i < to; i++ {
		q := Request{ID: fmt.Sprintf("e%d", i), Delay: time.Hour, HasDelay: true, Topic: "t", Payload: []byte("p")}
		q.ContentHash = raftfsm.ContentHash(q.Topic, q.Key, q.Payload, nil, 0, int64(q.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		if _, err := s.Schedule(context.Background(), []Request{q}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// tables lists Pebble's sstables: what a flush or a compaction wrote.
func (r *crashRig) tables() []string {
	r.t.Helper()
	names, err := r.fs.List("db")
	if err != nil {
		r.t.Fatal(err)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return !strings.HasSuffix(n, ".sst") })
	slices.Sort(names)
	return names
}

// TestReleaseCrashNeverLeavesRaftStateOverAnEmptyShard: releasing a replica deletes both its
// Pebble keys and its Raft directory, on two filesystems, so a power cut can fall between the
// steps. Whatever step it falls after, the replica that opens next is either the whole old
// one or a new, empty one with no Raft state, which the leader must add and send a snapshot;
// never Raft state (a voter with a log and a snapshot) over a Pebble that lost what that
// state says it holds, which could be promoted and lose acknowledged events. Such a state,
// as an older build's release left it, refuses to open.
func TestReleaseCrashNeverLeavesRaftStateOverAnEmptyShard(t *testing.T) {
	const events = 20
	type want int
	const (
		whole want = iota // the old replica, all of it
		fresh             // a new replica: no Raft state, no keys
		lost              // refused: ErrStateLost
	)
	cases := []struct {
		name  string
		steps func(r *crashRig) []func() error
		want  want
	}{
		{"release, crash before it", func(r *crashRig) []func() error { return nil }, whole},
		{"release, crash after the tombstone", func(r *crashRig) []func() error { return releaseSteps(r.st, 0, r.dir)[:1] }, fresh},
		{"release, crash after the drop", func(r *crashRig) []func() error { return releaseSteps(r.st, 0, r.dir)[:2] }, fresh},
		{"release, crash after the whole release", func(r *crashRig) []func() error { return releaseSteps(r.st, 0, r.dir) }, fresh},
		{"older build's release, crash after the drop", func(r *crashRig) []func() error {
			return []func() error{func() error { return r.st.DropShard(0) }}
		}, lost},
		{"Raft directory lost, keys kept", func(r *crashRig) []func() error {
			return []func() error{func() error { return os.RemoveAll(r.dir) }}
		}, fresh},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newCrashRig(t)
			s := r.mustOpen(true)
			r.schedule(s, 0, events)
			if err := s.Raft().Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			for _, step := range c.steps(r) {
				if err := step(); err != nil {
					t.Fatal(err)
				}
			}
			r.cut()

			s, err := r.open(false)
			if c.want == lost {
				if !errors.Is(err, ErrStateLost) {
					t.Fatalf("opening Raft state over a dropped shard: %v, want ErrStateLost", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			last, err := s.logs.LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(r.dir + releasedSuffix); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the release's tombstone is still there after the replica opened (%v)", err)
			}
			pending, applied := s.Stats().Pending, s.AppliedIndex()
			switch c.want {
			case whole:
				if last == 0 || pending != events {
					t.Fatalf("the replica reopened with its log up to %d and %d of its %d events", last, pending, events)
				}
			case fresh:
				if last != 0 || pending != 0 || applied != 0 {
					t.Fatalf("the replica reopened with its log up to %d, %d pending events, applied index %d: want a new, empty replica",
						last, pending, applied)
				}
			}
		})
	}
}

// TestOpenHostFinishesEveryInterruptedRelease: a release a crash interrupted is finished when
// the node starts, for a shard the node no longer holds too, so that its keys do not stay in
// Pebble for good.
func TestOpenHostFinishesEveryInterruptedRelease(t *testing.T) {
	r := newCrashRig(t)
	s := r.mustOpen(true)
	r.schedule(s, 0, 5)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := releaseSteps(r.st, 0, r.dir)[0](); err != nil {
		t.Fatal(err)
	}
	r.cut()
	if err := FinishReleases(r.st, 1, func(uint32) string { return r.dir }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.dir + releasedSuffix); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the tombstone is still there (%v)", err)
	}
	r.cut()
	fsm, err := raftfsm.NewFSM(r.st, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fsm.Close()
	if fsm.AppliedIndex() != 0 || fsm.Stats().Pending != 0 {
		t.Fatalf("after the release was finished and a power cut, shard 0 is at %d with %d pending events", fsm.AppliedIndex(), fsm.Stats().Pending)
	}
}
