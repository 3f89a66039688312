package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/chimehq/chime/raftfsm"
)

// changeAttempts bounds how often Update starts again when another change
// of the event committed between its read and its own entry.
const changeAttempts = 3

// Update makes ch the next version of the pending event ch.ID: the fields
// ch sets change, through Raft. When it reports Updated, no
// record of the version it replaced will be produced from then on: that
// version was in no fire batch when the change was proposed, was kept out
// of the wheel until it committed, and no produce attempt of it is
// unanswered (ErrFiring, ErrProduceUnknown otherwise, with nothing
// changed).
//
// A settled, unknown or differently versioned event is answered from this
// leader's state under its lease, without an entry; so is a refused
// condition, an event outside ch.Scope (a *NotPermittedError), and a
// payload for a tombstone event (ErrTombstonePayload). An Update keeps the
// event's partition and tombstone as they are.
func (s *Shard) Update(ctx context.Context, ch Change) (raftfsm.ChangeResult, error) {
	for attempt := 1; ; attempt++ {
		if err := s.readable(ctx); err != nil {
			return raftfsm.ChangeResult{}, err
		}
		rec, found, err := s.fsm.Get(ch.ID)
		if err != nil {
			return raftfsm.ChangeResult{}, err
		}
		now := raftfsm.ChangeResult{State: rec.State, Seq: rec.Seq, Due: rec.Due, Version: rec.Version}
		switch {
		case !found:
			return raftfsm.ChangeResult{Outcome: raftfsm.UpdateNotFound}, nil
		case !permits(ch.Scope, &rec):
			return raftfsm.ChangeResult{}, Refuse(ch.Scope, ch.ID)
		case rec.State != raftfsm.StateScheduled:
			now.Outcome = raftfsm.UpdateNotPending
			return now, nil
		case ch.IfVersion != 0 && ch.IfVersion != rec.Version:
			now.Outcome = raftfsm.VersionMismatch
			return now, nil
		case rec.Tombstone && ch.Fields&raftfsm.ChangePayload != 0 && len(ch.Payload) > 0:
			// The change applies only to rec.Seq (ChangeCheckPending), whose
			// content never changes, so this check holds when it commits.
			return raftfsm.ChangeResult{}, ErrTombstonePayload
		case s.inDoubt(rec):
			return raftfsm.ChangeResult{}, ErrProduceUnknown
		}
		if err := s.firing.pin(rec.Seq, rec.Due, rec.Policy); err != nil {
			return raftfsm.ChangeResult{}, err
		}
		ch.Fields |= raftfsm.ChangeCheckPending
		ch.Pending = rec.Seq
		if hook := s.cfg.Knobs.UpdatePinned; hook != nil {
			hook()
		}
		res, err := s.proposeUpdate(ctx, ch)
		s.firing.unpin(rec.Seq)
		if err != nil {
			return raftfsm.ChangeResult{}, err
		}
		if res.Outcome != raftfsm.UpdateMoved {
			return res, nil
		}
		if attempt == changeAttempts {
			return raftfsm.ChangeResult{}, ErrChanging
		}
	}
}

func (s *Shard) proposeUpdate(ctx context.Context, ch Change) (raftfsm.ChangeResult, error) {
	now := s.cfg.Now().UnixNano()
	if ch.HasDelay {
		ch.Due = now + int64(ch.Delay)
	}
	cmd := raftfsm.Update{ProposedAt: now, Changes: []raftfsm.Change{ch.Change}}
	resp, err := s.apply(ctx, raftfsm.AppendUpdate(nil, &cmd))
	if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrStopped) {
		// The entry may have been appended before leadership went, or
		// before the replica closed under it: a retry that found this
		// leader gone would apply the change again.
		return raftfsm.ChangeResult{}, fmt.Errorf("%w (%v)", ErrChangeUnknown, err)
	}
	if err != nil {
		return raftfsm.ChangeResult{}, err
	}
	res, ok := resp.(*raftfsm.UpdateResult)
	if !ok || len(res.Results) != 1 {
		return raftfsm.ChangeResult{}, fmt.Errorf("shard %d: unexpected update response %T", s.id, resp)
	}
	return res.Results[0], nil
}
