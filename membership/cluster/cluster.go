package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
)

// Gossip is what the Cluster reads from membership: *membership.Membership.
type Gossip interface {
	View() membership.View
	Changes() <-chan struct{}
	Peers() []string
	SetDraining(bool) error
}

// ErrAlone is returned for what needs other nodes on a node that runs
// without gossip (chimed dev).
var ErrAlone = errors.New("this node runs alone, without gossip (chimed dev)")

// Cluster is one node's knowledge of the cluster. It turns the gossip view
// into the placement (a shard.Directory for the shard layer), asks other
// nodes through the Peer service, and routes requests to shard leaders on
// other nodes (the Scheduler server's Backend).
type Cluster struct {
	self        string
	clusterID   string
	gossip      Gossip // nil when alone
	shards      int
	replication int
	retention   time.Duration
	deadTimeout time.Duration
	removedPath string
	peersPath   string
	dialCreds   credentials.TransportCredentials // nil: plaintext
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

// Config configures a Cluster.
type Config struct {
	// Membership is the node's gossip. Nil makes a Cluster of this node
	// alone (chimed dev): its view holds only Self, every shard's placement
	// is this node, and Drain and node removal fail with ErrAlone.
	Membership Gossip
	// Self is this node's metadata when Membership is nil.
	Self membership.Meta
	// ClusterID is the id the cluster was given when it was created.
	ClusterID   string
	Shards      int
	Replication int
	// Retention is how long the cluster keeps settled events (fixed at its
	// creation), for the cluster map.
	Retention time.Duration
	// DeadTimeout is how long a member may be dead before the placement
	// replaces its replicas; one back in time keeps them.
	DeadTimeout time.Duration
	// RemovedPath is a file holding the nodes an operator removed for good.
	RemovedPath string
	// PeersPath, if set, is a file kept up to date with the gossip
	// addresses of every member seen, for the node to find them again
	// after a restart.
	PeersPath string
	// DialCredentials secure the node's gRPC calls to other nodes (the Peer
	// service, forwarded requests, Admin calls about another node); nil
	// dials in plaintext.
	DialCredentials credentials.TransportCredentials
	Logger          *slog.Logger
}

// New computes the first placement and follows membership changes until
// Close.
func New(cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{
		gossip: cfg.Membership, clusterID: cfg.ClusterID, shards: cfg.Shards, retention: cfg.Retention,
		replication: cfg.Replication, deadTimeout: cfg.DeadTimeout, removedPath: cfg.RemovedPath, peersPath: cfg.PeersPath,
		logger: cfg.Logger, removed: map[string]bool{}, conns: map[string]*grpc.ClientConn{}, dialCreds: cfg.DialCredentials,
		changes: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if c.gossip == nil {
		c.self, c.replication = cfg.Self.NodeID, 1
		c.view = membership.View{Self: c.self, Members: map[string]membership.Member{
			c.self: {Meta: cfg.Self, State: membership.Alive, Since: time.Now()},
		}}
		c.desired = membership.Placement([]string{c.self}, c.shards, 1)
		close(c.done)
		return c, nil
	}
	c.self = c.gossip.View().Self
	if b, err := os.ReadFile(cfg.RemovedPath); err == nil {
		if c.removed, err = decodeRemoved(b); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.RemovedPath, err)
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

// Host returns the node's shard host, nil until SetHost.
func (c *Cluster) Host() *host.Host { return c.host.Load() }

// Close stops following membership and closes connections to other nodes.
func (c *Cluster) Close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
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
		case <-c.gossip.Changes():
		case <-t.C:
		}
		c.refresh()
	}
}

// refresh recomputes the placement from the current view and signals a
// change when it moved.
func (c *Cluster) refresh() {
	if c.gossip == nil {
		return
	}
	view := c.gossip.View()
	c.mu.RLock()
	removed := c.removed
	c.mu.RUnlock()
	desired := membership.Placement(view.Candidates(time.Now(), c.deadTimeout, removed), c.shards, c.replication)
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
	b, _ := json.Marshal(c.gossip.Peers())
	tmp := c.peersPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
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

// Self returns this node's id.
func (c *Cluster) Self() string { return c.self }

// Alone reports a Cluster without gossip (chimed dev).
func (c *Cluster) Alone() bool { return c.gossip == nil }

// Shards returns the cluster's shard count.
func (c *Cluster) Shards() int { return c.shards }

// View returns the membership view the placement was last computed from.
func (c *Cluster) View() membership.View {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.view
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
	m, ok := c.Member(node)
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
	m, ok := c.Member(node)
	return ok && m.Meta.Draining
}

// Replication implements shard.Directory.
func (c *Cluster) Replication() int { return c.replication }

// Retention is how long the cluster keeps settled events; 0 keeps them.
func (c *Cluster) Retention() time.Duration { return c.retention }

// ID returns the id the cluster was given when it was created; empty for a
// data directory older than cluster ids.
func (c *Cluster) ID() string { return c.clusterID }

// Changes implements shard.Directory.
func (c *Cluster) Changes() <-chan struct{} { return c.changes }

// Epoch implements shard.Directory.
func (c *Cluster) Epoch() uint64 { return c.epoch.Load() }

// LogIndex implements shard.Directory: it asks node's Peer service.
func (c *Cluster) LogIndex(ctx context.Context, node string, s uint32) (uint64, error) {
	st, err := c.NodeReplicas(ctx, node, s)
	if err != nil {
		return 0, err
	}
	for _, r := range st.Replicas {
		if r.Shard == s {
			return r.LastIndex, nil
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

// Drain gossips that this node is draining and recomputes the placement:
// every shard leader then moves its replicas and leaderships elsewhere.
func (c *Cluster) Drain() error {
	if c.gossip == nil {
		return fmt.Errorf("%w: there is no other node to move its replicas to", ErrAlone)
	}
	if err := c.gossip.SetDraining(true); err != nil {
		return fmt.Errorf("gossiping the draining state: %w", err)
	}
	c.refresh()
	return nil
}

// Remove forgets node for good on this node (persisted) and recomputes the
// placement.
func (c *Cluster) Remove(node string) error {
	if c.gossip == nil {
		return fmt.Errorf("%w: there is no other node to remove", ErrAlone)
	}
	c.mu.Lock()
	c.removed[node] = true
	b := encodeRemoved(c.removed)
	c.mu.Unlock()
	tmp := c.removedPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, c.removedPath); err != nil {
		return err
	}
	c.refresh()
	return nil
}

// encodeRemoved is the removed.json of the nodes in removed: their ids, sorted.
func encodeRemoved(removed map[string]bool) []byte {
	ids := slices.Sorted(maps.Keys(removed))
	b, _ := json.Marshal(ids)
	return b
}

// decodeRemoved reads a removed.json.
func decodeRemoved(b []byte) (map[string]bool, error) {
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		return nil, err
	}
	removed := make(map[string]bool, len(ids))
	for _, id := range ids {
		removed[id] = true
	}
	return removed, nil
}

// Member returns node as this node's view has it.
func (c *Cluster) Member(node string) (membership.Member, bool) {
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

// Conn returns a client connection to node's gRPC address, from a pool
// Close closes.
func (c *Cluster) Conn(node string) (*grpc.ClientConn, error) {
	m, ok := c.Member(node)
	if !ok || m.Meta.GRPCAddr == "" {
		return nil, fmt.Errorf("%w: node %q is not a known member", shard.ErrUnknownShard, node)
	}
	addr := m.Meta.GRPCAddr
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stop:
		return nil, fmt.Errorf("%w: the cluster view is closed", shard.ErrStopped)
	default:
	}
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := c.dialCreds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}
