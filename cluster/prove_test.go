package cluster

import (
	"errors"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// TestOnlyProvenMembersArePlaced: with credentials pinned to the node they
// dial, a member is given replicas only once a call to its gRPC address
// went through, which needs that node's certificate: b, serving its own,
// becomes a candidate; c's address answers with b's certificate (someone
// holding the gossip key and b's key, gossiping as c) and c never does.
// Without pinned credentials every live member is a candidate.
func TestOnlyProvenMembersArePlaced(t *testing.T) {
	dir := t.TempDir()
	ca, err := certstest.NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	source := func(id string) *certs.Source {
		pair, err := ca.Node(id)
		if err != nil {
			t.Fatal(err)
		}
		src, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca.File}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	ids := []string{"a", "b", "c"}
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
	serving := map[string]*certs.Source{"b": source("b"), "c": source("b")}
	for _, id := range []string{"b", "c"} {
		g := &fakeGossip{view: membership.View{Self: id, Members: members}, changes: make(chan struct{})}
		c, err := New(Config{Membership: g, Shards: 8, Replication: 3, DeadTimeout: time.Hour, RemovedPath: filepath.Join(t.TempDir(), "removed.json")})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(grpc.Creds(serving[id].ServerCredentials()))
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
	}
	// a is the Cluster under test, which nobody dials: its listener only
	// gave it an address for the members' view.
	if err := lns["a"].Close(); err != nil {
		t.Fatal(err)
	}

	placed := func(c *Cluster) []string {
		var out []string
		for s := range uint32(8) {
			for _, id := range c.Desired(s) {
				if !slices.Contains(out, id) {
					out = append(out, id)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	g := &fakeGossip{view: membership.View{Self: "a", Members: members}, changes: make(chan struct{})}
	a, err := New(Config{Membership: g, Shards: 8, Replication: 3, DeadTimeout: time.Hour, RemovedPath: filepath.Join(t.TempDir(), "removed.json"),
		DialCredentials: source("a").PeerCredentialsFor})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// New proves the live members before its first placement: b answered.
	if got := placed(a); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("placed on %v, want a and b: c's address answers with b's certificate", got)
	}
	if got := a.Takers(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("takers %v, want b alone", got)
	}
	// c is tried again every second, and stays out. New tries it at most
	// three times (its proofs, its first placement, the placement b's proof
	// wakes): a fourth failure is a retry of the refresh every second.
	waitFor(t, "a retry of c's proof to fail", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.proveFails["c"] >= 4
	})
	if got := placed(a); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("placed on %v after c was tried again, want a and b", got)
	}

	open, err := New(Config{Membership: &fakeGossip{view: membership.View{Self: "a", Members: members}, changes: make(chan struct{})},
		Shards: 8, Replication: 3, DeadTimeout: time.Hour, RemovedPath: filepath.Join(t.TempDir(), "removed.json")})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if got := placed(open); !slices.Equal(got, ids) {
		t.Fatalf("without pinned credentials placed on %v, want every live member", got)
	}
}
