package rpc

import (
	"context"
	"encoding/base64"
	"errors"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/cluster"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/raftfsm/recurrence"
	"github.com/chimehq/chime/shard"
)

// RecurringServer implements chimev1.RecurringServer on a Server's backend,
// limits and clock. Its methods share names with the Scheduler service's, so
// it is a type of its own.
type RecurringServer struct {
	chimev1.UnimplementedRecurringServer
	s *Server
}

// Recurring returns the chime.v1.Recurring service of s.
func (s *Server) Recurring() *RecurringServer { return &RecurringServer{s: s} }

// occurrenceSuffix is the most an occurrence adds to its schedule's id: '@'
// and the 19 digits of the largest Unix millisecond.
const occurrenceSuffix = 1 + 19

// upcomingCount is how many occurrence times Get lists.
const upcomingCount = 5

// checkScheduleID: required, short enough that its occurrences' event ids
// fit the id limit, and without the '@' that separates them.
func (s *Server) checkScheduleID(id string) error {
	switch maxID := s.limits.MaxIDBytes - occurrenceSuffix; {
	case id == "":
		return invalidArgument("id", "required")
	case len(id) > maxID:
		return invalidArgument("id", "%d bytes, at most %d allowed, so that its occurrences' event ids (id@<unix ms>) stay within %d", len(id), maxID, s.limits.MaxIDBytes)
	}
	if err := raftfsm.ScheduleIDRule(id); err != nil {
		return invalidArgument("id", "%v", err)
	}
	return nil
}

// intervalLimited is a caller's shard.Scope that also bounds how often its
// recurring schedules may occur (auth.Grant's min_interval).
type intervalLimited interface {
	ShortestInterval() time.Duration
}

// intervalSamples is how many consecutive occurrences a rule is checked
// over for the caller's shortest interval: a cron rule's gaps repeat within
// its own cycle, and its closest pair comes early in the first ones.
const intervalSamples = 64

