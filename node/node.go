package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	controlplane "github.com/chimehq/chime/cluster"
	"github.com/chimehq/chime/internal/durable"
	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/node/console"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/ingest"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
	"github.com/chimehq/chime/shard/raftmux"
	"github.com/chimehq/chime/shard/topiclimit"
)

// Config is everything one node needs: chimed fills it from flags, tests
// (node/nodetest) from their options.
type Config struct {
	NodeID   string
	DataDir  string
	GRPCAddr string
	HTTPAddr string
	RaftAddr string
	Brokers  []string
	Shards   int
	Limits   rpc.Limits
	Tuning   shard.Tuning
	// TopicLimits are the node's per-topic fire rate limits at start; the
	// Admin API changes them while it runs.
	TopicLimits topiclimit.Rules

	// KafkaSecurity is TLS and SASL for every connection to Brokers
	// (chimed's --kafka-tls* and --kafka-sasl-* flags).
	KafkaSecurity publish.Security
	// KafkaExistingTopicsOnly produces only to topics that exist
	// (publish.Config.ExistingTopicsOnly; chimed serve's default, unless
	// --kafka-auto-create-topics).
	KafkaExistingTopicsOnly bool

	MaxInFlight int
	MaxAttempts int
	DeadLetter  string
	Logger      *slog.Logger
	// OnFatal is called, at most once, when the node cannot go on: its data
	// directory cannot be written (the store and every replica report it),
	// or Pebble logged a fatal error. It must end the node at once and not
	// return: Close would wait for a flush that cannot happen. chimed exits
	// the process, so that the shards' other replicas elect leaders once
	// this node's heartbeats stop, and a restart replays from the Raft log
	// what Pebble lost. Nil panics with the error, which ends a process that
	// does not recover it all the same.
	OnFatal func(err error)
	// Now is the clock events are fired, stamped and resolved by.
	Now func() time.Time

	// Cluster mode: gossip with memberlist, replicate each shard on
	// Replication nodes, forward requests to shard leaders. Without it the
	// node is a fixed single node (chimed dev).
	Cluster    bool
	GossipAddr string
	// AdvertiseHost is the host name or IP the other nodes (and clients
	// reading the cluster map) reach this node by; the node advertises it
	// with the ports of its listeners. Empty advertises each listener's own
	// address, which a node listening on every interface cannot do. A name
	// is kept as it is, not resolved: Raft configurations hold it, and it
	// outlives the IP (a rescheduled pod keeps its name, not its IP).
	AdvertiseHost string
	// Join lists gossip addresses of members. An entry naming this node's
	// own gossip address is dropped, so that every node of a cluster can be
	// given the same list: the one it names creates the cluster.
	Join        []string
	Replication int
	DeadTimeout time.Duration
	// GossipKeyFile, when set, encrypts the gossip with the keys in this
	// file (membership.ParseKeyFile: base64, one per line, the primary
	// first). The node re-reads it when it changes and applies the new keys
	// without a restart; a file that does not load is logged and the keys
	// in use kept. Empty gossips in plaintext. Cluster mode only.
	GossipKeyFile string

	// RaftTransport, when set, gives each shard its Raft transport instead
	// of the Raft port on RaftAddr (none is bound); RaftAdvertise is then the
	// node's Raft address as the others know it. Tests pass raft's in-memory
	// transports.
	RaftTransport func(shard uint32) (raft.Transport, error)
	RaftAdvertise string
	// GossipTransport, when set, carries the gossip instead of GossipAddr
	// (tests pass an in-memory network's transport).
	GossipTransport memberlist.NodeAwareTransport
	// DebugEndpoints serves /debug/pprof/ and /debug/pebble on the HTTP
	// port (chimed --debug-endpoints). Off by default: a profile stalls the
	// node it is taken on and the LSM report tells an outsider how much it
	// holds, so they are for an operator who asks for them.
	DebugEndpoints bool
	// MaxConnections bounds the gRPC port's connections held at once
	// (chimed --max-connections; 0: DefaultMaxConnections).
	MaxConnections int
	// TLS, when set, puts every port of the node under TLS: gRPC and HTTP
	// (client certificates as the Source's ServerConfig says), the Raft port
	// (mutual, nodes only), and the node's own calls to other nodes (it
	// presents its certificate and accepts only nodes). Nil serves and dials
	// in plaintext.
	TLS *certs.Source
	// AuthFile, when set, makes every gRPC call (and the debug endpoints)
	// authenticate and stay within its role (package rpc/auth); in a
	// cluster it needs TLS, by which nodes know each other. Audit receives
	// the audit log (nil: the node's log).
	AuthFile string
	Audit    io.Writer
	// HTTPHandlers, when set, adds handlers to the HTTP port's mux (chimed's
	// fault-test builds add the clock offset).
	HTTPHandlers func(*http.ServeMux)
	// Console serves the web console (package node/console) on the HTTP
	// port under /ui/: off, read-only (every page, no action) or on (the
	// actions the signed-in credential's role permits). With AuthFile every
	// page asks for a sign-in.
	Console console.Mode
	// Ingest, when it lists Sources, makes the node a member of the ingest
	// consumer group: it reads its share of the source topics' partitions
	// from Brokers and applies their records through its own Scheduler API
	// (package rpc/ingest). The node fills in the brokers, their security,
	// the API, the auth file's credential per topic, the batch limit, the
	// logger and the metrics.
	Ingest ingest.Config
}

