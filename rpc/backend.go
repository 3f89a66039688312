package rpc

import (
	"context"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// Backend is what the gRPC server needs from the node, and gets in the
// validated form: a node's cluster.Cluster runs each request on its shard's
// leader (this node's replica, or another node's through the Peer service,
// which does not validate it again), waiting out a leader change (up to
// cluster.LeaderWait); rpctest.Backend is an in-memory one for tests. The
// server never reaches into Raft itself.
type Backend interface {
	// Schedule proposes validated requests and returns one result per
	// request, in order. An error means none of the results are known.
	Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error)
	// Cancel cancels one event; it returns only once no record of it can be
	// produced any more. An event outside scope (nil: anything) is refused
	// with a *shard.NotPermittedError.
	Cancel(ctx context.Context, id string, scope shard.Scope) (raftfsm.CancelResult, error)
	// Get reads one event; found is false for an unknown id.
	Get(ctx context.Context, id string) (rec raftfsm.Record, found bool, err error)
	// Update changes one pending event as its next version; once it reports
	// Updated, no record of an earlier version is produced any more.
	Update(ctx context.Context, ch shard.Change) (raftfsm.ChangeResult, error)
	// List returns up to limit events q selects after the position after
	// (from the start when nil), from every shard, ordered by due time, then
	// id; linearizable unless stale. truncated says it may have stopped
	// short of limit (a shard's events too large for one message) with more
	// to come after the last one.
	List(ctx context.Context, q raftfsm.Query, after *raftfsm.Position, limit int, stale bool) (recs []raftfsm.Record, truncated bool, err error)
	// Count returns how many events q selects, linearizably unless stale.
	Count(ctx context.Context, q raftfsm.Query, stale bool) (uint64, error)
	// CancelMatching cancels every pending event q selects (with dryRun,
	// only counts them), in steps, calling progress with each step's counts,
	// one call at a time. Every event a step counts as cancelled has the
	// promise Cancel gives.
	CancelMatching(ctx context.Context, q raftfsm.Query, dryRun bool, progress func(shard.CancelStep)) error
	// Recurring creates, updates, deletes, pauses, resumes, triggers or
	// backfills one recurring schedule on its shard's leader (shard.Shard.Recurring), which refuses
	// (a *shard.NotPermittedError) a stored schedule outside scope.
	Recurring(ctx context.Context, rc raftfsm.Recurring, scope shard.Scope) (*raftfsm.RecurringResult, error)
	// GetSchedule reads one recurring schedule, linearizably unless stale.
	GetSchedule(ctx context.Context, id string, stale bool) (raftfsm.Schedule, bool, error)
	// ListSchedules returns up to limit schedules whose id starts with
	// prefix, after the id after ("" from the first), from every shard in id
	// order; more says others may follow the last one.
	ListSchedules(ctx context.Context, prefix, after string, limit int, stale bool) ([]raftfsm.Schedule, bool, error)
}
