package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/hashicorp/memberlist"
)

// Defaults, chosen for a small LAN cluster whose nodes must idle cheaply (a
// node runs many Raft groups; gossip must stay a rounding error next to
// them). See doc.go for the failure-detection time they give.
const (
	// DefaultProbeInterval: one UDP ping+ack per node per second
	// (memberlist's LAN default). Probing is what detects failures, and it
	// is cheap: slowing it buys little CPU and costs detection time.
	DefaultProbeInterval = time.Second
	// DefaultProbeTimeout: memberlist's LAN default (a LAN RTT p99 is far below).
	DefaultProbeTimeout = 500 * time.Millisecond
	// DefaultSuspicionMult: memberlist's LAN default; a suspect has
	// SuspicionMult*max(1,log10(N))*ProbeInterval (4 s for N<=10) to refute.
	DefaultSuspicionMult = 4
	// DefaultGossipInterval is 500 ms instead of memberlist's 200 ms: the
	// gossip tick runs whether or not there is anything to send, and
	// membership changes also ride on every probe and ack, so a slower tick
	// saves idle wake-ups at the cost of a few hundred milliseconds of
	// propagation for drain and join updates.
	DefaultGossipInterval = 500 * time.Millisecond
	// DefaultPushPullInterval: memberlist's default full state sync (TCP),
	// the anti-entropy that repairs anything gossip missed.
	DefaultPushPullInterval = 30 * time.Second
	// DefaultGossipToTheDeadTime: how long memberlist keeps gossiping to a
	// dead node so it can refute, after which it forgets it. Membership
	// itself remembers dead nodes regardless.
	DefaultGossipToTheDeadTime = 30 * time.Second
	// DefaultDeadNodeReclaimTime: memberlist's default (0) never lets a dead
	// node's id come back from another address until memberlist forgets it
	// (GossipToTheDeadTime plus a probe round). This default lets it come
	// back as soon as the old address is declared dead. chimed sets the
	// dead timeout instead (--dead-timeout): whoever holds the gossip key
	// could otherwise take a crashed node's id over from anywhere at once.
	// A node that left (a graceful stop) may come back from a new address at
	// once whatever this is: memberlist always lets a left node's name go.
	DefaultDeadNodeReclaimTime = time.Nanosecond
	// DefaultTCPTimeout bounds each push/pull (including each join attempt
	// per seed address): memberlist's LAN default.
	DefaultTCPTimeout = 10 * time.Second
	// DefaultJoinTimeout bounds the join retries of Start.
	DefaultJoinTimeout = 30 * time.Second
	// DefaultBroadcastTimeout bounds how long SetDraining and Leave wait
	// for their update to be gossiped.
	DefaultBroadcastTimeout = 5 * time.Second
)

