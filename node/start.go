package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	controlplane "github.com/chimehq/chime/cluster"
	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/node/console"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/rpc/ingest"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
	"github.com/chimehq/chime/shard/topiclimit"
)

// Start starts a node on cfg.DataDir, creating it or joining a cluster if
// the directory is new. It does not wait for shard leaders (see WaitReady):
// requests that arrive before them wait within cluster.LeaderWait.
//
// Each step is a function of its own, in the order they run: the data
// directory, the configuration's consistency, the listeners, the cluster's
// parameters (gossip and joining, in cluster mode), Pebble and the
// publisher, the control plane, the shard replicas, then the gRPC and HTTP
// servers. A step that fails leaves what the earlier ones started to Close.
func Start(cfg Config) (_ *Node, err error) {
	n := &Node{cfg: cfg, serveErr: make(chan error, 2), topicLimits: topiclimit.NewTable(cfg.TopicLimits)}
	lns := &listeners{}
	defer func() {
		if err != nil {
			lns.close()
			// The step's error comes first. A Close that fails may leave part of
			// the node open (Pebble, the shards' Raft logs): a caller that starts
			// again on the same directory must hear of it.
			if cerr := n.Close(context.Background()); cerr != nil {
				err = errors.Join(err, fmt.Errorf("closing what started: %w", cerr))
			}
		}
	}()
	if err := openDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if err := n.listen(cfg, lns); err != nil {
		return nil, err
	}
	cfg.Join = withoutSelf(cfg.Join, cfg.GossipAddr, cfg.AdvertiseHost)
	meta, existed, err := n.settleCluster(&cfg)
	if err != nil {
		return nil, err
	}
	n.cfg = cfg
	if err := n.openStorage(); err != nil {
		return nil, err
	}
	reg := n.newRegistry()
	if err := n.startControlPlane(meta); err != nil {
		return nil, err
	}
	backend, err := n.openShards(lns, reg, existed)
	if err != nil {
		return nil, err
	}
	srv, err := n.serveGRPC(lns, reg, backend)
	if err != nil {
		return nil, err
	}
	if err := n.startIngest(reg, srv); err != nil {
		return nil, err
	}
	if cfg.Console != console.Off {
		cc := console.Config{Mode: cfg.Console, Target: n.grpcAdvertised, Auth: n.authz, SecureCookie: cfg.TLS != nil,
			NodeID: cfg.NodeID, Logger: cfg.Logger.With("component", "console"), Now: cfg.Now, Metrics: reg}
		if cfg.TLS != nil {
			cc.TLS = cfg.TLS.PeerClientConfig()
		}
		if n.console, err = console.New(cc); err != nil {
			return nil, err
		}
	}
	n.serveHTTP(lns, reg)
	return n, nil
}

// startIngest joins the ingest consumer group when Config.Ingest lists
// source topics: their records are applied through srv, as this node's
// gRPC calls are, and on a secured node act for the credential the auth
// file names for their topic.
func (n *Node) startIngest(reg *prometheus.Registry, srv *rpc.Server) error {
	cfg := n.cfg
	ic := cfg.Ingest
	if len(ic.Sources) == 0 {
		return nil
	}
	for _, s := range ic.Sources {
		// The tombstone back is an event like any other: it could never be
		// scheduled, and every record of the topic would be rejected.
		if why := cfg.Limits.ReservedTopic(s.Topic); s.TombstoneBack && why != "" {
			return fmt.Errorf("--ingest-tombstone-back: topic %s is reserved (%s), so no event may produce to it: name a schedules topic of the scheduler Chime replaces", s.Topic, why)
		}
		if why := cfg.Limits.ReservedTopic(s.HistoryTopic); s.HistoryTopic != "" && why != "" {
			return fmt.Errorf("--ingest-history-topic %s: reserved (%s), so no event may produce to it", s.HistoryTopic, why)
		}
	}
	ic.Brokers, ic.Security, ic.API, ic.MaxBatch = cfg.Brokers, cfg.KafkaSecurity, srv, cfg.Limits.MaxBatch
	ic.ClientID = "chime-" + cfg.NodeID
	ic.Logger = cfg.Logger.With("component", "ingest")
	ic.Metrics = ingest.NewMetrics()
	reg.MustRegister(ic.Metrics.Collectors()...)
	if n.authz != nil {
		ic.Interceptor = n.authz.Ingest
	}
	c, err := ingest.New(ic)
	if err != nil {
		return fmt.Errorf("--ingest-topics: %w", err)
	}
	n.ingest = c
	n.cluster.SetIngest(func() []*chimev1.IngestPartition {
		st := c.Status()
		out := make([]*chimev1.IngestPartition, len(st))
		for i, p := range st {
			out[i] = &chimev1.IngestPartition{Topic: p.Topic, Partition: p.Partition, NextOffset: p.Next, Lag: p.Lag}
		}
		return out
	})
	return nil
}

