package cluster

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// A List, Count or CancelMatching spans every shard: the node the client
// asked runs each shard's part on that shard's leader (its own replica when
// it leads, otherwise through Peer), in parallel, and merges the answers.
// The parts are stateless: a List page resumes from a position (due, id),
// and a bulk cancel step from the last event it listed, so any leader can
// answer the next one.

// FilterQuery turns a filter into the query it stands for. Its errors name
// the field and the rule it broke.
func FilterQuery(f *chimev1.EventFilter) (raftfsm.Query, error) {
	q := raftfsm.Query{Prefix: f.GetIdPrefix(), Topic: f.GetTopic(), Due: raftfsm.AnyDue}
	for i, st := range f.GetStates() {
		s, ok := fsmState(st)
		if !ok {
			return q, fmt.Errorf("filter.states[%d]: unknown state %s; one of SCHEDULED, FIRED, CANCELLED, DEAD_LETTERED", i, st)
		}
		q.States |= raftfsm.StatesOf(s)
	}
	for i, p := range f.GetPriorities() {
		if p > raftfsm.MaxPriority {
			return q, fmt.Errorf("filter.priorities[%d]: %d above %d; priorities are 0 (lowest) to %d (highest)", i, p, raftfsm.MaxPriority, raftfsm.MaxPriority)
		}
		q.Priorities |= raftfsm.PrioritiesOf(uint8(p))
	}
	if t := f.GetDueAfter(); t != nil {
		if err := t.CheckValid(); err != nil {
			return q, fmt.Errorf("filter.due_after: %v", err)
		}
		q.Due.From = t.AsTime().UnixNano()
	}
	if t := f.GetDueBefore(); t != nil {
		if err := t.CheckValid(); err != nil {
			return q, fmt.Errorf("filter.due_before: %v", err)
		}
		q.Due.To = t.AsTime().UnixNano()
	}
	if q.Due.To <= q.Due.From {
		return q, fmt.Errorf("filter.due_before: %s is not after filter.due_after %s", f.GetDueBefore().AsTime().Format(time.RFC3339Nano), f.GetDueAfter().AsTime().Format(time.RFC3339Nano))
	}
	return q, nil
}

// Filter is the filter that stands for q.
func Filter(q raftfsm.Query) *chimev1.EventFilter {
	f := &chimev1.EventFilter{IdPrefix: q.Prefix, Topic: q.Topic}
	for _, p := range states {
		if q.States != 0 && q.States.Has(p.fsm) {
			f.States = append(f.States, p.api)
		}
	}
	for p := range uint32(raftfsm.MaxPriority + 1) {
		if q.Priorities != 0 && q.Priorities.Has(uint8(p)) {
			f.Priorities = append(f.Priorities, p)
		}
	}
	if q.Due.From != math.MinInt64 {
		f.DueAfter = timestamppb.New(time.Unix(0, q.Due.From))
	}
	if q.Due.To != math.MaxInt64 {
		f.DueBefore = timestamppb.New(time.Unix(0, q.Due.To))
	}
	return f
}

// states pairs each stored state with the API's name for it.
var states = []struct {
	fsm raftfsm.State
	api chimev1.EventState
}{
	{raftfsm.StateScheduled, chimev1.EventState_EVENT_STATE_SCHEDULED},
	{raftfsm.StateFired, chimev1.EventState_EVENT_STATE_FIRED},
	{raftfsm.StateCancelled, chimev1.EventState_EVENT_STATE_CANCELLED},
	{raftfsm.StateDeadLettered, chimev1.EventState_EVENT_STATE_DEAD_LETTERED},
}

func fsmState(st chimev1.EventState) (raftfsm.State, bool) {
	for _, p := range states {
		if p.api == st {
			return p.fsm, true
		}
	}
	return 0, false
}

// EventState is the API's name for st.
func EventState(st raftfsm.State) (chimev1.EventState, bool) {
	for _, p := range states {
		if p.fsm == st {
			return p.api, true
		}
	}
	return chimev1.EventState_EVENT_STATE_UNSPECIFIED, false
}

