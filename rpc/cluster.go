package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
)

// Cluster is one node's knowledge of the cluster. It turns the gossip view
// into the placement (a shard.Directory for the shard layer), routes requests
// to shard leaders on other nodes (a Backend for the Scheduler server), and
// answers the Admin API.
type Cluster struct {
	self        string
	ml          *membership.Membership
	shards      int
	replication int
	deadTimeout time.Duration
	removedPath string
	peersPath   string
	logger      *slog.Logger

	host atomic.Pointer[host.Host] // set once the host is open

	mu      sync.RWMutex
	view    membership.View
	desired [][]string // by shard, preferred leader first
	removed map[string]bool
	conns   map[string]*grpc.ClientConn // by gRPC address

	epoch   atomic.Uint64
	changes chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// ClusterConfig configures a Cluster.
type ClusterConfig struct {
	Membership  *membership.Membership
	Shards      int
	Replication int
	// DeadTimeout is how long a member may be dead before the placement
	// replaces its replicas; one back in time keeps them.
	DeadTimeout time.Duration
	// RemovedPath is a file holding the nodes an operator removed for good.
	RemovedPath string
	// PeersPath, if set, is a file kept up to date with the gossip
	// addresses of every member seen, for the node to find them again
	// after a restart.
	PeersPath string
	Logger    *slog.Logger
}

// NewCluster computes the first placement and follows membership changes
// until Close.
func NewCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{
		self: cfg.Membership.View().Self, ml: cfg.Membership, shards: cfg.Shards,
		replication: cfg.Replication, deadTimeout: cfg.DeadTimeout, removedPath: cfg.RemovedPath, peersPath: cfg.PeersPath,
		logger: cfg.Logger, removed: map[string]bool{}, conns: map[string]*grpc.ClientConn{},
		changes: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if b, err := os.ReadFile(cfg.RemovedPath); err == nil {
		var ids []string
		if err := json.Unmarshal(b, &ids); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.RemovedPath, err)
		}
		for _, id := range ids {
			c.removed[id] = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	c.refresh()
	go c.loop()
	return c, nil
}

// SetHost gives the cluster the node's shard host, once it is open.
func (c *Cluster) SetHost(h *host.Host) { c.host.Store(h) }

// Close stops following membership and closes connections to other nodes.
func (c *Cluster) Close() {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
}

func (c *Cluster) loop() {
	defer close(c.done)
	// Dead members age past DeadTimeout without any gossip event, so the
	// placement is also recomputed on a timer.
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.ml.Changes():
		case <-t.C:
		}
		c.refresh()
	}
}

// refresh recomputes the placement from the current view and signals a
// change when it moved.
func (c *Cluster) refresh() {
	view := c.ml.View()
	c.mu.RLock()
	removed := c.removed
	c.mu.RUnlock()
	desired := Placement(view.Candidates(time.Now(), c.deadTimeout, removed), c.shards, c.replication)
	c.mu.Lock()
	changed := !slices.EqualFunc(desired, c.desired, slices.Equal[[]string]) || !sameMembers(view, c.view)
	c.view, c.desired = view, desired
	c.mu.Unlock()
	if changed {
		c.savePeers()
		c.epoch.Add(1)
		select {
		case c.changes <- struct{}{}:
		default:
		}
	}
}

// savePeers records the members' gossip addresses (best effort: a node that
// cannot write them only loses a shortcut for its next start).
func (c *Cluster) savePeers() {
	if c.peersPath == "" {
		return
	}
	b, _ := json.Marshal(c.ml.Peers())
	tmp := c.peersPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		os.Rename(tmp, c.peersPath)
	}
}

func sameMembers(a, b membership.View) bool {
	if len(a.Members) != len(b.Members) {
		return false
	}
	for id, m := range a.Members {
		o, ok := b.Members[id]
		if !ok || o.State != m.State || o.Meta != m.Meta {
			return false
		}
	}
	return true
}

