package shard

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

func TestPlan(t *testing.T) {
	none := func(string) bool { return false }
	set := func(nodes ...string) func(string) bool {
		return func(n string) bool { return slices.Contains(nodes, n) }
	}
	all := func(string) bool { return true }
	base := func() configState {
		return configState{self: "a", voters: []string{"a", "b", "c"}, desired: []string{"a", "b", "c"},
			replication: 3, removed: none, leaving: none, caughtUp: all, opened: all}
	}
	cases := []struct {
		name   string
		edit   func(*configState)
		kind   actionKind
		node   string
		toHead string
	}{
		{"converged: nothing to do", func(*configState) {}, noChange, "", ""},
		{"new desired node joins as a non-voter", func(s *configState) { s.desired = []string{"a", "b", "d"} }, addNonvoter, "d", ""},
		// Regression: raft sends to a server from the moment it is added,
		// and a node whose host had not opened the replica yet made its
		// leader log ERRORs on every send until it had (every replica of a
		// fresh cluster's start).
		{"desired node without an open replica is not added yet", func(s *configState) {
			s.desired, s.opened = []string{"a", "b", "d"}, set("a", "b", "c")
		}, noChange, "", ""},
		{"a desired node that has opened its replica goes first", func(s *configState) {
			s.voters, s.desired, s.opened = []string{"a"}, []string{"a", "b", "c"}, set("a", "c")
		}, addNonvoter, "c", ""},
		{"a voter stays while its replacement has not opened its replica", func(s *configState) {
			s.desired, s.leaving, s.opened = []string{"a", "b", "d"}, set("c"), set("a", "b", "c")
		}, noChange, "", ""},
		{"caught-up non-voter is promoted", func(s *configState) {
			s.desired, s.nonvoters = []string{"a", "b", "d"}, []string{"d"}
		}, promote, "d", ""},
		{"lagging non-voter: wait, change nothing else", func(s *configState) {
			s.desired, s.nonvoters, s.caughtUp = []string{"a", "b", "d"}, []string{"d"}, set("a", "b", "c")
		}, noChange, "", ""},
		{"non-voter no longer desired is dropped", func(s *configState) { s.nonvoters = []string{"d"} }, removeServer, "d", ""},
		{"surplus voter removed once its replacement is in", func(s *configState) {
			s.voters, s.desired = []string{"a", "b", "c", "d"}, []string{"a", "b", "d"}
		}, removeServer, "c", ""},
		{"leader leaving hands leadership over first", func(s *configState) {
			s.voters, s.desired = []string{"a", "b", "c", "d"}, []string{"b", "c", "d"}
		}, transfer, "", "b"},
		// Regression (found by the fault tests): a node that rejoined and
		// knew only itself computed desired = [a] and removed two live
		// voters. A view alone never takes a shard below its replication.
		{"partial view does not strip live voters", func(s *configState) { s.desired = []string{"a"} }, noChange, "", ""},
		{"dead voter with no spare stays (no shrink below R)", func(s *configState) { s.desired = []string{"a", "b"} }, noChange, "", ""},
		{"draining voter leaves even below R", func(s *configState) {
			s.desired, s.leaving = []string{"a", "b"}, set("c")
		}, removeServer, "c", ""},
		{"operator-removed voter leaves at once", func(s *configState) { s.removed = set("c") }, removeServer, "c", ""},
		{"never remove the last voter", func(s *configState) {
			s.voters, s.desired, s.replication, s.leaving = []string{"b"}, []string{"a"}, 1, set("b")
		}, addNonvoter, "a", ""},
		{"balance: leadership to the preferred leader", func(s *configState) {
			s.desired, s.balance = []string{"b", "a", "c"}, true
		}, transfer, "", "b"},
		{"no balancing outside the window", func(s *configState) { s.desired = []string{"b", "a", "c"} }, noChange, "", ""},
		// Regression (found by chime-jepsen's disk-stall): a preferred leader
		// whose disk was frozen answered its peers, counted as caught up,
		// and failed every transfer; handed leadership on every reconcile,
		// with raft refusing entries through each transfer, the shard took
		// nothing for as long as the disk hung.
		{"balance: no transfer to a node that failed one lately", func(s *configState) {
			s.desired, s.balance, s.transferFailed = []string{"b", "a", "c"}, true, set("b")
		}, noChange, "", ""},
		// Regression (found by chime-jepsen's loss): each new leader handed
		// the shard straight back to the preferred leader, which lost it
		// again to the loss on its link.
		// And (seeds 20261216 and 20261217) a leader that had lost the
		// shard and won it back handed it on under the same loss.
		{"balance: no transfer while a node lost the leadership lately", func(s *configState) {
			s.desired, s.balance, s.unsettled = []string{"b", "a", "c"}, true, true
		}, noChange, "", ""},
		{"leader leaving skips a node that failed a transfer lately", func(s *configState) {
			s.voters, s.desired, s.transferFailed = []string{"a", "b", "c", "d"}, []string{"b", "c", "d"}, set("b")
		}, transfer, "", "c"},
		{"leader leaving waits when every desired node failed a transfer lately", func(s *configState) {
			s.voters, s.desired, s.transferFailed = []string{"a", "b", "c", "d"}, []string{"b", "c", "d"}, set("b", "c", "d")
		}, noChange, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := base()
			c.edit(&st)
			got := plan(st)
			if got.kind != c.kind || got.node != c.node || (c.toHead != "" && (len(got.to) == 0 || got.to[0] != c.toHead)) {
				t.Errorf("plan = %+v; want kind %d node %q to[0] %q", got, c.kind, c.node, c.toHead)
			}
		})
	}
}