// listeners are the ports Start binds, closed by Start if it fails until a
// server owns them: each is set to nil when one does.
type listeners struct {
	raft, grpc, http net.Listener
}

func (l *listeners) close() {
	for _, ln := range []net.Listener{l.raft, l.grpc, l.http} {
		if ln != nil {
			_ = ln.Close() // fails only for a listener already closed
		}
	}
}

// openDataDir creates the data directory, or closes up one that exists.
// It holds every event's payload and the cluster's state: its owner's
// alone. One made by an older chimed (0755) is closed up too.
func openDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// checkConfig refuses settings that do not go together, before a port is
// bound: a certificate that does not name the node, an auth file in a
// cluster without TLS, a gossip key file without gossip.
func checkConfig(cfg Config) error {
	if cfg.TLS != nil {
		if err := cfg.TLS.CheckNode(cfg.NodeID); err != nil {
			return err
		}
	}
	if cfg.AuthFile != "" && cfg.Cluster && cfg.TLS == nil {
		return errors.New("--auth-file needs TLS (--tls-cert, --tls-key, --tls-ca) in a cluster: nodes prove to each other that they are nodes with their certificates")
	}
	if cfg.AuthFile != "" && cfg.Console != console.Off && cfg.TLS == nil {
		return errors.New("--console with --auth-file needs TLS (--tls-cert, --tls-key, --tls-ca): a sign-in sends a token, which plaintext HTTP would show to the network, and the console acts for the signed-in credential with the node's certificate; give TLS, or --console=off")
	}
	if cfg.GossipKeyFile != "" && !cfg.Cluster {
		return fmt.Errorf("gossip key file %s: this node does not gossip (not in cluster mode)", cfg.GossipKeyFile)
	}
	return nil
}

// listen binds addr, naming the flag in the error.
func listen(flag, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, addr, err)
	}
	return ln, nil
}

// listen binds the Raft port (unless cfg.RaftTransport replaces it), the
// gRPC and the HTTP ports into lns, and settles the addresses the node
// advertises for them.
func (n *Node) listen(cfg Config, lns *listeners) (err error) {
	if cfg.RaftTransport == nil {
		if lns.raft, err = listen("raft-addr", cfg.RaftAddr); err != nil {
			return err
		}
		if n.raftAddr, err = advertised(cfg, "raft-addr", cfg.RaftAddr, lns.raft.Addr()); err != nil {
			return err
		}
	} else {
		n.raftAddr = cfg.RaftAdvertise
	}
	if lns.grpc, err = listen("grpc-addr", cfg.GRPCAddr); err != nil {
		return err
	}
	if lns.http, err = listen("http-addr", cfg.HTTPAddr); err != nil {
		return err
	}
	n.grpcAddr, n.httpAddr = lns.grpc.Addr(), lns.http.Addr()
	if n.grpcAdvertised, err = advertised(cfg, "grpc-addr", cfg.GRPCAddr, n.grpcAddr); err != nil {
		return err
	}
	if n.httpAdvertised, err = advertised(cfg, "http-addr", cfg.HTTPAddr, n.httpAddr); err != nil {
		return err
	}
	return nil
}