// Node is a running node: Pebble, the shard host, the publisher, the
// membership (in cluster mode), and the gRPC and HTTP servers. Close stops
// them in dependency order.
type Node struct {
	cfg       Config
	fatalOnce sync.Once
	store     *raftfsm.Store
	pub       *publish.Publisher
	ml        *membership.Membership
	keys      *keyWatcher // nil without GossipKeyFile
	cluster   *controlplane.Cluster
	host      *host.Host
	// topicLimits are the fire rate limits its shard leaders enforce a
	// share of; the Admin API changes them.
	topicLimits *topiclimit.Table
	grpc        *grpc.Server
	http        *http.Server
	authz       *auth.Authorizer // nil without AuthFile
	ingest      *ingest.Consumer // nil without Config.Ingest.Sources
	console     *console.Console // nil with Config.Console off

	grpcAddr, httpAddr net.Addr
	// What the node advertises: the listeners' ports at cfg.AdvertiseHost.
	raftAddr, grpcAdvertised, httpAdvertised string
	serveErr                                 chan error
}

// clusterMeta is written once, when the data directory is created, so that a
// restart cannot change what was fixed at creation.
type clusterMeta struct {
	ClusterID   string `json:"cluster_id,omitempty"`
	Shards      int    `json:"shards"`
	Replication int    `json:"replication,omitempty"`
	// Retention (nanoseconds) is how long settled events are kept; absent
	// or 0 keeps them forever, as every cluster created before retention
	// existed does.
	Retention time.Duration `json:"retention_ns,omitempty"`
	NodeID    string        `json:"node_id"`
	// RaftAddr, set by a restore, is the Raft address the restored shards'
	// configurations name: the node must advertise exactly it.
	RaftAddr string    `json:"raft_addr,omitempty"`
	Created  time.Time `json:"created"`
	// RestoredFrom is the backup a restore created the directory from.
	RestoredFrom string `json:"restored_from,omitempty"`
}

func metaPath(dataDir string) string { return filepath.Join(dataDir, "cluster.json") }

