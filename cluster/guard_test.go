package cluster

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chimehq/chime/membership"
)

// newCluster is self's Cluster over a fixed view of members (without the
// Peer service), removed.json in path.
func newCluster(t *testing.T, self string, replication int, path string, members map[string]membership.Member) (*Cluster, *fakeGossip) {
	t.Helper()
	g := &fakeGossip{view: membership.View{Self: self, Members: members}, changes: make(chan struct{})}
	c, err := New(Config{Membership: g, Shards: 4, Replication: replication, DeadTimeout: time.Hour, RemovedPath: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, g
}

func alive(id string) membership.Member {
	return membership.Member{Meta: membership.Meta{NodeID: id}, State: membership.Alive, Since: time.Now()}
}

func deadSince(id string, ago time.Duration) membership.Member {
	return membership.Member{Meta: membership.Meta{NodeID: id}, State: membership.Dead, Since: time.Now().Add(-ago)}
}

// fourNodes is a, b and c alive, d alive but draining, and gone dead a
// minute ago (still a candidate, but no node to take a replica).
func fourNodes() map[string]membership.Member {
	d := alive("d")
	d.Meta.Draining = true
	return map[string]membership.Member{"a": alive("a"), "b": alive("b"), "c": alive("c"), "d": d, "gone": deadSince("gone", time.Minute)}
}

// Without force, a node drains only when at least the replication factor
// of other live, non-draining, non-removed nodes can take its replicas.
func TestDrainRefusedWithTooFewOtherNodes(t *testing.T) {
	c, g := newCluster(t, "a", 3, filepath.Join(t.TempDir(), "removed.json"), fourNodes())
	err := c.Drain(false)
	var tooFew *TooFewNodesError
	if !errors.As(err, &tooFew) || tooFew.Node != "a" || tooFew.Replication != 3 || !slices.Equal(tooFew.Takers, []string{"b", "c"}) {
		t.Fatalf("Drain with 2 takers at replication 3: %v (%+v)", err, tooFew)
	}
	for _, want := range []string{`node: "a" cannot be drained`, "replication factor 3", "2 other nodes can take replicas (b, c)", "chimectl drain --force"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if g.View().Members["a"].Meta.Draining {
		t.Fatal("a refused drain gossiped draining")
	}

	if err := c.Drain(true); err != nil {
		t.Fatalf("forced Drain: %v", err)
	}
	if !g.View().Members["a"].Meta.Draining {
		t.Fatal("a forced drain did not gossip draining")
	}
	for s := range uint32(4) {
		if slices.Contains(c.Desired(s), "a") {
			t.Errorf("shard %d: a draining node is still desired: %v", s, c.Desired(s))
		}
	}
	// Asking again follows the drain under way, force or not.
	if err := c.Drain(false); err != nil {
		t.Fatalf("Drain of a node already draining: %v", err)
	}
}

func TestDrainAllowedWithEnoughOtherNodes(t *testing.T) {
	c, g := newCluster(t, "a", 2, filepath.Join(t.TempDir(), "removed.json"), fourNodes())
	if err := c.Drain(false); err != nil {
		t.Fatalf("Drain with 2 takers at replication 2: %v", err)
	}
	if !g.View().Members["a"].Meta.Draining {
		t.Fatal("the drain did not gossip draining")
	}
}

// A node dead for longer than the dead timeout, or removed, takes no
// replica, so it does not count as a taker.
func TestDrainDoesNotCountRemovedNodes(t *testing.T) {
	members := fourNodes()
	members["c"] = deadSince("c", 2*time.Hour)
	c, _ := newCluster(t, "b", 2, filepath.Join(t.TempDir(), "removed.json"), members)
	if got := c.Takers(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("takers %v, want [a]", got)
	}
	members = fourNodes()
	c, _ = newCluster(t, "b", 2, filepath.Join(t.TempDir(), "removed.json"), members)
	if err := c.Remove("c"); err != nil {
		t.Fatal(err)
	}
	var tooFew *TooFewNodesError
	if err := c.Drain(false); !errors.As(err, &tooFew) || !slices.Equal(tooFew.Takers, []string{"a"}) {
		t.Fatalf("Drain with c removed: %v, want a refusal naming only a", err)
	}
}

func TestSinceAlive(t *testing.T) {
	c, _ := newCluster(t, "a", 2, filepath.Join(t.TempDir(), "removed.json"),
		map[string]membership.Member{"a": alive("a"), "b": alive("b"), "gone": deadSince("gone", 90*time.Second)})
	if ago, ok := c.SinceAlive("gone"); !ok || ago < 90*time.Second || ago > 100*time.Second {
		t.Errorf("SinceAlive(gone) = %v, %v; want about 90s", ago, ok)
	}
	if ago, ok := c.SinceAlive("b"); !ok || ago != 0 {
		t.Errorf("SinceAlive(b) = %v, %v; want 0 for a live node", ago, ok)
	}
	if _, ok := c.SinceAlive("nobody"); ok {
		t.Error("SinceAlive of an unknown node is known")
	}
	if c.DeadTimeout() != time.Hour {
		t.Errorf("DeadTimeout %v", c.DeadTimeout())
	}
}

// A removal is on disk when Remove returns, without the temporary file,
// and a Cluster started on the same file knows it.
func TestRemoveIsOnDiskAndReadAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "removed.json")
	members := map[string]membership.Member{"a": alive("a"), "b": alive("b"), "gone": deadSince("gone", 2*time.Hour), "old": deadSince("old", 2*time.Hour)}
	c, _ := newCluster(t, "a", 2, path, members)
	for _, n := range []string{"gone", "old", "gone"} {
		if err := c.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != `["gone","old"]` {
		t.Fatalf("removed.json %q, %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	c.Close()

	again, _ := newCluster(t, "a", 2, path, members)
	if !again.Removed("gone") || !again.Removed("old") || again.Removed("b") {
		t.Fatal("a Cluster started on removed.json does not know the removals")
	}
	for s := range uint32(4) {
		if d := again.Desired(s); !slices.Equal(d, []string{"a", "b"}) && !slices.Equal(d, []string{"b", "a"}) {
			t.Errorf("shard %d: desired %v, want a and b", s, d)
		}
	}
}

// A removal that cannot be written is not recorded at all.
func TestRemoveThatCannotBeWrittenChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "removed.json")
	c, _ := newCluster(t, "a", 2, path, map[string]membership.Member{"a": alive("a"), "gone": deadSince("gone", 2*time.Hour)})
	epoch := c.Epoch()
	if err := c.Remove("gone"); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Remove into a missing directory: %v, want an error naming %s", err, path)
	}
	if c.Removed("gone") || c.Epoch() != epoch {
		t.Fatal("a removal that was not written changed the cluster")
	}
}

// A node that was down when an operator removed another learns the removal
// from the members that record it once it is back, even when its gRPC port
// does not serve at first, and records it on its disk.
func TestAMemberBackLearnsTheRemoval(t *testing.T) {
	nodes := startNodes(t, "a", "b", "c")
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	down := time.Now().Add(-time.Minute)
	a.gossip.setState("c", membership.Dead, down)
	b.gossip.setState("c", membership.Dead, down)
	a.c.refresh()
	b.c.refresh()

	if err := a.c.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	a.c.ForgetEverywhere(context.Background(), "gone")
	if !b.c.Removed("gone") {
		t.Fatal("b, live, did not record the removal")
	}
	if c.c.Removed("gone") {
		t.Fatal("c learned the removal while a and b saw it dead")
	}

	// c is back in a's view, but at an address that does not serve yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	serving := a.gossip.View().Members["c"].Meta.GRPCAddr
	a.gossip.mu.Lock()
	m := a.gossip.view.Members["c"]
	m.State, m.Meta.GRPCAddr = membership.Alive, closed
	a.gossip.view.Members["c"] = m
	a.gossip.mu.Unlock()
	a.c.refresh()
	waitFor(t, "a's first tell to fail", func() bool {
		a.c.mu.RLock()
		defer a.c.mu.RUnlock()
		return a.c.tellFails["c"] > 0 && !a.c.telling["c"]
	})
	if c.c.Removed("gone") {
		t.Fatal("c learned the removal through an address that does not serve")
	}

	a.gossip.mu.Lock()
	m.Meta.GRPCAddr = serving
	a.gossip.view.Members["c"] = m
	a.gossip.mu.Unlock()
	a.c.refresh() // what a's refresh loop does every second
	waitFor(t, "c to learn the removal", func() bool { return c.c.Removed("gone") })
	if b, err := os.ReadFile(c.c.removedPath); err != nil || string(b) != `["gone"]` {
		t.Fatalf("c's removed.json %q, %v", b, err)
	}
	restarted, _ := newCluster(t, "c", 2, c.c.removedPath, map[string]membership.Member{"c": alive("c")})
	if !restarted.Removed("gone") {
		t.Fatal("c restarted on its removed.json does not know the removal")
	}
}

// waitFor polls ok until it holds, and fails the test if it does not
// within 5 s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
