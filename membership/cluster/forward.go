package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
)

// Any node accepts any request. The Cluster, as the Scheduler's Backend,
// proposes on the shards this node leads and forwards the rest to their
// leaders through the same public API, marked so that the receiving node
// does not forward again (a request that reaches a stale leader fails with
// UNAVAILABLE and the client retries, idempotently by id).

// Forwarded reports a request another node forwarded to this one: it must
// not be forwarded again.
func Forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(chimev1.ForwardedMetadata)) > 0
}

// ForwardContext marks an outgoing call as forwarded on behalf of scope's
// credential (nil: a caller whose credential limits nothing), whose grant
// the leader then checks the operation against.
func ForwardContext(ctx context.Context, scope shard.Scope) context.Context {
	if scope != nil {
		return metadata.AppendToOutgoingContext(ctx, chimev1.ForwardedMetadata, "1", chimev1.CredentialMetadata, scope.Credential())
	}
	return metadata.AppendToOutgoingContext(ctx, chimev1.ForwardedMetadata, "1")
}

func (c *Cluster) schedulerClient(ctx context.Context, s uint32) (chimev1.SchedulerClient, error) {
	if Forwarded(ctx) {
		return nil, fmt.Errorf("%w: shard %d (request was already forwarded once)", shard.ErrNotLeader, s)
	}
	cc, err := c.leaderConn(ctx, s)
	if err != nil {
		return nil, err
	}
	return chimev1.NewSchedulerClient(cc), nil
}

// leaderConn returns a connection to the node that leads shard s, another
// than this one: this node's own replica, when it leads, is asked directly.
func (c *Cluster) leaderConn(ctx context.Context, s uint32) (*grpc.ClientConn, error) {
	node, err := c.LeaderNode(ctx, s)
	if err != nil {
		return nil, err
	}
	if node == c.self {
		return nil, fmt.Errorf("%w: shard %d is changing leader", shard.ErrNotLeader, s)
	}
	// Tells a client that routes to leaders that its map is stale. Outside
	// a gRPC handler (no stream in ctx) SetHeader fails, and nobody is told.
	_ = grpc.SetHeader(ctx, metadata.Pairs(chimev1.LeaderMovedHeader, node))
	return c.Conn(node)
}

// Schedule implements Backend: each shard's requests go to its leader.
func (c *Cluster) Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	return host.ScheduleByShard(ctx, reqs, c.shards, c.scheduleOn)
}

// leaderMissing reports an error that a retry after a leader change can
// cure: this node's replica lost leadership or moved, or the node forwarded
// to answered UNAVAILABLE (it no longer leads either).
func leaderMissing(err error) bool {
	return errors.Is(err, shard.ErrNotLeader) || errors.Is(err, shard.ErrUnknownShard) ||
		status.Code(err) == codes.Unavailable
}

func (c *Cluster) scheduleOn(ctx context.Context, s uint32, reqs []shard.Request) ([]shard.Result, error) {
	if Forwarded(ctx) {
		return c.scheduleOnce(ctx, s, reqs)
	}
	return host.AwaitLeader(ctx, leaderMissing, func() ([]shard.Result, error) { return c.scheduleOnce(ctx, s, reqs) })
}

func (c *Cluster) scheduleOnce(ctx context.Context, s uint32, reqs []shard.Request) ([]shard.Result, error) {
	if r := c.LocalLeader(s); r != nil {
		res, err := r.Schedule(ctx, reqs)
		if !errors.Is(err, shard.ErrNotLeader) {
			return res, err
		}
	}
	cl, err := c.schedulerClient(ctx, s)
	if err != nil {
		return nil, err
	}
	req := &chimev1.BatchScheduleRequest{Events: make([]*chimev1.Event, len(reqs))}
	for i, r := range reqs {
		req.Events[i] = toEvent(r)
	}
	// One call's events, all with the scope of its caller's credential.
	resp, err := cl.BatchSchedule(ForwardContext(ctx, reqs[0].Scope), req)
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != len(reqs) {
		return nil, fmt.Errorf("forwarded batch: %d results for %d events", len(resp.Results), len(reqs))
	}
	out := make([]shard.Result, len(reqs))
	for i, r := range resp.Results {
		switch codes.Code(r.Code) {
		case codes.OK:
			out[i] = shard.Result{Outcome: raftfsm.Created, Due: r.Due.AsTime().UnixNano(), Version: r.Version}
			switch {
			case r.Existing:
				out[i].Outcome = raftfsm.Existing
			case r.Version > 1:
				out[i].Outcome = raftfsm.Replaced
			}
		case codes.AlreadyExists:
			out[i] = shard.Result{Outcome: raftfsm.Conflict}
		case codes.Aborted, codes.PermissionDenied:
			// A Replace the leader refused, or an id outside the caller's
			// scope, changing nothing: this event's answer, not the call's.
			out[i] = shard.Result{Err: status.Error(codes.Code(r.Code), r.Message)}
		default:
			return nil, status.Error(codes.Code(r.Code), r.Message)
		}
	}
	return out, nil
}

