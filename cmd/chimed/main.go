// Command chimed is the Chime daemon: a node of a durable delayed-event
// scheduler that produces each scheduled record to Kafka at its due time.
//
//	chimed dev     one node with an embedded Kafka-protocol broker, for trying Chime
//	chimed serve   a node against an external Kafka
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/wheel"
)

const usage = `chimed is the Chime daemon: it stores scheduled events durably (Raft +
Pebble) and produces each one to its Kafka topic when it falls due.

Usage:
  chimed dev   [flags]   one node with an embedded Kafka-protocol broker
  chimed serve [flags]   one node against an external Kafka (--kafka-brokers)

Run 'chimed <command> --help' for the flags of each command.

Start here:
  go run ./cmd/chimed dev
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "dev", "serve":
		return runNode(args[0], args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "chimed: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// flags binds the flags shared by dev and serve.
type flags struct {
	fs                                      *flag.FlagSet
	nodeID, dataDir, grpcAddr, httpAddr     string
	raftAddr, kafkaAddr, brokers, logLevel  string
	deadLetter                              string
	shards, maxPayload, maxInFlight         int
	maxAttempts                             int
	maxHorizon, resolution, linger, timeout time.Duration
}

func newFlags(cmd string, stderr io.Writer) *flags {
	f := &flags{fs: flag.NewFlagSet("chimed "+cmd, flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(stderr)
	defNode := "dev"
	if cmd == "serve" {
		defNode, _ = os.Hostname()
	}
	fs.StringVar(&f.nodeID, "node-id", defNode, "this node's unique, stable id (its Raft server id)")
	fs.StringVar(&f.dataDir, "data-dir", "./chime-data", "directory for Pebble, the Raft logs and snapshots")
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:7070", "address of the gRPC API (chime.v1.Scheduler, with reflection)")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:7080", "address of /healthz, /readyz and Prometheus /metrics")
	fs.StringVar(&f.raftAddr, "raft-addr", "127.0.0.1:7071", "address of the Raft port shared by every shard")
	if cmd == "dev" {
		fs.StringVar(&f.kafkaAddr, "kafka-addr", "127.0.0.1:9092", "address of the embedded Kafka-protocol broker")
	} else {
		fs.StringVar(&f.brokers, "kafka-brokers", "", "comma-separated Kafka bootstrap brokers (required)")
	}
	fs.IntVar(&f.shards, "shards", 4, "number of shards, fixed when the data directory is created")
	fs.IntVar(&f.maxPayload, "max-payload", rpc.DefaultLimits().MaxPayloadBytes, "largest accepted event payload, in bytes")
	fs.DurationVar(&f.maxHorizon, "max-horizon", rpc.DefaultLimits().MaxHorizon, "furthest ahead an event may be due")
	fs.DurationVar(&f.resolution, "resolution", wheel.DefaultResolution, "timing wheel tick: events fire at most one tick after they are due")
	fs.DurationVar(&f.linger, "linger", time.Millisecond, "how long a Kafka batch waits for more records")
	fs.IntVar(&f.maxInFlight, "max-inflight", publish.DefaultMaxInFlight, "produce batches in flight to Kafka at once")
	fs.IntVar(&f.maxAttempts, "max-attempts", publish.DefaultMaxAttempts, "produce attempts before a record goes to the dead-letter topic")
	fs.StringVar(&f.deadLetter, "dead-letter-topic", publish.DefaultDeadLetterTopic, "topic for records whose last produce attempt failed")
	fs.DurationVar(&f.timeout, "shutdown-timeout", 30*time.Second, "how long a graceful shutdown may take before it is forced")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		what := "one Chime node against an external Kafka"
		if cmd == "dev" {
			what = "one Chime node with an embedded Kafka-protocol broker, for trying Chime\nand for development; Kafka data is kept under --data-dir/kafka"
		}
		fmt.Fprintf(stderr, "Usage: chimed %s [flags]\n\nRuns %s.\nSIGINT or SIGTERM shut it down gracefully.\n\nFlags:\n", cmd, what)
		fs.PrintDefaults()
		if cmd == "dev" {
			fmt.Fprint(stderr, "\nExamples:\n  chimed dev\n  chimed dev --data-dir /tmp/chime --kafka-addr 127.0.0.1:19092\n")
		} else {
			fmt.Fprint(stderr, "\nExample:\n  chimed serve --kafka-brokers kafka-1:9092,kafka-2:9092 --data-dir /var/lib/chime\n")
		}
	}
	return f
}

func runNode(cmd string, args []string, stdout, stderr io.Writer) int {
	f := newFlags(cmd, stderr)
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if f.fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chimed %s: unexpected argument %q\n", cmd, f.fs.Arg(0))
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "chimed: --log-level: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	fail := func(err error) int {
		logger.Error("chimed failed", "err", err)
		return 1
	}
	started := time.Now()

	var brokers []string
	if cmd == "dev" {
		broker, err := startBroker(f.kafkaAddr, f.dataDir)
		if err != nil {
			return fail(fmt.Errorf("--kafka-addr %s: %w", f.kafkaAddr, err))
		}
		defer broker.Close()
		brokers = broker.ListenAddrs()
	} else {
		for _, b := range strings.Split(f.brokers, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		if len(brokers) == 0 {
			fmt.Fprintln(stderr, "chimed serve: --kafka-brokers is required (for example --kafka-brokers localhost:9092)")
			return 2
		}
	}
	lim := rpc.DefaultLimits()
	lim.MaxPayloadBytes = f.maxPayload
	lim.MaxHorizon = f.maxHorizon
	if err := lim.Validate(); err != nil {
		fmt.Fprintf(stderr, "chimed: %v\n", err)
		return 2
	}
	n, err := startNode(nodeConfig{
		NodeID: f.nodeID, DataDir: f.dataDir, GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr,
		RaftAddr: f.raftAddr, Brokers: brokers, Shards: f.shards, Limits: lim,
		Tuning: shard.Tuning{Resolution: f.resolution}, Linger: f.linger,
		MaxInFlight: f.maxInFlight, MaxAttempts: f.maxAttempts, DeadLetter: f.deadLetter,
		Logger: logger,
	})
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = n.waitReady(readyCtx)
	cancel()
	if err != nil {
		n.Close(context.Background())
		return fail(err)
	}
	printBanner(stdout, cmd, n, brokers, time.Since(started))

	select {
	case <-ctx.Done():
	case err := <-n.serveErr:
		logger.Error("server stopped", "err", err)
	}
	stop() // a second signal now kills the process
	logger.Info("shutting down", "timeout", f.timeout)
	sctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	if err := n.Close(sctx); err != nil {
		return fail(fmt.Errorf("shutdown: %w", err))
	}
	logger.Info("stopped")
	return 0
}

// startBroker runs the embedded Kafka-protocol broker (kfake) on addr, keeping
// its data under dataDir/kafka so records survive a restart of the dev node.
func startBroker(addr, dataDir string) (*kfake.Cluster, error) {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", portStr, err)
	}
	return kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(3),
		kfake.DataDir(dataDir+"/kafka"),
	)
}

func printBanner(w io.Writer, cmd string, n *node, brokers []string, took time.Duration) {
	kafka := strings.Join(brokers, ",")
	if cmd == "dev" {
		kafka += "   (embedded broker; topics are created on first use)"
	}
	fmt.Fprintf(w, `chimed %s: node %q ready in %v
  gRPC   %s   (chime.v1.Scheduler, server reflection on)
  Kafka  %s
  HTTP   http://%s   (/healthz /readyz /metrics)
  Raft   %s
  data   %s   (%d shards)

Try it:
  go run ./cmd/chimectl tail --topic demo &
  go run ./cmd/chimectl schedule --topic demo --in 2s --payload hello
  grpcurl -plaintext -d '{"event":{"topic":"demo","delay":"2s","payload":"aGVsbG8="}}' %s chime.v1.Scheduler/Schedule
  kcat -C -b %s -t demo -f '%%s  %%h\n'
`, cmd, n.cfg.NodeID, took.Round(time.Millisecond), n.grpcAddr, kafka, n.httpAddr, n.raftAddr,
		n.cfg.DataDir, n.cfg.Shards, n.grpcAddr, brokers[0])
}