// Placement computes every shard's desired voters over candidates by
// rendezvous hashing, then puts a preferred leader first so that leaders
// spread evenly: shard by shard, the desired voter with the fewest
// leaderships so far, then moves that lower the busiest node's count while
// any helps. Every node computes the same result from the same candidates.
func Placement(candidates []string, shards, replication int) [][]string {
	desired := make([][]string, shards)
	load := map[string]int{}
	for s := range shards {
		d := membership.Place(uint32(s), candidates, replication)
		best := 0
		for i, n := range d {
			if load[n] < load[d[best]] {
				best = i
			}
		}
		if len(d) > 0 {
			load[d[best]]++
			d[0], d[best] = d[best], d[0]
		}
		desired[s] = d
	}
	balanceLeaders(desired, candidates, load)
	return desired
}

// balanceLeaders moves preferred leaderships until no node is two below
// another one it can take from, directly or along a chain: node a can take a
// shard from b when b is its preferred leader and a is one of its voters. A
// chain a <- b <- c moves one shard from c to b and one from b to a, so only
// the two ends change count. This reaches the most even spread the replica
// placement allows (a node with few replicas may not get its share).
func balanceLeaders(desired [][]string, candidates []string, load map[string]int) {
	for {
		// The least-loaded node that can still gain, ties by id.
		improved := false
		order := slices.Clone(candidates)
		slices.SortStableFunc(order, func(a, b string) int { return load[a] - load[b] })
		for _, v := range order {
			if path := takeChain(desired, load, v); path != nil {
				// path[i] is the shard the i-th node of the chain takes
				// from the next one.
				for _, s := range path {
					d := desired[s]
					i := slices.Index(d, takerOf(desired, path, s, v))
					load[d[0]]--
					load[d[i]]++
					d[0], d[i] = d[i], d[0]
				}
				improved = true
				break
			}
		}
		if !improved {
			return
		}
	}
}

// takeChain finds, by breadth-first search from v, a shortest chain of
// shards ending at a node with at least two more leaderships than v, and
// returns the shards in the order their leaderships move (from the far end
// back to v).
func takeChain(desired [][]string, load map[string]int, v string) []int {
	type step struct {
		node  string
		shard int // shard by which node was reached
		prev  int // index of the previous step
	}
	steps := []step{{node: v, shard: -1, prev: -1}}
	seen := map[string]bool{v: true}
	for i := 0; i < len(steps); i++ {
		a := steps[i].node
		for s, d := range desired {
			if len(d) == 0 || seen[d[0]] || !slices.Contains(d[1:], a) {
				continue
			}
			b := d[0]
			seen[b] = true
			steps = append(steps, step{node: b, shard: s, prev: i})
			if load[b] >= load[v]+2 {
				var path []int
				for j := len(steps) - 1; steps[j].prev >= 0; j = steps[j].prev {
					path = append(path, steps[j].shard)
				}
				return path
			}
		}
	}
	return nil
}

// takerOf returns which node takes shard s along path: the node before it in
// the chain, which for the last shard is v.
func takerOf(desired [][]string, path []int, s int, v string) string {
	i := slices.Index(path, s)
	if i == len(path)-1 {
		return v
	}
	return desired[path[i+1]][0]
}

// Desired implements shard.Directory.
func (c *Cluster) Desired(s uint32) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if int(s) >= len(c.desired) {
		return nil
	}
	return c.desired[s]
}

// RaftAddr implements shard.Directory.
func (c *Cluster) RaftAddr(node string) (string, bool) {
	m, ok := c.member(node)
	return m.Meta.RaftAddr, ok && m.Meta.RaftAddr != ""
}

// Removed implements shard.Directory.
func (c *Cluster) Removed(node string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.removed[node]
}

// Leaving implements shard.Directory: the node gossips that it is draining.
func (c *Cluster) Leaving(node string) bool {
	m, ok := c.member(node)
	return ok && m.Meta.Draining
}

// Replication implements shard.Directory.
func (c *Cluster) Replication() int { return c.replication }

// Changes implements shard.Directory.
func (c *Cluster) Changes() <-chan struct{} { return c.changes }

// Epoch implements shard.Directory.
func (c *Cluster) Epoch() uint64 { return c.epoch.Load() }

// LogIndex implements shard.Directory.
func (c *Cluster) LogIndex(ctx context.Context, node string, s uint32) (uint64, error) {
	st, err := c.nodeStatus(ctx, node)
	if err != nil {
		return 0, err
	}
	for _, r := range st.Replicas {
		if r.Shard == s {
			return r.LastLogIndex, nil
		}
	}
	return 0, fmt.Errorf("node %s has no replica of shard %d", node, s)
}