// GetResponse is rec as Get returns it.
func GetResponse(rec *raftfsm.Record) (*chimev1.GetResponse, error) {
	st, ok := EventState(rec.State)
	if !ok {
		return nil, fmt.Errorf("unknown state %d for id %q", rec.State, rec.ID)
	}
	due := timestamppb.New(time.Unix(0, rec.Due))
	resp := &chimev1.GetResponse{
		Event: &chimev1.Event{
			Id:        rec.ID,
			DeliverAt: due,
			Topic:     rec.Topic,
			Key:       rec.Key,
			Payload:   rec.Payload,
		},
		State:           st,
		Due:             due,
		CreatedAt:       optionalTime(rec.CreatedAt),
		Attempts:        rec.Attempts,
		LastError:       rec.LastError,
		CancelledAt:     optionalTime(rec.CancelledAt),
		DeadLetterTopic: rec.DeadLetterTopic,
		Version:         rec.Version,
	}
	switch rec.State {
	case raftfsm.StateFired:
		resp.FiredAt = optionalTime(rec.FiredAt)
	case raftfsm.StateDeadLettered:
		resp.FiredAt = optionalTime(rec.DeadLetteredAt)
	}
	for _, h := range rec.Headers {
		resp.Event.Headers = append(resp.Event.Headers, &chimev1.Header{Key: h.Key, Value: h.Value})
	}
	setPolicy(resp.Event, rec.Policy)
	setOutput(resp.Event, rec.Output)
	return resp, nil
}

// setOutput writes o into ev: the partition when there is one, the
// tombstone.
func setOutput(ev *chimev1.Event, o raftfsm.Output) {
	if o.HasPartition {
		p := o.Partition
		ev.Partition = &p
	}
	ev.Tombstone = o.Tombstone
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

// optionalTime is nil for 0, the "not set" of raftfsm.Record's timestamps.
func optionalTime(unixNano int64) *timestamppb.Timestamp {
	if unixNano == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, unixNano))
}

// A query by priority goes to another node as ShardListV2, ShardCountV2 or ShardCancelV2: a
// node of a release before priorities would ignore the field in ShardList, ShardCount or
// ShardCancel and list, count or cancel every priority, where the V2 name it does not serve
// makes it answer UNIMPLEMENTED, acting on nothing. Every other query keeps the first names,
// which every release serves, so that a cluster being upgraded answers it throughout.

// shardCall calls a shard query under its first name, or under its V2 name when the
// query is by priority.
func shardCall[R any](ctx context.Context, sq *chimev1.ShardQuery,
	first, v2 func(context.Context, *chimev1.ShardQuery, ...grpc.CallOption) (R, error)) (R, error) {
	if len(sq.Filter.GetPriorities()) == 0 {
		return first(ctx, sq)
	}
	resp, err := v2(ctx, sq)
	return resp, earlierRelease(sq.Shard, err)
}

// earlierRelease names what an UNIMPLEMENTED answer to a V2 shard query means: the shard's
// leader runs a release that cannot filter by priority.
func earlierRelease(s uint32, err error) error {
	if status.Code(err) != codes.Unimplemented {
		return err
	}
	return status.Errorf(codes.FailedPrecondition, "filter.priorities: the leader of shard %d runs an earlier release, which cannot filter by priority, and did nothing; filter by priority once every node runs this release (%v)", s, status.Convert(err).Message())
}

func shardQuery(s uint32, q raftfsm.Query, after *raftfsm.Position, limit int, stale bool) *chimev1.ShardQuery {
	sq := &chimev1.ShardQuery{Shard: s, Filter: Filter(q), Limit: uint32(limit), StaleOk: stale}
	if after != nil {
		sq.AfterDue, sq.AfterId, sq.AfterSet = timestamppb.New(time.Unix(0, after.Due)), after.ID, true
	}
	return sq
}

// maxShardListBytes bounds the encoded events of one shard's List answer
// sent through Peer, below the 4 MiB a gRPC client accepts by default: 1,000
// events of a few KiB each would pass it. One event is at most a little over
// 1 MiB (the payload limit, a key, headers), so stopping before the event
// that would cross it keeps every answer under 4 MiB.
const maxShardListBytes = 3 << 20