func toEvent(r shard.Request) *chimev1.Event {
	ev := &chimev1.Event{Id: r.ID, Topic: r.Topic, Key: r.Key, Payload: r.Payload}
	if r.Replace {
		ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REPLACE
	}
	if r.HasDeliverAt {
		ev.DeliverAt = timestamppb.New(time.Unix(0, r.DeliverAt))
	}
	if r.HasDelay {
		ev.Delay = durationpb.New(r.Delay)
	}
	for _, h := range r.Headers {
		ev.Headers = append(ev.Headers, &chimev1.Header{Key: h.Key, Value: h.Value})
	}
	setPolicy(ev, r.Policy)
	return ev
}

// setPolicy writes p into ev: the priority always (so that a reader sees
// it), the window when there is one.
func setPolicy(ev *chimev1.Event, p raftfsm.Policy) {
	prio := uint32(p.Priority)
	ev.Priority = &prio
	if p.Window != 0 {
		ev.Window = durationpb.New(time.Duration(p.Window))
	}
}

// Cancel implements Backend.
func (c *Cluster) Cancel(ctx context.Context, id string, scope shard.Scope) (raftfsm.CancelResult, error) {
	if Forwarded(ctx) {
		return c.cancelOnce(ctx, id, scope)
	}
	return host.AwaitLeader(ctx, leaderMissing, func() (raftfsm.CancelResult, error) { return c.cancelOnce(ctx, id, scope) })
}

func (c *Cluster) cancelOnce(ctx context.Context, id string, scope shard.Scope) (raftfsm.CancelResult, error) {
	s := shard.For(id, c.shards)
	if r := c.LocalLeader(s); r != nil {
		res, err := r.Cancel(ctx, id, scope)
		if !errors.Is(err, shard.ErrNotLeader) {
			return res, err
		}
	}
	cl, err := c.schedulerClient(ctx, s)
	if err != nil {
		return raftfsm.CancelResult{}, err
	}
	// The leader's answer, error codes and messages included, is the answer.
	if _, err := cl.Cancel(ForwardContext(ctx, scope), &chimev1.CancelRequest{Id: id}); err != nil {
		return raftfsm.CancelResult{}, err
	}
	return raftfsm.CancelResult{Outcome: raftfsm.Cancelled}, nil
}

// Update implements Backend. Only a missing leader before anything was
// proposed is retried here: a change is not idempotent.
func (c *Cluster) Update(ctx context.Context, ch shard.Change) (raftfsm.ChangeResult, error) {
	if Forwarded(ctx) {
		return c.updateOnce(ctx, ch)
	}
	return host.AwaitLeader(ctx, leaderMissing, func() (raftfsm.ChangeResult, error) { return c.updateOnce(ctx, ch) })
}

func (c *Cluster) updateOnce(ctx context.Context, ch shard.Change) (raftfsm.ChangeResult, error) {
	s := shard.For(ch.ID, c.shards)
	if r := c.LocalLeader(s); r != nil {
		res, err := r.Update(ctx, ch)
		if !errors.Is(err, shard.ErrNotLeader) {
			return res, err
		}
	}
	cl, err := c.schedulerClient(ctx, s)
	if err != nil {
		return raftfsm.ChangeResult{}, err
	}
	// The leader's answer, error codes and messages included, is the answer.
	resp, err := cl.Update(ForwardContext(ctx, ch.Scope), toUpdateRequest(ch))
	if err != nil {
		return raftfsm.ChangeResult{}, err
	}
	return raftfsm.ChangeResult{Outcome: raftfsm.Updated, State: raftfsm.StateScheduled,
		Due: resp.Due.AsTime().UnixNano(), Version: resp.Version}, nil
}