// checkDefinition validates a rule and a target and returns the definition
// they write. The rule must have an occurrence after now: a schedule whose
// end is past would never produce anything. A caller whose scope bounds
// how often its schedules occur is held to that.
func (s *Server) checkDefinition(ctx context.Context, r *chimev1.RecurringRule, t *chimev1.RecurringTarget, now time.Time) (raftfsm.Definition, error) {
	if r == nil {
		return raftfsm.Definition{}, invalidArgument("rule", "required")
	}
	if t == nil {
		return raftfsm.Definition{}, invalidArgument("target", "required")
	}
	if r.Rule == nil {
		return raftfsm.Definition{}, invalidArgument("rule", "set exactly one of cron and every")
	}
	for _, ts := range []struct {
		field string
		ts    *timestamppb.Timestamp
	}{{"rule.start", r.Start}, {"rule.end", r.End}} {
		if ts.ts == nil {
			continue
		}
		if err := ts.ts.CheckValid(); err != nil {
			return raftfsm.Definition{}, invalidArgument(ts.field, "not a valid Timestamp: %v", err)
		}
	}
	for _, d := range []struct {
		field string
		d     interface {
			CheckValid() error
		}
		set bool
	}{{"rule.every", r.GetEvery(), r.GetEvery() != nil}, {"rule.jitter", r.Jitter, r.Jitter != nil}} {
		if !d.set {
			continue
		}
		if err := d.d.CheckValid(); err != nil {
			return raftfsm.Definition{}, invalidArgument(d.field, "not a valid Duration: %v", err)
		}
	}
	if r.GetCron() == "" && r.GetEvery() == nil {
		return raftfsm.Definition{}, invalidArgument("rule", "set exactly one of cron and every")
	}
	if _, ok := cluster.CatchUp(r.CatchUp); !ok {
		return raftfsm.Definition{}, invalidArgument("rule.catch_up", "unknown value %d (CATCH_UP_SKIP, CATCH_UP_LAST or CATCH_UP_ALL)", r.CatchUp)
	}
	lim := &s.limits
	if err := lim.checkTopic(recurringTarget, t.Topic); err != nil {
		return raftfsm.Definition{}, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := lim.checkContent(recurringTarget, &chimev1.Event{Key: t.Key, Payload: t.Payload, Headers: t.Headers}, false); err != nil {
		return raftfsm.Definition{}, status.Error(codes.InvalidArgument, err.Error())
	}
	if _, err := checkPolicy(recurringTarget, t.Priority, nil); err != nil {
		return raftfsm.Definition{}, status.Error(codes.InvalidArgument, err.Error())
	}
	d, err := cluster.Definition(r, t)
	if err != nil {
		return raftfsm.Definition{}, invalidArgument("rule", "%v", err)
	}
	d.MaxCatchUp = uint32(lim.MaxCatchUp)
	spec := d.Spec()
	if d.Every != 0 && d.Start == 0 {
		// The state machine anchors it at the creation; so does this check.
		spec.Start = now.Truncate(time.Millisecond)
	}
	rule, err := recurrence.Parse(spec)
	var fe *recurrence.FieldError
	if errors.As(err, &fe) {
		return raftfsm.Definition{}, invalidArgument("rule."+fe.Field, "%s", fe.Rule)
	}
	if err != nil {
		return raftfsm.Definition{}, invalidArgument("rule", "%v", err)
	}
	first, ok := rule.Next(now)
	if !ok {
		return raftfsm.Definition{}, invalidArgument("rule", "has no occurrence after now (%s): its end, or its calendar, is past", now.UTC().Format(time.RFC3339))
	}
	if il, ok := ScopeOf(ctx).(intervalLimited); ok {
		var gap time.Duration
		var at, then time.Time
		for prev, i := first, 0; i < intervalSamples; i++ {
			next, ok := rule.Next(prev)
			if !ok {
				break
			}
			if g := next.Sub(prev); gap == 0 || g < gap {
				gap, at, then = g, prev, next
			}
			prev = next
		}
		if least := il.ShortestInterval(); gap != 0 && gap < least {
			return raftfsm.Definition{}, status.Errorf(codes.PermissionDenied, "rule: occurs %v apart (%s, then %s), more often than credential %q's min_interval of %v",
				gap, at.UTC().Format(time.RFC3339), then.UTC().Format(time.RFC3339), ScopeOf(ctx).Credential(), least)
		}
	}
	return d, nil
}

// Create stores a recurring schedule.
func (rs *RecurringServer) Create(ctx context.Context, in *chimev1.CreateRecurringRequest) (*chimev1.RecurringSchedule, error) {
	s := rs.s
	if err := s.checkScheduleID(in.GetId()); err != nil {
		return nil, err
	}
	d, err := s.checkDefinition(ctx, in.GetRule(), in.GetTarget(), s.now())
	if err != nil {
		return nil, err
	}
	res, err := s.backend.Recurring(ctx, raftfsm.Recurring{Op: raftfsm.RecurringCreate, ID: in.Id, Hash: raftfsm.DefinitionHash(&d), Def: d}, ScopeOf(ctx))
	if err != nil {
		return nil, s.backendStatus("Create", err)
	}
	switch res.Outcome {
	case raftfsm.RecurringCreated, raftfsm.RecurringExisting:
		p := cluster.ScheduleProto(&res.Schedule)
		p.Existing = res.Outcome == raftfsm.RecurringExisting
		return p, nil
	case raftfsm.RecurringConflict:
		if err := rs.permitted(ctx, in.Id, &res.Schedule); err != nil {
			return nil, err
		}
		return nil, status.Errorf(codes.AlreadyExists, "recurring schedule %q exists with another rule or target (version %d); Update changes it", in.Id, res.Schedule.Version)
	}
	return nil, rs.outcomeStatus("Create", in.Id, 0, res)
}

// updateAttempts bounds how often an Update without expected_version reads
// the schedule again after another change committed between its read and
// its own entry.
const updateAttempts = 3

// Update replaces a schedule's rule, target, or both.
func (rs *RecurringServer) Update(ctx context.Context, in *chimev1.UpdateRecurringRequest) (*chimev1.RecurringSchedule, error) {
	s := rs.s
	if err := s.checkScheduleID(in.GetId()); err != nil {
		return nil, err
	}
	if in.Rule == nil && in.Target == nil {
		return nil, invalidArgument("request", "set rule, target or both: an update with neither changes nothing")
	}
	for attempt := 1; ; attempt++ {
		cur, err := rs.current(ctx, "Update", in.Id)
		if err != nil {
			return nil, err
		}
		if in.ExpectedVersion != 0 && in.ExpectedVersion != cur.Version {
			return nil, rs.outcomeStatus("Update", in.Id, in.ExpectedVersion, &raftfsm.RecurringResult{Outcome: raftfsm.RecurringVersionMismatch, Schedule: cur})
		}
		rule, target, ifVersion := in.Rule, in.Target, in.ExpectedVersion
		if rule == nil {
			rule = cluster.RuleProto(&cur.Definition)
		}
		if target == nil {
			target = cluster.TargetProto(&cur.Definition)
		}
		if ifVersion == 0 {
			ifVersion = cur.Version
		}
		d, err := s.checkDefinition(ctx, rule, target, s.now())
		if err != nil {
			return nil, err
		}
		res, err := s.backend.Recurring(ctx, raftfsm.Recurring{Op: raftfsm.RecurringUpdate, ID: in.Id, IfVersion: ifVersion, Hash: raftfsm.DefinitionHash(&d), Def: d}, ScopeOf(ctx))
		if err != nil {
			return nil, s.backendStatus("Update", err)
		}
		if res.Outcome == raftfsm.RecurringUpdated {
			return cluster.ScheduleProto(&res.Schedule), nil
		}
		if res.Outcome == raftfsm.RecurringVersionMismatch && in.ExpectedVersion == 0 && attempt < updateAttempts {
			continue // changed since it was read: merge into the new version
		}
		return nil, rs.outcomeStatus("Update", in.Id, in.ExpectedVersion, res)
	}
}

// Delete removes a schedule.
func (rs *RecurringServer) Delete(ctx context.Context, in *chimev1.DeleteRecurringRequest) (*chimev1.DeleteRecurringResponse, error) {
	rc := raftfsm.Recurring{Op: raftfsm.RecurringDelete, ID: in.GetId(), IfVersion: in.GetExpectedVersion()}
	if _, err := rs.op(ctx, "Delete", rc, raftfsm.RecurringDeleted); err != nil {
		return nil, err
	}
	return &chimev1.DeleteRecurringResponse{}, nil
}

// Pause stops a schedule's occurrences until Resume.
func (rs *RecurringServer) Pause(ctx context.Context, in *chimev1.PauseRecurringRequest) (*chimev1.RecurringSchedule, error) {
	res, err := rs.op(ctx, "Pause", raftfsm.Recurring{Op: raftfsm.RecurringPause, ID: in.GetId()}, raftfsm.RecurringPaused)
	if err != nil {
		return nil, err
	}
	return cluster.ScheduleProto(&res.Schedule), nil
}

// Resume makes a paused schedule occur again.
func (rs *RecurringServer) Resume(ctx context.Context, in *chimev1.ResumeRecurringRequest) (*chimev1.RecurringSchedule, error) {
	res, err := rs.op(ctx, "Resume", raftfsm.Recurring{Op: raftfsm.RecurringResume, ID: in.GetId()}, raftfsm.RecurringResumed)
	if err != nil {
		return nil, err
	}
	return cluster.ScheduleProto(&res.Schedule), nil
}

// Bounds of Trigger and Backfill.
const (
	// triggerSkew is how far after this node's clock a Trigger's at may be:
	// the caller chose it on its own clock.
	triggerSkew = time.Minute
	// triggerMaxAge is how far before this node's clock a Trigger's at may
	// be. at is the time the trigger was asked for, fixed for the retries of
	// one Trigger, which end within minutes; an older instant is a
	// Backfill's, which follows the rule.
	triggerMaxAge = 24 * time.Hour
	// maxBackfill is the most nominal times one Backfill covers, and
	// maxBackfillBytes the most bytes of targets it writes: all of a
	// Backfill's occurrences are created by one Raft entry, in one Pebble
	// batch, which must stay bounded whatever the schedule's payload (a 1 MiB
	// payload allows 64 occurrences a call).
	maxBackfill      = 1000
	maxBackfillBytes = 64 << 20
)

// Trigger produces one extra occurrence of a schedule now.
func (rs *RecurringServer) Trigger(ctx context.Context, in *chimev1.TriggerRecurringRequest) (*chimev1.TriggerRecurringResponse, error) {
	s := rs.s
	if err := s.checkScheduleID(in.GetId()); err != nil {
		return nil, err
	}
	now := s.now()
	at := now
	if in.At != nil {
		if err := in.At.CheckValid(); err != nil {
			return nil, invalidArgument("at", "not a valid Timestamp: %v", err)
		}
		at = in.At.AsTime()
		switch {
		case at.After(now.Add(triggerSkew)):
			return nil, invalidArgument("at", "%s is more than %v after this node's clock (%s): a trigger happens now; at names the moment it was asked for",
				at.UTC().Format(time.RFC3339Nano), triggerSkew, now.UTC().Format(time.RFC3339Nano))
		case at.Before(now.Add(-triggerMaxAge)):
			return nil, invalidArgument("at", "%s is more than %v before this node's clock (%s): Backfill makes past occurrences of the rule",
				at.UTC().Format(time.RFC3339Nano), triggerMaxAge, now.UTC().Format(time.RFC3339Nano))
		}
	}
	// The occurrence's id names the millisecond: so does the entry.
	at = time.UnixMilli(at.UnixMilli())
	res, err := rs.op(ctx, "Trigger", raftfsm.Recurring{Op: raftfsm.RecurringTrigger, ID: in.Id, At: at.UnixNano()}, raftfsm.RecurringTriggered)
	if err != nil {
		return nil, err
	}
	return &chimev1.TriggerRecurringResponse{
		EventId:    raftfsm.OccurrenceID(in.Id, at),
		Occurrence: timestamppb.New(at),
		Due:        timestamppb.New(time.Unix(0, res.Due)),
		Existing:   res.Existing != 0,
	}, nil
}

// Backfill creates the occurrences of a range of a schedule's rule that
// have no event.
func (rs *RecurringServer) Backfill(ctx context.Context, in *chimev1.BackfillRecurringRequest) (*chimev1.BackfillRecurringResponse, error) {
	s := rs.s
	if err := s.checkScheduleID(in.GetId()); err != nil {
		return nil, err
	}
	var bounds [2]time.Time
	for i, ts := range []struct {
		field string
		ts    *timestamppb.Timestamp
	}{{"from", in.From}, {"to", in.To}} {
		if ts.ts == nil {
			return nil, invalidArgument(ts.field, "required: the occurrences backfilled are the rule's nominal times in [from, to)")
		}
		if err := ts.ts.CheckValid(); err != nil {
			return nil, invalidArgument(ts.field, "not a valid Timestamp: %v", err)
		}
		bounds[i] = ts.ts.AsTime()
	}
	from, to, now := bounds[0], bounds[1], s.now()
	switch {
	case !from.Before(to):
		return nil, invalidArgument("to", "%s is not after from (%s): the range [from, to) is empty", to.UTC().Format(time.RFC3339Nano), from.UTC().Format(time.RFC3339Nano))
	case to.After(now.Add(triggerSkew)):
		return nil, invalidArgument("to", "%s is in the future (this node's clock says %s, %v of skew allowed): a backfill makes occurrences that were missed; the schedule makes future ones",
			to.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), triggerSkew)
	}
	rc := raftfsm.Recurring{Op: raftfsm.RecurringBackfill, ID: in.Id, From: from.UnixNano(), To: to.UnixNano(), Limit: maxBackfill, LimitBytes: maxBackfillBytes}
	res, err := rs.op(ctx, "Backfill", rc, raftfsm.RecurringBackfilled)
	if err != nil {
		return nil, err
	}
	resp := &chimev1.BackfillRecurringResponse{Created: uint32(len(res.Created)), Existing: res.Existing}
	for _, ns := range res.Created {
		resp.CreatedOccurrences = append(resp.CreatedOccurrences, timestamppb.New(time.Unix(0, ns)))
	}
	return resp, nil
}