// loadMeta reads the data directory's cluster.json; ok is false when the
// directory is new.
func loadMeta(dataDir string) (m clusterMeta, ok bool, err error) {
	b, err := os.ReadFile(metaPath(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, err
	}
	if m, err = decodeMeta(b); err != nil {
		return m, false, fmt.Errorf("%s: %w", metaPath(dataDir), err)
	}
	return m, true, nil
}

// decodeMeta decodes a cluster.json, and refuses one no node could have
// written: Start would act on it (a negative shard count panicked sizing the
// placement) or refuse it with a misleading reason (no node id).
func decodeMeta(b []byte) (clusterMeta, error) {
	var m clusterMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return clusterMeta{}, err
	}
	switch {
	case m.NodeID == "":
		return clusterMeta{}, errors.New("node_id: missing")
	case m.Shards < 1 || m.Shards > membership.MaxShards:
		return clusterMeta{}, fmt.Errorf("shards: %d, must be 1 to %d", m.Shards, membership.MaxShards)
	case m.Replication < 0:
		return clusterMeta{}, fmt.Errorf("replication: %d, must not be negative", m.Replication)
	case m.Retention < 0:
		return clusterMeta{}, fmt.Errorf("retention_ns: %d, must not be negative", m.Retention)
	}
	return m, nil
}

// saveMeta writes cluster.json: a crash leaves the whole file or none, so a
// restart never finds half of the parameters fixed at creation.
func saveMeta(dataDir string, m clusterMeta) error {
	b, _ := json.MarshalIndent(m, "", "  ")
	return durable.WriteFile(metaPath(dataDir), b, 0o600)
}

// maxStreamsPerConn bounds the calls one client connection has in flight,
// and with MaxRequestBytes the memory its requests hold (per-identity rate
// limits in --auth-file bound how fast they come). The 16 callers of
// chimectl bench share one connection per node.
const maxStreamsPerConn = 128

// DefaultMaxConnections bounds the client connections a node's gRPC port
// holds at once (chimed --max-connections); one more waits in the kernel's
// accept queue until another closes. Each holds a reader goroutine and its
// HTTP/2 buffers; 4096 is far more than the clients and nodes of a cluster
// open (one connection per client process per node), and bounds what a
// flood of connections can hold.
const DefaultMaxConnections = 4096

const (
	// handshakeTimeout bounds a connection's TLS and HTTP/2 handshake: a
	// peer that opens a connection and says nothing holds a slot of
	// --max-connections for no longer.
	handshakeTimeout = 10 * time.Second
	// keepaliveTime and keepaliveTimeout: a connection quiet for
	// keepaliveTime is pinged, and closed if no answer comes within
	// keepaliveTimeout, so that connections of vanished clients do not
	// pile up.
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	// keepaliveMinTime is the shortest ping interval a client may use (a
	// client pinging more often is sent GOAWAY): pings are cheap, but a
	// flood of them is not.
	keepaliveMinTime = 5 * time.Second
)

// raftTLS secures the Raft port with the node's certificate. The
// handshakes accept nodes of the cluster's CA only; beyond that, a node
// speaks Raft with this one only if no operator removed it and it is a
// member or in the shard's Raft configuration here (after a restart the
// configuration knows the peers before the gossip has found them again),
// named by its certificate; and a dialled address must be held by the node
// that advertises it. The key of a removed node, of another cluster's node
// under the same CA, or of one node standing in at another's address,
// carries no Raft traffic.
func (n *Node) raftTLS(src *certs.Source) *raftmux.TLS {
	if src == nil {
		return nil
	}
	return &raftmux.TLS{Server: src.PeerServerConfig(), Client: src.PeerClientConfig(),
		Admit: func(layer uint32, cs tls.ConnectionState) error {
			return n.peerRefusal(certs.PeerNodeID(cs), shard.LayerShard(layer))
		},
		Dialled: func(layer uint32, addr string, cs tls.ConnectionState) error {
			id := certs.PeerNodeID(cs)
			if err := dialledRefusal(n.cluster.View().Members, addr, id); err != nil {
				return err
			}
			return n.peerRefusal(id, shard.LayerShard(layer))
		}}
}

