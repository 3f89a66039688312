// Package cluster is a node's control plane: it turns the gossip view into
// the placement the shard leaders reconcile toward, answers and asks the
// node-to-node questions that needs, and forwards client requests to the
// shard leaders on other nodes.
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
//   - The chime.v1.Peer service (RegisterPeer) and its client side: a
//     replica's typed Raft status (LogIndex for promoting a non-voter,
//     Members for releasing a replica, the Admin API's Status fan-out) and
//     Forget, the fan-out of an operator's node removal, and ShardList,
//     ShardCount, ShardCancel and ShardSchedules, one shard's part of a
//     List, Count, CancelMatching or Recurring.List, answered by this node's
//     replica alone. Peer is
//     node-to-node; the operator API (Admin, in package rpc) can change
//     without breaking reconciliation.
//   - The Scheduler and Recurring servers' Backend in a cluster: a request
//     goes to this node's replica when it leads the shard, otherwise to the
//     shard's leader through the public Scheduler or Recurring API, marked forwarded (Forwarded,
//     ForwardContext) so it is forwarded at most once. A request meeting a
//     leader change waits for the new leader (host.AwaitLeader). List,
//     Count and CancelMatching span every shard: each shard's part runs on
//     its leader (here, or through Peer) in parallel, and the answers merge
//     here (query.go); a page token or a bulk cancel's step is a position,
//     not state on any node, so the next part can run on any leader.
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
//   - Ask another node through the public Admin API.
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
//   - host.ScheduleByShard, used by Schedule, runs one goroutine per shard
//     of a batch and waits for all of them; host.EachShard, used by List,
//     Count and CancelMatching, one per shard, cancelled together at the
//     first error, and waits for all of them.
package cluster
