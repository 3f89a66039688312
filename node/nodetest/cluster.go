package nodetest

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/chimehq/chime/node"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/shard"
)

// Options shape a Cluster. A zero field takes the default beside it.
type Options struct {
	Shards      int           // 8
	Replication int           // 3
	DeadTimeout time.Duration // 4 s: past it a dead member's replicas move
	Tuning      shard.Tuning  // the shard defaults, as chimed's flags give them
	// Brokers are the Kafka brokers the nodes publish to; by default the
	// cluster starts a kfake broker of its own.
	Brokers []string
	// Logger receives every node's log; by default it is discarded.
	Logger *slog.Logger
}

// Cluster is a set of nodes in the test process: real Pebble in temporary
// directories, real Raft on raft's in-memory transport (one network per
// shard, connecting that shard's replicas), real memberlist on an in-memory
// network, the real control plane, and gRPC and HTTP servers on loopback,
// publishing to Kafka (a kfake broker). Nodes can be killed, restarted and
// partitioned. Every method fails the test on error; the cluster shuts down
// in the test's cleanup.
type Cluster struct {
	t       testing.TB
	opts    Options
	Brokers []string
	dir     string // the nodes' data directories are under it

	raft   *raftNet
	gossip *gossipNet

	mu    sync.Mutex
	nodes map[string]*Node
	order []string           // in the order added; the first created the cluster
	cut   map[[2]string]bool // links cut by Partition, by node id pair
}

// Node is one node of a Cluster, up or down. Its data directory, gossip
// address and gRPC and HTTP addresses stay the same across restarts.
type Node struct {
	ID string
	c  *Cluster

	dataDir, gossipAddr, grpcAddr, httpAddr string

	mu   sync.Mutex
	n    *node.Node       // nil while down
	conn *grpc.ClientConn // to grpcAddr, dialled once
}

// MakeCluster starts n nodes, n1 to nN (n1 creates the cluster, the others
// join it), and waits until every shard has its desired voters.
func MakeCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	c := New(t, opts)
	for i := range n {
		c.Add(fmt.Sprintf("n%d", i+1))
	}
	c.WaitConverged(60*time.Second, "")
	return c
}

// New returns a cluster without nodes (see Add).
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Shards == 0 {
		opts.Shards = 8
	}
	if opts.Replication == 0 {
		opts.Replication = 3
	}
	if opts.DeadTimeout == 0 {
		opts.DeadTimeout = 4 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{t: t, opts: opts, Brokers: opts.Brokers, raft: newRaftNet(), gossip: newGossipNet(),
		nodes: map[string]*Node{}, cut: map[[2]string]bool{}}
	if len(c.Brokers) == 0 {
		c.Brokers = publishtest.NewBroker(t, kfake.DefaultNumPartitions(4)).Addrs()
	}
	// Registered after the broker's and the directory's: the nodes stop
	// first.
	c.dir = t.TempDir()
	t.Cleanup(c.shutdown)
	return c
}

func (c *Cluster) shutdown() {
	for _, id := range slices.Backward(c.IDs()) {
		n := c.Node(id)
		if n.Up() {
			n.close(false)
		}
		n.mu.Lock()
		if n.conn != nil {
			_ = n.conn.Close() // fails only for a connection already closed
		}
		n.mu.Unlock()
	}
}

// Add starts a new node; it joins the first node that is up, or creates
// the cluster if there is none.
func (c *Cluster) Add(id string) *Node {
	c.t.Helper()
	c.mu.Lock()
	if _, ok := c.nodes[id]; ok {
		c.mu.Unlock()
		c.t.Fatalf("nodetest: node %s exists", id)
	}
	n := &Node{ID: id, c: c, dataDir: filepath.Join(c.dir, id), grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0"}
	var join []string
	for _, other := range c.order {
		if o := c.nodes[other]; o.Up() {
			join = []string{o.gossipAddr}
			break
		}
	}
	c.nodes[id] = n
	c.order = append(c.order, id)
	c.mu.Unlock()
	n.start(join)
	return n
}

// Node returns node id.
func (c *Cluster) Node(id string) *Node {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	if n == nil {
		c.t.Fatalf("nodetest: no node %s", id)
	}
	return n
}

// IDs returns the node ids in the order they were added.
func (c *Cluster) IDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.order)
}

// Shards returns the cluster's shard count.
func (c *Cluster) Shards() int { return c.opts.Shards }