// dialledRefusal says why node id, whose certificate answered at addr, may
// not carry the Raft traffic dialled there. Raft names the node it means in
// every address it dials (raftmux.Bind), and only that node may answer: a
// message meant for one node and taken by another (a removed node's address
// given to its replacement) would count one replica's answers as another's.
// A bare address, from a dialler that named no node, must not be another
// member's advertised Raft address.
func dialledRefusal(members map[string]membership.Member, addr, id string) error {
	if want, at, ok := raftmux.Bound(addr); ok {
		if id != want {
			return fmt.Errorf("node %q was dialled at %s, but the certificate there is node %q's", want, at, id)
		}
		return nil
	}
	for owner, m := range members {
		if m.Meta.RaftAddr == addr && owner != id {
			return fmt.Errorf("%s is node %q's Raft address, but the certificate there is node %q's", addr, owner, id)
		}
	}
	return nil
}

// peerRefusal says why node id may not speak Raft with this node, or call
// it with a node certificate, if it may not: it must not have been removed
// by an operator, and must be a member or a server of the Raft
// configuration of one of shards here (of every local shard when none is
// given). While a shard's replica here is opening, its Raft peers are taken
// on a node id no operator removed. n.cluster is set before the host opens
// the Raft port and before the gRPC port serves; the host once it opened.
func (n *Node) peerRefusal(id string, shards ...uint32) error {
	switch {
	case id == "":
		return fmt.Errorf("its certificate names no node id (%s)", certs.NodeIDName("<id>"))
	case n.cluster.Removed(id):
		return fmt.Errorf("node %q was removed from the cluster", id)
	}
	if _, ok := n.cluster.Member(id); ok {
		return nil
	}
	if h := n.cluster.Host(); h != nil || len(shards) > 0 {
		var replicas map[uint32]*shard.Shard
		switch {
		case len(shards) == 0:
			replicas = h.Shards()
		case h == nil || h.Replica(shards[0]) == nil:
			// The replica is opening (its layer takes connections before
			// the host hands it out, and opening waits out an election
			// timeout): its configuration cannot be read yet, and refusing
			// its peers would hold its election back until it can.
			// Removed nodes are still refused.
			return nil
		default:
			replicas = map[uint32]*shard.Shard{shards[0]: h.Replica(shards[0])}
		}
		for _, r := range replicas {
			voters, nonvoters, err := r.Configuration()
			if err == nil && (slices.Contains(voters, id) || slices.Contains(nonvoters, id)) {
				return nil
			}
		}
	}
	return fmt.Errorf("node %q is neither a member of the cluster nor a server of a shard here", id)
}

func dialCredentials(src *certs.Source) func(node string) credentials.TransportCredentials {
	if src == nil {
		return nil
	}
	return src.PeerCredentialsFor
}

