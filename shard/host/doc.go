// Package host runs the shard replicas of one node: it opens them, routes
// each event id to its shard, and, in a cluster, opens and releases replicas
// as the placement moves them.
//
// # What it owns
//
//   - The node's Raft port (a raftmux.Mux over Config.RaftListener, or, in
//     tests, one Config.Transport per shard) and one shard.Shard per replica
//     on this node, opened in parallel at Open.
//   - Routing: an id goes to shard.For(id, Shards) (chimev1.ShardOf); ScheduleByShard splits a
//     batch by shard and proposes the parts in parallel. A request that meets
//     a shard without a leader waits for one (AwaitLeader, at most
//     LeaderWait, within the request's context).
//   - Queries across shards (query.go): EachShard runs a List, Count or bulk
//     cancel step on every shard in parallel, Merge orders the shards' List
//     answers by due time then id, and CancelByShard drives each shard's
//     bulk cancel steps to their end; the Host runs them on its own
//     replicas, a cluster.Cluster on each shard's leader.
//   - With a Directory, the control loop: it opens an empty replica for every
//     shard the placement gives this node (the shard's leader then adds it),
//     and releases (closes and deletes) a replica once the shard's leader has
//     taken this node out of the configuration. It also reopens a replica
//     that is shard.Shard.Stuck (its raft refuses every entry for a
//     leadership transfer that never ended): a new raft instance over the
//     same data starts without raft's stranded flag.
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
//
// # Goroutines
//
//   - The control loop (only with a Directory), started by Open, stopped by
//     Close (close(stop), then <-done), before the replicas close.
//   - ScheduleByShard runs one goroutine per shard of a batch and waits for
//     all of them before it returns; EachShard (List, Count, and the bulk
//     cancel's CancelByShard) one per shard, under a context the first
//     error cancels, and waits for all of them.
//   - The replicas' own goroutines (Raft, firing) and the mux's accept loop
//     belong to shard.Shard and raftmux; Close stops them.
package host