// current reads schedule id as its shard's leader has it: the definition
// an Update without a rule or a target keeps. A schedule that does not
// exist, or is not the caller's, is answered from that read.
func (rs *RecurringServer) current(ctx context.Context, name, id string) (raftfsm.Schedule, error) {
	cur, found, err := rs.s.backend.GetSchedule(ctx, id, false)
	if err != nil {
		return raftfsm.Schedule{}, rs.s.backendStatus(name, err)
	}
	if !found {
		return raftfsm.Schedule{}, status.Errorf(codes.NotFound, "no recurring schedule %q", id)
	}
	if err := rs.permitted(ctx, id, &cur); err != nil {
		return raftfsm.Schedule{}, err
	}
	return cur, nil
}

// permitted refuses sched, as stored, to a caller whose credential's scope
// does not hold it: the same refusal whether or not the id exists.
func (rs *RecurringServer) permitted(ctx context.Context, id string, sched *raftfsm.Schedule) error {
	if scope := ScopeOf(ctx); scope != nil && !scope.Permits(id, sched.Definition.Topic) {
		return rs.s.backendStatus("Recurring", shard.Refuse(scope, id))
	}
	return nil
}

// op applies rc, which succeeds with want, after validating its id as
// Create does. The shard's leader checks the caller's scope against the
// schedule as stored and answers an unknown schedule, one outside scope,
// or an outcome its state already decides without proposing anything.
func (rs *RecurringServer) op(ctx context.Context, name string, rc raftfsm.Recurring, want raftfsm.RecurringOutcome) (*raftfsm.RecurringResult, error) {
	if err := rs.s.checkScheduleID(rc.ID); err != nil {
		return nil, err
	}
	res, err := rs.s.backend.Recurring(ctx, rc, ScopeOf(ctx))
	if err != nil {
		return nil, rs.s.backendStatus(name, err)
	}
	if res.Outcome != want {
		return nil, rs.outcomeStatus(name, rc.ID, rc.IfVersion, res)
	}
	return res, nil
}