// joinCluster starts gossip and settles the cluster parameters: a new node
// that joins learns them from the members, the node that creates a cluster
// takes them from its flags, and a node with stored parameters checks that
// the members agree.
func (n *Node) joinCluster(cfg Config, meta clusterMeta, existed bool) (clusterMeta, error) {
	creating := !existed && len(cfg.Join) == 0
	if creating {
		meta.ClusterID = newClusterID()
	}
	params := membership.ClusterParams{ClusterID: meta.ClusterID, Shards: uint32(meta.Shards), Replication: uint32(meta.Replication), Retention: meta.Retention}
	if !existed && !creating {
		params = membership.ClusterParams{} // learned below
	}
	// A node that already belongs to the cluster does not need a seed to
	// answer: it reaches the members it knew (and --join) in the background,
	// so a restart while others are down or partitioned still starts.
	join, peers := cfg.Join, loadPeers(cfg.DataDir)
	if existed {
		join, peers = nil, append(peers, cfg.Join...)
	}
	var keys [][]byte
	var loaded fileStamp
	if cfg.GossipKeyFile != "" {
		var err error
		if keys, loaded, err = readKeyFile(cfg.GossipKeyFile); err != nil {
			return meta, fmt.Errorf("gossip key file: %w", err)
		}
	}
	var err error
	n.ml, err = membership.Start(membership.Config{
		Meta: membership.Meta{
			NodeID: cfg.NodeID, GRPCAddr: n.grpcAdvertised, RaftAddr: n.raftAddr, HTTPAddr: n.httpAdvertised,
			ClusterID: params.ClusterID, Shards: params.Shards, Replication: params.Replication, Retention: params.Retention,
		},
		BindAddr: cfg.GossipAddr, AdvertiseAddr: gossipAdvertise(cfg.GossipAddr, cfg.AdvertiseHost), Transport: cfg.GossipTransport, Join: join, Peers: peers, Keys: keys, Logger: cfg.Logger.With("component", "membership"),
		// A crashed node's id is not taken over from another address before
		// its replicas would be replaced anyway; one that left is at once.
		DeadNodeReclaimTime: cfg.DeadTimeout,
		Label:               GossipLabel,
	})
	if err != nil {
		return meta, err
	}
	if cfg.GossipKeyFile != "" {
		n.keys = newKeyWatcher(cfg.GossipKeyFile, loaded, n.ml, cfg.Logger.With("component", "membership"))
		n.keys.start()
	}
	if len(join) == 0 {
		return meta, nil
	}
	// The parameters arrive with the members' metadata, a gossip round or
	// two after the join.
	learned, err := backoff.Retry(context.Background(), func() (membership.ClusterParams, error) { return n.ml.View().ClusterParams() },
		backoff.WithBackOff(backoff.NewConstantBackOff(100*time.Millisecond)), backoff.WithMaxElapsedTime(30*time.Second))
	if err != nil {
		return meta, fmt.Errorf("learning the cluster's parameters from --join %v: %w", cfg.Join, err)
	}
	if !params.IsZero() && learned != params {
		return meta, fmt.Errorf("this node's data (%s) belongs to cluster %s, but the members at --join %v belong to %s", cfg.DataDir, params, cfg.Join, learned)
	}
	if params.IsZero() {
		if err := n.ml.SetClusterParams(learned); err != nil {
			return meta, err
		}
		meta.ClusterID, meta.Shards, meta.Replication, meta.Retention = learned.ClusterID, int(learned.Shards), int(learned.Replication), learned.Retention
	}
	return meta, nil
}

// peersPath keeps the gossip addresses of the members this node has seen,
// so that after a restart it can find them again without --join.
func peersPath(dataDir string) string { return filepath.Join(dataDir, "peers.json") }

func loadPeers(dataDir string) []string {
	b, err := os.ReadFile(peersPath(dataDir))
	if err != nil {
		return nil
	}
	return decodePeers(b)
}

// decodePeers decodes a peers.json (best effort: a node that cannot read it
// needs --join). A file that does not decode gives nothing, not the part
// json.Unmarshal filled before its error, and an empty address is dropped:
// the node would try to join it every reconnect interval.
func decodePeers(b []byte) []string {
	var peers []string
	if json.Unmarshal(b, &peers) != nil {
		return nil
	}
	return slices.DeleteFunc(peers, func(p string) bool { return p == "" })
}

// GossipLabel prefixes every gossip packet and stream of a Chime node: a
// node hears no gossip without it, so a Chime cluster never merges with
// another memberlist user (Consul, Nomad, Serf) on the same network. Nodes
// of a release without the label do not hear ones with it: a cluster
// upgrades across it with every node stopped before any starts again.
const GossipLabel = "chime"

