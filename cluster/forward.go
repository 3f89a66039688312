package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// The Cluster is the rpc.Backend of every node: each operation runs on its
// shard's leader (on), here or through the leader's Peer service, which
// receives the request as this node validated it (ValidEvent,
// ShardUpdateRequest, the Recurring command's log encoding) and does not
// validate it again.

// Forwarded reports an Admin call another node forwarded to this one: it
// must not be forwarded again.
func Forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(chimev1.ForwardedMetadata)) > 0
}

// ForwardContext marks an outgoing call as made by this node on behalf of
// scope's credential (nil: a caller whose credential limits nothing), whose
// grant the other node's authorizer then applies.
func ForwardContext(ctx context.Context, scope shard.Scope) context.Context {
	if scope != nil {
		return metadata.AppendToOutgoingContext(ctx, chimev1.ForwardedMetadata, "1", chimev1.CredentialMetadata, scope.Credential())
	}
	return metadata.AppendToOutgoingContext(ctx, chimev1.ForwardedMetadata, "1")
}

// Schedule implements rpc.Backend: each shard's requests go to its leader.
// A batch's requests all carry the scope of one caller. A part with a
// Replace is a change that is not idempotent (a second attempt makes
// another version, produced again if the first had fired), so it is
// forwarded again only after its leader answered that it proposed nothing
// (changeOutcome); a plain Schedule retried finds its id.
func (c *Cluster) Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	return scheduleByShard(ctx, reqs, c.shards, func(ctx context.Context, s uint32, part []shard.Request) ([]shard.Result, error) {
		replace := slices.ContainsFunc(part, func(r shard.Request) bool { return r.Replace })
		return on(ctx, c, s, false, part[0].Scope,
			func(r *shard.Shard) ([]shard.Result, error) { return r.Schedule(ctx, part) },
			func(ctx context.Context, p chimev1.PeerClient) ([]shard.Result, error) {
				resp, err := p.ShardSchedule(ctx, validEvents(s, part))
				if err != nil && replace {
					return nil, changeOutcome(err)
				}
				if err != nil {
					return nil, err
				}
				return fromShardResults(resp.Results, len(part))
			})
	})
}

// validEvents is the Peer form of a shard's validated requests.
func validEvents(s uint32, reqs []shard.Request) *chimev1.ShardScheduleRequest {
	evs := make([]chimev1.ValidEvent, len(reqs))
	out := &chimev1.ShardScheduleRequest{Shard: s, Events: make([]*chimev1.ValidEvent, len(reqs))}
	for i := range reqs {
		r, ev := &reqs[i], &evs[i]
		ev.Id, ev.Topic, ev.Key, ev.Payload, ev.Headers = r.ID, r.Topic, r.Key, r.Payload, headersProto(r.Headers)
		ev.DeliverAt, ev.HasDeliverAt, ev.Delay, ev.HasDelay = r.DeliverAt, r.HasDeliverAt, int64(r.Delay), r.HasDelay
		ev.ContentHash, ev.Replace, ev.Priority, ev.Window = r.ContentHash, r.Replace, uint32(r.Policy.Priority), r.Policy.Window
		if r.Output.HasPartition {
			ev.Partition = &r.Output.Partition
		}
		ev.Tombstone = r.Output.Tombstone
		out.Events[i] = ev
	}
	return out
}

// fromValidEvents is the requests a ShardScheduleRequest carries, with
// scope.
func fromValidEvents(evs []*chimev1.ValidEvent, scope shard.Scope) []shard.Request {
	reqs := make([]shard.Request, len(evs))
	for i, ev := range evs {
		reqs[i] = shard.Request{ID: ev.Id, Topic: ev.Topic, Key: ev.Key, Payload: ev.Payload, Headers: headersOf(ev.Headers),
			DeliverAt: ev.DeliverAt, HasDeliverAt: ev.HasDeliverAt, Delay: time.Duration(ev.Delay), HasDelay: ev.HasDelay,
			ContentHash: ev.ContentHash, Replace: ev.Replace,
			Policy: raftfsm.Policy{Priority: uint8(ev.Priority), Window: ev.Window}, Scope: scope}
		if ev.Partition != nil {
			reqs[i].Output.Partition, reqs[i].Output.HasPartition = *ev.Partition, true
		}
		reqs[i].Output.Tombstone = ev.Tombstone
	}
	return reqs
}

// shardResults is the Peer form of a replica's Schedule results: a
// refusal of one event alone as the gRPC status StatusOf gives it.
func shardResults(logger *slog.Logger, res []shard.Result) []*chimev1.ShardResult {
	rs := make([]chimev1.ShardResult, len(res))
	out := make([]*chimev1.ShardResult, len(res))
	for i, r := range res {
		if r.Err != nil {
			st := status.Convert(StatusOf(logger, "Schedule", r.Err))
			rs[i].Code, rs[i].Message = int32(st.Code()), st.Message()
		} else {
			rs[i].Outcome, rs[i].Due, rs[i].Version = uint32(r.Outcome), r.Due, r.Version
		}
		out[i] = &rs[i]
	}
	return out
}