// Config configures a node's membership. Zero durations take the defaults above.
type Config struct {
	// Meta is what this node advertises. Meta.NodeID is required and is
	// memberlist's node name.
	Meta Meta

	// BindAddr is the gossip "ip:port" (TCP and UDP). An empty ip means all
	// interfaces; port 0 picks a free port (see LocalAddr).
	BindAddr string
	// Transport, when set, carries the gossip instead of sockets on
	// BindAddr, which is then ignored, and gives this node's address (tests
	// pass an in-memory network's transport). Shutdown shuts it down.
	Transport memberlist.NodeAwareTransport
	// AdvertiseAddr is the "ip:port" the others should use, if not the
	// bound one (NAT, containers). Port 0 means the bound port.
	AdvertiseAddr string
	// Join lists seed gossip addresses ("host:port"). Empty means this is
	// the first node of a new cluster.
	Join []string
	// JoinTimeout bounds how long Start retries the seeds. A join attempt
	// already under way may overrun it by up to TCPTimeout per seed address.
	// Start also retries while the cluster still sees this node's id alive
	// at another address (a restart at a new address before the old one is
	// declared dead), so JoinTimeout should exceed the failure-detection
	// time (see doc.go).
	JoinTimeout time.Duration
	// Peers are more gossip addresses of members, reached in the background
	// (not required to answer at start): a restarted node passes the members
	// it knew, so it finds the cluster again without --join.
	Peers []string
	// ReconnectInterval is how often peers and members that are not live
	// are contacted again, so that the sides of a healed partition, or a
	// restarted node, merge back into one view. Default 5 s.
	ReconnectInterval time.Duration

	ProbeInterval       time.Duration
	ProbeTimeout        time.Duration
	SuspicionMult       int
	GossipInterval      time.Duration
	PushPullInterval    time.Duration
	GossipToTheDeadTime time.Duration
	DeadNodeReclaimTime time.Duration
	TCPTimeout          time.Duration
	BroadcastTimeout    time.Duration

	// Label, when set, prefixes every gossip packet and stream (memberlist's
	// Label; with Keys it is authenticated data): a member with another
	// label, or none, is not heard, so that two gossip systems on one
	// network (another cluster, another product on memberlist) never merge.
	Label string

	// Keys, when set, encrypt and authenticate all gossip (memberlist's
	// keyring, AES-GCM): Keys[0], the primary, encrypts everything this node
	// sends; every key is tried on what it receives, and anything that none
	// decrypts, plaintext included, is dropped. Each key is 16, 24 or 32
	// bytes. Empty leaves gossip in plaintext for the member's lifetime;
	// SetKeys changes the keys of a member started with some.
	Keys [][]byte

	// Now stamps Member.Since. Default time.Now. Timeouts (join, broadcast)
	// use the real clock whatever Now is.
	Now func() time.Time
	// Logger receives membership events; memberlist's own log lines are
	// routed to it at debug level. Default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"JoinTimeout", &c.JoinTimeout, DefaultJoinTimeout},
		{"ReconnectInterval", &c.ReconnectInterval, 5 * time.Second},
		{"ProbeInterval", &c.ProbeInterval, DefaultProbeInterval},
		{"ProbeTimeout", &c.ProbeTimeout, DefaultProbeTimeout},
		{"GossipInterval", &c.GossipInterval, DefaultGossipInterval},
		{"PushPullInterval", &c.PushPullInterval, DefaultPushPullInterval},
		{"GossipToTheDeadTime", &c.GossipToTheDeadTime, DefaultGossipToTheDeadTime},
		{"DeadNodeReclaimTime", &c.DeadNodeReclaimTime, DefaultDeadNodeReclaimTime},
		{"TCPTimeout", &c.TCPTimeout, DefaultTCPTimeout},
		{"BroadcastTimeout", &c.BroadcastTimeout, DefaultBroadcastTimeout},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return c, fmt.Errorf("membership: Config.%s is %s: must be positive (0 means the default %s)", d.name, *d.v, d.def)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		return c, fmt.Errorf("membership: Config.ProbeTimeout (%s) must be shorter than ProbeInterval (%s)", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.SuspicionMult < 0 {
		return c, fmt.Errorf("membership: Config.SuspicionMult is %d: must be positive (0 means the default %d)", c.SuspicionMult, DefaultSuspicionMult)
	}
	if c.SuspicionMult == 0 {
		c.SuspicionMult = DefaultSuspicionMult
	}
	if len(c.Keys) > 0 {
		if err := checkKeys("Config.Keys", c.Keys); err != nil {
			return c, err
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// ErrNodeIDConflict is returned by Start when the cluster holds this node's
// id at another address: a live node, or a dead one whose id may not be
// reclaimed yet (Config.DeadNodeReclaimTime).
var ErrNodeIDConflict = errors.New("membership: node id already used by another node")

// ErrShutdown is returned by methods called after Shutdown.
var ErrShutdown = errors.New("membership: shut down")

// ErrLeft is returned by SetDraining and SetClusterParams after Leave: a node
// that left cannot change what it advertises.
var ErrLeft = errors.New("membership: node has left the cluster")

// ErrClusterParamsFixed is returned by SetClusterParams when the node already
// advertises different cluster parameters.
var ErrClusterParamsFixed = errors.New("membership: cluster parameters are fixed")

// Membership is a running gossip member. Its methods are safe for concurrent use.
type Membership struct {
	list *memberlist.Memberlist
	// localAddr is the gossip address this node advertises, read from
	// memberlist once at start. Memberlist's LocalNode cannot be asked later:
	// after a leave it forgets the local node like any other dead one
	// (GossipToTheDeadTime on) and LocalNode then dereferences nil.
	localAddr        string
	now              func() time.Time
	log              *slog.Logger
	broadcastTimeout time.Duration
	changes          chan struct{}

	// keyring is memberlist's (Config.Keyring), nil when gossip is not
	// encrypted. keysMu serialises SetKeys: the keyring's own lock covers
	// one change, and a rotation is several.
	keyring *memberlist.Keyring
	keysMu  sync.Mutex

	// lifeMu serialises everything that calls memberlist to change the
	// local node (SetDraining, SetClusterParams, Leave) with Shutdown:
	// memberlist panics on Leave after Shutdown, and an update after Leave
	// would block until its timeout. It is held across those calls; mu is
	// never taken before it.
	lifeMu sync.Mutex

	// mu guards the fields below. Memberlist calls the delegates with its
	// own node lock held, so nothing may call into memberlist while holding
	// mu.
	mu      sync.Mutex
	meta    Meta
	encoded []byte            // wire form of meta, what NodeMeta returns
	members map[string]Member // the view, by node id
	// leaving holds the ids of live members that announced a graceful
	// leave; NotifyLeave turns them Left instead of Dead.
	leaving  map[string]bool
	conflict string // set when another node claims our id; read by join
	// conflictLogged rate-limits the error log of a conflict, which
	// memberlist reports on every gossip that carries the claim.
	conflictLogged map[string]time.Time
	left           bool
	shutdown       bool

	// sends counts the leave announcements in flight; Shutdown waits for
	// them (each is bounded by Config.TCPTimeout).
	sends sync.WaitGroup

	// peers are gossip addresses to reach again when they are not live:
	// Config.Peers plus every member ever seen. reconnectLoop owns the
	// retries; stop/done end it.
	peers     []string
	reconnect time.Duration
	stop      chan struct{}
	done      chan struct{}
}

// Start starts gossip on cfg.BindAddr and, if cfg.Join is not empty, joins
// the cluster through the seeds, retrying until one answers or
// cfg.JoinTimeout passes. On error nothing keeps running.
func Start(cfg Config) (*Membership, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	encoded, err := encodeMeta(cfg.Meta)
	if err != nil {
		return nil, err
	}
	m := &Membership{
		now:              cfg.Now,
		log:              cfg.Logger.With("node", cfg.Meta.NodeID),
		broadcastTimeout: cfg.BroadcastTimeout,
		changes:          make(chan struct{}, 1),
		meta:             cfg.Meta,
		encoded:          encoded,
		members:          make(map[string]Member),
		leaving:          make(map[string]bool),
		conflictLogged:   make(map[string]time.Time),
	}
	mc, err := memberlistConfig(cfg, m)
	if err != nil {
		return nil, err
	}
	list, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start gossip on %s: %w", cfg.BindAddr, err)
	}
	m.list, m.localAddr = list, list.LocalNode().Address()
	if len(cfg.Join) > 0 {
		if err := m.join(cfg.Join, cfg.JoinTimeout, cfg.DeadNodeReclaimTime); err != nil {
			_ = list.Shutdown()
			return nil, err
		}
	}
	m.peers = append(slices.Clone(cfg.Peers), cfg.Join...)
	m.reconnect = cfg.ReconnectInterval
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	go m.reconnectLoop()
	encryption := "off"
	if m.keyring != nil {
		encryption = "primary key " + KeyID(cfg.Keys[0])
	}
	m.log.Info("membership started", "gossip_addr", m.LocalAddr(), "seeds", cfg.Join, "peers", cfg.Peers, "encryption", encryption, "keys", len(cfg.Keys))
	return m, nil
}

// memberlistConfig is memberlist's configuration for cfg (with its
// defaults), delivering events to m.
func memberlistConfig(cfg Config, m *Membership) (*memberlist.Config, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Meta.NodeID
	if cfg.Transport != nil {
		// The transport decides the addresses.
		mc.Transport = cfg.Transport
		mc.BindAddr, mc.BindPort, mc.AdvertisePort = "", 0, 0
	} else {
		ip, port, err := splitIPPort("BindAddr", cfg.BindAddr)
		if err != nil {
			return nil, err
		}
		if ip == "" {
			ip = "0.0.0.0"
		}
		mc.BindAddr, mc.BindPort = ip, port
		mc.AdvertisePort = port
	}
	if cfg.AdvertiseAddr != "" {
		ip, port, err := splitIPPort("AdvertiseAddr", cfg.AdvertiseAddr)
		if err != nil {
			return nil, err
		}
		if ip == "" {
			return nil, fmt.Errorf("membership: Config.AdvertiseAddr %q has no ip", cfg.AdvertiseAddr)
		}
		mc.AdvertiseAddr = ip
		if port != 0 {
			mc.AdvertisePort = port
		}
	}
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.GossipInterval = cfg.GossipInterval
	mc.PushPullInterval = cfg.PushPullInterval
	mc.GossipToTheDeadTime = cfg.GossipToTheDeadTime
	mc.DeadNodeReclaimTime = cfg.DeadNodeReclaimTime
	mc.Label = cfg.Label
	mc.TCPTimeout = cfg.TCPTimeout
	if len(cfg.Keys) > 0 {
		keys := make([][]byte, len(cfg.Keys))
		for i, k := range cfg.Keys {
			keys[i] = bytes.Clone(k)
		}
		kr, err := memberlist.NewKeyring(keys[1:], keys[0])
		if err != nil {
			return nil, fmt.Errorf("membership: Config.Keys: %w", err) // checked by withDefaults; never
		}
		mc.Keyring, m.keyring = kr, kr
		// Both are memberlist's defaults; set so that no change of default
		// can let plaintext in or out.
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	d := &delegate{m: m}
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	mc.Logger = log.New(&logWriter{log: m.log}, "", 0)
	return mc, nil
}

// reconnectLoop contacts, every ReconnectInterval, the known peers that are
// not live members. Memberlist gossips only with live members and forgets
// dead ones after GossipToTheDeadTime, so without this two sides of a long
// partition, or a node restarted without seeds, would stay apart after the
// network healed: each would go on seeing the other as dead.
func (m *Membership) reconnectLoop() {
	defer close(m.done)
	t := time.NewTicker(m.reconnect)
	defer t.Stop()
	var lastKeyWarn time.Time
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		// A node that left rejoins nobody: the others have seen it go, and
		// a join would bring it back as alive until its shutdown.
		targets := m.absentPeers()
		if len(targets) == 0 {
			continue
		}
		n, err := m.list.Join(targets)
		switch hint := keyMismatchHint(err); {
		case err == nil && n > 0:
			m.log.Info("reconnected to members", "answered", n, "tried", targets)
		case hint != "" && time.Since(lastKeyWarn) >= keyWarnEvery:
			// A node restarted with the wrong keys joins nobody at start
			// (it has peers, not seeds): this is where it says why.
			lastKeyWarn = time.Now()
			m.log.Warn("cannot reach members: "+hint, "tried", targets, "err", oneLine(err))
		}
	}
}

// absentPeers returns the gossip addresses, known from configuration or
// from having seen the member, of nodes that are not live members now.
func (m *Membership) absentPeers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.left {
		return nil
	}
	live := map[string]bool{}
	self := ""
	for _, mem := range m.members {
		if mem.Meta.NodeID == m.meta.NodeID {
			self = mem.GossipAddr
		}
		if mem.State.Live() {
			live[mem.GossipAddr] = true
		} else if mem.GossipAddr != "" && !slices.Contains(m.peers, mem.GossipAddr) {
			m.peers = append(m.peers, mem.GossipAddr)
		}
	}
	var out []string
	for _, p := range m.peers {
		if !live[p] && p != self && p != m.localAddr && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// Peers returns the gossip addresses of every member this node has seen,
// for a restarted node to reach again (chimed keeps them in its data
// directory).
func (m *Membership) Peers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, mem := range m.members {
		if mem.Meta.NodeID != m.meta.NodeID && mem.GossipAddr != "" {
			out = append(out, mem.GossipAddr)
		}
	}
	slices.Sort(out)
	return out
}

// untilDeadline shortens b's waits so that the last attempt is at deadline.
type untilDeadline struct {
	backoff.BackOff
	deadline time.Time
}

func (u untilDeadline) NextBackOff() time.Duration {
	remaining := time.Until(u.deadline)
	if remaining <= 0 {
		return backoff.Stop
	}
	return min(u.BackOff.NextBackOff(), remaining)
}

// join contacts the seeds until one answers without reporting that our id is
// taken, backing off between attempts, within timeout.
func (m *Membership) join(seeds []string, timeout, reclaim time.Duration) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.Multiplier, b.MaxInterval, b.RandomizationFactor = 100*time.Millisecond, 2, 2*time.Second, 0
	var lastErr error
	var conflict, self string
	attempt := 0
	_, err := backoff.Retry(context.Background(), func() (int, error) {
		attempt++
		m.mu.Lock()
		m.conflict = ""
		m.mu.Unlock()
		// Join does a push/pull with each seed and merges its state before
		// returning, so a conflict on our id is already reported when it returns.
		n, err := m.list.Join(seeds)
		m.mu.Lock()
		conflict, self = m.conflict, m.meta.NodeID
		m.mu.Unlock()
		switch {
		case err != nil:
			lastErr = err
		case conflict != "":
			// Maybe a previous incarnation of this node that is not
			// declared dead yet: retry, it will be.
			lastErr = nil
			err = ErrNodeIDConflict
		default:
			m.log.Info("joined cluster", "seeds_answered", n, "attempts", attempt)
			return n, nil
		}
		level := slog.LevelDebug
		if attempt == 1 {
			level = slog.LevelWarn // once, so that a join that hangs says why
		}
		m.log.Log(context.Background(), level, "join attempt failed; retrying", "attempt", attempt, "timeout", timeout,
			"err", oneLine(lastErr), "conflict", conflict, "hint", keyMismatchHint(lastErr))
		return n, err
	}, backoff.WithBackOff(untilDeadline{b, time.Now().Add(timeout)}), backoff.WithMaxElapsedTime(0))
	if err == nil {
		return nil
	}
	if conflict != "" {
		return fmt.Errorf("%w: node id %q is held by the node at %s (this node is at %s); still so after %s of retries: give each node its own id, or, if that node is gone, wait until it has been dead for %s, after which its id may be taken from another address",
			ErrNodeIDConflict, self, conflict, m.LocalAddr(), timeout, reclaim)
	}
	hint := keyMismatchHint(lastErr)
	if hint != "" {
		hint = ": " + hint
	}
	return fmt.Errorf("membership: could not join the cluster: none of the seeds %s answered within %s; last attempt: %s%s",
		strings.Join(seeds, ", "), timeout, oneLine(lastErr), hint)
}

// oneLine flattens memberlist's join error, a multi-line list with one entry
// per seed address.
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// keyMismatchHint explains a join refused over encryption; memberlist's
// words ("no installed keys could decrypt the message", "remote state is
// encrypted and encryption is not configured", "encryption is configured but
// remote state is not encrypted") name the symptom, not the cause.
func keyMismatchHint(err error) string {
	if err == nil || !strings.Contains(err.Error(), "crypt") {
		return ""
	}
	return "the other side's gossip keys and this node's do not match (both need encryption on or off, and each side's primary key among the other's keys)"
}

// View returns a consistent snapshot of the membership.
func (m *Membership) View() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := View{Self: m.meta.NodeID, Members: make(map[string]Member, len(m.members))}
	for id, mem := range m.members {
		v.Members[id] = mem
	}
	return v
}

// Changes returns a channel that receives a value after any join, leave,
// metadata update or state change. Notifications are coalesced (buffer 1):
// after a receive, call View for the current state. The channel is never
// closed.
func (m *Membership) Changes() <-chan struct{} { return m.changes }

// LocalAddr returns the gossip "ip:port" this node advertises: the bound
// address, with the port actually bound when BindAddr asked for port 0, or
// AdvertiseAddr when set. It is what other nodes should list in Join.
func (m *Membership) LocalAddr() string { return m.localAddr }

// SetDraining sets the local Draining flag and gossips it (memberlist
// UpdateNode). The local view changes at once. An error means memberlist had
// not finished broadcasting the update within Config.BroadcastTimeout; the
// flag is set anyway and the next push/pull carries it. Setting the current
// value does nothing.
func (m *Membership) SetDraining(draining bool) error {
	return m.updateMeta(func(meta *Meta) error {
		meta.Draining = draining
		return nil
	})
}

// SetClusterParams makes the node advertise the cluster parameters, once a
// new node has learned them (View.ClusterParams) and stored them. Setting the
// parameters the node already advertises does nothing; changing them returns
// ErrClusterParamsFixed.
func (m *Membership) SetClusterParams(p ClusterParams) error {
	return m.updateMeta(func(meta *Meta) error {
		if cur := meta.ClusterParams(); cur != p && !cur.IsZero() {
			return fmt.Errorf("%w: this node advertises %s, not %s", ErrClusterParamsFixed, cur, p)
		}
		meta.ClusterID, meta.Shards, meta.Replication, meta.Retention = p.ClusterID, p.Shards, p.Replication, p.Retention
		return nil
	})
}

func (m *Membership) updateMeta(change func(*Meta) error) error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()

	m.mu.Lock()
	switch {
	case m.shutdown:
		m.mu.Unlock()
		return ErrShutdown
	case m.left:
		m.mu.Unlock()
		return ErrLeft
	}
	meta := m.meta
	if err := change(&meta); err != nil || meta == m.meta {
		m.mu.Unlock()
		return err // nil when there is nothing to change
	}
	encoded, err := encodeMeta(meta)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	m.meta, m.encoded = meta, encoded
	if self, ok := m.members[meta.NodeID]; ok {
		self.Meta = meta
		m.members[meta.NodeID] = self
	}
	m.mu.Unlock()
	m.notify()

	if err := m.list.UpdateNode(m.broadcastTimeout); err != nil {
		return fmt.Errorf("membership: metadata updated locally but not gossiped within %s (push/pull will carry it): %w", m.broadcastTimeout, err)
	}
	return nil
}

