package rpc

import (
	"context"
	"fmt"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Update validates a change of one pending event and applies it.
func (s *Server) Update(ctx context.Context, in *chimev1.UpdateRequest) (*chimev1.UpdateResponse, error) {
	ch, ferr := s.checkUpdate(in, s.now())
	if ferr != nil {
		return nil, status.Error(codes.InvalidArgument, ferr.Error())
	}
	ch.Scope = ScopeOf(ctx)
	res, err := s.backend.Update(ctx, ch)
	if err != nil {
		return nil, s.backendStatus("Update", err)
	}
	switch res.Outcome {
	case raftfsm.Updated:
		return &chimev1.UpdateResponse{Id: ch.ID, Due: timestamppb.New(time.Unix(0, res.Due)), Version: res.Version}, nil
	case raftfsm.UpdateNotFound:
		return nil, notFound(ch.ID)
	case raftfsm.UpdateNotPending:
		return nil, status.Errorf(codes.FailedPrecondition, "id: event %q has %s; only a scheduled event can be updated", ch.ID, settledWords(res.State))
	case raftfsm.VersionMismatch:
		return nil, status.Errorf(codes.FailedPrecondition, "expected_version: event %q is at version %d, not %d", ch.ID, res.Version, ch.IfVersion)
	}
	return nil, s.backendStatus("Update", fmt.Errorf("backend returned unknown update outcome %v for id %q", res.Outcome, ch.ID))
}

// settledWords says how an event left SCHEDULED, for a message.
func settledWords(st raftfsm.State) string {
	switch st {
	case raftfsm.StateFired:
		return "already fired"
	case raftfsm.StateCancelled:
		return "been cancelled"
	case raftfsm.StateDeadLettered:
		return "been dead-lettered"
	}
	return "state " + st.String()
}

// checkUpdate validates in, by the rules a Schedule's event follows for the
// fields it sets, and returns the change: the fields set, and at least one.
func (s *Server) checkUpdate(in *chimev1.UpdateRequest, now time.Time) (shard.Change, *fieldError) {
	if ferr := s.checkID(in.GetId()); ferr != nil {
		return shard.Change{}, ferr
	}
	ch := shard.Change{Change: raftfsm.Change{ID: in.Id, IfVersion: in.ExpectedVersion}}
	ev := &chimev1.Event{DeliverAt: in.DeliverAt, Delay: in.Delay, Key: in.Key, Payload: in.Payload, Headers: in.Headers.GetHeaders()}
	switch {
	case in.DeliverAt != nil && in.Delay != nil:
		return shard.Change{}, invalid("deliver_at", "set at most one of deliver_at and delay (both are set)")
	case in.DeliverAt != nil || in.Delay != nil:
		var due shard.Request
		if ferr := s.limits.checkDue(topLevel, ev, now, &due); ferr != nil {
			return shard.Change{}, ferr
		}
		ch.Fields |= raftfsm.ChangeDue
		ch.Due, ch.Delay, ch.HasDelay = due.DeliverAt, due.Delay, due.HasDelay
	}
	if ferr := s.limits.checkContent(topLevel, ev, false); ferr != nil {
		return shard.Change{}, ferr
	}
	if in.Key != nil {
		ch.Fields |= raftfsm.ChangeKey
		ch.Key = in.Key
	}
	if in.Payload != nil {
		ch.Fields |= raftfsm.ChangePayload
		ch.Payload = in.Payload
	}
	if in.Headers != nil {
		ch.Fields |= raftfsm.ChangeHeaders
		for _, h := range in.Headers.Headers {
			ch.Headers = append(ch.Headers, raftfsm.Header{Key: h.Key, Value: h.Value})
		}
	}
	if ch.Fields == 0 {
		return shard.Change{}, invalid("request", "nothing to change: set deliver_at or delay, key, payload or headers")
	}
	return ch, nil
}
