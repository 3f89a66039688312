package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/chimehq/chime/raftfsm"
)

// List returns up to limit events q selects after the position after (from
// the start when nil), in due-then-id order. It is linearizable, as Get is
// (readable); with staleOK any replica answers from what it has applied.
func (s *Shard) List(ctx context.Context, q raftfsm.Query, after *raftfsm.Position, limit int, staleOK bool) ([]raftfsm.Record, error) {
	if err := s.queryable(ctx, staleOK); err != nil {
		return nil, err
	}
	return s.fsm.List(q, after, limit)
}

// Count returns how many events q selects, linearizably unless staleOK.
func (s *Shard) Count(ctx context.Context, q raftfsm.Query, staleOK bool) (uint64, error) {
	if err := s.queryable(ctx, staleOK); err != nil {
		return 0, err
	}
	return s.fsm.Count(q)
}

func (s *Shard) queryable(ctx context.Context, staleOK bool) error {
	if staleOK {
		return nil
	}
	return s.readable(ctx)
}

// CancelStep is what one step of a bulk cancel did on a shard. Every event
// it matched is counted once, in Cancelled, Fired or Held.
type CancelStep struct {
	// Matched is the pending events the step found.
	Matched uint64
	// Cancelled is those it cancelled: no record of them can be produced
	// any more, as after Cancel.
	Cancelled uint64
	// Fired is those that fired, dead-lettered or were removed before the
	// cancel applied.
	Fired uint64
	// Held is those left as they were because a record of them may already
	// be on its way to Kafka (a fire batch holds them, or a produce attempt
	// went unanswered), and those the cancel reached but cannot promise
	// about (Cancel's ErrCancelUnsure). A later run finds the first kind
	// settled, or pending again and cancellable.
	Held uint64
	// Next is where the next step starts, nil when the shard holds no more
	// matches: a position in due order, or in id order when the query has
	// an id prefix (only its ID counts then), for the next step of the same
	// query.
	Next *raftfsm.Position
}

// CancelMatching cancels, through one Raft entry, the next limit pending
// events q selects after the position after (by id under an id prefix, by
// due time otherwise); with dryRun it only counts them. q's States are ignored: only pending events can be cancelled. A
// step cancels events at or before Next; running the steps again from the
// start finds only what is still pending, so a bulk cancel cut short (by a
// leader change, a timeout) is finished by running it again.
func (s *Shard) CancelMatching(ctx context.Context, q raftfsm.Query, after *raftfsm.Position, limit int, dryRun bool) (CancelStep, error) {
	if err := s.readable(ctx); err != nil {
		return CancelStep{}, err
	}
	q.States = raftfsm.StatesOf(raftfsm.StateScheduled)
	var refs []raftfsm.Listed
	var err error
	if q.Prefix != "" {
		// By id, in the id index's order: a step reads only its own matches.
		afterID := ""
		if after != nil {
			afterID = after.ID
		}
		refs, err = s.fsm.PendingUnder(q, afterID, limit)
	} else {
		refs, err = s.fsm.ListRefs(q, after, limit)
	}
	if err != nil {
		return CancelStep{}, err
	}
	step := CancelStep{Matched: uint64(len(refs))}
	if len(refs) == limit {
		step.Next = &refs[len(refs)-1].Position
	}
	if dryRun || len(refs) == 0 {
		return step, nil
	}
	cmd := raftfsm.Cancel{ProposedAt: s.cfg.Now().UnixNano(), IDs: make([]string, 0, len(refs))}
	for _, r := range refs {
		if s.inDoubt(raftfsm.Record{Seq: r.Seq, Due: r.Due, State: raftfsm.StateScheduled}) {
			step.Held++
			continue
		}
		cmd.IDs = append(cmd.IDs, r.ID)
	}
	if len(cmd.IDs) == 0 {
		return step, nil
	}
	resp, err := s.apply(ctx, raftfsm.AppendCancel(nil, &cmd))
	if err != nil {
		return CancelStep{}, err
	}
	res, ok := resp.(*raftfsm.CancelBatchResult)
	if !ok || len(res.Results) != len(cmd.IDs) {
		return CancelStep{}, fmt.Errorf("shard %d: unexpected cancel response %T", s.id, resp)
	}
	for _, r := range res.Results {
		switch err := s.cancelled(ctx, r); {
		case errors.Is(err, ErrCancelUnsure):
			step.Held++
		case err != nil:
			return CancelStep{}, err
		case r.Outcome == raftfsm.Cancelled || r.Outcome == raftfsm.AlreadyCancelled:
			step.Cancelled++
		default:
			step.Fired++
		}
	}
	return step, nil
}