// Leave announces a graceful leave and waits up to timeout (Config.
// BroadcastTimeout if timeout <= 0) for it to be delivered: half of it for a
// direct announcement to every live member, so they report this node Left
// rather than Dead, the rest for memberlist's leave gossip. Gossip keeps
// running until Shutdown, which should follow; SetDraining and
// SetClusterParams fail with ErrLeft from now on.
func (m *Membership) Leave(timeout time.Duration) error {
	if timeout <= 0 {
		timeout = m.broadcastTimeout
	}
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()

	began := time.Now()
	m.mu.Lock()
	switch {
	case m.shutdown:
		m.mu.Unlock()
		return ErrShutdown
	case m.left:
		m.mu.Unlock()
		return nil
	}
	m.left = true
	self := m.meta.NodeID
	m.leaving[self] = true // so our own NotifyLeave says Left
	var peers []Member
	for id, mem := range m.members {
		if id != self && mem.State.Live() {
			peers = append(peers, mem)
		}
	}
	m.mu.Unlock()

	// First tell every live member directly, over TCP, that this is a
	// leave: memberlist v0.5.4 does not tell the others whether a node left
	// or failed, and its gossip of anything else we could send before the
	// leave may never reach some members. Then leave.
	m.announceLeaving(self, peers, began.Add(timeout/2))
	remaining := max(timeout-time.Since(began), time.Millisecond) // memberlist reads 0 as no timeout
	if err := m.list.Leave(remaining); err != nil {
		return fmt.Errorf("membership: leave not gossiped within %s: %w", timeout, err)
	}
	m.log.Info("left cluster")
	return nil
}

