// Package ingest is the Kafka way into the Scheduler API: a team schedules
// by producing an ordinary record to an ingest topic, in Chime's own
// contract or in that of the Kafka-native scheduler it replaces (etf1,
// Karafka, sky), and every node of the cluster, a member of one consumer
// group, applies its share of the partitions through its own Scheduler
// service, in process, exactly as a gRPC call: validated by package rpc,
// authorized as the credential the auth file names for the topic, and run
// on the shard's leader by package cluster.
//
// # What it owns
//
//   - The record contracts (format.go and one file per format): a record
//     decodes to an Op (schedule these events, cancel these ids, or skip)
//     or a RecordError naming the key, header or Avro field and the rule.
//     Every event carries chime-source, the topic/partition/offset of its
//     record.
//   - The consumer (Consumer): a franz-go group member (cooperative-sticky
//     balancing), with auto-commit off and rebalances held while a poll's
//     records are applied. Not kafka-go, which produces the fired records:
//     its consumer group rebalances eagerly (every partition stops at every
//     join) and cannot hold a rebalance until the records in flight are
//     committed, so a partition could change hands between a record's
//     apply and its commit. A partition's records are applied in order:
//     runs of schedules with distinct ids go in one BatchSchedule each, up
//     to four runs in flight when no two share an id, and a cancel waits
//     for every run before it. A partition's offset is committed only
//     once every record before it was committed by Raft or produced to the
//     rejected topic, so a crash or a rebalance reads again at most what was
//     not committed, and reading a record again changes nothing: a schedule
//     is sent with ON_CONFLICT_REJECT, so the same record finds its own
//     event (same content, same chime-source) and a conflict is replaced
//     only by a newer record of the same partition (replaceIfNewer), never
//     by an older one read again after it.
//   - Back-pressure: a call that may pass later (no leader, a shard that
//     takes no writes, a rate limit or quota) is retried with backoff, and
//     the partition waits; a record is never skipped. A call refused for
//     the record itself (INVALID_ARGUMENT, PERMISSION_DENIED, ...) rejects
//     that record alone: its copy goes to the rejected topic with
//     chime-error and chime-source, and the partition goes on.
//   - The ingest metrics (Metrics): records by result, rejections by
//     reason, lag per partition, apply latency, retries.
//
// # What it must never do
//
//   - Commit an offset before the records up to it are applied or
//     rejected, or skip a record because a call failed.
//   - Validate or authorize an event itself: the Scheduler service and the
//     authorizer's interceptor do, so a record is held to the rules of a
//     gRPC call, word for word.
//   - Produce a fired record: the shard leaders do (package publish); this
//     package produces only rejected records.
//
// # Goroutines
//
//   - The poll loop, started by New and stopped by Close (cancel, then wait
//     for it); Close then leaves the group. Each poll applies its
//     partitions in parallel, one goroutine per partition, each with up to
//     four more for its runs in flight, and waits for all of them before
//     it commits. A rebalance the group wants stops the poll's work at its
//     next wait (rebalanceDue), so that one stuck partition cannot stall
//     the group.
package ingest
