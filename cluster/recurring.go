package cluster

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// Recurring implements rpc.Backend: rc applies on the leader of its
// schedule's shard, which checks scope against the schedule as it stores
// it. Only a missing leader before anything was proposed is retried, unless
// the command answers the same the second time (changeOutcome).
func (c *Cluster) Recurring(ctx context.Context, rc raftfsm.Recurring, scope shard.Scope) (*raftfsm.RecurringResult, error) {
	return on(ctx, c, shard.For(rc.ID, c.shards), false, scope,
		func(r *shard.Shard) (*raftfsm.RecurringResult, error) { return r.Recurring(ctx, rc, scope) },
		func(ctx context.Context, p chimev1.PeerClient) (*raftfsm.RecurringResult, error) {
			resp, err := p.ShardRecurring(ctx, &chimev1.ShardRecurringRequest{Command: raftfsm.AppendRecurring(nil, &rc)})
			if err != nil {
				if !shard.Retryable(rc.Op) {
					err = changeOutcome(err)
				}
				return nil, err
			}
			res := &raftfsm.RecurringResult{Outcome: raftfsm.RecurringOutcome(resp.Outcome), Error: resp.Error,
				Created: resp.Created, Existing: resp.Existing, Due: resp.Due}
			if resp.Schedule != nil {
				if res.Schedule, err = FromScheduleProto(resp.Schedule); err != nil {
					return nil, err
				}
			}
			return res, nil
		})
}

// GetSchedule implements rpc.Backend.
func (c *Cluster) GetSchedule(ctx context.Context, id string, stale bool) (raftfsm.Schedule, bool, error) {
	type got struct {
		s  raftfsm.Schedule
		ok bool
	}
	s := shard.For(id, c.shards)
	g, err := on(ctx, c, s, stale, nil,
		func(r *shard.Shard) (got, error) {
			s, ok, err := r.GetSchedule(ctx, id, stale)
			return got{s, ok}, err
		},
		func(ctx context.Context, p chimev1.PeerClient) (got, error) {
			// The schedule with id, if there is one, is the first whose id
			// starts with it.
			resp, err := p.ShardSchedules(ctx, &chimev1.ShardSchedulesQuery{Shard: s, IdPrefix: id, Limit: 1, StaleOk: stale})
			if err != nil || len(resp.Schedules) == 0 || resp.Schedules[0].Id != id {
				return got{}, err
			}
			s, err := FromScheduleProto(resp.Schedules[0])
			return got{s, true}, err
		})
	return g.s, g.ok, err
}

// ListSchedules implements rpc.Backend: up to limit schedules whose id
// starts with prefix, after the id after, merged from every shard in id
// order; more says others follow.
func (c *Cluster) ListSchedules(ctx context.Context, prefix, after string, limit int, stale bool) ([]raftfsm.Schedule, bool, error) {
	type part struct {
		scheds []raftfsm.Schedule
		more   bool
	}
	parts := make([]part, c.shards)
	err := eachShard(ctx, c.shards, func(ctx context.Context, s uint32) (err error) {
		parts[s], err = on(ctx, c, s, stale, nil,
			func(r *shard.Shard) (part, error) {
				scheds, more, err := r.ListSchedules(ctx, prefix, after, limit, stale)
				return part{scheds, more}, err
			},
			func(ctx context.Context, p chimev1.PeerClient) (part, error) {
				resp, err := p.ShardSchedules(ctx, &chimev1.ShardSchedulesQuery{Shard: s, IdPrefix: prefix, AfterId: after, Limit: uint32(limit), StaleOk: stale})
				if err != nil {
					return part{}, err
				}
				out := part{scheds: make([]raftfsm.Schedule, len(resp.Schedules)), more: resp.More}
				for i, p := range resp.Schedules {
					if out.scheds[i], err = FromScheduleProto(p); err != nil {
						return part{}, err
					}
				}
				return out, nil
			})
		return err
	})
	if err != nil {
		return nil, false, err
	}
	scheds, more := make([][]raftfsm.Schedule, len(parts)), make([]bool, len(parts))
	for i, p := range parts {
		scheds[i], more[i] = p.scheds, p.more
	}
	merged, anyMore := mergeSchedules(scheds, more, limit)
	return merged, anyMore, nil
}