// msgLeaving is the first byte of the user message a node sends each live
// member just before it leaves; the rest is its node id.
const msgLeaving byte = 1

// leaveMessage is the leave announcement of node id.
func leaveMessage(id string) []byte { return append([]byte{msgLeaving}, id...) }

// announceLeaving sends the leave announcement to each peer concurrently and
// waits for them until wait. Sends still in flight then are left to finish
// on their own (Shutdown waits for them): a member that misses the
// announcement reports this node Dead instead of Left, which placement
// treats the same.
func (m *Membership) announceLeaving(self string, peers []Member, wait time.Time) {
	msg := leaveMessage(self)
	results := make(chan error, len(peers))
	for _, p := range peers {
		host, portStr, err := net.SplitHostPort(p.GossipAddr)
		port, perr := strconv.ParseUint(portStr, 10, 16)
		if err != nil || perr != nil || net.ParseIP(host) == nil {
			results <- fmt.Errorf("%s: bad gossip address %q", p.Meta.NodeID, p.GossipAddr)
			continue
		}
		node := &memberlist.Node{Name: p.Meta.NodeID, Addr: net.ParseIP(host), Port: uint16(port)}
		m.sends.Add(1)
		go func() {
			defer m.sends.Done()
			if err := m.list.SendReliable(node, msg); err != nil {
				results <- fmt.Errorf("%s: %w", node.Name, err)
				return
			}
			results <- nil
		}()
	}
	timer := time.NewTimer(time.Until(wait))
	defer timer.Stop()
	for range peers {
		select {
		case err := <-results:
			if err != nil {
				m.log.Warn("leave announcement not delivered; that member will see this node dead, not left", "err", err)
			}
		case <-timer.C:
			m.log.Warn("leave announcements still in flight; those members may see this node dead, not left")
			return
		}
	}
}

