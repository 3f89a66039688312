// Package client is the Go client of Chime, the durable delayed-event
// scheduler: it schedules records to be produced to Kafka at a time,
// changes, cancels and reads them, and manages recurring schedules.
//
// Dial a cluster once and share the Client; it is safe for concurrent use:
//
//	c, err := client.Dial(ctx, "chime-1:7443,chime-2:7443,chime-3:7443",
//		client.WithTLSFiles("ca.pem", "", ""), client.WithTokenFile("/run/secrets/chime-token"))
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//
//	res, err := c.Schedule(ctx, client.Event{
//		ID:      "invoice-42/reminder", // the idempotency key; empty picks one
//		Topic:   "billing.reminders",
//		Payload: []byte(`{"invoice":42}`),
//	}, client.In(72*time.Hour))
//
// What the client does for you:
//
//   - Ids: an event without one gets a UUIDv7 before the first attempt, so
//     a retried Schedule is recognised by the server as the same event
//     (Result.Existing).
//   - Retries: calls that failed for a reason that may pass (no node, a
//     shard between leaders, an event being fired, a rate limit) are
//     repeated with jittered exponential backoff, within the context and
//     the RetryPolicy. When a change's last attempt went unanswered, the
//     client reads the event back and answers what happened, rather than
//     "maybe".
//   - Routing: calls about one id go straight to the leader of the id's
//     shard (from the cluster map, refreshed in the background), and a
//     ScheduleBatch is split by shard and sent in parallel; any node
//     forwards a call that reaches it instead.
//   - Errors: the server's answers are typed for errors.Is and errors.As
//     (ErrNotFound, *ConflictError, *InvalidError, ...), and keep their
//     gRPC status (status.Code(err)).
//
// Consumers of the produced records read Chime's headers with ParseFired,
// and drop the second copy at-least-once delivery can make with a Deduper
// (every copy of an event's version carries the same id and version).
// High-rate producers of single events gather them into batches with a
// Batcher. Tests run against chimetest.NewFake, the real server's code in
// memory on a virtual clock, or chimetest.StartDev, a real node.
package client