// Members implements shard.Directory: it asks the shard's leader.
func (c *Cluster) Members(ctx context.Context, s uint32) (voters, nonvoters []string, err error) {
	r, _, err := c.leaderReplica(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	return r.Voters, r.Nonvoters, nil
}

// Remove forgets node for good on this node (persisted) and recomputes the
// placement.
func (c *Cluster) Remove(node string) error {
	c.mu.Lock()
	c.removed[node] = true
	ids := make([]string, 0, len(c.removed))
	for id := range c.removed {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	slices.Sort(ids)
	b, _ := json.Marshal(ids)
	tmp := c.removedPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, c.removedPath); err != nil {
		return err
	}
	c.refresh()
	return nil
}

func (c *Cluster) member(node string) (membership.Member, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.view.Members[node]
	return m, ok
}

// liveMembers returns the live members' ids, sorted.
func (c *Cluster) liveMembers() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.view.Live()
}

// conn returns a client connection to node's gRPC address.
func (c *Cluster) conn(node string) (*grpc.ClientConn, error) {
	m, ok := c.member(node)
	if !ok || m.Meta.GRPCAddr == "" {
		return nil, fmt.Errorf("%w: node %q is not a known member", shard.ErrUnknownShard, node)
	}
	addr := m.Meta.GRPCAddr
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

// nodeStatus asks node (this one included) for its replicas.
func (c *Cluster) nodeStatus(ctx context.Context, node string) (*chimev1.NodeStatusResponse, error) {
	if node == c.self {
		return c.localStatus(), nil
	}
	cc, err := c.conn(node)
	if err != nil {
		return nil, err
	}
	return chimev1.NewAdminClient(cc).NodeStatus(ctx, &chimev1.NodeStatusRequest{})
}

// localStatus describes this node's replicas.
func (c *Cluster) localStatus() *chimev1.NodeStatusResponse {
	resp := &chimev1.NodeStatusResponse{NodeId: c.self}
	if m, ok := c.member(c.self); ok {
		resp.Draining = m.Meta.Draining
	}
	h := c.host.Load()
	if h == nil {
		return resp
	}
	for id, s := range h.Shards() {
		resp.Replicas = append(resp.Replicas, replicaStatus(id, s))
	}
	slices.SortFunc(resp.Replicas, func(a, b *chimev1.Replica) int { return int(a.Shard) - int(b.Shard) })
	return resp
}

func replicaStatus(id uint32, s *shard.Shard) *chimev1.Replica {
	st := s.Stats()
	rs := s.RaftStats()
	r := &chimev1.Replica{
		Shard: id, RaftState: rs["state"], Leader: s.Leader(), AppliedIndex: s.AppliedIndex(),
		Pending: st.Pending, Fired: st.Fired, Cancelled: st.Cancelled, DeadLettered: st.DeadLettered, Refired: st.Refired,
	}
	fmt.Sscan(rs["last_log_index"], &r.LastLogIndex)
	fmt.Sscan(rs["commit_index"], &r.CommitIndex)
	fmt.Sscan(rs["term"], &r.Term)
	r.Voters, r.Nonvoters, _ = s.Configuration()
	return r
}

// leaderReplica finds the shard's leader: this node's replica when it leads,
// otherwise by asking the shard's likely holders, then every live member.
func (c *Cluster) leaderReplica(ctx context.Context, s uint32) (*chimev1.Replica, string, error) {
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil && r.IsLeader() {
			return replicaStatus(s, r), c.self, nil
		}
	}
	asked := map[string]bool{c.self: true}
	order := append([]string{}, c.Desired(s)...)
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil && r.Leader() != "" {
			order = append([]string{r.Leader()}, order...)
		}
	}
	order = append(order, c.liveMembers()...)
	for _, n := range order {
		if asked[n] {
			continue
		}
		asked[n] = true
		st, err := c.nodeStatus(ctx, n)
		if err != nil {
			continue
		}
		for _, r := range st.Replicas {
			if r.Shard == s && r.RaftState == "Leader" {
				return r, n, nil
			}
		}
	}
	return nil, "", fmt.Errorf("%w: no leader found for shard %d", shard.ErrNotLeader, s)
}