// Shutdown stops gossip without announcing anything: the others will detect
// this node as Dead (call Leave first for Left). It waits for an in-flight
// Leave or SetDraining to finish (bounded by their timeouts). Safe to call
// more than once.
func (m *Membership) Shutdown() error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	m.mu.Lock()
	if m.shutdown {
		m.mu.Unlock()
		return nil
	}
	m.shutdown = true
	m.mu.Unlock()
	close(m.stop)
	<-m.done
	err := m.list.Shutdown()
	m.sends.Wait()
	if err != nil {
		return fmt.Errorf("membership: shutdown: %w", err)
	}
	m.log.Info("membership stopped")
	return nil
}

func (m *Membership) notify() {
	select {
	case m.changes <- struct{}{}:
	default:
	}
}

// delegate receives memberlist's callbacks. Memberlist calls the event
// methods one at a time, with its node lock held (so they must not call
// back into memberlist), and may still call them after Shutdown (a
// suspicion timer that fires late).
type delegate struct{ m *Membership }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
)

func (d *delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if len(d.m.encoded) > limit {
		// encodeMeta enforces memberlist.MetaMaxSize, the only limit
		// memberlist passes; never hand memberlist more (it panics).
		d.m.log.Error("node metadata exceeds memberlist's limit; advertising none", "size", len(d.m.encoded), "limit", limit)
		return nil
	}
	return bytes.Clone(d.m.encoded)
}