// maxShardSchedulesBytes bounds one shard's ShardSchedules answer, as
// maxShardListBytes does a List's.
const maxShardSchedulesBytes = maxShardListBytes

func (p peerServer) ShardSchedules(ctx context.Context, q *chimev1.ShardSchedulesQuery) (*chimev1.ShardSchedulesResponse, error) {
	r, err := p.replica(q.Shard)
	if err != nil {
		return nil, err
	}
	scheds, more, err := r.ListSchedules(ctx, q.IdPrefix, q.AfterId, int(q.Limit), q.StaleOk)
	if err != nil {
		return nil, StatusOf(p.c.logger, "Recurring.List", err)
	}
	resp := &chimev1.ShardSchedulesResponse{More: more}
	size := 0
	for i := range scheds {
		sp := ScheduleProto(&scheds[i])
		if size += proto.Size(sp); size > maxShardSchedulesBytes && i > 0 {
			resp.More = true
			break
		}
		resp.Schedules = append(resp.Schedules, sp)
	}
	return resp, nil
}

// Conversions between the Recurring API's messages and the state machine's
// schedules. The rpc layer validates what a client sends before it becomes a
// Definition; these convert what is already valid.

var catchUps = []struct {
	api chimev1.CatchUp
	fsm raftfsm.CatchUp
}{
	{chimev1.CatchUp_CATCH_UP_LAST, raftfsm.CatchUpLast},
	{chimev1.CatchUp_CATCH_UP_SKIP, raftfsm.CatchUpSkip},
	{chimev1.CatchUp_CATCH_UP_ALL, raftfsm.CatchUpAll},
}

// CatchUp maps the API's catch-up to the state machine's; unspecified is
// CatchUpLast, the default.
func CatchUp(c chimev1.CatchUp) (raftfsm.CatchUp, bool) {
	if c == chimev1.CatchUp_CATCH_UP_UNSPECIFIED {
		return raftfsm.CatchUpLast, true
	}
	for _, p := range catchUps {
		if p.api == c {
			return p.fsm, true
		}
	}
	return 0, false
}

func catchUpProto(c raftfsm.CatchUp) chimev1.CatchUp {
	for _, p := range catchUps {
		if p.fsm == c {
			return p.api
		}
	}
	return chimev1.CatchUp_CATCH_UP_UNSPECIFIED
}

// RuleProto is d's rule as the API writes it.
func RuleProto(d *raftfsm.Definition) *chimev1.RecurringRule {
	r := &chimev1.RecurringRule{TimeZone: d.TimeZone, MaxOccurrences: d.MaxOccurrences, CatchUp: catchUpProto(d.CatchUp),
		Start: optionalTime(d.Start), End: optionalTime(d.End)}
	if d.Every != 0 {
		r.Rule = &chimev1.RecurringRule_Every{Every: durationpb.New(time.Duration(d.Every))}
	} else {
		r.Rule = &chimev1.RecurringRule_Cron{Cron: d.Cron}
	}
	if d.Jitter != 0 {
		r.Jitter = durationpb.New(time.Duration(d.Jitter))
	}
	return r
}

// TargetProto is d's target as the API writes it.
func TargetProto(d *raftfsm.Definition) *chimev1.RecurringTarget {
	prio := uint32(d.Priority)
	t := &chimev1.RecurringTarget{Topic: d.Topic, Key: d.Key, Payload: d.Payload, Priority: &prio}
	for _, h := range d.Headers {
		t.Headers = append(t.Headers, &chimev1.Header{Key: h.Key, Value: h.Value})
	}
	return t
}

var scheduleStates = map[raftfsm.ScheduleState]chimev1.RecurringState{
	raftfsm.ScheduleActive:    chimev1.RecurringState_RECURRING_STATE_ACTIVE,
	raftfsm.SchedulePaused:    chimev1.RecurringState_RECURRING_STATE_PAUSED,
	raftfsm.ScheduleCompleted: chimev1.RecurringState_RECURRING_STATE_COMPLETED,
}

