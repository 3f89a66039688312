// Package rpc is Chime's gRPC front door: it serves the chime.v1.Scheduler
// API (proto/chime/v1/scheduler.proto) on top of a [Backend], which in a
// node is a shard.Host that routes each id to its shard and proposes through
// Raft.
//
// # What it owns
//
//   - Validating client input (design invariant 7). Every rule is checked
//     before anything reaches the Backend; a request that breaks one fails
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
//     with their presence), before the shard leader resolves a delay into a
//     due time, so a retried request with the same delay is recognised as the
//     same event and gets the original due time back.
//   - Turning results into responses: Created and Existing into a
//     ScheduleResponse, Conflict into ALREADY_EXISTS, cancel outcomes into
//     NOT_FOUND / FAILED_PRECONDITION, raftfsm.Record into GetResponse.
//   - Mapping Backend errors to gRPC status codes, in one function
//     (backendStatus): shard.ErrNotLeader, ErrStopped and ErrUnknownShard are
//     UNAVAILABLE (retryable), context errors keep their meaning, errors that
//     already carry a gRPC status (a forwarded call) pass through, anything
//     else is INTERNAL and logged.
//   - Registering gRPC server reflection next to the service ([Register]), so
//     grpcurl and other generic clients can discover the API.
//
// # What it must never do
//
// It never reaches into Raft, Pebble or the timing wheel: everything goes
// through the Backend, with the request's context, so a client's deadline or
// cancellation bounds the proposal. It never decides due times for delayed
// events (the shard leader does, with its clock), and it never passes an
// invalid event on, not even as part of a batch whose other events are valid.
//
// # Clock
//
// The server's clock (NewServer's now) is used only to check the horizon
// (deliver_at at most MaxHorizon ahead) and is injected so tests decide it.
package rpc
