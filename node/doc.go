// Package node assembles one Chime node from its parts and runs it: Pebble,
// the Kafka publisher, the shard host, gossip and the control plane (in
// cluster mode), and the gRPC and HTTP servers. chimed runs it from flags;
// its test kit, nodetest, runs several in one process; client/chimetest
// runs one (StartDev). It is a library: what the process does about an
// error is its caller's to decide.
//
// # Starting
//
// Start runs one step after another (start.go), each a function that
// either finishes or returns an error, leaving what the earlier steps
// started to Close: openDataDir, checkConfig, listen (the Raft, gRPC and
// HTTP ports and the addresses advertised for them), settleCluster
// (cluster.json, and in cluster mode the gossip and joining, joinCluster),
// openStorage (Pebble, the publisher), startControlPlane, openShards (the
// replicas, on the Raft port), serveGRPC and serveHTTP.
//
// # What it owns
//
//   - The data directory's layout and cluster.json, written once when the
//     directory is created (through internal/durable: a crash leaves the
//     whole file or none), so that a restart cannot change the shard count,
//     the replication or the node id fixed then. A cluster.json no node
//     writes (no node id, a shard count outside 1..membership.MaxShards, a
//     negative replication or retention) fails Start, naming the field.
//   - Restoring (Restore): a backup directory (package backup), checked
//     whole first (its manifest's HMAC with the backup key, or, told to
//     take an unsigned backup, none; every shard file and stream; and the
//     topic of every event and recurring schedule it holds against the
//     reserved topics the node will run with, since a restored node fires
//     what it holds without the API's checks), laid out as a new cluster's
//     first node: each shard's
//     stream planted as its replica's one Raft snapshot (shard.PlantSnapshot)
//     and cluster.json with the backup's parameters, a new cluster id and the
//     Raft address the shards' configurations name. A directory a restore
//     did not finish (restore.incomplete) and a restored one under another
//     node id or Raft address are refused at Start.
//   - Joining: a new node learns the cluster's parameters from the members'
//     gossip; a node with data checks that the members agree, and reaches the
//     members it knew (peers.json) without needing a seed to answer.
//   - The gossip key file (Config.GossipKeyFile, chimed --gossip-key-file):
//     read at Start, then looked at every second and applied to the
//     membership (SetKeys) when it changed; a change that does not load is
//     logged once, counted (chime_gossip_key_file_errors_total) and the keys
//     in use kept. chime_gossip_key_info names the keys in use by id.
//   - Security wiring: with Config.TLS (an rpc/certs Source) every port
//     and the node's own calls to other nodes are TLS (the Raft port and
//     node-to-node calls mutual, nodes only); with Config.AuthFile the gRPC
//     server authorizes every call (rpc/auth) and the debug endpoints are
//     an admin's, and a cluster node refuses to start without TLS, by which
//     nodes know each other. Requests are bounded by the event limits
//     (rpc.Limits.MaxRequestBytes) and 128 concurrent calls per connection.
//   - chimed dev's embedded broker and single-node assembly (dev.go):
//     StartBroker runs kfake as chimed dev does, and StartDev starts it with
//     one node on loopback ports and waits until the node is ready, for
//     tests (client/chimetest.StartDev) and tools that want a whole Chime
//     in process. chimed dev itself starts the broker with StartBroker.
//   - Start and Close order: Close leaves the gossip first (a member that left
//     is not suspected), stops taking requests, then closes the shards, the
//     control plane, gossip, the publisher and Pebble.
//
// # What it must never do
//
//   - Parse flags or exit the process: nothing here calls os.Exit or
//     log.Fatal, and errors go to the caller, which names the flag. When its
//     data directory cannot be written (the store, a replica or Pebble's
//     fatal log line says so) the node hands the error to Config.OnFatal,
//     whose caller decides: chimed exits at once rather than Close, which
//     would wait for a flush that cannot happen, so that the shards' other
//     replicas elect leaders. The goroutine that found the failure cannot go
//     on, so if OnFatal is nil or returns, it panics with the error.
//   - Bootstrap a shard on a node that has data or was told to join: only
//     the node that creates a cluster starts shards alone, and only then.
//     (A restored node starts its shards from their planted snapshots: raft
//     finds state and does not bootstrap.)
//   - Restore into a data directory that holds anything, or lay out
//     anything before the whole backup has been checked; restore a backup
//     whose manifest does not verify with the key it was given, or any
//     backup without a key unless told to take it unsigned, or one holding
//     an event or schedule whose topic is reserved.
//   - Wait for shard leaders in Start: a node whose peers are down must still
//     start and serve, as it is part of what brings their quorum back.
//
// # Goroutines
//
//   - The gRPC and HTTP servers' Serve loops, started by Start, ended by
//     Close; an error from either arrives on ServeErr.
//   - The gossip key file watcher (gossipkeys.go), started by Start when
//     GossipKeyFile is set, ended by Close before the gossip shuts down.
//   - StartDev's broker (kfake's goroutines), ended by Dev.Close after the
//     node.
//   - Everything else belongs to the parts (host, cluster, membership,
//     publish), each stopped by Close.
//
// # Injection for tests
//
// Config.RaftTransport and Config.GossipTransport replace the Raft port and
// the gossip sockets with in-memory networks; everything else is the
// production code path.
package node
