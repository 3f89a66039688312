// Package publish gets fired events into Kafka and reports, per event,
// whether Kafka acknowledged it.
//
// The shard leader takes events that fell due out of its timing wheel,
// reads their payloads from storage and hands them to [Publisher.Publish].
// Only after Publish reports an [Outcome] with Done set may the shard mark
// the event fired through Raft. This package owns exactly that step: turning
// a [Record] into a Kafka record, producing it with acks=all, retrying
// failures with exponential backoff and jitter, and after the last
// attempt producing it to the dead-letter topic instead.
//
// # Who retries what
//
// Two layers wait and retry, each with its own backoff.ExponentialBackOff
// (github.com/cenkalti/backoff/v5, the project's one backoff) and its own
// parameters:
//
//   - publish retries a produce, inside one Publish call, bounded by that
//     call's ctx (the shard passes its leader lease as the deadline, so a
//     call makes no new attempt once the lease is over). Config.BackoffBase,
//     BackoffMax and BackoffJitter shape the waits; the schedule starts
//     afresh with each call.
//   - the shard re-fires: events a Publish call did not complete (Done
//     false) go back into the shard's timing wheel and are handed to a later
//     Publish call, after the shard's own, longer backoff, which the first
//     produce that succeeds cuts short. This package keeps no record across
//     calls except Record.Attempts, which the caller hands back.
//
// # Guarantees
//
//   - Done is true only after Kafka acknowledged the record with acks=all,
//     either on its own topic or, with DeadLettered set, on the dead-letter
//     topic. Done false means "not known to be in Kafka": the caller must
//     fire the event again later (with Record.Attempts set from the
//     Outcome), which may duplicate it. Every copy carries the same
//     chime-id header so consumers can drop duplicates (at least once, never
//     exactly once).
//   - Attempts counts attempts on the record's own topic across calls: a
//     record handed in with Attempts >= MaxAttempts goes straight to the
//     dead-letter topic.
//   - Publish blocks until every record is settled or ctx ends; it never
//     returns before an attempt it started is answered unless ctx ended or
//     the Publisher was closed. After Close returns no goroutine of this
//     package is left running.
//   - The clock (Config.Now) is injected, so tests decide FiredAt; a
//     negative Config.BackoffJitter makes the backoff schedule exact.
//   - Publisher.Collector exports the counters of Stats to Prometheus
//     (chime_publish_*_total).
//
// # Wire format
//
// Key is Record.Key, or Record.ID when Key is empty, so the partition of a
// keyed record follows from its key exactly as with the Java client (see
// [Publisher] for the partitioner), unless the Record names its partition
// (Record.Partition): then it goes to that one, and a topic without it
// makes the record go to the dead-letter topic at once (ErrNoPartition).
// Value is Record.Value, an empty one as an empty value; a Record.Tombstone
// has a null value (a Kafka tombstone). Headers are the event's headers in
// order, followed by
//
//	chime-id              the event id (the idempotency key)
//	chime-due-unix-ms     when the event was due, unix milliseconds
//	chime-fired-unix-ms   when this attempt was sent, unix milliseconds
//	chime-attempt         1-based number of the attempt on the event's topic
//
// all as decimal strings. Dead-letter records carry the same key, value
// and headers (chime-attempt is the last attempt made on the original
// topic; the partition is the one murmur2 picks, since Record.Partition is
// a partition of the record's own topic), plus
//
//	chime-topic           the topic the event was meant for
//	chime-error           the last produce error
//
// and, only when the record could not fit into a produce request,
// chime-dropped: "value" when the value was left out so that the
// dead-letter record itself fits, "value,headers" when the event's own
// headers had to go too.
//
// These names are part of the API: they are defined, and read back, in
// package chimev1 (proto/chime/v1): chimev1.ParseHeaders turns a consumed
// record's headers, from any Kafka client, into a chimev1.Headers, and is
// what chimectl tail, chimectl bench and chime-jepsen use. This package's
// Header* constants are the same names. A change to the format above is a
// change to that contract.
//
// # Connecting to the brokers
//
// Every connection the Publisher makes (produce requests, and the
// metadata requests that look up partitions and create topics) comes from
// one kafka-go Transport, which applies Config.Security to each: TLS
// (Security.TLS, a *tls.Config; an empty ServerName becomes the host of
// the broker dialled) and then SASL (Security.SASL: PLAIN or
// SCRAM-SHA-512, a user and a password). The TCP connection beneath is
// dialled here, with TCP_USER_TIMEOUT (see UnackedTimeout). Security holds
// no client's types, so chimectl's franz-go consumers take the same value;
// cmd/internal/kafkaflag builds it from the --kafka-tls* and --kafka-sasl-*
// flags. A connection the broker closes at once (a TLS or SASL mismatch,
// refused credentials) fails the attempt with an error that says so; it is
// retried like any other failure, and never hangs longer than WriteTimeout.
//
// # What this package must never do
//
// It never reads files or the environment: certificates and the SASL
// password arrive loaded, in Config.Security; it never logs or returns the
// password.
//
// It never marks anything fired, never reads storage or the wheel, and never
// reports Done for a record Kafka did not acknowledge. It never lets
// kafka-go retry (it sends requests with kafka-go's Client, which does not):
// retries, their count and their backoff are decided here, where they are
// visible in Outcome and Stats. It never re-fires a record on its own after
// Publish returned: that belongs to the shard.
package publish
