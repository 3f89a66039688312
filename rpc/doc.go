// Package rpc is Chime's gRPC front door for clients and operators: it
// serves the chime.v1.Scheduler API (proto/chime/v1/scheduler.proto) and the
// chime.v1.Recurring API (recurring.proto) on top of a [Backend], and the
// chime.v1.Admin API (admin.proto) on top of the node's control plane
// (package cluster). In every node, chimed dev included, the Backend is the
// node's cluster.Cluster, which runs each request, as this package validated
// it, on its shard's leader.
//
// # What it owns
//
//   - Validating client input (design invariant 7), once, on the node the
//     client called (counted by chime_rpc_validated_events_total). Every rule
//     is checked before anything reaches the Backend; a request that breaks one fails
//     with INVALID_ARGUMENT and a message that names the field path and the
//     rule, e.g. "event.topic: required" or "events[3].payload: 2000000
//     bytes, at most 1048576 allowed (--max-payload)", and changes nothing.
//     The limits are in [Limits].
//   - Generating ids for events that arrive without one: 128 bits from
//     crypto/rand, rendered as 26 lower-case base32 characters. A generated
//     id makes the request NOT idempotent: a client that retries a Schedule
//     without an id after a lost response schedules the event twice. Clients
//     that retry must choose their own ids.
//   - The idempotency fingerprint: raftfsm.ContentHash over the event as the
//     client sent it (topic, key, payload, headers, and deliver_at or delay
//     with their presence; priority, window, partition and tombstone when
//     set), before the shard leader resolves a delay into a
//     due time, so a retried request with the same delay is recognised as the
//     same event and gets the original due time back.
//   - Turning results into responses: Created and Existing into a
//     ScheduleResponse, Conflict into ALREADY_EXISTS, cancel outcomes into
//     NOT_FOUND / FAILED_PRECONDITION, raftfsm.Record into GetResponse.
//   - Answering Backend errors with the gRPC status cluster.StatusOf maps
//     them to, the one mapping the leader's Peer service uses too:
//     shard.ErrNotLeader, ErrStopped and ErrUnknownShard are UNAVAILABLE
//     (retryable), context errors keep their meaning, errors that already
//     carry a gRPC status (the leader's answer to a Peer call) pass through,
//     anything else is INTERNAL and logged.
//   - Registering gRPC server reflection next to the service ([Register]), so
//     grpcurl and other generic clients can discover the API.
//   - The Admin API ([RegisterAdmin]) for chimectl and chime-jepsen: Status
//     and GetClusterMap (the members, and every shard's leader, voters and
//     counts gathered from every live member), NodeStatus (this node's
//     replicas, with a state digest on request), TransferLeader, Drain,
//     RemoveNode and Backup, validated and answered in the operator's words.
//     Drain and RemoveNode have guard rails, FAILED_PRECONDITION unless the
//     request sets force: Drain, checked on the node that drains, when fewer
//     other nodes than the replication factor could take its replicas;
//     RemoveNode when the node was seen alive within the dead timeout
//     (chimed --dead-timeout). A node seen live now is never removed, force
//     or not: drain it instead.
//     Calls about another node or shard are forwarded to it through the Admin
//     API; a Backup stream from the shard's leader is relayed a message at a
//     time (at most 1 MiB of data each, with its size and SHA-256 in the last
//     one), never gathered in memory. On a
//     node without gossip (chimed dev) it answers for that node, and Drain
//     and RemoveNode fail with FAILED_PRECONDITION saying why.
//   - Through its subpackages: rpc/certs, the TLS material of every port and
//     dialer (and who is a node); rpc/auth, who may call what (tokens,
//     certificates, roles, rate limits and quotas) and the audit log. They
//     run before this package sees a request: validation comes after
//     authorization.
//
// # What it must never do
//
// It never reaches into Raft, Pebble or the timing wheel: everything goes
// through the Backend, with the request's context, so a client's deadline or
// cancellation bounds the proposal; the Admin API reads replicas only through
// their typed status and moves leadership only through shard.Shard. It does
// not compute placement, keep membership state, or talk to other nodes for
// the shard layer: that is package cluster's (with its node-to-node Peer
// service). It never decides due times for delayed
// events (the shard leader does, with its clock), and it never passes an
// invalid event on, not even as part of a batch whose other events are valid.
//
// # Clock
//
// The server's clock (NewServer's now) is used only to check the horizon
// (deliver_at at most MaxHorizon ahead) and is injected so tests decide it.
package rpc