func (n *Node) start(join []string) {
	c := n.c
	c.t.Helper()
	gt, err := c.gossip.transport(n.gossipAddr)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := node.Config{
		NodeID: n.ID, DataDir: n.dataDir, GRPCAddr: n.grpcAddr, HTTPAddr: n.httpAddr,
		Brokers: c.Brokers, Shards: c.opts.Shards, Limits: rpc.DefaultLimits(), Tuning: c.opts.Tuning,
		MaxInFlight: publish.DefaultMaxInFlight, MaxAttempts: publish.DefaultMaxAttempts, DeadLetter: publish.DefaultDeadLetterTopic,
		Logger: c.opts.Logger.With("node", n.ID), Now: time.Now,
		Cluster: true, Join: join, Replication: c.opts.Replication, DeadTimeout: c.opts.DeadTimeout,
		RaftAdvertise:   n.ID,
		RaftTransport:   func(id uint32) (raft.Transport, error) { return c.raft.transport(n.ID, id) },
		GossipTransport: gt,
	}
	nn, err := node.Start(cfg)
	if err != nil {
		_ = gt.Shutdown() // returns nil: it only takes the address off the simulated network
		c.t.Fatalf("nodetest: starting %s: %v", n.ID, err)
	}
	n.mu.Lock()
	n.n, n.gossipAddr, n.grpcAddr, n.httpAddr = nn, gt.addr, nn.GRPCAddr(), nn.HTTPAddr()
	n.mu.Unlock()
}

// Up reports whether the node is running.
func (n *Node) Up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.n != nil
}

// Running returns the running node; the test fails if it is down.
func (n *Node) Running() *node.Node {
	n.c.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.n == nil {
		n.c.t.Fatalf("nodetest: node %s is down", n.ID)
	}
	return n.n
}

// Restart starts a node that is down again on its data, as chimed restarted
// with the same flags (and no --join: it finds the members it knew).
func (n *Node) Restart() {
	n.c.t.Helper()
	if n.Up() {
		n.c.t.Fatalf("nodetest: node %s is up", n.ID)
	}
	n.start(nil)
}

// Kill stops the node as a crash looks to the others: it is cut off from
// every node first, so no leave or leadership handover reaches them, then
// closed. (Its Pebble closes cleanly: process-level tests cover kill -9.)
func (n *Node) Kill() {
	n.c.t.Helper()
	c := n.c
	others := c.IDs()
	c.mu.Lock()
	for _, o := range others {
		if o != n.ID {
			c.link(n.ID, o, false)
		}
	}
	c.mu.Unlock()
	n.close(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range others {
		if o != n.ID && !c.cut[pair(n.ID, o)] {
			c.link(n.ID, o, true)
		}
	}
}

// Stop shuts the node down gracefully, as SIGTERM does.
func (n *Node) Stop() {
	n.c.t.Helper()
	n.close(true)
}

func (n *Node) close(graceful bool) {
	n.mu.Lock()
	nn := n.n
	n.n = nil
	n.mu.Unlock()
	if nn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !graceful {
		cancel() // in-flight requests are cut off, not waited for
	}
	if err := nn.Close(ctx); err != nil && graceful {
		n.c.t.Errorf("nodetest: stopping %s: %v", n.ID, err)
	}
}

// link connects (up) or cuts the Raft and gossip links between nodes a and b.
func (c *Cluster) link(a, b string, up bool) {
	c.raft.setCut(a, b, !up)
	na, nb := c.nodes[a], c.nodes[b]
	if na == nil || nb == nil {
		return
	}
	c.gossip.setCut(na.gossipAddr, nb.gossipAddr, !up)
}

// Partition cuts every Raft and gossip link between the nodes in side and
// the others, until Heal. The gRPC ports stay reachable (forwarded requests
// go through); what a partition changes is who can elect and gossip.
func (c *Cluster) Partition(side ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range side {
		for _, b := range c.order {
			if !slices.Contains(side, b) {
				c.cut[pair(a, b)] = true
				c.link(a, b, false)
			}
		}
	}
}

// Heal restores every link Partition cut.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.cut {
		c.link(p[0], p[1], true)
	}
	clear(c.cut)
}

