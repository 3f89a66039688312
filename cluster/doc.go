// Package cluster is what a node does above its shard replicas: the request
// path, which runs every client request on its shard's leader, here or on
// another node, and the control plane, which turns the gossip view into the
// placement the shard leaders reconcile toward and answers and asks the
// node-to-node questions that needs.
//
// # What it owns
//
//   - The view -> placement -> shard.Directory chain: on every membership
//     change (and every second, as dead members age past DeadTimeout) it
//     computes membership.Placement over the view's candidates and signals
//     the host (Changes) and the shard leaders (Epoch).
//   - The nodes an operator removed (RemovedPath, JSON, written through a
//     synced temporary file, renamed, then the directory synced, before the
//     placement changes; read at start) and the gossip addresses of every
//     member seen (PeersPath, best effort, for a restart without --join).
//     A removal reaches every member: the operator's fan-out (Forget) tells
//     the live ones, and every node that records a removal tells each live
//     member again until it confirms, after each new removal and whenever
//     the member comes back from not live, so a node that was down or not
//     yet serving when a node was removed records it too.
//   - The guard rails of Drain and removal: Drain refuses, unless forced,
//     when fewer other nodes than the replication factor could take the
//     node's replicas (Takers); SinceAlive and DeadTimeout tell the Admin
//     API whether a node it is asked to remove may still come back.
//   - A pool of gRPC client connections to the other members, by node and
//     address, closed by Close. With DialCredentials (TLS) a connection's
//     handshake accepts only the node it was dialled for, and a member is a
//     placement candidate only once a Peer call to it through such a
//     connection went through (prove): the gossip key alone does not get a
//     process replicas under a node's name. New proves the live members
//     before its first placement; the others are tried on every refresh.
//   - The request path: the Cluster is the rpc.Backend of every node,
//     chimed dev included. Package rpc validates a request once, on the node
//     the client called; the Cluster splits a batch by shard
//     (scheduleByShard) and runs each shard's part where locate says (on):
//     on this node's replica when it leads the shard, otherwise on the
//     leader's node through a Peer call that carries the request in its
//     validated form (ValidEvent, ShardUpdateRequest, a Recurring command's
//     log encoding), which the leader's replica proposes without validating
//     it again. The leader of a shard this node does not lead comes from a
//     cache (leaders), filled by a lookup (LeaderNode: this node's replica's
//     view, else the shard's likely holders, then every live member) and
//     emptied by a not-leader or UNAVAILABLE answer; lookups are counted
//     (chime_cluster_leader_lookups_total). A missing leader is waited out
//     for up to LeaderWait (awaitLeader). List, Count, CancelMatching,
//     Forecast and Recurring.List span every shard: each shard's part runs
//     on its leader in parallel, and the answers merge here (query.go,
//     forecast.go); a page token or a
//     bulk cancel's step is a position, not state on any node, so the next
//     part can run on any leader. The client's credential travels with a
//     Peer call as its name (ForwardContext), which the leader's authorizer
//     resolves to the grant the replica checks stored events against
//     (Config.ScopeOf).
//   - The one mapping of errors to gRPC codes (StatusOf), used by package
//     rpc for this node's answers and by the Peer service for the leader's,
//     so a client gets the same code and words whichever node it called.
//   - The chime.v1.Peer service (RegisterPeer) and its client side: a
//     replica's typed Raft status (LogIndex for promoting a non-voter,
//     Members for releasing a replica, the Admin API's Status fan-out),
//     Forget, the fan-out of an operator's node removal, and ShardParked,
//     a replica's parked events for the shard's new leader; the request path's
//     calls (ShardSchedule, ShardUpdate, ShardCancelEvent, ShardGet,
//     ShardRecurring) and ShardList, ShardCount, ShardCancel,
//     ShardForecast and ShardSchedules, one shard's part of a List, Count,
//     CancelMatching, Forecast or Recurring.List; a List, Count or
//     CancelMatching by priority is sent as ShardListV2, ShardCountV2 or
//     ShardCancelV2, which a node of a release before priorities does not
//     serve, so that it refuses the query rather than ignore the filter and
//     act on every priority. Each is answered by this node's replica alone, never
//     forwarded further. Peer is node-to-node; the operator API (Admin, in
//     package rpc) can change without breaking reconciliation.
//   - A Cluster without gossip (Config.Membership nil, chimed dev): a view of
//     this node alone, every shard placed on it, Drain and Remove refused
//     with ErrAlone.
//
// # What it must never do
//
//   - Change a Raft configuration. Only a shard's leader does, in package
//     shard, reading this package's answers; gossip never authorises a
//     change by itself.
//   - Reach into Raft beyond a replica's typed status (shard.Shard.Status).
//   - Ask another node through the public Admin API, or send it a client
//     request through the public Scheduler or Recurring API: what another
//     node is asked for a client goes through Peer, validated.
//   - Validate a client request: package rpc does, once.
//   - Read the clock for the placement except to age dead members
//     (view.Candidates gets now as an argument).
//
// # Goroutines
//
//   - The refresh loop (only with gossip), started by New, stopped by Close
//     (close(stop), then <-done); Close then closes the connection pool, and
//     Conn fails afterwards.
//   - AllReplicas asks the live members in parallel and waits for every
//     answer, each bounded by 2 s.
//   - Telling the live members about removed nodes: at most one goroutine
//     per member at a time, started by the refresh, each call bounded by
//     2 s; Close cancels them and waits for them.
//   - scheduleByShard, used by Schedule, runs one goroutine per shard of a
//     batch and waits for all of them; eachShard, used by List, Count,
//     CancelMatching and ListSchedules, one per shard, cancelled together at
//     the first error, and waits for all of them.
package cluster