// settleCluster reads the data directory's cluster.json, or makes a new
// directory's, joins the gossip in cluster mode (joinCluster), and sets
// cfg's shard count, replication and retention to the ones fixed when the
// cluster was created. existed is false for a new directory.
func (n *Node) settleCluster(cfg *Config) (meta clusterMeta, existed bool, err error) {
	if _, err := os.Stat(filepath.Join(cfg.DataDir, restoringName)); err == nil {
		return meta, false, fmt.Errorf("%s: a chimed restore into this directory did not finish (%s is there): delete the directory's contents and run chimed restore again",
			cfg.DataDir, restoringName)
	}
	if meta, existed, err = loadMeta(cfg.DataDir); err != nil {
		return meta, false, err
	}
	if existed && meta.NodeID != cfg.NodeID {
		return meta, false, fmt.Errorf("%s belongs to node %q, not %q: use --node-id %s or another --data-dir", cfg.DataDir, meta.NodeID, cfg.NodeID, meta.NodeID)
	}
	if existed && meta.RaftAddr != "" && meta.RaftAddr != n.raftAddr {
		// The restored shards' Raft configurations name meta.RaftAddr: other
		// replicas would dial it, and never reach this node.
		return meta, false, fmt.Errorf("%s was restored for the Raft address %s, which every shard's configuration names, but this node's Raft address is %s: use --raft-addr %s",
			cfg.DataDir, meta.RaftAddr, n.raftAddr, meta.RaftAddr)
	}
	if !existed {
		meta = clusterMeta{Shards: cfg.Shards, Replication: cfg.Replication, Retention: cfg.Tuning.Retention, NodeID: cfg.NodeID, Created: time.Now().UTC()}
		if !cfg.Cluster {
			// A node alone is a cluster of its own: a backup of it names it.
			meta.ClusterID = newClusterID()
		}
	}
	if cfg.Cluster {
		if meta, err = n.joinCluster(*cfg, meta, existed); err != nil {
			return meta, existed, err
		}
	}
	if existed && (meta.Shards != cfg.Shards || (cfg.Cluster && meta.Replication != cfg.Replication) || meta.Retention != cfg.Tuning.Retention) {
		cfg.Logger.Info("using the shard count, replication and retention fixed when the cluster was created",
			"shards", meta.Shards, "replication", meta.Replication, "retention", meta.Retention, "file", metaPath(cfg.DataDir))
	}
	cfg.Shards, cfg.Replication, cfg.Tuning.Retention = meta.Shards, meta.Replication, meta.Retention
	if !existed {
		if err := saveMeta(cfg.DataDir, meta); err != nil {
			return meta, existed, err
		}
	}
	return meta, existed, nil
}

// openStorage opens Pebble and the Kafka publisher. From here on a data
// directory that cannot be written ends the node through Config.OnFatal.
func (n *Node) openStorage() (err error) {
	cfg := n.cfg
	if n.store, err = raftfsm.OpenStore(filepath.Join(cfg.DataDir, "pebble"), raftfsm.StoreOptions{
		Logger: pebbleLogger{cfg.Logger, n.fatal}, FailAfter: cfg.Tuning.DiskFailAfter, Failed: n.diskFailed,
	}); err != nil {
		return fmt.Errorf("opening Pebble: %w", err)
	}
	n.pub, err = publish.New(publish.Config{
		Brokers: cfg.Brokers, Security: cfg.KafkaSecurity, ExistingTopicsOnly: cfg.KafkaExistingTopicsOnly, MaxInFlight: cfg.MaxInFlight,
		MaxAttempts: cfg.MaxAttempts, DeadLetterTopic: cfg.DeadLetter,
		ClientID: "chimed-" + cfg.NodeID, Logger: cfg.Logger.With("component", "publish"), Now: cfg.Now,
	})
	return err
}

// newRegistry is the registry /metrics serves, with the process's, the
// publisher's, the node's and the gossip keys' collectors; openShards adds
// the shards'.
func (n *Node) newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(n.pub.Collector(), nodeCollector{replication: n.cfg.Replication, dataDir: n.cfg.DataDir})
	if n.keys != nil {
		reg.MustRegister(keysCollector{ml: n.ml, watcher: n.keys})
	}
	return reg
}