// outcomeStatus is the status of an outcome other than the call's success.
func (rs *RecurringServer) outcomeStatus(op, id string, expected uint64, res *raftfsm.RecurringResult) error {
	switch res.Outcome {
	case raftfsm.RecurringNotFound:
		return status.Errorf(codes.NotFound, "no recurring schedule %q", id)
	case raftfsm.RecurringVersionMismatch:
		if expected == 0 {
			return status.Errorf(codes.Aborted, "recurring schedule %q changed while the %s was proposed (now version %d); nothing was changed: retry", id, op, res.Schedule.Version)
		}
		return status.Errorf(codes.FailedPrecondition, "expected_version: recurring schedule %q is at version %d, not %d", id, res.Schedule.Version, expected)
	case raftfsm.RecurringNotPaused:
		return status.Errorf(codes.FailedPrecondition, "recurring schedule %q is %v, not paused", id, res.Schedule.State)
	case raftfsm.RecurringMoved:
		return status.Errorf(codes.Aborted, "recurring schedule %q: its pending occurrence changed while the %s was proposed; nothing was changed: retry", id, op)
	case raftfsm.RecurringInvalid:
		return status.Errorf(codes.InvalidArgument, "rule: %s", res.Error)
	case raftfsm.RecurringCompletedState:
		return status.Errorf(codes.FailedPrecondition, "recurring schedule %q is completed (its rule has no further occurrence): a %s acts on an active or paused schedule; an Update gives it occurrences again", id, op)
	case raftfsm.RecurringTooMany:
		return status.Errorf(codes.InvalidArgument, "to: %s; end the range [from, to) earlier, or split it into several Backfills", res.Error)
	case raftfsm.RecurringBeyondPending:
		return status.Errorf(codes.FailedPrecondition, "to: %s; end the range at or before it", res.Error)
	}
	return rs.s.backendStatus(op, errors.New("unexpected outcome "+res.Outcome.String()))
}