// List implements rpc.Backend: up to limit events q selects after after,
// merged from every shard in due-then-id order. A shard whose answer came
// back truncated (its events too large for one message) may hold more
// events after its last one, so the merge stops there, and reports
// truncated: the caller's next page starts from the last event returned.
func (c *Cluster) List(ctx context.Context, q raftfsm.Query, after *raftfsm.Position, limit int, stale bool) ([]raftfsm.Record, bool, error) {
	type part struct {
		recs      []raftfsm.Record
		truncated bool
	}
	parts := make([]part, c.shards)
	err := eachShard(ctx, c.shards, func(ctx context.Context, s uint32) (err error) {
		parts[s], err = on(ctx, c, s, stale, nil,
			func(r *shard.Shard) (part, error) {
				recs, err := r.List(ctx, q, after, limit, stale)
				return part{recs: recs}, err
			},
			func(ctx context.Context, p chimev1.PeerClient) (part, error) {
				resp, err := shardCall(ctx, shardQuery(s, q, after, limit, stale), p.ShardList, p.ShardListV2)
				if err != nil {
					return part{}, err
				}
				out := part{recs: make([]raftfsm.Record, len(resp.Events)), truncated: resp.Truncated}
				for i, g := range resp.Events {
					out.recs[i] = fromGetResponse(g)
				}
				return out, nil
			})
		return err
	})
	if err != nil {
		return nil, false, err
	}
	all := make([][]raftfsm.Record, len(parts))
	var cutoff *raftfsm.Position
	for i, p := range parts {
		all[i] = p.recs
		if p.truncated && len(p.recs) > 0 {
			last := raftfsm.Position{Due: p.recs[len(p.recs)-1].Due, ID: p.recs[len(p.recs)-1].ID}
			if cutoff == nil || last.Less(*cutoff) {
				cutoff = &last
			}
		}
	}
	merged := merge(all, limit)
	if cutoff == nil {
		return merged, false, nil
	}
	n := 0
	for n < len(merged) && !cutoff.Less(raftfsm.Position{Due: merged[n].Due, ID: merged[n].ID}) {
		n++
	}
	return merged[:n], true, nil
}

