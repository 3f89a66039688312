package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/chimehq/chime/backup"
	"github.com/chimehq/chime/node"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/rpc"
)

const restoreAbout = `Usage: chimed restore --from DIR --backup-key-file FILE [flags]

Creates the data directory of a new cluster's first node from a backup that
chimectl backup wrote to DIR. It checks the whole backup before it writes
anything: the manifest's format version and its signature, then every shard
file's size and SHA-256 against the manifest, and its stream as a restore
will (the shard and applied index it names, every frame, its checksum and
counters), and the topic of every event and recurring schedule in it. A
corrupt, incomplete, forged or mismatched backup is refused with the file
and the rule, e.g.
"backup DIR: shard-002.snap: sha256 mismatch (manifest says ..., file has ...)",
and --data-dir is left empty. --data-dir must be new or empty.

It then lays out --data-dir as a node that founds a new cluster with the
backup's shard count, replication and retention (and a new cluster id): each
shard's copy becomes that shard's Raft snapshot, with --node-id at --raft-addr
its only voter. Start chimed on it with the same --node-id, --data-dir and
--raft-addr and without --join; as each shard opens it loads its copy, then
fires every pending event, those that fell due since the backup at once (as
after a restart), and answers Get for every event the backup holds. Other
nodes join it with --join as they join any cluster, and receive their
replicas from it. Nothing is copied into Kafka: records fired before the
backup are not produced again, and events the old cluster fired after the
backup was taken are produced again (with the same chime-id), since the
backup holds them as pending.

The manifest is signed with the backup key (an HMAC-SHA256 over every field,
so over each shard file's size and SHA-256 and the source cluster's id) when
chimectl backup was given --backup-key-file. Give the same file here: a
manifest that does not verify with it, or carries no signature, is refused.
The key is the file's content with surrounding whitespace trimmed, at least
32 bytes, in a file only its owner may read or write:
  (umask 077; head -c 32 /dev/urandom | base64 > /etc/chime/backup.key)
Without --backup-key-file the backup is refused unless --allow-unsigned is
given, which restores a backup taken without a key (or by a chimectl before
backups were signed) and checks no signature.

An event or recurring schedule whose topic is reserved (--reserved-topics,
--dead-letter-topic, with the meaning chimed serve gives them; --allow-topic
exempts a topic) is refused with its shard, id and topic: the API would
refuse to schedule it, and a restored node fires what it holds without the
checks the API makes.

Flags:
`

const restoreExamples = `
Examples:
  # the signed backup of a cluster, then its restore onto a new machine
  chimectl --addr 10.0.0.1:7070 backup --out /backups/b1 --backup-key-file /etc/chime/backup.key
  chimed restore --from /backups/b1 --backup-key-file /etc/chime/backup.key \
      --data-dir /var/lib/chime --node-id a --raft-addr 10.0.1.1:7071
  chimed serve --node-id a --data-dir /var/lib/chime --raft-addr 10.0.1.1:7071 --kafka-brokers kafka:9092 \
      --grpc-addr 10.0.1.1:7070 --gossip-addr 10.0.1.1:7072
  # the first node of chimed dev --nodes 3 (node-0, Raft on 7071; node-1 and node-2 join it),
  # from a backup taken without a key
  chimed restore --from /backups/b1 --allow-unsigned --data-dir ./chime-data/node-0 --node-id node-0 --raft-addr 127.0.0.1:7071
  chimed dev --nodes 3
`