// NotifyMsg receives leave announcements (see Leave). An announcement that
// arrives after memberlist already reported the node gone (the two travel
// separately) turns Dead into Left.
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) < 2 || b[0] != msgLeaving {
		d.m.log.Warn("unknown user message ignored", "size", len(b))
		return
	}
	id := string(b[1:])
	d.m.mu.Lock()
	mem, ok := d.m.members[id]
	switch {
	case ok && mem.State.Live():
		d.m.leaving[id] = true
		ok = false
	case ok && mem.State == Dead:
		mem.State = Left
		d.m.members[id] = mem
	default:
		ok = false
	}
	d.m.mu.Unlock()
	d.m.log.Debug("member announced its leave", "member", id)
	if ok {
		d.m.log.Info("member gone", "member", id, "state", Left.String())
		d.m.notify()
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// memberFromNode decodes what a memberlist node carries. A node whose
// metadata cannot be decoded keeps only its id: it advertises no cluster
// parameters, so it is never a placement candidate.
func (d *delegate) memberFromNode(n *memberlist.Node) Member {
	mem := Member{GossipAddr: n.Address()}
	meta, err := decodeMeta(n.Meta)
	if err != nil {
		d.m.log.Warn("undecodable node metadata; the node cannot be placed on", "member", n.Name, "gossip_addr", mem.GossipAddr, "err", err)
		meta = Meta{NodeID: n.Name}
	}
	if meta.NodeID != n.Name {
		d.m.log.Warn("node metadata names another id; using the gossip name", "member", n.Name, "meta_id", meta.NodeID)
		meta.NodeID = n.Name
	}
	mem.Meta = meta
	return mem
}

func (d *delegate) NotifyJoin(n *memberlist.Node) {
	mem := d.memberFromNode(n)
	mem.State, mem.Since = Alive, d.m.now()
	d.m.mu.Lock()
	prev, known := d.m.members[n.Name]
	d.m.members[n.Name] = mem
	delete(d.m.leaving, n.Name) // back: a later failure is a failure
	self := d.m.meta.ClusterParams()
	d.m.mu.Unlock()
	if p := mem.Meta.ClusterParams(); !p.IsZero() && !self.IsZero() && p != self {
		d.m.log.Warn("member advertises other cluster parameters; it will not be placed on", "member", n.Name, "theirs", p.String(), "ours", self.String())
	}
	if known {
		d.m.log.Info("member back", "member", n.Name, "gossip_addr", mem.GossipAddr, "was", prev.State.String())
	} else {
		d.m.log.Info("member joined", "member", n.Name, "gossip_addr", mem.GossipAddr)
	}
	d.m.notify()
}

func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	mem := d.memberFromNode(n)
	d.m.mu.Lock()
	prev, known := d.m.members[n.Name]
	if known {
		mem.State, mem.Since = prev.State, prev.Since
	} else {
		mem.State, mem.Since = Alive, d.m.now()
	}
	d.m.members[n.Name] = mem
	d.m.mu.Unlock()
	d.m.log.Debug("member updated", "member", n.Name, "draining", mem.Meta.Draining)
	d.m.notify()
}

