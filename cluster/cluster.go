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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/chimehq/chime/internal/durable"
	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
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
	dialCreds   func(node string) credentials.TransportCredentials // nil: plaintext
	logger      *slog.Logger

	host atomic.Pointer[host.Host] // set once the host is open
	// ingest, once set, lists the ingest partitions this node consumes.
	ingest atomic.Pointer[func() []*chimev1.IngestPartition]
	// leaders caches the shards' leaders for the requests this node routes.
	leaders *leaders
	scopeOf func(context.Context) shard.Scope

	mu      sync.RWMutex
	view    membership.View
	desired [][]string // by shard, preferred leader first
	// removed is replaced, never changed in place, so a copy read under mu
	// stays valid after mu is released.
	removed map[string]bool
	// removedGen counts the changes of removed; told holds, by live member,
	// the removedGen that member confirmed it records (see tellRemoved).
	removedGen uint64
	told       map[string]uint64
	telling    map[string]bool             // a tell in flight, by member
	tellFails  map[string]int              // consecutive failed tells, by member
	conns      map[string]*grpc.ClientConn // by gRPC address

	// removeMu orders Removes, so that each one's write of removed.json
	// includes every removal recorded before it.
	removeMu sync.Mutex

	// proven holds the members whose id a call through credentials pinned
	// to it proved (DialCredentials), proving those whose proof is under
	// way, and proveFails the consecutive failures, by member.
	proven     map[string]bool
	proving    map[string]bool
	proveFails map[string]int
	wake       chan struct{} // a proof succeeded: refresh the placement

	// The calls tellRemoved and prove start in the background: bgCtx is
	// cancelled by Close, which waits for bgWG.
	bgCtx    context.Context
	cancelBG context.CancelFunc
	bgWG     sync.WaitGroup

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
	// DialCredentials secure the node's gRPC calls to node (the Peer
	// service, forwarded requests, Admin calls about another node), and
	// must fail the handshake unless the other end proves to be node (its
	// certificate names it). With them, a member is a placement candidate
	// only once a call to it went through: holding the gossip key is not
	// enough to be given replicas under a node's name. Nil dials in
	// plaintext, and every member is a candidate.
	DialCredentials func(node string) credentials.TransportCredentials
	// ScopeOf is what the credential a Peer call was made on behalf of may
	// act on, from the call's context (nil, or nil answers: anything).
	ScopeOf func(context.Context) shard.Scope
	Logger  *slog.Logger
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
		removedGen: 1, told: map[string]uint64{}, telling: map[string]bool{}, tellFails: map[string]int{},
		proven: map[string]bool{}, proving: map[string]bool{}, proveFails: map[string]int{}, wake: make(chan struct{}, 1),
		changes: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		leaders: newLeaders(), scopeOf: cfg.ScopeOf,
	}
	c.bgCtx, c.cancelBG = context.WithCancel(context.Background())
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
	c.proveAll()
	c.refresh()
	go c.loop()
	return c, nil
}

// proveAll proves, in parallel and for at most peerWait, every live member
// before the first placement, so that a restarted node does not start from
// a placement of itself alone while its proofs are on their way. A member
// that does not answer in time is proven by a later refresh.
func (c *Cluster) proveAll() {
	if c.dialCreds == nil {
		return
	}
	view := c.gossip.View()
	c.mu.Lock()
	c.view = view // Conn finds the members' addresses there
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range view.Live() {
		if id != c.self {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.prove(id)
			}()
		}
	}
	wg.Wait()
}

// prove asks member, through credentials pinned to it, for its replicas: a
// call that goes through proves that the node at its gRPC address holds
// member's key, and makes it a placement candidate.
func (c *Cluster) prove(member string) {
	err := func() error {
		cc, err := c.Conn(member)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(c.bgCtx, peerWait)
		defer cancel()
		resp, err := chimev1.NewPeerClient(cc).Replicas(ctx, &chimev1.ReplicasRequest{})
		if err == nil && resp.NodeId != member {
			err = fmt.Errorf("it answered as node %q", resp.NodeId)
		}
		return err
	}()
	c.mu.Lock()
	delete(c.proving, member)
	if err == nil {
		c.proven[member] = true
		delete(c.proveFails, member)
		c.mu.Unlock()
		select {
		case c.wake <- struct{}{}:
		default:
		}
		return
	}
	c.proveFails[member]++
	fails := c.proveFails[member]
	c.mu.Unlock()
	if c.bgCtx.Err() != nil {
		return // closing
	}
	// The first failures are usual: a node joins gossip before its gRPC
	// port serves.
	level := slog.LevelDebug
	if fails == 5 {
		level = slog.LevelWarn
	}
	c.logger.Log(context.Background(), level, "a member has not proved its id; it is no placement candidate until it does (retrying every second)",
		"member", member, "failures", fails, "err", err)
}