func fromShardResults(rs []*chimev1.ShardResult, n int) ([]shard.Result, error) {
	if len(rs) != n {
		return nil, fmt.Errorf("forwarded batch: %d results for %d events", len(rs), n)
	}
	out := make([]shard.Result, n)
	for i, r := range rs {
		if r.Code != int32(codes.OK) {
			out[i].Err = status.Error(codes.Code(r.Code), r.Message)
			continue
		}
		out[i] = shard.Result{Outcome: raftfsm.ScheduleOutcome(r.Outcome), Due: r.Due, Version: r.Version}
	}
	return out, nil
}

func headersProto(hs []raftfsm.Header) []*chimev1.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]*chimev1.Header, len(hs))
	for i, h := range hs {
		out[i] = &chimev1.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

func headersOf(hs []*chimev1.Header) []raftfsm.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]raftfsm.Header, len(hs))
	for i, h := range hs {
		out[i] = raftfsm.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// Cancel implements rpc.Backend.
func (c *Cluster) Cancel(ctx context.Context, id string, scope shard.Scope) (raftfsm.CancelResult, error) {
	return on(ctx, c, shard.For(id, c.shards), false, scope,
		func(r *shard.Shard) (raftfsm.CancelResult, error) { return r.Cancel(ctx, id, scope) },
		func(ctx context.Context, p chimev1.PeerClient) (raftfsm.CancelResult, error) {
			resp, err := p.ShardCancelEvent(ctx, &chimev1.ShardEventRequest{Id: id})
			if err != nil {
				return raftfsm.CancelResult{}, err
			}
			return raftfsm.CancelResult{Outcome: raftfsm.CancelOutcome(resp.Outcome)}, nil
		})
}

// Update implements rpc.Backend. Only a missing leader before anything was
// proposed is retried: a change is not idempotent, so a forwarded call
// that failed once it may have reached the leader is UNKNOWN
// (changeOutcome).
func (c *Cluster) Update(ctx context.Context, ch shard.Change) (raftfsm.ChangeResult, error) {
	return on(ctx, c, shard.For(ch.ID, c.shards), false, ch.Scope,
		func(r *shard.Shard) (raftfsm.ChangeResult, error) { return r.Update(ctx, ch) },
		func(ctx context.Context, p chimev1.PeerClient) (raftfsm.ChangeResult, error) {
			resp, err := p.ShardUpdate(ctx, &chimev1.ShardUpdateRequest{Id: ch.ID, IfVersion: ch.IfVersion, Fields: uint32(ch.Fields),
				Due: ch.Due, Delay: int64(ch.Delay), HasDelay: ch.HasDelay, Key: ch.Key, Payload: ch.Payload, Headers: headersProto(ch.Headers)})
			if err != nil {
				return raftfsm.ChangeResult{}, changeOutcome(err)
			}
			return raftfsm.ChangeResult{Outcome: raftfsm.UpdateOutcome(resp.Outcome), State: raftfsm.State(resp.State),
				Due: resp.Due, Version: resp.Version}, nil
		})
}

// change is the shard.Change a ShardUpdateRequest carries, with scope.
func change(req *chimev1.ShardUpdateRequest, scope shard.Scope) shard.Change {
	return shard.Change{Change: raftfsm.Change{ID: req.Id, IfVersion: req.IfVersion, Fields: raftfsm.ChangeFields(req.Fields),
		Due: req.Due, Key: req.Key, Payload: req.Payload, Headers: headersOf(req.Headers)},
		Delay: time.Duration(req.Delay), HasDelay: req.HasDelay, Scope: scope}
}

type found struct {
	rec raftfsm.Record
	ok  bool
}

// Get implements rpc.Backend.
func (c *Cluster) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	f, err := on(ctx, c, shard.For(id, c.shards), false, nil,
		func(r *shard.Shard) (found, error) {
			rec, ok, err := r.Get(ctx, id)
			return found{rec, ok}, err
		},
		func(ctx context.Context, p chimev1.PeerClient) (found, error) {
			resp, err := p.ShardGet(ctx, &chimev1.ShardEventRequest{Id: id})
			if err != nil || !resp.Found {
				return found{}, err
			}
			return found{fromGetResponse(resp.Event), true}, nil
		})
	return f.rec, f.ok, err
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
	if p := g.GetEvent().Partition; p != nil {
		rec.Partition, rec.HasPartition = *p, true
	}
	rec.Tombstone = g.GetEvent().GetTombstone()
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
		rec.Headers = headersOf(ev.Headers)
	}
	return rec
}
