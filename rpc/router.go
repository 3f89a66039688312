package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// forwardedKey marks a request forwarded by another node.
const forwardedKey = "chime-forwarded"

func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

func forwardCtx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
}

// leaderNode returns the node that leads shard s as far as this node can
// tell, or an error wrapping shard.ErrNotLeader.
func (c *Cluster) leaderNode(ctx context.Context, s uint32) (string, error) {
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil {
			if l := r.Leader(); l != "" {
				return l, nil
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, node, err := c.leaderReplica(ctx, s)
	return node, err
}

// local returns this node's replica of s when it leads it.
func (c *Cluster) local(s uint32) *shard.Shard {
	if h := c.host.Load(); h != nil {
		if r := h.Replica(s); r != nil && r.IsLeader() {
			return r
		}
	}
	return nil
}

func (c *Cluster) schedulerClient(ctx context.Context, s uint32) (chimev1.SchedulerClient, error) {
	if forwarded(ctx) {
		return nil, fmt.Errorf("%w: shard %d (request was already forwarded once)", shard.ErrNotLeader, s)
	}
	node, err := c.leaderNode(ctx, s)
	if err != nil {
		return nil, err
	}
	if node == c.self {
		return nil, fmt.Errorf("%w: shard %d is changing leader", shard.ErrNotLeader, s)
	}
	cc, err := c.conn(node)
	if err != nil {
		return nil, err
	}
	return chimev1.NewSchedulerClient(cc), nil
}

// Schedule implements Backend: each shard's requests go to its leader.
func (c *Cluster) Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	return host.ScheduleByShard(ctx, reqs, c.shards, c.scheduleOn)
}

// leaderWait bounds how long a request waits out a leadership change (an
// election, a transfer, a replica move) before UNAVAILABLE reaches the
// client.
const leaderWait = 3 * time.Second

// retryLeader runs fn until it succeeds, fails for another reason than a
// missing leader, or leaderWait (or ctx) runs out. Every operation it wraps is
// idempotent by event id.
func retryLeader[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	deadline := time.Now().Add(leaderWait)
	backoff := 20 * time.Millisecond
	for {
		v, err := fn()
		if err == nil || !leaderMissing(err) || time.Now().Add(backoff).After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

// leaderMissing reports an error that a retry after a leader change can cure.
func leaderMissing(err error) bool {
	return errors.Is(err, shard.ErrNotLeader) || errors.Is(err, shard.ErrUnknownShard) ||
		status.Code(err) == codes.Unavailable
}

func (c *Cluster) scheduleOn(ctx context.Context, s uint32, reqs []shard.Request) ([]shard.Result, error) {
	if forwarded(ctx) {
		return c.scheduleOnce(ctx, s, reqs)
	}
	return retryLeader(ctx, func() ([]shard.Result, error) { return c.scheduleOnce(ctx, s, reqs) })
}

func (c *Cluster) scheduleOnce(ctx context.Context, s uint32, reqs []shard.Request) ([]shard.Result, error) {
	if r := c.local(s); r != nil {
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
	resp, err := cl.BatchSchedule(forwardCtx(ctx), req)
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
			out[i] = shard.Result{Outcome: raftfsm.Created, Due: r.Due.AsTime().UnixNano()}
			if r.Existing {
				out[i].Outcome = raftfsm.Existing
			}
		case codes.AlreadyExists:
			out[i] = shard.Result{Outcome: raftfsm.Conflict}
		default:
			return nil, status.Error(codes.Code(r.Code), r.Message)
		}
	}
	return out, nil
}

func toEvent(r shard.Request) *chimev1.Event {
	ev := &chimev1.Event{Id: r.ID, Topic: r.Topic, Key: r.Key, Payload: r.Payload}
	if r.HasDeliverAt {
		ev.DeliverAt = timestamppb.New(time.Unix(0, r.DeliverAt))
	}
	if r.HasDelay {
		ev.Delay = durationpb.New(r.Delay)
	}
	for _, h := range r.Headers {
		ev.Headers = append(ev.Headers, &chimev1.Header{Key: h.Key, Value: h.Value})
	}
	return ev
}

// Cancel implements Backend.
func (c *Cluster) Cancel(ctx context.Context, id string) (raftfsm.CancelResult, error) {
	if forwarded(ctx) {
		return c.cancelOnce(ctx, id)
	}
	return retryLeader(ctx, func() (raftfsm.CancelResult, error) { return c.cancelOnce(ctx, id) })
}

func (c *Cluster) cancelOnce(ctx context.Context, id string) (raftfsm.CancelResult, error) {
	s := shard.For(id, c.shards)
	if r := c.local(s); r != nil {
		res, err := r.Cancel(ctx, id)
		if !errors.Is(err, shard.ErrNotLeader) {
			return res, err
		}
	}
	cl, err := c.schedulerClient(ctx, s)
	if err != nil {
		return raftfsm.CancelResult{}, err
	}
	// The leader's answer, error codes and messages included, is the answer.
	if _, err := cl.Cancel(forwardCtx(ctx), &chimev1.CancelRequest{Id: id}); err != nil {
		return raftfsm.CancelResult{}, err
	}
	return raftfsm.CancelResult{Outcome: raftfsm.Cancelled}, nil
}

type found struct {
	rec raftfsm.Record
	ok  bool
}

// Get implements Backend.
func (c *Cluster) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	if forwarded(ctx) {
		return c.getOnce(ctx, id)
	}
	f, err := retryLeader(ctx, func() (found, error) {
		rec, ok, err := c.getOnce(ctx, id)
		return found{rec, ok}, err
	})
	return f.rec, f.ok, err
}

func (c *Cluster) getOnce(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	s := shard.For(id, c.shards)
	if r := c.local(s); r != nil {
		rec, ok, err := r.Get(ctx, id)
		if !errors.Is(err, shard.ErrNotLeader) {
			return rec, ok, err
		}
	}
	cl, err := c.schedulerClient(ctx, s)
	if err != nil {
		return raftfsm.Record{}, false, err
	}
	resp, err := cl.Get(forwardCtx(ctx), &chimev1.GetRequest{Id: id})
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
