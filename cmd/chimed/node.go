package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/shard"
)

// nodeConfig is everything one chimed node needs, from flags.
type nodeConfig struct {
	NodeID      string
	DataDir     string
	GRPCAddr    string
	HTTPAddr    string
	RaftAddr    string
	Brokers     []string
	Shards      int
	Limits      rpc.Limits
	Tuning      shard.Tuning
	Linger      time.Duration
	MaxInFlight int
	MaxAttempts int
	DeadLetter  string
	Logger      *slog.Logger
}

// node is a running chimed: Pebble, the shard host, the publisher, and the
// gRPC and HTTP servers. Close stops them in dependency order.
type node struct {
	cfg   nodeConfig
	store *raftfsm.Store
	pub   *publish.Publisher
	host  *shard.Host
	grpc  *grpc.Server
	http  *http.Server

	grpcAddr, httpAddr, raftAddr net.Addr
	serveErr                     chan error
}

// clusterMeta is written once, when the data directory is created, so that a
// restart cannot change what was fixed at creation.
type clusterMeta struct {
	Shards  int       `json:"shards"`
	NodeID  string    `json:"node_id"`
	Created time.Time `json:"created"`
}

func loadOrCreateMeta(cfg *nodeConfig) error {
	path := filepath.Join(cfg.DataDir, "cluster.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		m := clusterMeta{Shards: cfg.Shards, NodeID: cfg.NodeID, Created: time.Now().UTC()}
		b, _ = json.MarshalIndent(m, "", "  ")
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}
	if err != nil {
		return err
	}
	var m clusterMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if m.Shards != cfg.Shards && cfg.Shards != 0 {
		cfg.Logger.Warn("ignoring --shards: the shard count is fixed when the data directory is created",
			"flag", cfg.Shards, "stored", m.Shards, "file", path)
	}
	cfg.Shards = m.Shards
	if m.NodeID != cfg.NodeID {
		return fmt.Errorf("%s belongs to node %q, not %q: use --node-id %s or another --data-dir", cfg.DataDir, m.NodeID, cfg.NodeID, m.NodeID)
	}
	return nil
}

func startNode(cfg nodeConfig) (_ *node, err error) {
	n := &node{cfg: cfg, serveErr: make(chan error, 2)}
	defer func() {
		if err != nil {
			n.Close(context.Background())
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	if err := loadOrCreateMeta(&cfg); err != nil {
		return nil, err
	}
	n.cfg = cfg
	if n.store, err = raftfsm.OpenStore(filepath.Join(cfg.DataDir, "pebble"), raftfsm.StoreOptions{Logger: pebbleLogger{cfg.Logger}}); err != nil {
		return nil, fmt.Errorf("opening Pebble: %w", err)
	}
	if n.pub, err = publish.New(publish.Config{
		Brokers: cfg.Brokers, Linger: cfg.Linger, MaxInFlight: cfg.MaxInFlight,
		MaxAttempts: cfg.MaxAttempts, DeadLetterTopic: cfg.DeadLetter,
		ClientID: "chimed-" + cfg.NodeID, Logger: cfg.Logger.With("component", "publish"),
	}); err != nil {
		return nil, err
	}
	raftLn, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, fmt.Errorf("--raft-addr: %w", err)
	}
	n.raftAddr = raftLn.Addr()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if n.host, err = shard.OpenHost(shard.HostConfig{
		NodeID: cfg.NodeID, DataDir: filepath.Join(cfg.DataDir, "raft"), Shards: cfg.Shards,
		RaftListener: raftLn, Store: n.store, Publisher: n.pub, Tuning: cfg.Tuning, Bootstrap: true,
		Logger: cfg.Logger, Metrics: shard.NewMetrics(reg),
	}); err != nil {
		raftLn.Close()
		return nil, err
	}
	reg.MustRegister(n.host.Collector())

	grpcLn, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("--grpc-addr: %w", err)
	}
	n.grpcAddr = grpcLn.Addr()
	n.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	rpc.Register(n.grpc, rpc.NewServer(n.host, cfg.Limits, time.Now, cfg.Logger.With("component", "rpc")))
	go func() { n.serveErr <- n.grpc.Serve(grpcLn) }()

	httpLn, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	n.httpAddr = httpLn.Addr()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !n.host.Ready() {
			http.Error(w, "not ready: a shard has no leader yet", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := n.http.Serve(httpLn); !errors.Is(err, http.ErrServerClosed) {
			n.serveErr <- err
		}
	}()
	return n, nil
}

// waitReady blocks until every shard has a leader.
func (n *node) waitReady(ctx context.Context) error {
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
func (n *node) Close(ctx context.Context) error {
	var errs []error
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
		n.http.Shutdown(ctx)
	}
	if n.host != nil {
		errs = append(errs, n.host.Close())
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
// errors) instead of the standard logger.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
	os.Exit(1)
}