// candidates filters the placement candidates to those proven (all of them
// without DialCredentials), and starts proving the live members that are
// not.
func (c *Cluster) candidates(view membership.View, all []string) []string {
	if c.dialCreds == nil {
		return all
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stop:
	default:
		for _, id := range view.Live() {
			if id != c.self && !c.proven[id] && !c.proving[id] {
				c.proving[id] = true
				c.bgWG.Add(1)
				go func() {
					defer c.bgWG.Done()
					c.prove(id)
				}()
			}
		}
	}
	return slices.DeleteFunc(all, func(id string) bool { return id != c.self && !c.proven[id] })
}

// SetHost gives the cluster the node's shard host, once it is open.
func (c *Cluster) SetHost(h *host.Host) { c.host.Store(h) }

// SetIngest makes f tell the Peer service's Replicas, and so the Admin
// API's Status, which ingest partitions this node consumes.
func (c *Cluster) SetIngest(f func() []*chimev1.IngestPartition) { c.ingest.Store(&f) }

// Host returns the node's shard host, nil until SetHost.
func (c *Cluster) Host() *host.Host { return c.host.Load() }

// Close stops following membership, waits for the tells of removed nodes
// in flight, and closes connections to other nodes.
func (c *Cluster) Close() {
	c.mu.Lock()
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.mu.Unlock()
	<-c.done
	// tellRemoved starts a tell only under mu with stop still open, so none
	// starts after the close above.
	c.cancelBG()
	c.bgWG.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		_ = cc.Close() // fails only for a connection already closed
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
		case <-c.wake:
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
	desired := membership.Placement(c.candidates(view, view.Candidates(time.Now(), c.deadTimeout, removed)), c.shards, c.replication)
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
	c.tellRemoved(view)
}

// tellRemoved starts telling each live member that has not confirmed it
// records every node this one records as removed, through the Peer
// service's Forget. A member confirms again after every new removal, and
// after it was seen not live: a node that was down (or had not joined yet)
// when an operator removed a node learns it when it comes back, since the
// operator's fan-out reached only the members live then. A member that
// fails is asked again on the next refresh (every second), which also
// covers a node whose gossip is up before its gRPC port serves.
func (c *Cluster) tellRemoved(view membership.View) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stop:
		return
	default:
	}
	for _, id := range slices.Concat(slices.Collect(maps.Keys(c.told)), slices.Collect(maps.Keys(c.tellFails))) {
		if m, ok := view.Members[id]; !ok || !m.State.Live() {
			delete(c.told, id)
			delete(c.tellFails, id)
		}
	}
	if len(c.removed) == 0 {
		return
	}
	for _, id := range view.Live() {
		if id == c.self || c.removed[id] || c.telling[id] || c.told[id] == c.removedGen {
			continue
		}
		// A member refuses to forget a node it sees live, and so would
		// every member that sees it as this one does; the node itself
		// is not told to forget itself.
		var nodes []string
		for _, r := range slices.Sorted(maps.Keys(c.removed)) {
			if m, ok := view.Members[r]; r != id && (!ok || !m.State.Live()) {
				nodes = append(nodes, r)
			}
		}
		c.telling[id] = true
		c.bgWG.Add(1)
		go c.tell(id, nodes, c.removedGen)
	}
}

