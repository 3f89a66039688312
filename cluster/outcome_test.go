package cluster

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/shard"
)

// TestChangeOutcome: a forwarded change that is not idempotent is tried
// again only after its leader answered that it proposed nothing; a call
// that failed once it may have reached the leader (the leader killed as it
// committed the change) ends UNKNOWN, never retried. A fault run retried
// such an update on the next leader, which answered "has already fired"
// for the version the first attempt had made.
func TestChangeOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code // the code changeOutcome leaves; Unavailable is retried
	}{
		{"the leader was not the leader", StatusOf(nil, "Update", fmt.Errorf("shard 3: %w", shard.ErrNotLeader)), codes.Unavailable},
		{"the leader's replica was closing", StatusOf(nil, "Update", shard.ErrStopped), codes.Unavailable},
		{"the leader had no replica", StatusOf(nil, "Update", shard.ErrUnknownShard), codes.Unavailable},
		{"the connection reset after the call was sent", status.Error(codes.Unavailable, "error reading from server: read tcp 10.77.0.16:40032->10.77.0.12:7070: read: connection reset by peer"), codes.Unknown},
		{"the leader lost leadership under the change", StatusOf(nil, "Update", fmt.Errorf("%w (leadership lost)", shard.ErrChangeUnknown)), codes.Unknown},
		{"the leader refused the change", status.Error(codes.FailedPrecondition, "has already fired"), codes.FailedPrecondition},
		{"the call's deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), codes.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := changeOutcome(tc.err)
			if status.Code(got) != tc.want {
				t.Errorf("changeOutcome(%v) = %v, want code %v", tc.err, got, tc.want)
			}
			if retried := leaderMissing(got); retried != (tc.want == codes.Unavailable) {
				t.Errorf("retried after %v: %v", got, retried)
			}
		})
	}
	if changeOutcome(nil) != nil {
		t.Error("changeOutcome(nil) is an error")
	}
	if nothingProposed(errors.New("plain")) {
		t.Error("an error without a status says nothing was proposed")
	}
}