// Get returns one schedule and its next occurrence times.
func (rs *RecurringServer) Get(ctx context.Context, in *chimev1.GetRecurringRequest) (*chimev1.RecurringSchedule, error) {
	s := rs.s
	if err := s.checkScheduleID(in.GetId()); err != nil {
		return nil, err
	}
	sched, found, err := s.backend.GetSchedule(ctx, in.Id, in.StaleOk)
	if err != nil {
		return nil, s.backendStatus("Get", err)
	}
	if !found {
		return nil, status.Errorf(codes.NotFound, "no recurring schedule %q", in.Id)
	}
	if err := rs.permitted(ctx, in.Id, &sched); err != nil {
		return nil, err
	}
	p := cluster.ScheduleProto(&sched)
	p.Upcoming = upcoming(&sched, s.now())
	return p, nil
}

// upcoming lists the nominal times of a schedule's next occurrences: the
// pending one and those after it; for a paused schedule, those after now (a
// Resume now with CATCH_UP_SKIP would make them).
func upcoming(sched *raftfsm.Schedule, now time.Time) []*timestamppb.Timestamp {
	r, err := recurrence.Parse(sched.Definition.Spec())
	if err != nil {
		return nil
	}
	var out []*timestamppb.Timestamp
	var at time.Time
	switch {
	case sched.State == raftfsm.ScheduleActive && sched.NextSeq != 0:
		at = time.Unix(0, sched.Next)
		out = append(out, timestamppb.New(at))
	case sched.State == raftfsm.SchedulePaused:
		at = now
	default:
		return nil
	}
	left := uint64(0)
	if max := sched.Definition.MaxOccurrences; max != 0 {
		if sched.Occurrences >= max {
			return out
		}
		left = max - sched.Occurrences - uint64(len(out))
	}
	for len(out) < upcomingCount && (sched.Definition.MaxOccurrences == 0 || left > 0) {
		next, ok := r.Next(at)
		if !ok {
			break
		}
		out = append(out, timestamppb.New(next))
		at = next
		if left > 0 {
			left--
		}
	}
	return out
}