func newClusterID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// WaitReady blocks until every shard has a leader.
func (n *Node) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !n.host.Ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("shards without a leader: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close stops the node gracefully: stop taking requests (letting those in
// progress finish), stop the shards (firing batches finish and record their
// results through Raft), then the publisher and Pebble.
func (n *Node) Close(ctx context.Context) error {
	var errs []error
	if n.ml != nil {
		// Tell the others first: a member that left is not suspected, and
		// keeps its replicas if it returns within the dead timeout.
		if err := n.ml.Leave(2 * time.Second); err != nil {
			n.cfg.Logger.Warn("leaving the gossip cluster", "err", err)
		}
	}
	if n.ingest != nil {
		// First: what it has applied is committed while the API still takes
		// its calls.
		n.ingest.Close()
	}
	if n.grpc != nil {
		stopped := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			n.grpc.Stop()
		}
	}
	if n.http != nil {
		// Shutdown fails when ctx ends with requests still open (a
		// /debug/pprof/profile runs for seconds): they are left to finish.
		// No state of the node is at stake there, so Close goes on, and
		// logs it as it does a failed Leave.
		if err := n.http.Shutdown(ctx); err != nil {
			n.cfg.Logger.Warn("stopping the HTTP server", "err", err)
		}
	}
	if n.console != nil {
		// Its bulk jobs call the gRPC API, which has stopped: they end.
		if err := n.console.Close(); err != nil {
			n.cfg.Logger.Warn("closing the console", "err", err)
		}
	}
	if n.authz != nil {
		n.authz.Close() // no call is left to refuse
	}
	if n.host != nil {
		errs = append(errs, n.host.Close())
	}
	if n.cluster != nil {
		n.cluster.Close()
	}
	if n.keys != nil {
		n.keys.Close()
		n.keys = nil
	}
	if n.ml != nil {
		errs = append(errs, n.ml.Shutdown())
	}
	if n.pub != nil {
		errs = append(errs, n.pub.Close())
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	return errors.Join(errs...)
}

// pebbleLogger sends Pebble's log lines to slog at debug level (errors stay
// errors) instead of the standard logger, and its fatal ones to fatal.
type pebbleLogger struct {
	l     *slog.Logger
	fatal func(error)
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, "component", "pebble")
	p.fatal(errors.New("pebble: " + msg))
}

// diskFailed is the store's StoreOptions.Failed and every replica's
// shard.Config.DiskFailed.
func (n *Node) diskFailed(err error) {
	n.cfg.Logger.Error("the data directory cannot be written: stopping so that other replicas lead this node's shards", "err", err)
	n.fatal(err)
}

// fatal hands err to Config.OnFatal, once, and never returns: what called
// it cannot go on.
func (n *Node) fatal(err error) {
	n.fatalOnce.Do(func() {
		if n.cfg.OnFatal != nil {
			n.cfg.OnFatal(err)
		}
	})
	panic(fmt.Sprintf("chime node %s cannot go on: %v", n.cfg.NodeID, err))
}

// Config returns the node's configuration, with the shard count and
// replication fixed when its cluster was created.
func (n *Node) Config() Config { return n.cfg }

// GRPCAddr is the address the gRPC API listens on.
func (n *Node) GRPCAddr() string { return n.grpcAddr.String() }

// HTTPAddr is the address of /healthz, /readyz and /metrics.
func (n *Node) HTTPAddr() string { return n.httpAddr.String() }

// RaftAddr is the node's Raft address as the others know it.
func (n *Node) RaftAddr() string { return n.raftAddr }

// GossipAddr is the node's gossip address, or "" without gossip.
func (n *Node) GossipAddr() string {
	if n.ml == nil {
		return ""
	}
	return n.ml.LocalAddr()
}

// Host returns the node's shard replicas.
func (n *Node) Host() *host.Host { return n.host }

// Cluster returns the node's control plane, which is also its request path
// (the Backend of its gRPC API).
func (n *Node) Cluster() *controlplane.Cluster { return n.cluster }

// ServeErr delivers an error from the gRPC or HTTP server that stopped
// serving on its own.
func (n *Node) ServeErr() <-chan error { return n.serveErr }
