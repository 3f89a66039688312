// Package chimetest helps test code that uses Chime, at two depths.
//
// NewFake returns a Fake: a client.Scheduler that answers in memory, on a
// virtual clock the test moves with Advance, and records what fires
// instead of producing it to Kafka. It is the real gRPC server (package
// rpc) over an in-memory store, reached by a real *client.Client through
// an in-memory connection, so its validation errors, idempotency rules and
// Update and Cancel outcomes are the server's own, and a test of
// time-driven code takes no time.
//
// StartDev starts a real node with an embedded Kafka-protocol broker, as
// `chimed dev` does, inside the test process, for end-to-end tests that
// consume the records Chime produces.
//
// # What the Fake does not do
//
// It has no Raft, no shards and no retention: settled events stay until
// Close. Every event fires at its due time exactly (a Window is not
// spread), on its first attempt; nothing is dead-lettered. A recurring
// schedule's pending occurrence is not an event until it fires, so Get,
// List and Cancel do not see it before then. The Admin API is not served.
//
// # Goroutines
//
// The Fake's gRPC server and the client's connection run until Close.
// StartDev's node and broker run until the test's cleanup. Neither leaves
// a goroutine behind.
package chimetest
