// Command chimed is the Chime daemon: a node of a durable delayed-event
// scheduler that produces each scheduled record to Kafka at its due time.
//
//	chimed dev       one node with an embedded Kafka-protocol broker, for trying Chime
//	chimed serve     a node against an external Kafka
//	chimed restore   lay out a new cluster's first node from a backup (chimectl backup)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/chimehq/chime/cmd/internal/kafkaflag"
	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/node"
	"github.com/chimehq/chime/node/console"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/ingest"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/topiclimit"
	"github.com/chimehq/chime/wheel"
)

const usage = `chimed is the Chime daemon: it stores scheduled events durably (Raft +
Pebble) and produces each one to its Kafka topic when it falls due.

Usage:
  chimed dev     [flags]   one node with an embedded Kafka-protocol broker
  chimed serve   [flags]   one node against an external Kafka (--kafka-brokers)
  chimed restore [flags]   a new cluster's first node from a backup (chimectl backup)
  chimed health  [flags]   exit 0 if the node on this machine answers /healthz (or /readyz)

Run 'chimed <command> --help' for the flags of each command.

Start here:
  go run ./cmd/chimed dev
`

func main() {
	raiseProcs()
	limitMallocArenas()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// minProcs is the fewest Ps (GOMAXPROCS) chimed runs with unless the
// GOMAXPROCS environment variable says otherwise.
//
// A node's CPU-heavy work (Pebble's flushes and compactions, applying Raft
// entries) runs in long stretches; with one P per core, the Go scheduler
// hands a waiting goroutine a P only when a running one is preempted, every
// 10 ms, so on a small machine the firing loop and the produce round trips
// queued behind compactions. With more Ps than cores the kernel interleaves
// the threads at a finer grain. Measured with chimectl bench on 2 cores at
// 10,000 events/s due: fire lateness p99 28 -> 17 ms and max 496 -> 56 ms,
// consumer lag p99 130 -> 33 ms, schedule ack p99 206 -> 51 ms, for 6% more
// CPU per event. Machines with at least this many cores are unaffected.
const minProcs = 8

func raiseProcs() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < minProcs {
		runtime.GOMAXPROCS(minProcs)
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "dev", "serve":
		return runNode(args[0], args[1:], stdout, stderr)
	case "restore":
		return runRestore(args[1:], stdout, stderr)
	case "health":
		return runHealth(args[1:], stdout, stderr)
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
	fs                                              *flag.FlagSet
	nodeID, dataDir, grpcAddr, httpAddr             string
	raftAddr, kafkaAddr, brokers, logLevel          string
	deadLetter, gossipAddr, join, gossipKeyFile     string
	tlsCert, tlsKey, tlsCA, tlsClientCA             string
	authFile, auditLog, topicRateLimit              string
	advertiseHost                                   string
	allowTopics                                     []string
	debugEndpoints, insecure                        bool
	console                                         string
	autoCreateTopics, kafkaInsecure                 bool
	reservedTopics                                  []string
	shards, maxPayload, maxInFlight, maxCatchUp     int
	maxAttempts, replication, nodes, maxConnections int
	auditLogMaxSize, auditLogMaxFiles               int
	maxHorizon, resolution, timeout, maxClockSkew   time.Duration
	wheelHorizon                                    time.Duration
	retention                                       daysDuration
	deadTimeout, startupWait, diskFailure           time.Duration
	kafka                                           *kafkaflag.Flags
	ingest                                          *ingestFlags
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
	follows := func(offset int) string {
		if cmd != "dev" {
			return ""
		}
		return fmt.Sprintf("; when not given, --grpc-addr's host and port + %d", offset)
	}
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:7070", "address of the gRPC API (chime.v1.Scheduler, with reflection)")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:7080", "address of /healthz, /readyz and Prometheus /metrics"+follows(httpOffset))
	fs.StringVar(&f.raftAddr, "raft-addr", "127.0.0.1:7071", "address of the Raft port shared by every shard"+follows(raftOffset))
	fs.StringVar(&f.gossipAddr, "gossip-addr", "127.0.0.1:7072", "address for membership gossip (TCP and UDP)"+follows(gossipOffset))
	if cmd == "dev" {
		fs.StringVar(&f.kafkaAddr, "kafka-addr", "127.0.0.1:9092", "address of the embedded Kafka-protocol broker")
		fs.IntVar(&f.nodes, "nodes", 1, "run a local cluster of this many nodes in one process; node i (from 0) uses\nthe ports above plus 100*i and --data-dir/node-i")
		fs.BoolVar(&f.autoCreateTopics, "kafka-auto-create-topics", true, "let the broker create an event's topic when its first record is produced (on in dev)")
	} else {
		fs.BoolVar(&f.autoCreateTopics, "kafka-auto-create-topics", false, "let the brokers create an event's topic when its first record is produced, if they allow it\n(auto.create.topics.enable). Off, an event whose topic does not exist is retried, then\ndead-lettered: a mistyped topic does not become a new one. The dead-letter topic is\ncreated either way if the brokers allow it")
		fs.BoolVar(&f.kafkaInsecure, "kafka-insecure", false, "talk to Kafka without TLS although this node serves TLS (refused otherwise: the records, and\nthe SASL password, would cross the network in the clear)")
		fs.StringVar(&f.brokers, "kafka-brokers", "", "comma-separated Kafka bootstrap brokers (required)")
		fs.StringVar(&f.join, "join", "", "comma-separated gossip addresses of existing members; empty creates a new cluster. An\nentry naming this node itself is skipped, so every node can be given the same list: the\nnode it names creates the cluster, the others join it")
		fs.StringVar(&f.advertiseHost, "advertise-host", "", "the `host` name or IP the other nodes and clients reach this node by; it is advertised with\nthe ports of --raft-addr, --grpc-addr and --http-addr, and is required when they listen on\nevery interface (0.0.0.0:7071). Give a name that survives the node's IP changing (a\nKubernetes pod's DNS name): Raft configurations keep it")
	}
	f.kafka = kafkaflag.Register(fs, "Chime's producer")
	fs.IntVar(&f.shards, "shards", 8, "number of shards, fixed when the cluster is created")
	fs.IntVar(&f.replication, "replication", 3, "replicas (Raft voters) per shard, fixed when the cluster is created")
	f.retention = daysDuration(7 * 24 * time.Hour)
	fs.Var(&f.retention, "retention", "how long a fired, cancelled or dead-lettered event is kept after it settles (its id stays an\nidempotency key and Get shows it until then; 0 keeps them forever); fixed when the cluster is\ncreated. A `duration` or days: 7d, 36h, 90m")
	fs.DurationVar(&f.deadTimeout, "dead-timeout", 2*time.Minute, "how long a member may be dead before its replicas move to other nodes")
	fs.IntVar(&f.maxPayload, "max-payload", rpc.DefaultLimits().MaxPayloadBytes, "largest accepted event payload, in bytes (at most 16777216, 16 MiB: a request of two such events must fit one Raft log entry)")
	fs.DurationVar(&f.maxHorizon, "max-horizon", rpc.DefaultLimits().MaxHorizon, "furthest ahead an event may be due")
	fs.StringVar(&f.topicRateLimit, "topic-rate-limit", "", "per-topic fire rate limits: comma-separated `TOPIC=N/s` (or N/m, N/h), TOPIC a name or a glob\n(billing.*), e.g. reports=5000/s,billing.*=1000/s; a topic takes the first rule that matches\nit, and its records share the rate across the cluster. Each shard's leader enforces its share\n(the rate divided by --shards); records over it wait, highest priority first. chimectl\nrate-limit set changes them while the cluster runs")
	fs.IntVar(&f.maxCatchUp, "max-catch-up", rpc.DefaultLimits().MaxCatchUp, "most missed occurrences a recurring schedule with catch-up ALL produces in a row (after an\noutage or a pause) before it goes on with the future ones; stored with each schedule as it is\ncreated or updated")
	fs.DurationVar(&f.resolution, "resolution", wheel.DefaultResolution, "timing wheel tick: events fire at most one tick after they are due")
	fs.DurationVar(&f.wheelHorizon, "wheel-horizon", time.Hour, "how far ahead the in-memory timing wheel holds events (at least 1s); later ones stay on disk in\nthe due index and are loaded as the horizon reaches them, so memory follows the events due\nwithin it, not all the node holds. Each node sets its own")
	fs.DurationVar(&f.maxClockSkew, "max-clock-skew", time.Second, "how far apart the nodes' clocks may be; for this long after a leader change, cancels of unfired events due by then are refused (ABORTED, retryable) because the old leader may have produced them")
	fs.IntVar(&f.maxInFlight, "max-inflight", publish.DefaultMaxInFlight, "produce requests in flight to Kafka at once (each carries one partition's share of a fire batch)")
	fs.IntVar(&f.maxAttempts, "max-attempts", publish.DefaultMaxAttempts, "produce attempts before a record goes to the dead-letter topic")
	fs.StringVar(&f.deadLetter, "dead-letter-topic", publish.DefaultDeadLetterTopic, "topic for records whose last produce attempt failed")
	if cmd == "serve" {
		fs.BoolVar(&f.insecure, "insecure", false, "serve on addresses beyond loopback without all of TLS, --auth-file and --gossip-key-file\n(refused otherwise: anyone who reaches such a node could use it)")
	} else {
		fs.BoolVar(&f.insecure, "insecure", false, "serve on addresses beyond loopback (refused otherwise: the embedded broker has no TLS and\nno authentication, so anyone who reaches it reads and writes every topic)")
	}
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM `file` of this node's certificate (and chain): turns TLS on for every port. It must\nname "+certs.NodeName+" and "+certs.NodeIDName("<node-id>")+" (DNS subject alternative names) besides\nthe names clients dial, and be signed by --tls-ca. With dev --nodes, put {node} where each\nnode's id goes (in --tls-key too). Files are reloaded when they change")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM `file` of --tls-cert's private key")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "PEM `file` of the CA that signed the nodes' certificates: the Raft port and the nodes'\ncalls to each other are mutual TLS, accepting only certificates it signed that name "+certs.NodeName)
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "PEM `file` of the CA that signs clients' certificates: set, the gRPC and HTTP ports require a\nclient certificate it signed (or a node's)")
	fs.StringVar(&f.authFile, "auth-file", "", "JSON `file` of the bearer tokens (as SHA-256 hashes) and client certificates allowed to call\nthe node, each with a role (admin, scheduler with its topics and id prefixes, reader); every\ncall must then authenticate. Reloaded when it changes. In a cluster it needs TLS")
	fs.StringVar(&f.auditLog, "audit-log", "", "`file` to append the audit log to, one JSON line per Admin call, per call a node\ncertificate makes for itself, and per refused call (a caller refused again and again from\none address: its first refusal, then one line every 10 s with the count) (default: the\nnode's log)")
	fs.IntVar(&f.auditLogMaxSize, "audit-log-max-size", 100, "`MiB` the --audit-log file may reach before it is rotated (to FILE.1, FILE.2, ...; 0 never)")
	fs.IntVar(&f.auditLogMaxFiles, "audit-log-max-files", 10, "rotated --audit-log files kept; the oldest beyond are removed")
	gossips := "every node needs it"
	if cmd == "dev" {
		gossips = "the nodes of --nodes share it"
	}
	fs.StringVar(&f.gossipKeyFile, "gossip-key-file", "", "`file` of gossip encryption keys, base64, one per line (# comments allowed), made with\n"+
		"head -c 32 /dev/urandom | base64: the first line's key encrypts, every line's decrypts. Set,\n"+
		"gossip is encrypted and authenticated and a member without the cluster's keys cannot join;\n"+
		gossips+". Re-read when it changes: to rotate, add the new key as a second line\n"+
		"everywhere, then move it first everywhere, then remove the old one (docs/operations.md)")
	fs.IntVar(&f.maxConnections, "max-connections", node.DefaultMaxConnections, "most client connections the gRPC port holds at once; one more waits in the kernel's\naccept queue until another closes")
	consoleDefault, consoleWhy := "read-only", "read-only in serve: a console that changes events is turned on, not found on"
	if cmd == "dev" {
		consoleDefault, consoleWhy = "on", "on in dev"
	}
	fs.StringVar(&f.console, "console", consoleDefault, "the web console on the HTTP port under /ui/: off, read-only (find and read events, the\n"+
		"cluster), or on (also cancel, reschedule, fire now, edit, bulk cancel, as the signed-in\n"+
		"credential's role permits); "+consoleWhy+". With --auth-file it asks for a sign-in\n"+
		"(a token, or a client certificate the browser presents), acts as that credential and\n"+
		"needs TLS (--auth-file without --tls-cert turns the default off)")
	fs.BoolVar(&f.debugEndpoints, "debug-endpoints", false, "serve /debug/pprof/ (profiles) and /debug/pebble (the LSM report) on the HTTP port")
	registerTopicFlags(fs, &f.reservedTopics, &f.allowTopics)
	f.ingest = registerIngestFlags(fs, cmd)
	fs.DurationVar(&f.diskFailure, "disk-failure-timeout", raftfsm.DefaultFailAfter, "how long --data-dir may fail writes (Pebble's flushes failing, or one write to Pebble or a\nRaft log stalled) before chimed exits with status 1, so that replicas on working disks lead\nits shards: a node that cannot write applies and fires nothing. What Pebble had not flushed\nis in the Raft log")
	fs.DurationVar(&f.timeout, "shutdown-timeout", 30*time.Second, "how long a graceful shutdown may take before it is forced: what has not stopped 5 s\nlater is left, and chimed exits with status 1")
	fs.DurationVar(&f.startupWait, "startup-wait", time.Minute, "how long to wait for shard leaders before printing the startup banner (the node serves either way)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		what := `one Chime node against an external Kafka. The first node of a cluster is
started without --join and creates it (with --shards, --replication and --retention);
every other node is started with --join naming one or more members`
		if cmd == "dev" {
			what = "Chime with an embedded Kafka-protocol broker, for trying it and for\ndevelopment: one node, or a local cluster with --nodes; Kafka data is kept\nunder --data-dir/kafka. With --kafka-sasl-mechanism the embedded broker demands that\nSASL user; it serves plaintext only, so the --kafka-tls* flags are refused"
		}
		fmt.Fprintf(stderr, "Usage: chimed %s [flags]\n\nRuns %s.\nSIGINT or SIGTERM shut it down gracefully.\n\nFlags:\n", cmd, what)
		fs.PrintDefaults()
		fmt.Fprint(stderr, envHelp())
		if cmd == "dev" {
			fmt.Fprint(stderr, "\nExamples:\n  chimed dev\n  chimed dev --nodes 3\n  chimed dev --data-dir /tmp/chime --kafka-addr 127.0.0.1:19092\n")
		} else {
			fmt.Fprint(stderr, `
Examples:
  # the first node creates the cluster, secured (see the README's Security section)
  chimed serve --node-id a --kafka-brokers kafka:9092 --data-dir /var/lib/chime \
      --grpc-addr 10.0.0.1:7070 --raft-addr 10.0.0.1:7071 --gossip-addr 10.0.0.1:7072 \
      --tls-cert a.pem --tls-key a-key.pem --tls-ca nodes-ca.pem --tls-client-ca clients-ca.pem \
      --auth-file auth.json --gossip-key-file gossip.keys
  # the others join it, each with its own certificate and the same other files
  chimed serve --node-id b ... --grpc-addr 10.0.0.2:7070 ... --join 10.0.0.1:7072
  # on a network you trust, in the clear
  chimed serve --node-id a --kafka-brokers kafka:9092 --grpc-addr 10.0.0.1:7070 ... --insecure
`)
		}
	}
	return f
}

// The ports chimed dev derives from --grpc-addr's for the addresses not
// given, matching the defaults 7070 (gRPC), 7071, 7072 and 7080, so that a
// second dev started with only --grpc-addr (and --kafka-addr) takes a free
// set of ports.
const (
	raftOffset   = 1
	gossipOffset = 2
	httpOffset   = 10
)

// followGRPC sets, in dev, every address among --raft-addr, --gossip-addr
// and --http-addr that was not given to --grpc-addr's host with its port
// plus the offset. A gRPC port of 0 (any free port) gives 0 too.
func (f *flags) followGRPC() error {
	given := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	host, portStr, err := net.SplitHostPort(f.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr %q: %w", f.grpcAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--grpc-addr %q: port %q is not a number", f.grpcAddr, portStr)
	}
	for _, a := range []struct {
		name   string
		addr   *string
		offset int
	}{{"raft-addr", &f.raftAddr, raftOffset}, {"gossip-addr", &f.gossipAddr, gossipOffset}, {"http-addr", &f.httpAddr, httpOffset}} {
		if given[a.name] {
			continue
		}
		p := 0
		if port != 0 {
			p = port + a.offset
		}
		*a.addr = net.JoinHostPort(host, strconv.Itoa(p))
	}
	return nil
}

// exposed returns the first of the node's listen addresses that is not on
// loopback (a host that is not a loopback IP, "localhost", or empty, which
// listens on every interface), with its flag; "" when all are loopback.
func exposed(f *flags) (flag, addr string) {
	addrs := []struct{ flag, addr string }{
		{"grpc-addr", f.grpcAddr}, {"http-addr", f.httpAddr}, {"raft-addr", f.raftAddr}, {"gossip-addr", f.gossipAddr},
	}
	if f.kafkaAddr != "" {
		addrs = append(addrs, struct{ flag, addr string }{"kafka-addr", f.kafkaAddr})
	}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a.addr)
		if err != nil {
			return a.flag, a.addr // refused later, with the parse error
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return a.flag, a.addr
		}
	}
	return "", ""
}

// missingProtection says what an exposed node lacks, and what anyone who
// reaches it could then do; "" when it lacks nothing.
func missingProtection(tls, auth, gossipKey bool) string {
	var missing []string
	if !tls {
		missing = append(missing, "encryption (--tls-cert, --tls-key, --tls-ca)")
	}
	if !auth {
		missing = append(missing, "authentication (--auth-file)")
	}
	if !gossipKey {
		missing = append(missing, "gossip encryption (--gossip-key-file)")
	}
	if len(missing) == 0 {
		return ""
	}
	could := "read every event, schedule, cancel, drain and join"
	switch {
	case tls && auth:
		could = "join the gossip and unsettle the placement"
	case tls:
		could = "schedule, cancel and drain"
	}
	return fmt.Sprintf("without %s: anyone who reaches it could %s", strings.Join(missing, ", "), could)
}

// lockDataDir takes an exclusive lock on dataDir/chimed.lock for as long as
// the process runs, so that a second chimed on the same --data-dir stops at
// once with an error naming it, instead of failing later on a lock inside
// Pebble, bbolt or the embedded broker (or sharing the broker's files).
func lockDataDir(dataDir string) (*os.File, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", dataDir, err)
	}
	path := filepath.Join(dataDir, "chimed.lock")
	lf, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", dataDir, err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lf.Close() // nothing was written to it; the lock's error is the one to report
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("--data-dir %s is in use by another chimed (it holds %s): give each chimed its own --data-dir", dataDir, path)
		}
		return nil, fmt.Errorf("--data-dir %s: locking %s: %w", dataDir, path, err)
	}
	return lf, nil
}

func runNode(cmd string, args []string, stdout, stderr io.Writer) int {
	f := newFlags(cmd, stderr)
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	unknownEnv, err := setFromEnv(f.fs, []string{"allow-topic"}, os.Environ())
	if err != nil {
		fmt.Fprintf(stderr, "chimed %s: %v\n", cmd, err)
		return 2
	}
	if cmd == "dev" {
		if err := f.followGRPC(); err != nil {
			fmt.Fprintf(stderr, "chimed dev: %v\n", err)
			return 2
		}
	}
	if f.fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chimed %s: unexpected argument %q\n", cmd, f.fs.Arg(0))
		return 2
	}
	kafkaSec, err := f.kafka.Security(os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "chimed %s: %v\n", cmd, err)
		return 2
	}
	if cmd == "dev" && kafkaSec.TLS != nil {
		fmt.Fprintln(stderr, "chimed dev: the embedded broker serves plaintext only: --kafka-tls, --kafka-tls-ca, --kafka-tls-cert and --kafka-tls-key are for chimed serve")
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "chimed: --log-level: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if len(unknownEnv) > 0 {
		logger.Warn("ignoring environment variables that name no flag of chimed "+cmd, "vars", unknownEnv)
	}
	// tlsFor loads the TLS files of node id, whose name in --tls-cert and
	// --tls-key a dev cluster's {node} stands for.
	tlsFor := func(id string) (*certs.Source, error) {
		files := certs.Files{Cert: strings.ReplaceAll(f.tlsCert, nodePlaceholder, id), Key: strings.ReplaceAll(f.tlsKey, nodePlaceholder, id),
			CA: f.tlsCA, ClientCA: f.tlsClientCA}
		src, err := certs.Load(files, logger.With("component", "tls"))
		if err == nil {
			err = src.CheckNode(id)
		}
		return src, err
	}
	var tlsSource *certs.Source
	if f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != "" || f.tlsClientCA != "" {
		var err error
		switch devCluster := cmd == "dev" && f.nodes > 1; {
		case devCluster && (!strings.Contains(f.tlsCert, nodePlaceholder) || !strings.Contains(f.tlsKey, nodePlaceholder)):
			err = fmt.Errorf("--nodes %d with TLS: each node needs a certificate of its own, naming %s: put %s in --tls-cert and --tls-key where its id goes (node-0, node-1, ...), e.g. --tls-cert 'node-%s.pem' --tls-key 'node-%s-key.pem'",
				f.nodes, certs.NodeIDName("<node-id>"), nodePlaceholder, nodePlaceholder, nodePlaceholder)
		case devCluster:
			// Every node's files are checked before any starts; each node
			// loads its own (see the loop that starts them).
			for i := range f.nodes {
				if tlsSource, err = tlsFor(devNode(node.Config{Logger: logger}, i).NodeID); err != nil {
					break
				}
			}
		default:
			tlsSource, err = tlsFor(f.nodeID)
		}
		if err != nil {
			fmt.Fprintf(stderr, "chimed %s: %v\n", cmd, err)
			return 2
		}
	}
	if f.gossipKeyFile != "" {
		if cmd == "dev" && f.nodes <= 1 {
			fmt.Fprintln(stderr, "chimed dev: --gossip-key-file encrypts gossip, and one dev node does not gossip: add --nodes 3, or drop the flag")
			return 2
		}
		data, err := os.ReadFile(f.gossipKeyFile)
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			err = pe.Err // the path is in the message already
		}
		if err == nil {
			_, err = membership.ParseKeyFile(data)
		}
		if err != nil {
			fmt.Fprintf(stderr, "chimed %s: --gossip-key-file %s: %v\n", cmd, f.gossipKeyFile, err)
			return 2
		}
	}
	if cmd == "dev" && !f.insecure {
		if flag, addr := exposed(f); flag != "" {
			fmt.Fprintf(stderr, "chimed dev: --%s %s is reachable beyond this machine, and chimed dev serves its embedded Kafka broker there without TLS or authentication, to anyone; pass --insecure to serve on a network you trust anyway\n", flag, addr)
			return 2
		}
	}
	if cmd == "serve" && !f.insecure {
		if flag, addr := exposed(f); flag != "" {
			if why := missingProtection(tlsSource != nil, f.authFile != "", f.gossipKeyFile != ""); why != "" {
				fmt.Fprintf(stderr, "chimed serve: --%s %s is reachable beyond this machine, %s; pass --insecure to serve on a network you trust anyway\n", flag, addr, why)
				return 2
			}
		}
	}
	topicLimits, err := topiclimit.Parse(f.topicRateLimit)
	if err != nil {
		fmt.Fprintf(stderr, "chimed: --topic-rate-limit: %v\n", err)
		return 2
	}
	if f.auditLogMaxSize < 0 || f.auditLogMaxFiles < 0 {
		fmt.Fprintf(stderr, "chimed: --audit-log-max-size %d, --audit-log-max-files %d: must not be negative\n", f.auditLogMaxSize, f.auditLogMaxFiles)
		return 2
	}
	var audit io.Writer
	if f.auditLog != "" {
		af, err := auth.OpenRotatingFile(f.auditLog, int64(f.auditLogMaxSize)<<20, f.auditLogMaxFiles)
		if err != nil {
			fmt.Fprintf(stderr, "chimed: --audit-log: %v\n", err)
			return 2
		}
		// Closing flushes the audit log's last records: a failure loses
		// some, which the operator must hear of.
		defer func() {
			if err := af.Close(); err != nil {
				fmt.Fprintf(stderr, "chimed: --audit-log: %v\n", err)
			}
		}()
		audit = af
	}
	fail := func(err error) int {
		logger.Error("chimed failed", "err", err)
		return 1
	}
	started := time.Now()
	lock, err := lockDataDir(f.dataDir)
	if err != nil {
		return fail(err)
	}
	// The lock file is empty; the lock goes with the process in any case.
	defer func() { _ = lock.Close() }()

	// Every check of the flags comes before anything is started: a bad
	// value stops chimed dev before its embedded broker takes its port.
	lim := rpc.DefaultLimits()
	lim.MaxPayloadBytes = f.maxPayload
	lim.MaxHorizon = f.maxHorizon
	if f.maxCatchUp < 1 {
		fmt.Fprintf(stderr, "chimed: --max-catch-up %d: must be at least 1 (a schedule with catch-up SKIP produces no missed occurrence)\n", f.maxCatchUp)
		return 2
	}
	lim.MaxCatchUp = f.maxCatchUp
	own := []string{f.deadLetter}
	if f.ingest.topics != "" {
		own = append(own, f.ingest.rejected)
	}
	setTopicLimits(&lim, f.reservedTopics, f.allowTopics, own...)
	if err := lim.Validate(); err != nil {
		fmt.Fprintf(stderr, "chimed: %v\n", err)
		return 2
	}
	sources, err := f.ingest.sources()
	if err != nil {
		fmt.Fprintf(stderr, "chimed: %v\n", err)
		return 2
	}
	consoleMode, err := console.ParseMode(f.console)
	if err != nil {
		fmt.Fprintf(stderr, "chimed: %v\n", err)
		return 2
	}
	var brokers []string
	if cmd == "dev" {
		broker, err := node.StartBroker(f.kafkaAddr, f.dataDir, kafkaSec.SASL)
		if err != nil {
			return fail(fmt.Errorf("--kafka-addr %s: %w", f.kafkaAddr, err))
		}
		defer broker.Close()
		brokers = broker.ListenAddrs()
	} else {
		brokers = strings.Fields(strings.ReplaceAll(f.brokers, ",", " ")) // commas or spaces separate
		if len(brokers) == 0 {
			fmt.Fprintln(stderr, "chimed serve: --kafka-brokers is required (for example --kafka-brokers localhost:9092)")
			return 2
		}
		if tlsSource != nil && kafkaSec.TLS == nil && !f.kafkaInsecure {
			fmt.Fprintln(stderr, "chimed serve: this node serves TLS (--tls-cert) but would produce to Kafka in plaintext: give --kafka-tls (or --kafka-tls-ca), or --kafka-insecure if the brokers are on a network you trust")
			return 2
		}
		if s := kafkaSec.SASL; s != nil && s.Mechanism == publish.SASLPlain && kafkaSec.TLS == nil {
			logger.Warn("--kafka-sasl-mechanism PLAIN without --kafka-tls sends the Kafka password in the clear")
		}
	}
	if f.wheelHorizon < time.Second {
		fmt.Fprintf(stderr, "chimed: --wheel-horizon %v: must be at least 1s (the wheel must hold the events about to fire, and those a load brings in)\n", f.wheelHorizon)
		return 2
	}
	consoleGiven := false
	f.fs.Visit(func(fl *flag.Flag) { consoleGiven = consoleGiven || fl.Name == "console" })
	if !consoleGiven && f.authFile != "" && f.tlsCert == "" {
		// A signed-in console needs TLS: by default, a node secured by
		// tokens alone serves none rather than refusing to start.
		consoleMode = console.Off
	}
	base := node.Config{
		NodeID: f.nodeID, DataDir: f.dataDir, GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr,
		RaftAddr: f.raftAddr, Brokers: brokers, KafkaSecurity: kafkaSec, KafkaExistingTopicsOnly: !f.autoCreateTopics, Shards: f.shards, Limits: lim, TopicLimits: topicLimits,
		Tuning: shard.Tuning{Resolution: f.resolution, ClockSkewBound: f.maxClockSkew, Retention: time.Duration(f.retention),
			WheelHorizon: f.wheelHorizon, DiskFailAfter: f.diskFailure},
		MaxInFlight: f.maxInFlight, MaxAttempts: f.maxAttempts, DeadLetter: f.deadLetter, DebugEndpoints: f.debugEndpoints, Console: consoleMode, MaxConnections: f.maxConnections,
		Logger: logger, Now: nodeClock(), Cluster: cmd == "serve" || f.nodes > 1, GossipAddr: f.gossipAddr, AdvertiseHost: f.advertiseHost,
		Join: strings.Fields(strings.ReplaceAll(f.join, ",", " ")), Replication: f.replication, DeadTimeout: f.deadTimeout,
		HTTPHandlers: registerFaultHandlers, TLS: tlsSource, AuthFile: f.authFile, Audit: audit, GossipKeyFile: f.gossipKeyFile,
		Ingest: ingest.Config{Sources: sources, Group: f.ingest.group, RejectedTopic: f.ingest.rejected, DryRun: f.ingest.dryRun},
		// A node whose data directory cannot be written has logged why:
		// the process ends at once, so that replicas on working disks
		// lead its shards.
		OnFatal: func(error) { os.Exit(1) },
	}
	if cmd == "serve" {
		f.nodes = 1
	}
	if f.nodes < 1 {
		fmt.Fprintln(stderr, "chimed dev: --nodes must be at least 1")
		return 2
	}
	if !base.Cluster {
		base.Replication = 1
	}
	var nodes []*node.Node
	closeAll := func(ctx context.Context) error {
		var errs []error
		for i := len(nodes) - 1; i >= 0; i-- {
			errs = append(errs, nodes[i].Close(ctx))
		}
		return errors.Join(errs...)
	}
	for i := range f.nodes {
		cfg := base
		if f.nodes > 1 {
			cfg = devNode(base, i)
			if i > 0 {
				cfg.Join = []string{nodes[0].GossipAddr()}
			}
			if cfg.TLS != nil {
				src, err := tlsFor(cfg.NodeID)
				if err != nil {
					if cerr := closeAll(context.Background()); cerr != nil {
						logger.Error("closing the nodes started", "err", cerr)
					}
					return fail(err)
				}
				cfg.TLS = src
			}
		}
		n, err := node.Start(cfg)
		if err != nil {
			if cerr := closeAll(context.Background()); cerr != nil {
				logger.Error("closing the nodes started", "err", cerr)
			}
			return fail(err)
		}
		nodes = append(nodes, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The banner waits for shard leaders, but a node whose shards cannot
	// elect one yet (its peers down or partitioned) keeps running: it is
	// part of what brings them back. (The fault tests found a node that
	// exited here and so kept its shards without quorum.)
	readyCtx, cancel := context.WithTimeout(ctx, f.startupWait)
	for _, n := range nodes {
		if err = n.WaitReady(readyCtx); err != nil {
			break
		}
	}
	cancel()
	if ctx.Err() != nil {
		// Shut down by a signal before the banner: as after it, a node that
		// fails to close fails the run.
		if err := closeAll(context.Background()); err != nil {
			return fail(fmt.Errorf("shutdown: %w", err))
		}
		return 0
	}
	if err != nil {
		logger.Warn("not every shard has a leader yet; serving anyway", "waited", f.startupWait, "err", err)
	}
	printBanner(stdout, cmd, nodes, brokers, f.kafka.Args(), time.Since(started))

	serveErr := make(chan error, len(nodes))
	for _, n := range nodes {
		go func() {
			select {
			case err := <-n.ServeErr():
				serveErr <- err
			case <-ctx.Done():
			}
		}()
	}
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		logger.Error("server stopped", "err", err)
	}
	stop() // a second signal now kills the process
	logger.Info("shutting down", "timeout", f.timeout)
	sctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	if err := closeWithin(sctx, shutdownGrace, closeAll); err != nil {
		return fail(fmt.Errorf("shutdown: %w", err))
	}
	logger.Info("stopped")
	return 0
}

// devNode derives node i of a local cluster: its own data directory, ports
// shifted by 100*i, and the node id node-i.
// nodePlaceholder in a dev cluster's --tls-cert and --tls-key stands for
// each node's id: every node has a certificate of its own.
const nodePlaceholder = "{node}"

func devNode(base node.Config, i int) node.Config {
	cfg := base
	cfg.NodeID = fmt.Sprintf("node-%d", i)
	cfg.DataDir = filepath.Join(base.DataDir, cfg.NodeID)
	shift := func(addr string) string {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return addr
		}
		p, _ := strconv.Atoi(port)
		return net.JoinHostPort(host, strconv.Itoa(p+100*i))
	}
	cfg.GRPCAddr, cfg.HTTPAddr = shift(base.GRPCAddr), shift(base.HTTPAddr)
	cfg.RaftAddr, cfg.GossipAddr = shift(base.RaftAddr), shift(base.GossipAddr)
	cfg.Logger = base.Logger.With("node", cfg.NodeID)
	return cfg
}

// printBanner says the node is up, where it listens, and how to try it.
// kafkaArgs are the --kafka-tls* and --kafka-sasl-* flags given, which the
// chimectl tail hint repeats; kcat's are not shown, nor its hint then.
func printBanner(w io.Writer, cmd string, nodes []*node.Node, brokers, kafkaArgs []string, took time.Duration) {
	kafka := strings.Join(brokers, ",")
	if cmd == "dev" {
		kafka += "   (embedded broker; topics are created on first use)"
	}
	first := nodes[0]
	what := fmt.Sprintf("node %q", first.Config().NodeID)
	if len(nodes) > 1 {
		what = fmt.Sprintf("%d-node cluster", len(nodes))
	}
	fmt.Fprintf(w, "chimed %s: %s ready in %v\n", cmd, what, took.Round(time.Millisecond))
	for _, n := range nodes {
		cfg := n.Config()
		if len(nodes) > 1 {
			fmt.Fprintf(w, "  %s\n", cfg.NodeID)
		}
		fmt.Fprintf(w, "  gRPC   %s   (chime.v1.Scheduler, server reflection on)\n", n.GRPCAddr())
		scheme := "http"
		if cfg.TLS != nil {
			scheme = "https"
		}
		fmt.Fprintf(w, "  HTTP   %s://%s   (/healthz /readyz /metrics)\n", scheme, n.HTTPAddr())
		if cfg.Console != console.Off {
			fmt.Fprintf(w, "  UI     %s://%s/ui/   (the web console, %s)\n", scheme, n.HTTPAddr(), cfg.Console)
		}
		fmt.Fprintf(w, "  Raft   %s\n", n.RaftAddr())
		if g := n.GossipAddr(); g != "" {
			fmt.Fprintf(w, "  gossip %s\n", g)
		}
		ret := "settled events kept forever"
		if r := daysDuration(cfg.Tuning.Retention); r > 0 {
			ret = "settled events kept " + r.String()
		}
		fmt.Fprintf(w, "  data   %s   (%d shards, replication %d, %s)\n", cfg.DataDir, cfg.Shards, cfg.Replication, ret)
	}
	fmt.Fprintf(w, "  Kafka  %s\n", kafka)
	ingestTopic := ""
	if srcs := first.Config().Ingest.Sources; len(srcs) > 0 {
		topics := make([]string, len(srcs))
		for i, s := range srcs {
			topics[i] = s.Topic + " (" + s.Format + ")"
		}
		if f := srcs[0].Format; f == "" || f == "chime" {
			ingestTopic = srcs[0].Topic
		}
		fmt.Fprintf(w, "  Ingest %s   (produce a record to schedule: docs/ingest.md)\n", strings.Join(topics, ", "))
	}
	tailArgs := ""
	if len(kafkaArgs) > 0 {
		tailArgs = " " + strings.Join(kafkaArgs, " ")
	}
	fmt.Fprintf(w, `
Try it:
  go run ./cmd/chimectl tail --brokers %[2]s%[3]s --topic demo --from-beginning &
  go run ./cmd/chimectl --addr %[1]s schedule --topic demo --in 2s --payload hello
  grpcurl -plaintext -d '{"event":{"topic":"demo","delay":"2s","payload":"aGVsbG8="}}' %[1]s chime.v1.Scheduler/Schedule
`, first.GRPCAddr(), brokers[0], tailArgs)
	if len(kafkaArgs) == 0 {
		fmt.Fprintf(w, "  kcat -C -b %s -t demo -f '%%s  %%h\\n'\n", brokers[0])
		if ingestTopic != "" {
			fmt.Fprintf(w, "  echo hello | kcat -P -b %s -t %s -k my-id -H chime-delay=2s -H chime-topic=demo\n", brokers[0], ingestTopic)
		}
	}
	if len(nodes) > 1 {
		fmt.Fprintf(w, "  go run ./cmd/chimectl --addr %s status\n", first.GRPCAddr())
	}
}

// daysDuration is a flag value that reads Go durations and whole or
// fractional days ("7d", "1.5d"), since retention is naturally counted in
// days and time.ParseDuration stops at hours.
type daysDuration time.Duration

func (d daysDuration) String() string {
	v := time.Duration(d)
	if v > 0 && v%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", v/(24*time.Hour))
	}
	return v.String()
}

func (d *daysDuration) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 || n > 100*365 {
			return fmt.Errorf("%q is not a number of days from 0 to 36500", s)
		}
		*d = daysDuration(n * float64(24*time.Hour))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (like 7d, 36h or 90m)", s)
	}
	if v < 0 {
		return fmt.Errorf("%q is negative", s)
	}
	*d = daysDuration(v)
	return nil
}