func toUpdateRequest(ch shard.Change) *chimev1.UpdateRequest {
	req := &chimev1.UpdateRequest{Id: ch.ID, ExpectedVersion: ch.IfVersion}
	switch {
	case ch.Fields&raftfsm.ChangeDue == 0:
	case ch.HasDelay:
		req.Delay = durationpb.New(ch.Delay)
	default:
		req.DeliverAt = timestamppb.New(time.Unix(0, ch.Due))
	}
	if ch.Fields&raftfsm.ChangeKey != 0 {
		req.Key = nonNil(ch.Key)
	}
	if ch.Fields&raftfsm.ChangePayload != 0 {
		req.Payload = nonNil(ch.Payload)
	}
	if ch.Fields&raftfsm.ChangeHeaders != 0 {
		req.Headers = &chimev1.HeaderList{}
		for _, h := range ch.Headers {
			req.Headers.Headers = append(req.Headers.Headers, &chimev1.Header{Key: h.Key, Value: h.Value})
		}
	}
	return req
}

// nonNil returns b, or an empty slice for nil: an optional bytes field is
// sent only when it is not nil.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

type found struct {
	rec raftfsm.Record
	ok  bool
}

// Get implements Backend.
func (c *Cluster) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	if Forwarded(ctx) {
		return c.getOnce(ctx, id)
	}
	f, err := host.AwaitLeader(ctx, leaderMissing, func() (found, error) {
		rec, ok, err := c.getOnce(ctx, id)
		return found{rec, ok}, err
	})
	return f.rec, f.ok, err
}

func (c *Cluster) getOnce(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	s := shard.For(id, c.shards)
	if r := c.LocalLeader(s); r != nil {
		rec, ok, err := r.Get(ctx, id)
		if !errors.Is(err, shard.ErrNotLeader) {
			return rec, ok, err
		}
	}
	cl, err := c.schedulerClient(ctx, s)
	if err != nil {
		return raftfsm.Record{}, false, err
	}
	resp, err := cl.Get(ForwardContext(ctx, nil), &chimev1.GetRequest{Id: id})
	if status.Code(err) == codes.NotFound {
		return raftfsm.Record{}, false, nil
	}
	if err != nil {
		return raftfsm.Record{}, false, err
	}
	return fromGetResponse(resp), true, nil
}

func fromGetResponse(g *chimev1.GetResponse) raftfsm.Record {
	ns := func(t *timestamppb.Timestamp) int64 {
		if t == nil {
			return 0
		}
		return t.AsTime().UnixNano()
	}
	rec := raftfsm.Record{
		Due: ns(g.Due), CreatedAt: ns(g.CreatedAt), CancelledAt: ns(g.CancelledAt),
		Attempts: g.Attempts, LastError: g.LastError, DeadLetterTopic: g.DeadLetterTopic,
		Version: g.Version, Policy: raftfsm.DefaultPolicy,
	}
	if p := g.GetEvent().Priority; p != nil {
		rec.Priority = uint8(*p)
	}
	if w := g.GetEvent().GetWindow(); w != nil {
		rec.Window = int64(w.AsDuration())
	}
	switch g.State {
	case chimev1.EventState_EVENT_STATE_SCHEDULED:
		rec.State = raftfsm.StateScheduled
	case chimev1.EventState_EVENT_STATE_FIRED:
		rec.State, rec.FiredAt = raftfsm.StateFired, ns(g.FiredAt)
	case chimev1.EventState_EVENT_STATE_CANCELLED:
		rec.State = raftfsm.StateCancelled
	case chimev1.EventState_EVENT_STATE_DEAD_LETTERED:
		rec.State, rec.DeadLetteredAt = raftfsm.StateDeadLettered, ns(g.FiredAt)
	}
	if ev := g.Event; ev != nil {
		rec.ID, rec.Topic, rec.Key, rec.Payload = ev.Id, ev.Topic, ev.Key, ev.Payload
		for _, h := range ev.Headers {
			rec.Headers = append(rec.Headers, raftfsm.Header{Key: h.Key, Value: h.Value})
		}
	}
	return rec
}