// NotifyLeave tells Dead from Left by whether the node announced its leave
// (NotifyMsg): memberlist v0.5.4 passes node.State as StateAlive whatever
// happened (nodeState.State shadows Node.State, hashicorp/memberlist#293).
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	mem := d.memberFromNode(n)
	mem.State, mem.Since = Dead, d.m.now()
	d.m.mu.Lock()
	if d.m.leaving[n.Name] {
		mem.State = Left
		delete(d.m.leaving, n.Name)
	}
	d.m.members[n.Name] = mem
	d.m.mu.Unlock()
	d.m.log.Info("member gone", "member", n.Name, "gossip_addr", mem.GossipAddr, "state", mem.State.String())
	d.m.notify()
}

func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	key := existing.Name + " " + other.Address()
	now := time.Now()
	d.m.mu.Lock()
	self := d.m.meta.NodeID
	if existing.Name == self {
		d.m.conflict = other.Address()
	}
	level := slog.LevelError
	if last, ok := d.m.conflictLogged[key]; ok && now.Sub(last) < time.Minute {
		level = slog.LevelDebug
	} else {
		if len(d.m.conflictLogged) >= 64 {
			clear(d.m.conflictLogged)
		}
		d.m.conflictLogged[key] = now
	}
	d.m.mu.Unlock()
	d.m.log.Log(context.Background(), level, "two nodes claim the same node id; the newcomer is ignored",
		"node_id", existing.Name, "known_at", existing.Address(), "claimed_from", other.Address(), "self", existing.Name == self)
}