// ScheduleProto is s as the Recurring service returns it (without
// upcoming and existing, which the rpc layer adds).
func ScheduleProto(s *raftfsm.Schedule) *chimev1.RecurringSchedule {
	p := &chimev1.RecurringSchedule{
		Id:          s.ID,
		Rule:        RuleProto(&s.Definition),
		Target:      TargetProto(&s.Definition),
		State:       scheduleStates[s.State],
		Version:     s.Version,
		CreatedAt:   optionalTime(s.CreatedAt),
		UpdatedAt:   optionalTime(s.UpdatedAt),
		PausedAt:    optionalTime(s.PausedAt),
		Occurrences: s.Occurrences,
	}
	if s.NextSeq != 0 {
		p.NextOccurrence = timestamppb.New(time.Unix(0, s.Next))
		p.NextEventId = raftfsm.OccurrenceID(s.ID, time.Unix(0, s.Next))
		p.NextDue = timestamppb.New(time.Unix(0, s.NextDue))
	}
	p.ResumesFrom = optionalTime(s.ResumesFrom)
	return p
}

// FromScheduleProto reads a schedule another node answered with.
func FromScheduleProto(p *chimev1.RecurringSchedule) (raftfsm.Schedule, error) {
	s := raftfsm.Schedule{ID: p.Id, Version: p.Version, Occurrences: p.Occurrences,
		CreatedAt: unixNano(p.CreatedAt), UpdatedAt: unixNano(p.UpdatedAt), PausedAt: unixNano(p.PausedAt),
		ResumesFrom: unixNano(p.ResumesFrom)}
	for st, api := range scheduleStates {
		if api == p.State {
			s.State = st
		}
	}
	if s.State == 0 {
		return raftfsm.Schedule{}, fmt.Errorf("schedule %q: unknown state %v", p.Id, p.State)
	}
	d, err := Definition(p.Rule, p.Target)
	if err != nil {
		return raftfsm.Schedule{}, fmt.Errorf("schedule %q: %w", p.Id, err)
	}
	s.Definition = d
	if p.NextOccurrence != nil {
		// Not known to another node: any seq but 0 says one is pending.
		s.Next, s.NextDue, s.NextSeq = unixNano(p.NextOccurrence), unixNano(p.NextDue), 1
	}
	return s, nil
}

// Definition is the definition a valid rule and target write.
func Definition(r *chimev1.RecurringRule, t *chimev1.RecurringTarget) (raftfsm.Definition, error) {
	cu, ok := CatchUp(r.GetCatchUp())
	if !ok {
		return raftfsm.Definition{}, fmt.Errorf("unknown catch-up %v", r.GetCatchUp())
	}
	d := raftfsm.Definition{
		Cron:           r.GetCron(),
		TimeZone:       r.GetTimeZone(),
		Start:          unixNano(r.GetStart()),
		End:            unixNano(r.GetEnd()),
		Jitter:         int64(r.GetJitter().AsDuration()),
		MaxOccurrences: r.GetMaxOccurrences(),
		CatchUp:        cu,
		Topic:          t.GetTopic(),
		Key:            t.GetKey(),
		Payload:        t.GetPayload(),
		Priority:       raftfsm.DefaultPriority,
	}
	if t.Priority != nil {
		if *t.Priority > raftfsm.MaxPriority {
			return raftfsm.Definition{}, fmt.Errorf("priority %d above %d", *t.Priority, raftfsm.MaxPriority)
		}
		d.Priority = uint8(*t.Priority)
	}
	if r.GetEvery() != nil {
		d.Every = int64(r.GetEvery().AsDuration())
	}
	if r.GetJitter() == nil {
		d.Jitter = 0
	}
	for _, h := range t.GetHeaders() {
		d.Headers = append(d.Headers, raftfsm.Header{Key: h.Key, Value: h.Value})
	}
	return d, nil
}

// unixNano is ts in Unix nanoseconds, 0 when unset.
func unixNano(ts *timestamppb.Timestamp) int64 {
	if ts == nil {
		return 0
	}
	return ts.AsTime().UnixNano()
}