// Leader returns the node whose replica leads shard id, among the nodes that
// are up, or "" if none does. Two can claim it for a moment after a
// partition (the deposed one has not heard yet); the one in the later term
// wins.
func (c *Cluster) Leader(id uint32) string {
	best, term := "", uint64(0)
	for _, nid := range c.IDs() {
		n := c.Node(nid)
		n.mu.Lock()
		nn := n.n
		n.mu.Unlock()
		if nn == nil {
			continue
		}
		r := nn.Host().Replica(id)
		if r == nil || !r.IsLeader() {
			continue
		}
		if st, err := r.Status(); err == nil && (best == "" || st.Term > term) {
			best, term = nid, st.Term
		}
	}
	return best
}

// conn returns a client connection to the node's gRPC address, which is
// the same across restarts.
func (n *Node) clientConn() *grpc.ClientConn {
	n.c.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			n.c.t.Fatal(err)
		}
		n.conn = cc
	}
	return n.conn
}

// Scheduler is a client of the node's Scheduler API.
func (n *Node) Scheduler() chimev1.SchedulerClient { return chimev1.NewSchedulerClient(n.clientConn()) }

// Admin is a client of the node's Admin API.
func (n *Node) Admin() chimev1.AdminClient { return chimev1.NewAdminClient(n.clientConn()) }

// Recurring is a client of the node's chime.v1.Recurring API.
func (n *Node) Recurring() chimev1.RecurringClient { return chimev1.NewRecurringClient(n.clientConn()) }

// HTTPAddr is the node's /healthz, /readyz and /metrics address.
func (n *Node) HTTPAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.httpAddr
}

// Status asks node id (the first node that is up, if id is "") for the
// cluster's status; nil if it does not answer within 5 s.
func (c *Cluster) Status(id string) *chimev1.StatusResponse {
	if id == "" {
		for _, o := range c.IDs() {
			if c.Node(o).Up() {
				id = o
				break
			}
		}
		if id == "" {
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Node(id).Admin().Status(ctx, &chimev1.StatusRequest{})
	if err != nil {
		return nil
	}
	return st
}

// Converged reports whether st shows every one of shards shards with a
// leader and exactly its desired voters, no non-voter left.
func Converged(st *chimev1.StatusResponse, shards int) bool {
	if st == nil || len(st.Shards) != shards {
		return false
	}
	for _, s := range st.Shards {
		if s.Leader == "" || len(s.Nonvoters) > 0 || len(s.Desired) == 0 || !sameSet(s.Voters, s.Desired) {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// WaitConverged waits until the status from node from ("": the first node
// up) shows the cluster converged, and returns that status.
func (c *Cluster) WaitConverged(d time.Duration, from string) *chimev1.StatusResponse {
	c.t.Helper()
	var st *chimev1.StatusResponse
	WaitFor(c.t, d, func() (bool, string) {
		st = c.Status(from)
		return Converged(st, c.opts.Shards), "cluster converged: " + Describe(st)
	})
	return st
}

// WaitSettled waits until the cluster has converged and every shard is led
// by its preferred leader, so no balancing transfer is still to come.
func (c *Cluster) WaitSettled(d time.Duration) *chimev1.StatusResponse {
	c.t.Helper()
	var st *chimev1.StatusResponse
	WaitFor(c.t, d, func() (bool, string) {
		st = c.Status("")
		ok := Converged(st, c.opts.Shards)
		for _, s := range st.GetShards() {
			ok = ok && s.Leader == s.Desired[0]
		}
		return ok, "every shard on its preferred leader: " + Describe(st)
	})
	return st
}

// Describe renders a status for a failure message.
func Describe(st *chimev1.StatusResponse) string {
	if st == nil {
		return "<no status>"
	}
	s := ""
	for _, m := range st.Members {
		s += fmt.Sprintf("[%s %s] ", m.Id, m.State)
	}
	for _, sh := range st.Shards {
		s += fmt.Sprintf("\n  shard %d leader=%q voters=%v nonvoters=%v desired=%v", sh.Id, sh.Leader, sh.Voters, sh.Nonvoters, sh.Desired)
	}
	return s
}

// PollInterval is how often WaitFor checks its condition.
const PollInterval = 20 * time.Millisecond

// WaitFor polls cond every PollInterval until it holds, and fails the test
// if it does not within d. cond returns whether it holds and what it waits
// for (with the state seen), for the failure message.
func WaitFor(t testing.TB, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		ok, what := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		<-tick.C
	}
}
