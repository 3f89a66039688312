// Package host runs the shard replicas of one node: it opens them, finds
// the replica of a shard (Replica), and, in a cluster, opens and releases
// replicas as the placement moves them. Requests reach the replicas through
// package cluster's request path, which knows which node leads what.
//
// # What it owns
//
//   - The node's Raft port (a raftmux.Mux over Config.RaftListener, or, in
//     tests, one Config.Transport per shard) and one shard.Shard per replica
//     on this node, opened in parallel at Open.
//   - With a Directory, the control loop: it opens an empty replica for every
//     shard the placement gives this node (the shard's leader then adds it),
//     and releases (closes and deletes) a replica once the shard's leader has
//     taken this node out of the configuration. It also reopens a replica
//     that is shard.Shard.Stuck (its raft refuses every entry for a
//     leadership transfer that never ended, or, a follower, counts log
//     entries its log store no longer holds): a new raft instance over the
//     same data starts without raft's stranded flag, and reads its last
//     index from the log store.
//   - Readiness (Ready) and the per-shard Prometheus collector (Collector).
//
// # What it must never do
//
//   - Change a Raft configuration: only a shard's leader does, in package
//     shard. The host only follows: it opens a replica before the leader adds
//     it and deletes one only after the leader removed it, so a replica that
//     still counts toward a quorum is never deleted.
//   - Release a replica this node leads.
//   - Talk to other nodes itself: questions about other nodes go through the
//     shard.Directory it is given.
//   - Route or serve requests: a second request path beside package
//     cluster's would answer differently from it.
//
// # Goroutines
//
//   - The control loop (only with a Directory), started by Open, stopped by
//     Close (close(stop), then <-done), before the replicas close.
//   - The replicas' own goroutines (Raft, firing) and the mux's accept loop
//     belong to shard.Shard and raftmux; Close stops them.
package host