// tell asks member to forget nodes and records that it confirmed gen.
func (c *Cluster) tell(member string, nodes []string, gen uint64) {
	defer c.bgWG.Done()
	var err error
	for _, n := range nodes {
		if err = c.forget(c.bgCtx, member, n); err != nil {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.telling, member)
	if err != nil {
		c.tellFails[member]++
		// The first failures are usual: a node joins gossip before its
		// gRPC port serves.
		level := slog.LevelDebug
		if c.tellFails[member] == 5 {
			level = slog.LevelWarn
		}
		c.logger.Log(c.bgCtx, level, "telling a member about removed nodes; retrying every second",
			"member", member, "removed", nodes, "failures", c.tellFails[member], "err", err)
		return
	}
	delete(c.tellFails, member)
	c.told[member] = max(c.told[member], gen)
}

// savePeers records the members' gossip addresses (best effort: a node that
// cannot write them only loses a shortcut for its next start).
func (c *Cluster) savePeers() {
	if c.peersPath == "" {
		return
	}
	b, _ := json.Marshal(c.gossip.Peers())
	if err := durable.WriteFile(c.peersPath, b, 0o600); err != nil {
		c.logger.Debug("writing the members' gossip addresses", "file", c.peersPath, "err", err)
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

// Parked implements shard.Directory: it asks node's Peer service.
func (c *Cluster) Parked(ctx context.Context, node string, s uint32) ([]raftfsm.Fired, error) {
	cc, err := c.Conn(node)
	if err != nil {
		return nil, err
	}
	resp, err := chimev1.NewPeerClient(cc).ShardParked(ctx, &chimev1.ShardParkedRequest{Shard: s})
	if err != nil {
		return nil, err
	}
	out := make([]raftfsm.Fired, len(resp.Events))
	for i, e := range resp.Events {
		out[i] = raftfsm.Fired{Seq: e.Seq, FiredAt: e.FiredAt, Attempts: e.Attempts, Due: e.Due}
	}
	return out, nil
}

// Members implements shard.Directory: it asks the shard's leader.
func (c *Cluster) Members(ctx context.Context, s uint32) (voters, nonvoters []string, err error) {
	r, _, err := c.leaderReplica(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	return r.Voters, r.Nonvoters, nil
}

// TooFewNodesError is Drain's refusal when fewer other nodes than the
// replication factor could take the node's replicas.
type TooFewNodesError struct {
	Node        string
	Replication int
	// Takers are the other nodes that could take replicas.
	Takers []string
}

func (e *TooFewNodesError) Error() string {
	takers := "none"
	if len(e.Takers) > 0 {
		takers = strings.Join(e.Takers, ", ")
	}
	return fmt.Sprintf("node: %q cannot be drained without leaving its shards with fewer voters than the replication factor %d: "+
		"%d other %s can take replicas (%s), and one more failure could then cost a shard its quorum; "+
		"start another node first, or drain with force (chimectl drain --force) to accept that",
		e.Node, e.Replication, len(e.Takers), nodesWord(len(e.Takers)), takers)
}

// Drain gossips that this node is draining and recomputes the placement:
// every shard leader then moves its replicas and leaderships elsewhere.
//
// Unless force, Drain first checks that at least Replication other nodes
// could take the replicas (Takers). The placement puts each shard on
// min(Replication, candidates) nodes, so with fewer, every shard on this
// node would go on with fewer voters than Replication; Drain then returns a
// *TooFewNodesError and changes nothing. A node already draining is not
// checked again: asking again follows the drain under way.
func (c *Cluster) Drain(force bool) error {
	if c.gossip == nil {
		return fmt.Errorf("%w: there is no other node to move its replicas to", ErrAlone)
	}
	self, ok := c.Member(c.self)
	if draining := ok && self.Meta.Draining; !force && !draining {
		if takers := c.Takers(); len(takers) < c.replication {
			return &TooFewNodesError{Node: c.self, Replication: c.replication, Takers: takers}
		}
	}
	if err := c.gossip.SetDraining(true); err != nil {
		return fmt.Errorf("gossiping the draining state: %w", err)
	}
	c.refresh()
	return nil
}

func nodesWord(n int) string {
	if n == 1 {
		return "node"
	}
	return "nodes"
}

// Takers returns the nodes other than this one that could take replicas
// now, sorted: the placement's candidates that are live and proven.
func (c *Cluster) Takers() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for _, id := range c.view.Candidates(time.Now(), c.deadTimeout, c.removed) {
		if id != c.self && c.view.Members[id].State.Live() && (c.dialCreds == nil || c.proven[id]) {
			out = append(out, id)
		}
	}
	return out
}

// DeadTimeout is how long a member may be dead before the placement
// replaces its replicas (chimed --dead-timeout).
func (c *Cluster) DeadTimeout() time.Duration { return c.deadTimeout }

// SinceAlive returns how long ago this node last saw node alive: zero while
// node is live, otherwise the time since this node saw it die or leave
// (membership.Member.Since, by this node's clock). ok is false for a node
// this node does not know. The placement keeps node's replicas while
// SinceAlive is under DeadTimeout, in case it comes back.
func (c *Cluster) SinceAlive(node string) (ago time.Duration, ok bool) {
	m, ok := c.Member(node)
	if !ok || m.State.Live() {
		return 0, ok
	}
	return max(time.Since(m.Since), 0), true
}

// Remove forgets node for good on this node and recomputes the placement.
// The removal is on disk before Remove returns and before the placement
// changes: removed.json is replaced through a synced temporary file and a
// synced directory, so a node that restarts, even after a power loss,
// still knows it. Removing a node already removed changes nothing. The
// live members learn it through tellRemoved.
func (c *Cluster) Remove(node string) error {
	if c.gossip == nil {
		return fmt.Errorf("%w: there is no other node to remove", ErrAlone)
	}
	c.removeMu.Lock()
	defer c.removeMu.Unlock()
	c.mu.RLock()
	next := maps.Clone(c.removed)
	c.mu.RUnlock()
	if next[node] {
		return nil
	}
	next[node] = true
	if err := durable.WriteFile(c.removedPath, encodeRemoved(next), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", c.removedPath, err)
	}
	c.mu.Lock()
	c.removed = next
	c.removedGen++
	c.mu.Unlock()
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
	// By node and address: a connection's credentials accept only the
	// node it was dialled for.
	key := node + "@" + addr
	if cc := c.conns[key]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if c.dialCreds != nil {
		creds = c.dialCreds(node)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	c.conns[key] = cc
	return cc, nil
}