// startControlPlane starts the control plane over the gossip (or, without
// it, this node alone). It comes before the replicas: the Raft port's TLS
// asks it who may connect (peerRefusal).
func (n *Node) startControlPlane(meta clusterMeta) (err error) {
	cfg := n.cfg
	cc := controlplane.Config{
		ClusterID: meta.ClusterID, Shards: cfg.Shards, Replication: cfg.Replication, Retention: cfg.Tuning.Retention, DeadTimeout: cfg.DeadTimeout,
		RemovedPath: filepath.Join(cfg.DataDir, "removed.json"), PeersPath: peersPath(cfg.DataDir),
		Logger:          cfg.Logger.With("component", "cluster"),
		DialCredentials: dialCredentials(cfg.TLS),
		// A Peer call carries the grant of the client a node forwards for,
		// which the authorizer puts in the call's context.
		ScopeOf: rpc.ScopeOf,
		// Without gossip (chimed dev) the cluster is this node alone: the
		// Admin API answers for it, and the host has no Directory.
		Self: membership.Meta{NodeID: cfg.NodeID, GRPCAddr: n.grpcAdvertised, RaftAddr: n.raftAddr, HTTPAddr: n.httpAdvertised},
	}
	if n.ml != nil {
		cc.Membership = n.ml
	}
	n.cluster, err = controlplane.New(cc)
	return err
}

// openShards opens the node's shard replicas on the Raft listener, which
// the host owns from then on, and returns what serves the API: the control
// plane, whose request path runs each request on its shard's leader, here
// or on another node, in chimed dev as in a cluster.
func (n *Node) openShards(lns *listeners, reg *prometheus.Registry, existed bool) (rpc.Backend, error) {
	cfg := n.cfg
	hc := host.Config{
		NodeID: cfg.NodeID, DataDir: filepath.Join(cfg.DataDir, "raft"), Shards: cfg.Shards,
		RaftListener: lns.raft, RaftAdvertise: cfg.RaftAdvertise, Transport: cfg.RaftTransport, Store: n.store, Publisher: n.pub, Tuning: cfg.Tuning,
		Logger: cfg.Logger, Metrics: shard.NewMetrics(reg), Now: cfg.Now,
		RaftTLS: n.raftTLS(cfg.TLS), TopicLimits: n.topicLimits, DiskFailed: n.diskFailed,
		// Only the node that creates the cluster starts shards alone, and
		// only then: a restarted node must never found a second group.
		Bootstrap: !existed && len(cfg.Join) == 0,
	}
	if cfg.Cluster {
		hc.Directory = n.cluster
	}
	var err error
	if n.host, err = host.Open(hc); err != nil {
		return nil, err
	}
	lns.raft = nil
	reg.MustRegister(n.host.Collector())
	reg.MustRegister(n.cluster.LeaderLookups())
	n.cluster.SetHost(n.host)
	return n.cluster, nil
}

// serveGRPC starts the gRPC server on its listener with the API, the Admin
// API and the node-to-node Peer service, behind the authorizer when
// Config.AuthFile is set.
func (n *Node) serveGRPC(lns *listeners, reg *prometheus.Registry, backend rpc.Backend) (*rpc.Server, error) {
	cfg := n.cfg
	// A request is bounded by the event limits (MaxRequestBytes), and so
	// are the requests one connection can have in flight at once.
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.Limits.MaxRequestBytes()), grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true})}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(cfg.TLS.ServerCredentials()))
	}
	if cfg.AuthFile != "" {
		authz, err := n.newAuthorizer(backend)
		if err != nil {
			return nil, err
		}
		n.authz = authz
		opts = append(opts, grpc.InTapHandle(authz.Tap),
			grpc.ChainUnaryInterceptor(authz.UnaryInterceptor), grpc.ChainStreamInterceptor(authz.StreamInterceptor))
	}
	n.grpc = grpc.NewServer(opts...)
	srv := rpc.NewServer(backend, cfg.Limits, cfg.Now, cfg.Logger.With("component", "rpc"))
	reg.MustRegister(srv.Collector())
	rpc.Register(n.grpc, srv)
	rpc.RegisterAdmin(n.grpc, n.cluster, n.topicLimits, cfg.Logger.With("component", "admin"))
	controlplane.RegisterPeer(n.grpc, n.cluster)
	maxConns := cfg.MaxConnections
	if maxConns == 0 {
		maxConns = DefaultMaxConnections
	}
	ln := netutil.LimitListener(lns.grpc, maxConns)
	lns.grpc = nil
	go func() { n.serveErr <- n.grpc.Serve(ln) }()
	return srv, nil
}

