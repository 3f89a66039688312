package rpc_test

import (
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/cluster"
	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc"
)

// fakeGossip is a fixed membership view that tests edit.
type fakeGossip struct {
	mu      sync.Mutex
	view    membership.View
	changes chan struct{}
}

func (g *fakeGossip) View() membership.View {
	g.mu.Lock()
	defer g.mu.Unlock()
	v := g.view
	v.Members = maps.Clone(g.view.Members)
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

func (g *fakeGossip) draining() bool { return g.View().Members[g.view.Self].Meta.Draining }

// adminNode is one node of an adminCluster: its control plane, its gossip,
// and an Admin client to it.
type adminNode struct {
	c       *cluster.Cluster
	gossip  *fakeGossip
	admin   chimev1.AdminClient
	removed string // its removed.json
}

// adminCluster starts a Cluster serving Admin and Peer on loopback for each
// id in live, all alive, and the same view on each of the members in dead
// (dead since the time given, without a server). The dead timeout is 1h.
func adminCluster(t *testing.T, replication int, live []string, dead map[string]time.Time) map[string]*adminNode {
	t.Helper()
	members := map[string]membership.Member{}
	lns := map[string]net.Listener{}
	for _, id := range live {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id] = ln
		members[id] = membership.Member{Meta: membership.Meta{NodeID: id, GRPCAddr: ln.Addr().String(), RaftAddr: "127.0.0.1:1"},
			State: membership.Alive, Since: time.Now()}
	}
	for id, since := range dead {
		members[id] = membership.Member{Meta: membership.Meta{NodeID: id, GRPCAddr: "127.0.0.1:1"}, State: membership.Dead, Since: since}
	}
	out := map[string]*adminNode{}
	for _, id := range live {
		g := &fakeGossip{view: membership.View{Self: id, Members: maps.Clone(members)}, changes: make(chan struct{})}
		path := filepath.Join(t.TempDir(), "removed.json")
		c, err := cluster.New(cluster.Config{Membership: g, Shards: 4, Replication: replication, DeadTimeout: time.Hour, RemovedPath: path})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		rpc.RegisterAdmin(gs, c, nil, nil)
		cluster.RegisterPeer(gs, c)
		done := make(chan struct{})
		go func() {
			defer close(done)
			// nil after Stop, ErrServerStopped when Stop came first
			if err := gs.Serve(lns[id]); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("serving %s: %v", id, err)
			}
		}()
		cc, err := grpc.NewClient(lns[id].Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close(); gs.Stop(); <-done; c.Close() })
		out[id] = &adminNode{c: c, gossip: g, admin: chimev1.NewAdminClient(cc), removed: path}
	}
	return out
}

func wantRefusal(t *testing.T, err error, wants ...string) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
	for _, w := range wants {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), w)
		}
	}
}

// Drain, asked of any node, refuses to leave shards short of voters when no
// other node can take them, unless forced; force travels with the request
// forwarded to the node that drains.
func TestDrainGuardRail(t *testing.T) {
	nodes := adminCluster(t, 3, []string{"a", "b", "c"}, nil)
	ctx := ctx(t)
	_, err := nodes["a"].admin.Drain(ctx, &chimev1.DrainRequest{Node: "b"})
	wantRefusal(t, err, `node: "b" cannot be drained`, "replication factor 3", "2 other nodes can take replicas (a, c)", "--force")
	if nodes["b"].gossip.draining() {
		t.Fatal("a refused drain gossiped draining")
	}

	resp, err := nodes["a"].admin.Drain(ctx, &chimev1.DrainRequest{Node: "b", Force: true})
	if err != nil || resp.Node != "b" {
		t.Fatalf("forced drain: %v, %v", resp, err)
	}
	if !nodes["b"].gossip.draining() {
		t.Fatal("a forced drain did not gossip draining")
	}
	// Following the drain under way needs no force.
	if _, err := nodes["b"].admin.Drain(ctx, &chimev1.DrainRequest{Node: "b"}); err != nil {
		t.Fatalf("asking again about a node draining: %v", err)
	}
}

func TestDrainWithEnoughNodesNeedsNoForce(t *testing.T) {
	nodes := adminCluster(t, 2, []string{"a", "b", "c"}, nil)
	if _, err := nodes["a"].admin.Drain(ctx(t), &chimev1.DrainRequest{Node: "b"}); err != nil {
		t.Fatalf("drain with 2 other nodes at replication 2: %v", err)
	}
	if !nodes["b"].gossip.draining() {
		t.Fatal("the drain did not gossip draining")
	}
}

// RemoveNode refuses a node seen alive within the dead timeout unless
// forced, takes one dead for longer, never takes a live one, and the
// removal is on every live member's disk when it returns.
func TestRemoveNodeGuardRail(t *testing.T) {
	now := time.Now()
	nodes := adminCluster(t, 2, []string{"a", "b", "c"}, map[string]time.Time{
		"recent": now.Add(-time.Minute), "old": now.Add(-2 * time.Hour),
	})
	ctx := ctx(t)
	a := nodes["a"].admin

	_, err := a.RemoveNode(ctx, &chimev1.RemoveNodeRequest{Node: "recent"})
	wantRefusal(t, err, `node: "recent" was seen alive 1m`, "chimed --dead-timeout 1h0m0s", "remove it in ", "--force")
	for id, n := range nodes {
		if n.c.Removed("recent") {
			t.Fatalf("%s recorded a refused removal", id)
		}
	}

	_, err = a.RemoveNode(ctx, &chimev1.RemoveNodeRequest{Node: "c", Force: true})
	wantRefusal(t, err, `node: "c" is alive; drain it instead`)

	if _, err := a.RemoveNode(ctx, &chimev1.RemoveNodeRequest{Node: "old"}); err != nil {
		t.Fatalf("removing a node dead for longer than the dead timeout: %v", err)
	}
	if _, err := a.RemoveNode(ctx, &chimev1.RemoveNodeRequest{Node: "recent", Force: true}); err != nil {
		t.Fatalf("forced removal: %v", err)
	}
	for id, n := range nodes {
		if !n.c.Removed("recent") || !n.c.Removed("old") || n.c.Removed("c") {
			t.Errorf("%s: removed recent %v, old %v, c %v", id, n.c.Removed("recent"), n.c.Removed("old"), n.c.Removed("c"))
		}
	}
	// Every node has it on its disk, and knows it after a restart.
	for id, n := range nodes {
		if b, err := os.ReadFile(n.removed); err != nil || string(b) != `["old","recent"]` {
			t.Errorf("%s: removed.json %q, %v", id, b, err)
		}
		again, err := cluster.New(cluster.Config{Membership: n.gossip, Shards: 4, Replication: 2, DeadTimeout: time.Hour, RemovedPath: n.removed})
		if err != nil {
			t.Fatal(err)
		}
		if !again.Removed("recent") || !again.Removed("old") {
			t.Errorf("%s restarted on its removed.json does not know the removals", id)
		}
		again.Close()
	}
}