// scheduleTokenVersion leads a Recurring.List page token: the version, then
// the last id of the page.
const scheduleTokenVersion = 1

// List returns a page of schedules in id order.
func (rs *RecurringServer) List(ctx context.Context, in *chimev1.ListRecurringRequest) (*chimev1.ListRecurringResponse, error) {
	s := rs.s
	if n := len(in.GetIdPrefix()); n > s.limits.MaxIDBytes {
		return nil, invalidArgument("id_prefix", "%d bytes, at most %d allowed", n, s.limits.MaxIDBytes)
	}
	limit, err := listLimit(in.GetLimit())
	if err != nil {
		return nil, err
	}
	after := ""
	if tok := in.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) < 2 || b[0] != scheduleTokenVersion || len(b)-1 > s.limits.MaxIDBytes || !utf8.Valid(b[1:]) {
			return nil, invalidArgument("page_token", "not a token this server issued")
		}
		after = string(b[1:])
	}
	scheds, more, err := s.backend.ListSchedules(ctx, in.GetIdPrefix(), after, limit, in.GetStaleOk())
	if err != nil {
		return nil, s.backendStatus("List", err)
	}
	resp := &chimev1.ListRecurringResponse{}
	size, last := 0, ""
	scope := ScopeOf(ctx)
	for i := range scheds {
		if scope != nil && !scope.Permits(scheds[i].ID, scheds[i].Definition.Topic) {
			// Another credential's: left out, and the page goes on past it.
			last = scheds[i].ID
			continue
		}
		p := cluster.ScheduleProto(&scheds[i])
		if size += proto.Size(p); size > maxPageBytes && len(resp.Schedules) > 0 {
			more = true
			break
		}
		resp.Schedules = append(resp.Schedules, p)
		last = p.Id
	}
	if more && last != "" {
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString(append([]byte{scheduleTokenVersion}, last...))
	}
	return resp, nil
}
