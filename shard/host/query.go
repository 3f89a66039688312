package host

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// CancelStepSize is how many events one step of a bulk cancel lists and
// cancels in one Raft entry: large enough that the entry's cost is spread
// thin, small enough that a step commits well within a second.
const CancelStepSize = 1000

// EachShard runs part for every one of shards in parallel and returns the
// first error; the first error cancels the context the others run under.
func EachShard(ctx context.Context, shards int, part func(ctx context.Context, s uint32) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for s := range uint32(shards) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := part(ctx, s); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// Merge returns the first limit of the shards' List answers, each in
// due-then-id order, in that order.
func Merge(parts [][]raftfsm.Record, limit int) []raftfsm.Record {
	all := slices.Concat(parts...)
	slices.SortFunc(all, func(a, b raftfsm.Record) int {
		return cmp.Or(cmp.Compare(a.Due, b.Due), strings.Compare(a.ID, b.ID))
	})
	return all[:min(limit, len(all))]
}

// CountByShard runs count on every one of shards in parallel and sums the
// answers.
func CountByShard(ctx context.Context, shards int, count func(ctx context.Context, s uint32) (uint64, error)) (uint64, error) {
	counts := make([]uint64, shards)
	err := EachShard(ctx, shards, func(ctx context.Context, s uint32) (err error) {
		counts[s], err = count(ctx, s)
		return err
	})
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range counts {
		n += c
	}
	return n, nil
}

// CancelByShard runs the steps of a bulk cancel on every shard in parallel,
// each from the start until its shard has no more matches, and reports each
// step to progress, one call at a time.
func CancelByShard(ctx context.Context, shards int, step func(ctx context.Context, s uint32, after *raftfsm.Position) (shard.CancelStep, error), progress func(shard.CancelStep)) error {
	var mu sync.Mutex
	return EachShard(ctx, shards, func(ctx context.Context, s uint32) error {
		var after *raftfsm.Position
		for {
			st, err := step(ctx, s, after)
			if err != nil {
				return err
			}
			mu.Lock()
			progress(st)
			mu.Unlock()
			if after = st.Next; after == nil {
				return nil
			}
		}
	})
}

// onReplica runs op on this host's replica of s, waiting for a leader as
// Schedule does.
func onReplica[T any](ctx context.Context, h *Host, s uint32, op func(*shard.Shard) (T, error)) (T, error) {
	return AwaitLeader(ctx, leaderless, func() (T, error) {
		r := h.Replica(s)
		if r == nil {
			var zero T
			return zero, shard.ErrUnknownShard
		}
		return op(r)
	})
}

// List returns up to limit events q selects after after, from every shard,
// in due-then-id order; never truncated (see rpc.Backend).
func (h *Host) List(ctx context.Context, q raftfsm.Query, after *raftfsm.Position, limit int, stale bool) ([]raftfsm.Record, bool, error) {
	parts := make([][]raftfsm.Record, h.cfg.Shards)
	err := EachShard(ctx, h.cfg.Shards, func(ctx context.Context, s uint32) (err error) {
		parts[s], err = onReplica(ctx, h, s, func(r *shard.Shard) ([]raftfsm.Record, error) { return r.List(ctx, q, after, limit, stale) })
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return Merge(parts, limit), false, nil
}

// GetSchedule reads one recurring schedule on its shard.
func (h *Host) GetSchedule(ctx context.Context, id string, stale bool) (raftfsm.Schedule, bool, error) {
	type got struct {
		s  raftfsm.Schedule
		ok bool
	}
	g, err := onReplica(ctx, h, shard.For(id, h.cfg.Shards), func(r *shard.Shard) (got, error) {
		s, ok, err := r.GetSchedule(ctx, id, stale)
		return got{s, ok}, err
	})
	return g.s, g.ok, err
}

// ListSchedules returns up to limit schedules whose id starts with prefix,
// after the id after, from every shard in id order; more says others follow.
func (h *Host) ListSchedules(ctx context.Context, prefix, after string, limit int, stale bool) ([]raftfsm.Schedule, bool, error) {
	parts, more := make([][]raftfsm.Schedule, h.cfg.Shards), make([]bool, h.cfg.Shards)
	err := EachShard(ctx, h.cfg.Shards, func(ctx context.Context, s uint32) error {
		type part struct {
			scheds []raftfsm.Schedule
			more   bool
		}
		p, err := onReplica(ctx, h, s, func(r *shard.Shard) (part, error) {
			scheds, more, err := r.ListSchedules(ctx, prefix, after, limit, stale)
			return part{scheds, more}, err
		})
		parts[s], more[s] = p.scheds, p.more
		return err
	})
	if err != nil {
		return nil, false, err
	}
	merged, anyMore := MergeSchedules(parts, more, limit)
	return merged, anyMore, nil
}

// MergeSchedules merges shards' schedules (each part in id order, more[i]
// set when part i's shard holds more after its last one) into the first
// limit in id order. A shard that holds more may hold schedules between its
// last one and another shard's later ones, so nothing after the first such
// last id is taken; more says something may follow what is returned.
func MergeSchedules(parts [][]raftfsm.Schedule, more []bool, limit int) ([]raftfsm.Schedule, bool) {
	all := slices.Concat(parts...)
	cut, cutSet := "", false
	for i, p := range parts {
		if more[i] && len(p) > 0 {
			if last := p[len(p)-1].ID; !cutSet || last < cut {
				cut, cutSet = last, true
			}
		}
	}
	slices.SortFunc(all, func(a, b raftfsm.Schedule) int { return strings.Compare(a.ID, b.ID) })
	if cutSet {
		n, _ := slices.BinarySearchFunc(all, cut, func(s raftfsm.Schedule, id string) int { return strings.Compare(s.ID, id) })
		all = all[:n+1]
	}
	if len(all) > limit {
		return all[:limit], true
	}
	return all, cutSet
}

// Count returns how many events q selects, over every shard.
func (h *Host) Count(ctx context.Context, q raftfsm.Query, stale bool) (uint64, error) {
	return CountByShard(ctx, h.cfg.Shards, func(ctx context.Context, s uint32) (uint64, error) {
		return onReplica(ctx, h, s, func(r *shard.Shard) (uint64, error) { return r.Count(ctx, q, stale) })
	})
}

// CancelMatching cancels every pending event q selects, reporting each
// step to progress.
func (h *Host) CancelMatching(ctx context.Context, q raftfsm.Query, dryRun bool, progress func(shard.CancelStep)) error {
	return CancelByShard(ctx, h.cfg.Shards, func(ctx context.Context, s uint32, after *raftfsm.Position) (shard.CancelStep, error) {
		return onReplica(ctx, h, s, func(r *shard.Shard) (shard.CancelStep, error) {
			return r.CancelMatching(ctx, q, after, CancelStepSize, dryRun)
		})
	}, progress)
}