// logDirectory answers LogIndex with a fixed index; nothing else is used.
type logDirectory struct {
	Directory
	index uint64
	err   error
}

func (d logDirectory) LogIndex(context.Context, string, uint32) (uint64, error) {
	return d.index, d.err
}

// TestCaughtUpComparesRaftLogs pins what "caught up" means for promoting a
// non-voter and handing it leadership: its Raft log against the leader's,
// not its applied index. A replica restored from an expanded snapshot
// reference has applied the leader's whole state while its log (and its Raft
// configuration) are still the reference's; judged by applied index, a fault
// run promoted one and made it leader, and the shard lost its leader for
// good. Here the leader's log runs ahead of its applied index by barriers,
// which raft never hands to the FSM, as it runs ahead of a restored replica.
func TestCaughtUpComparesRaftLogs(t *testing.T) {
	n := openNode(t, t.TempDir(), "", publishtest.NewBroker(t).Addrs(), 1)
	defer n.close()
	s := n.host.Replica(0)
	for range caughtUpLag + 16 {
		if err := s.raft.Barrier(0).Error(); err != nil {
			t.Fatal(err)
		}
	}
	last, applied := s.raft.LastIndex(), s.fsm.AppliedIndex()
	if last <= applied+caughtUpLag {
		t.Fatalf("log at %d, applied %d: the barriers did not put the log ahead", last, applied)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		dir   logDirectory
		ready bool
	}{
		{"log as far as the leader's applied state only", logDirectory{index: applied}, false},
		{"log level with the leader's", logDirectory{index: last}, true},
		{"log within the allowed lag", logDirectory{index: last - caughtUpLag}, true},
		{"log just beyond the allowed lag", logDirectory{index: last - caughtUpLag - 1}, false},
		{"node does not answer", logDirectory{err: errors.New("unreachable")}, false},
	} {
		probe := &Shard{cfg: Config{Directory: c.dir}, id: s.id, raft: s.raft, fsm: s.fsm}
		if got := probe.caughtUp(ctx, "n2"); got != c.ready {
			t.Errorf("%s: caughtUp = %v, want %v", c.name, got, c.ready)
		}
	}
}

// placeDirectory places the shard on n1 and n2; n2 answers LogIndex only
// once its replica is open.
type placeDirectory struct {
	Directory
	open atomic.Bool
}

func (d *placeDirectory) Desired(uint32) []string          { return []string{"n1", "n2"} }
func (d *placeDirectory) RaftAddr(n string) (string, bool) { return n, true }
func (d *placeDirectory) Removed(string) bool              { return false }
func (d *placeDirectory) Leaving(string) bool              { return false }
func (d *placeDirectory) Replication() int                 { return 2 }
func (d *placeDirectory) LogIndex(_ context.Context, n string, _ uint32) (uint64, error) {
	if n == "n2" && !d.open.Load() {
		return 0, errors.New("node n2 has no replica of shard 0")
	}
	return 0, nil
}
func (d *placeDirectory) Parked(context.Context, string, uint32) ([]raftfsm.Fired, error) {
	return nil, nil
}

// TestReconcileAddsOnlyAnOpenReplica pins that a leader adds a node to its
// shard only once the node has opened its replica: raft sends to a server
// from the moment it is added, and before, a node whose host had not yet
// opened the replica made the leader log an ERROR for every heartbeat and
// append it sent until it had (on every fresh start of a cluster).
func TestReconcileAddsOnlyAnOpenReplica(t *testing.T) {
	n := openNode(t, t.TempDir(), "", publishtest.NewBroker(t).Addrs(), 1)
	defer n.close()
	s := n.host.Replica(0)
	dir := &placeDirectory{}
	leader := &Shard{cfg: Config{NodeID: "n1", Directory: dir}, id: s.id, raft: s.raft, fsm: s.fsm, logger: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	for range 3 {
		leader.reconcile(ctx, false)
	}
	if voters, nonvoters, err := s.Configuration(); err != nil || !slices.Equal(voters, []string{"n1"}) || len(nonvoters) != 0 {
		t.Fatalf("n2 not open: configuration %v %v (%v), want voter n1 alone", voters, nonvoters, err)
	}
	dir.open.Store(true)
	leader.reconcile(ctx, false)
	if voters, nonvoters, err := s.Configuration(); err != nil || !slices.Equal(voters, []string{"n1"}) || !slices.Equal(nonvoters, []string{"n2"}) {
		t.Fatalf("n2 open: configuration %v %v (%v), want voter n1, non-voter n2", voters, nonvoters, err)
	}
}