func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chimed restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defNode, _ := os.Hostname()
	from := fs.String("from", "", "the backup `directory` (chimectl backup --out); required")
	dataDir := fs.String("data-dir", "./chime-data", "the new node's data directory; must be new or empty")
	nodeID := fs.String("node-id", defNode, "the id the node will run with (chimed serve --node-id)")
	raftAddr := fs.String("raft-addr", "127.0.0.1:7071", "the Raft address the node will run with (chimed serve --raft-addr), which the other nodes reach it at")
	advertiseHost := fs.String("advertise-host", "", "the `host` the node will run with (chimed serve --advertise-host): with it, the Raft address is this\nhost with --raft-addr's port, kept as a name")
	replication := fs.Int("replication", 0, "replicas per shard of the new cluster; 0 keeps the backed-up cluster's")
	keyFile := fs.String("backup-key-file", "", "`file` of the backup key chimectl backup --backup-key-file signed the manifest with: the\nmanifest must verify with it. At least 32 bytes, surrounding whitespace trimmed, readable by\nits owner only")
	allowUnsigned := fs.Bool("allow-unsigned", false, "restore without --backup-key-file: a backup taken without a key, or a signed one without\nchecking its signature")
	deadLetter := fs.String("dead-letter-topic", publish.DefaultDeadLetterTopic, "the dead-letter `topic` the node will run with (chimed serve --dead-letter-topic), which no\nevent may target")
	var reservedTopics, allowTopics []string
	registerTopicFlags(fs, &reservedTopics, &allowTopics)
	fs.Usage = func() {
		fmt.Fprint(stderr, restoreAbout)
		fs.PrintDefaults()
		fmt.Fprint(stderr, envHelp())
		fmt.Fprint(stderr, restoreExamples)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "chimed restore: "+format+"\nRun 'chimed restore --help' for usage.\n", a...)
		return 2
	}
	// The variables of chimed serve that restore has no flag for (a
	// container's environment sets them all) are not mistakes here.
	if _, err := setFromEnv(fs, []string{"allow-topic"}, os.Environ()); err != nil {
		return usage("%v", err)
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected argument %q", fs.Arg(0))
	case *from == "":
		return usage("--from is required: the backup directory chimectl backup wrote")
	case *nodeID == "":
		return usage("--node-id must not be empty")
	case *replication < 0:
		return usage("--replication must not be negative")
	case *keyFile != "" && *allowUnsigned:
		return usage("give --backup-key-file or --allow-unsigned, not both: with the key, a backup must be signed with it")
	}
	var key []byte
	if *keyFile != "" {
		var err error
		if key, err = backup.ReadKeyFile(*keyFile); err != nil {
			return usage("%v", err)
		}
	}
	var lim rpc.Limits
	setTopicLimits(&lim, reservedTopics, allowTopics, *deadLetter)
	if err := lim.Validate(); err != nil {
		return usage("%v", err)
	}
	advertised, err := raftAdvertise(*raftAddr, *advertiseHost)
	if err != nil {
		return usage("%v", err)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "chimed restore: %v\n", err)
		return 1
	}
	lock, err := lockDataDir(*dataDir)
	if err != nil {
		return fail(err)
	}
	// The lock file is empty; the lock goes with the process in any case.
	defer func() { _ = lock.Close() }()
	m, err := node.Restore(node.RestoreConfig{
		From: *from, DataDir: *dataDir, NodeID: *nodeID, RaftAddr: advertised, Replication: *replication,
		Key: key, AllowUnsigned: *allowUnsigned, Limits: lim,
		Progress: func(msg string) { fmt.Fprintln(stdout, msg) },
	})
	if err != nil {
		return fail(err)
	}
	rep := m.Replication
	if *replication > 0 {
		rep = *replication
	}
	ret := "settled events kept forever"
	if r := daysDuration(m.Retention); r > 0 {
		ret = "settled events kept " + r.String()
	}
	source := "cluster " + m.ClusterID
	if m.ClusterID == "" {
		source = "a cluster with no id"
	}
	fmt.Fprintf(stdout, `restored %d shards into %s as node %q (replication %d, %s), from the backup of %s taken %s
Start it with the same --node-id, --data-dir and --raft-addr, and no --join:
  chimed serve --node-id %s --data-dir %s --raft-addr %s --kafka-brokers HOST:PORT ...
Other nodes join it with --join <its --gossip-addr>.
`, m.ShardCount, *dataDir, *nodeID, rep, ret, source, m.Created.Format("2006-01-02T15:04:05Z07:00"), *nodeID, *dataDir, advertised)
	return 0
}

// raftAdvertise is the Raft address a node started with --raft-addr addr
// (and --advertise-host) advertises. The restored shards' configurations
// must name exactly it: with an advertise host, that host (kept as a name)
// and addr's port; without, the listener's address, so a host name is
// resolved as the listener would resolve it, and an address the other
// nodes cannot dial (no port, an unspecified IP) is refused.
func raftAdvertise(addr, advertiseHost string) (string, error) {
	if advertiseHost != "" {
		_, port, err := net.SplitHostPort(addr)
		if err != nil || port == "0" {
			return "", fmt.Errorf("--raft-addr %q: give the address chimed serve will listen on, with its port", addr)
		}
		return net.JoinHostPort(advertiseHost, port), nil
	}
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--raft-addr %q: %v", addr, err)
	}
	if ta.Port == 0 || ta.IP == nil || ta.IP.IsUnspecified() {
		return "", fmt.Errorf("--raft-addr %q: give the address the other nodes reach this node's Raft port at (an IP or host name, and a port), the one chimed serve will run with", addr)
	}
	return ta.String(), nil
}