// Count implements rpc.Backend: the events q selects, summed over every
// shard.
func (c *Cluster) Count(ctx context.Context, q raftfsm.Query, stale bool) (uint64, error) {
	counts := make([]uint64, c.shards)
	err := eachShard(ctx, c.shards, func(ctx context.Context, s uint32) (err error) {
		counts[s], err = on(ctx, c, s, stale, nil,
			func(r *shard.Shard) (uint64, error) { return r.Count(ctx, q, stale) },
			func(ctx context.Context, p chimev1.PeerClient) (uint64, error) {
				resp, err := shardCall(ctx, shardQuery(s, q, nil, 0, stale), p.ShardCount, p.ShardCountV2)
				return resp.GetCount(), err
			})
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

// CancelMatching implements rpc.Backend: the steps of a bulk cancel, on
// every shard's leader in parallel, each shard's from the start until it has
// no more matches, each step reported to progress, one call at a time.
func (c *Cluster) CancelMatching(ctx context.Context, q raftfsm.Query, dryRun bool, progress func(shard.CancelStep)) error {
	var mu sync.Mutex
	return eachShard(ctx, c.shards, func(ctx context.Context, s uint32) error {
		var after *raftfsm.Position
		for {
			st, err := on(ctx, c, s, false, nil,
				func(r *shard.Shard) (shard.CancelStep, error) {
					return r.CancelMatching(ctx, q, after, CancelStepSize, dryRun)
				},
				func(ctx context.Context, p chimev1.PeerClient) (shard.CancelStep, error) {
					sq := shardQuery(s, q, after, CancelStepSize, false)
					sq.DryRun = dryRun
					resp, err := shardCall(ctx, sq, p.ShardCancel, p.ShardCancelV2)
					if err != nil {
						return shard.CancelStep{}, err
					}
					st := shard.CancelStep{Matched: resp.Step.GetMatched(), Cancelled: resp.Step.GetCancelled(),
						Fired: resp.Step.GetSkippedFired(), Held: resp.Step.GetSkippedHeld()}
					if resp.NextSet {
						st.Next = &raftfsm.Position{Due: resp.NextDue.AsTime().UnixNano(), ID: resp.NextId}
					}
					return st, nil
				})
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

// The Peer side: one shard's part, on this node's replica of it, never
// forwarded further (a replica that no longer leads answers UNAVAILABLE and
// the asking node finds the new leader).

func (p peerServer) query(sq *chimev1.ShardQuery) (*shard.Shard, raftfsm.Query, *raftfsm.Position, error) {
	q, err := FilterQuery(sq.GetFilter())
	if err != nil {
		return nil, q, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	var after *raftfsm.Position
	if sq.AfterSet {
		after = &raftfsm.Position{Due: sq.AfterDue.AsTime().UnixNano(), ID: sq.AfterId}
	}
	r, err := p.replica(sq.Shard)
	return r, q, after, err
}

func (p peerServer) ShardList(ctx context.Context, sq *chimev1.ShardQuery) (*chimev1.ShardListResponse, error) {
	r, q, after, err := p.query(sq)
	if err != nil {
		return nil, err
	}
	recs, err := r.List(ctx, q, after, int(sq.Limit), sq.StaleOk)
	if err != nil {
		return nil, StatusOf(p.c.logger, "List", err)
	}
	resp := &chimev1.ShardListResponse{}
	size := 0
	for i := range recs {
		g, err := GetResponse(&recs[i])
		if err != nil {
			return nil, StatusOf(p.c.logger, "List", err)
		}
		if size += proto.Size(g); size > maxShardListBytes && i > 0 {
			resp.Truncated = true
			break
		}
		resp.Events = append(resp.Events, g)
	}
	return resp, nil
}

func (p peerServer) ShardCount(ctx context.Context, sq *chimev1.ShardQuery) (*chimev1.CountResponse, error) {
	r, q, _, err := p.query(sq)
	if err != nil {
		return nil, err
	}
	n, err := r.Count(ctx, q, sq.StaleOk)
	if err != nil {
		return nil, StatusOf(p.c.logger, "Count", err)
	}
	return &chimev1.CountResponse{Count: n}, nil
}

// ShardListV2, ShardCountV2 and ShardCancelV2 are the names a query by priority is sent
// under (shardCall); they answer as the first names do, which take priorities too.

func (p peerServer) ShardListV2(ctx context.Context, sq *chimev1.ShardQuery) (*chimev1.ShardListResponse, error) {
	return p.ShardList(ctx, sq)
}

func (p peerServer) ShardCountV2(ctx context.Context, sq *chimev1.ShardQuery) (*chimev1.CountResponse, error) {
	return p.ShardCount(ctx, sq)
}

func (p peerServer) ShardCancelV2(ctx context.Context, sq *chimev1.ShardQuery) (*chimev1.ShardCancelResponse, error) {
	return p.ShardCancel(ctx, sq)
}

func (p peerServer) ShardCancel(ctx context.Context, sq *chimev1.ShardQuery) (*chimev1.ShardCancelResponse, error) {
	r, q, after, err := p.query(sq)
	if err != nil {
		return nil, err
	}
	step, err := r.CancelMatching(ctx, q, after, int(sq.Limit), sq.DryRun)
	if err != nil {
		return nil, StatusOf(p.c.logger, "CancelMatching", err)
	}
	resp := &chimev1.ShardCancelResponse{Step: &chimev1.CancelMatchingProgress{
		Matched: step.Matched, Cancelled: step.Cancelled, SkippedFired: step.Fired, SkippedHeld: step.Held}}
	if step.Next != nil {
		resp.NextDue, resp.NextId, resp.NextSet = timestamppb.New(time.Unix(0, step.Next.Due)), step.Next.ID, true
	}
	return resp, nil
}