// logWriter routes memberlist's log lines ("[LEVEL] memberlist: msg") to slog
// at debug level: memberlist is chatty, and what matters is logged by
// Membership itself at the right level. The exception is gossip dropped
// because it is not encrypted with a key this node has: memberlist is the
// only one to see it, and an operator needs to (a member left out of a key
// rotation, or a stranger), so it is a warning, at most one per
// keyWarnEvery (the sender retries all the time).
type logWriter struct {
	log *slog.Logger

	mu       sync.Mutex
	lastWarn time.Time
}

const keyWarnEvery = 10 * time.Second

func (w *logWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	level := ""
	if strings.HasPrefix(line, "[") {
		if i := strings.IndexByte(line, ']'); i > 0 {
			level, line = line[1:i], strings.TrimSpace(line[i+1:])
		}
	}
	if level == "ERR" && strings.Contains(line, "crypt") {
		w.mu.Lock()
		now := time.Now()
		warn := now.Sub(w.lastWarn) >= keyWarnEvery
		if warn {
			w.lastWarn = now
		}
		w.mu.Unlock()
		if warn {
			w.log.Warn("gossip dropped: its sender does not share this node's gossip keys (encryption on one side only, or no common key); more such drops are logged at debug for "+keyWarnEvery.String(),
				"memberlist", line)
			return len(p), nil
		}
	}
	w.log.Debug(line, "memberlist_level", level)
	return len(p), nil
}

// splitIPPort parses "ip:port" where ip may be empty.
func splitIPPort(field, addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("membership: Config.%s %q: want ip:port: %w", field, addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("membership: Config.%s %q: port must be a number 0-65535", field, addr)
	}
	if host != "" && net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("membership: Config.%s %q: host must be an ip address (memberlist binds and advertises ips)", field, addr)
	}
	return host, int(port), nil
}
