package cluster

import (
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// fakeGossip is a fixed view that tests edit.
type fakeGossip struct {
	mu      sync.Mutex
	view    membership.View
	changes chan struct{}
}

func (g *fakeGossip) View() membership.View {
	g.mu.Lock()
	defer g.mu.Unlock()
	v := g.view
	v.Members = map[string]membership.Member{}
	for id, m := range g.view.Members {
		v.Members[id] = m
	}
	return v
}
func (g *fakeGossip) Changes() <-chan struct{} { return g.changes }
func (g *fakeGossip) Peers() []string          { return nil }
func (g *fakeGossip) SetDraining(d bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.view.Members[g.view.Self]
	m.Meta.Draining = d
	g.view.Members[g.view.Self] = m
	return nil
}

// setState changes how g sees member id.
func (g *fakeGossip) setState(id string, st membership.State, since time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.view.Members[id]
	m.State, m.Since = st, since
	g.view.Members[id] = m
}

// node is a Cluster serving the Peer service on loopback.
type node struct {
	c      *Cluster
	gs     *grpc.Server
	gossip *fakeGossip
}

func startNodes(t *testing.T, ids ...string) map[string]*node {
	t.Helper()
	members := map[string]membership.Member{}
	lns := map[string]net.Listener{}
	for _, id := range ids {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id] = ln
		members[id] = membership.Member{Meta: membership.Meta{NodeID: id, GRPCAddr: ln.Addr().String(), RaftAddr: "127.0.0.1:1"}, State: membership.Alive}
	}
	members["gone"] = membership.Member{Meta: membership.Meta{NodeID: "gone"}, State: membership.Dead}
	out := map[string]*node{}
	for _, id := range ids {
		g := &fakeGossip{view: membership.View{Self: id, Members: maps.Clone(members)}, changes: make(chan struct{})}
		c, err := New(Config{Membership: g, Shards: 4, Replication: 2, DeadTimeout: time.Hour,
			RemovedPath: filepath.Join(t.TempDir(), "removed.json")})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		RegisterPeer(gs, c)
		done := make(chan struct{})
		go func() {
			defer close(done)
			// nil after Stop, ErrServerStopped when Stop came first
			if err := gs.Serve(lns[id]); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("serving %s: %v", id, err)
			}
		}()
		t.Cleanup(func() { gs.Stop(); <-done; c.Close() })
		out[id] = &node{c: c, gs: gs, gossip: g}
	}
	return out
}

// Removing a node reaches every live member through the Peer service, is
// persisted, and takes the node out of every placement.
func TestForgetEverywhere(t *testing.T) {
	nodes := startNodes(t, "a", "b", "c")
	a := nodes["a"]
	a.c.ForgetEverywhere(context.Background(), "gone")
	if err := a.c.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	for id, n := range nodes {
		if !n.c.Removed("gone") {
			t.Errorf("%s did not record the removal", id)
		}
		b, err := os.ReadFile(n.c.removedPath)
		if err != nil || string(b) != `["gone"]` {
			t.Errorf("%s: removed file %q, %v", id, b, err)
		}
	}
	// A member refuses to forget a node it sees alive, or itself.
	if err := forget(nodes["b"].c, "c"); err == nil {
		t.Error("b forgot c, which it sees alive")
	}
	if err := forget(nodes["b"].c, "b"); err == nil {
		t.Error("b forgot itself")
	}
	if nodes["b"].c.Removed("c") || nodes["b"].c.Removed("b") {
		t.Error("a refused removal was recorded")
	}
}

func forget(c *Cluster, node string) error {
	_, err := peerServer{c: c}.Forget(context.Background(), &chimev1.ForgetRequest{Node: node})
	return err
}

// Without a host, a node reports no replicas; asking one over the Peer
// service gets its id back, no shard has a leader to find, and a question
// about one replica fails.
func TestReplicasOverPeer(t *testing.T) {
	nodes := startNodes(t, "a", "b")
	st, err := nodes["a"].c.NodeReplicas(context.Background(), "b")
	if err != nil || st.NodeId != "b" || len(st.Replicas) != 0 {
		t.Fatalf("replicas of b: %v, %v", st, err)
	}
	if got := nodes["a"].c.AllReplicas(context.Background()); len(got) != 2 {
		t.Fatalf("all replicas: %d members answered, want 2", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := nodes["a"].c.LogIndex(ctx, "b", 0); err == nil {
		t.Fatal("LogIndex of a node without the replica succeeded")
	}
	if _, err := nodes["a"].c.Parked(ctx, "b", 0); err == nil {
		t.Fatal("Parked of a node without the replica succeeded")
	}
	for s := range uint32(4) {
		if d := nodes["a"].c.Desired(s); len(d) != 2 || !slices.Contains([]string{"a", "b"}, d[0]) {
			t.Errorf("shard %d: desired %v", s, d)
		}
	}
}

// A Cluster without gossip is this node alone: every shard is placed on it,
// and what needs another node fails with ErrAlone.
func TestAlone(t *testing.T) {
	c, err := New(Config{Self: membership.Meta{NodeID: "dev", GRPCAddr: "127.0.0.1:1"}, Shards: 3, Replication: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Alone() || c.Self() != "dev" || c.Replication() != 1 {
		t.Fatalf("alone %v, self %q, replication %d", c.Alone(), c.Self(), c.Replication())
	}
	for s := range uint32(3) {
		if d := c.Desired(s); !slices.Equal(d, []string{"dev"}) {
			t.Errorf("shard %d: desired %v, want [dev]", s, d)
		}
	}
	if v := c.View(); len(v.Live()) != 1 {
		t.Errorf("live members %v", v.Live())
	}
	if err := c.Drain(false); !errors.Is(err, ErrAlone) {
		t.Errorf("Drain: %v, want ErrAlone", err)
	}
	if err := c.Remove("x"); !errors.Is(err, ErrAlone) {
		t.Errorf("Remove: %v, want ErrAlone", err)
	}
}