// newAuthorizer reads Config.AuthFile into the authorizer every gRPC call
// (and the debug endpoints) pass through. The quotas it checks count
// through backend.
func (n *Node) newAuthorizer(backend rpc.Backend) (*auth.Authorizer, error) {
	cfg := n.cfg
	ao := auth.Options{Path: cfg.AuthFile, Logger: cfg.Logger.With("component", "auth"), Audit: cfg.Audit, Now: cfg.Now,
		// Any replica's count will do for a quota, which is checked
		// against a count up to a second old anyway.
		CountPending: func(ctx context.Context, prefix string) (uint64, error) {
			return backend.Count(ctx, raftfsm.Query{Prefix: prefix, States: raftfsm.StatesOf(raftfsm.StateScheduled)}, true)
		},
		Node: func(id string) error { return n.peerRefusal(id) },
		CountSchedules: func(ctx context.Context, prefix string, limit uint64) (uint64, error) {
			var n uint64
			for after := ""; n < limit; {
				scheds, more, err := backend.ListSchedules(ctx, prefix, after, int(min(limit-n, 1000)), true)
				if err != nil {
					return 0, err
				}
				n += uint64(len(scheds))
				if !more || len(scheds) == 0 {
					break
				}
				after = scheds[len(scheds)-1].ID
			}
			return n, nil
		}}
	if cfg.TLS != nil {
		ao.Identify = cfg.TLS.Identify
	}
	return auth.New(ao)
}

// serveHTTP starts the HTTP server on its listener: /healthz, /readyz,
// /metrics from reg, the debug endpoints when asked for, and the caller's
// handlers.
func (n *Node) serveHTTP(lns *listeners, reg *prometheus.Registry) {
	cfg := n.cfg
	n.http = &http.Server{Handler: n.httpMux(reg), ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)}
	ln := lns.http
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS.ServerConfig())
	}
	lns.http = nil
	go func() {
		if err := n.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			n.serveErr <- err
		}
	}()
}

func (n *Node) httpMux(reg *prometheus.Registry) *http.ServeMux {
	cfg := n.cfg
	mux := http.NewServeMux()
	// The handlers' writes fail only when the client has gone: there is
	// no one left to answer, so their errors are discarded.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	// /readyz?voter=1 also waits until the node is a voter of every shard
	// the placement gives it: what a rolling restart must wait for before
	// it stops the next node, or a shard whose replica there was just
	// drained could lose its quorum.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !n.host.Ready() {
			http.Error(w, "not ready: a shard has no leader yet", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Query().Has("voter") {
			if missing := n.host.MissingVoters(); len(missing) > 0 {
				http.Error(w, fmt.Sprintf("not ready: not yet a voter of shards %v, which the placement gives this node", missing), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Profiles and Pebble's LSM report, for finding where a loaded node
	// spends its CPU and I/O, only when asked for.
	if cfg.DebugEndpoints {
		// With auth on, for admins only.
		debug := func(h http.HandlerFunc) http.Handler {
			if n.authz != nil {
				return n.authz.AdminHTTP(h)
			}
			return h
		}
		mux.Handle("/debug/pprof/", debug(pprof.Index))
		mux.Handle("/debug/pprof/profile", debug(pprof.Profile))
		mux.Handle("/debug/pprof/trace", debug(pprof.Trace))
		mux.Handle("/debug/pebble", debug(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, n.store.LSM()) }))
	}
	if n.console != nil {
		mux.Handle("/ui/", n.console.Handler())
	}
	if cfg.HTTPHandlers != nil {
		cfg.HTTPHandlers(mux)
	}
	return mux
}
