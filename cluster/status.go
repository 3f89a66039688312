package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/chimehq/chime/shard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The words of the UNAVAILABLE answers a leader gives for a change it did
// not propose (a change whose proposal's outcome is unknown answers
// UNKNOWN instead): a node forwarding a change that is not idempotent
// tries it again only after one of these (nothingProposed).
const (
	leadershipMoving = "(leadership is moving)"
	shuttingDown     = "(this node is shutting down)"
	movingReplicas   = "(the cluster is moving replicas)"
)

// nothingProposed reports an answer of a shard's leader saying it proposed
// nothing. UNAVAILABLE alone does not say it: the connection to the leader
// failing after the call was sent (the leader killed as it committed the
// change) is UNAVAILABLE too, and a change retried then was applied twice
// (an update answered "has already fired" for the version it had made).
func nothingProposed(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	m := st.Message()
	return strings.Contains(m, leadershipMoving) || strings.Contains(m, shuttingDown) || strings.Contains(m, movingReplicas)
}

// changeOutcome is the error a forwarded change that is not idempotent
// ends with: a leader's answer as it is, but a failed call that may have
// reached the leader UNKNOWN, which no node or client retries blindly.
func changeOutcome(err error) error {
	if err == nil || nothingProposed(err) || status.Code(err) != codes.Unavailable {
		return err
	}
	return status.Errorf(codes.Unknown, "%v; the call to the shard's leader failed after it was sent, so the change may or may not take effect (Get shows the event's version)", err)
}

// StatusOf is the one place an error of a request (of a replica, of the
// request path, of a Peer call) becomes the gRPC status a client or the
// asking node is sent, on every path:
//
//   - shard.ErrNotLeader, ErrStopped, ErrUnknownShard: UNAVAILABLE. Nothing
//     was proposed (or the outcome is unknown because the node is going
//     away), and a retry, after a short backoff or on another node, can
//     succeed. Schedule with a client-chosen id is idempotent, so retrying it
//     is always safe; a Replace proposed before leadership went answers
//     ErrChangeUnknown instead.
//   - shard.ErrProduceUnknown, ErrFiring, ErrChanging: ABORTED. Nothing was
//     changed; a retry once the event's firing is over can succeed (or say
//     that it fired). ErrCancelUnsure: ABORTED, and the message says the
//     cancel is recorded. ErrChangeUnknown: UNKNOWN, the outcome of a change
//     that is not idempotent, so not to be retried blindly.
//   - shard.ErrTombstonePayload: FAILED_PRECONDITION, naming the payload:
//     the stored event, not the request alone, refuses it.
//   - *shard.NotPermittedError: PERMISSION_DENIED, in its own words, which
//     are the same whether or not the id exists.
//   - context.DeadlineExceeded / context.Canceled: DEADLINE_EXCEEDED /
//     CANCELED. The outcome is unknown: the proposal may still commit.
//   - An error that already carries a gRPC status (a call the Backend
//     forwarded to another node) keeps it.
//   - Anything else: INTERNAL, logged with the operation (to logger, when
//     not nil), because it is a bug or a broken node, not something the
//     client can fix.
func StatusOf(logger *slog.Logger, op string, err error) error {
	switch {
	case errors.Is(err, shard.ErrNotLeader):
		return status.Errorf(codes.Unavailable, "%v %s; retry in a moment", err, leadershipMoving)
	case errors.Is(err, shard.ErrStopped):
		return status.Errorf(codes.Unavailable, "%v %s; retry on another node", err, shuttingDown)
	case errors.Is(err, shard.ErrProduceUnknown):
		return status.Errorf(codes.Aborted, "%v; nothing was changed: retry the %s once Kafka is reachable (it then fails with FAILED_PRECONDITION if the event fired)", err, strings.ToLower(op))
	case errors.Is(err, shard.ErrFiring):
		return status.Errorf(codes.Aborted, "%v; nothing was changed: retry in a moment (it then fails with FAILED_PRECONDITION if the event fired)", err)
	case errors.Is(err, shard.ErrChanging):
		return status.Errorf(codes.Aborted, "%v; nothing was changed by this request: retry it", err)
	case errors.Is(err, shard.ErrTombstonePayload):
		return status.Error(codes.FailedPrecondition, "payload: the event is a tombstone (its record has a null value), so an update cannot give it a payload; nothing was changed")
	case errors.Is(err, shard.ErrChangeUnknown):
		return status.Errorf(codes.Unknown, "%v", err)
	case errors.Is(err, shard.ErrCancelUnsure):
		return status.Errorf(codes.Aborted, "%v; the cancel is recorded (Get shows CANCELLED)", err)
	case errors.Is(err, shard.ErrUnknownShard):
		return status.Errorf(codes.Unavailable, "%v %s; retry in a moment or on another node", err, movingReplicas)
	case errors.As(err, new(*shard.NotPermittedError)):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s: %v (a Schedule or Cancel may still take effect; retrying it with the same id is safe)", op, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s: %v (a Schedule or Cancel may still take effect; retrying it with the same id is safe)", op, err)
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	if logger != nil {
		logger.Error("request failed", "op", op, "err", err)
	}
	return status.Errorf(codes.Internal, "%s: internal error: %v", op, err)
}
