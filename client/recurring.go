package client

import (
	"bytes"
	"context"
	"iter"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Recurring manages recurring schedules: a Rule (a cron expression or a
// fixed interval, in a time zone) and a Target (topic, key, payload,
// headers). Each occurrence is produced as an ordinary event with the id
// "<schedule id>@<occurrence Unix ms>" and the headers chime-recurring-id
// and chime-occurrence-unix-ms: Client.Get and List show it, and
// Client.Cancel of its id cancels that one occurrence. Get it from
// Client.Recurring; it shares the Client's connections, retries and
// routing.
type Recurring struct {
	c *Client
}

// Recurring returns the client's recurring-schedule API.
func (c *Client) Recurring() *Recurring { return &Recurring{c: c} }

// Rule says when a schedule occurs: Cron or Every, bounded and shaped by
// the other fields (which RuleOptions set).
type Rule struct {
	// Cron is a cron expression: five fields (minute, hour, day of month,
	// month, day of week) with an optional leading seconds field, or a
	// descriptor (@daily, @every 1h30m, ...).
	Cron string
	// Every is a fixed interval (at least 1s, whole milliseconds), anchored
	// at Start (at the creation when Start is zero). Set Cron or Every.
	Every time.Duration
	// TimeZone is the IANA zone Cron is read in (UTC when empty). Intervals
	// ignore it.
	TimeZone string
	// Start: no occurrence before it. End: none after it (zero: no end).
	Start, End time.Time
	// MaxOccurrences: at most this many (0: no limit).
	MaxOccurrences uint64
	// Jitter delays each occurrence by a fixed pseudo-random amount in
	// [0, Jitter), at most 24h.
	Jitter time.Duration
	// CatchUp says which occurrences missed during an outage or a pause
	// happen; the zero value is CatchUpLast.
	CatchUp CatchUp
}

// RuleOption bounds or shapes a Rule: StartAt, EndAt, MaxOccurrences,
// Jitter, WithCatchUp.
type RuleOption func(*Rule)

// Cron is the rule of a cron expression read in the IANA time zone zone
// ("" for UTC), such as Cron("0 9 * * MON-FRI", "Europe/Paris") or, with a
// seconds field, Cron("*/5 * * * * *", "").
func Cron(expr, zone string, opts ...RuleOption) Rule {
	r := Rule{Cron: expr, TimeZone: zone}
	for _, o := range opts {
		o(&r)
	}
	return r
}

// Every is the rule of a fixed interval d (at least 1s), anchored at the
// creation, or at StartAt.
func Every(d time.Duration, opts ...RuleOption) Rule {
	r := Rule{Every: d}
	for _, o := range opts {
		o(&r)
	}
	return r
}

// StartAt: no occurrence before t; an interval counts from t.
func StartAt(t time.Time) RuleOption { return func(r *Rule) { r.Start = t } }

// EndAt: no occurrence after t.
func EndAt(t time.Time) RuleOption { return func(r *Rule) { r.End = t } }

// MaxOccurrences: at most n occurrences, then the schedule completes.
func MaxOccurrences(n uint64) RuleOption { return func(r *Rule) { r.MaxOccurrences = n } }

// Jitter delays each occurrence by an amount in [0, d), fixed per
// occurrence, to spread schedules that share a rule.
func Jitter(d time.Duration) RuleOption { return func(r *Rule) { r.Jitter = d } }

// WithCatchUp sets which missed occurrences happen.
func WithCatchUp(c CatchUp) RuleOption { return func(r *Rule) { r.CatchUp = c } }

// CatchUp says which occurrences missed during an outage, a late fire or a
// pause happen.
type CatchUp int

const (
	// CatchUpLast: the latest missed occurrence, then the future ones (the
	// default).
	CatchUpLast CatchUp = iota
	// CatchUpSkip: only future occurrences.
	CatchUpSkip
	// CatchUpAll: every missed occurrence, oldest first (at most the
	// cluster's --max-catch-up in a row), then the future ones.
	CatchUpAll
)

// Target is what each occurrence produces.
type Target struct {
	Topic   string
	Key     []byte
	Payload []byte
	// Headers, in order; each occurrence adds chime-recurring-id and
	// chime-occurrence-unix-ms after them.
	Headers []Header
	// Priority of each occurrence, 0 to 9; nil for the default, 5. (In Go
	// 1.26: Priority: new(7).)
	Priority *int
}

// RecurringState is where a recurring schedule is.
type RecurringState int

const (
	RecurringActive    RecurringState = iota + 1 // its next occurrence is pending
	RecurringPaused                              // no occurrence until Resume
	RecurringCompleted                           // its rule has no further occurrence
)

// String is the state in lower case: "active", "paused", "completed".
func (s RecurringState) String() string {
	switch s {
	case RecurringActive:
		return "active"
	case RecurringPaused:
		return "paused"
	case RecurringCompleted:
		return "completed"
	}
	return "RecurringState(" + strconv.Itoa(int(s)) + ")"
}

// RecurringSchedule is a recurring schedule as stored, and where it is.
type RecurringSchedule struct {
	ID      string
	Rule    Rule
	Target  Target
	State   RecurringState
	Version uint64 // 1 at creation, one more per Update

	CreatedAt, UpdatedAt time.Time
	PausedAt             time.Time // while paused
	// ResumesFrom, while paused, is the first of the rule's times the
	// schedule has not made (nor counted as passed by a Backfill): a Resume
	// makes it first, or catches up from it as CatchUp says. The pending
	// occurrence a Pause cancelled is here; backfill from it to keep the
	// pause from skipping any.
	ResumesFrom time.Time

	// The pending occurrence, while active: its nominal time, its event id
	// and its due time (nominal plus jitter).
	NextOccurrence time.Time
	NextEventID    string
	NextDue        time.Time
	// Occurrences counts those that settled (produced, dead-lettered, or
	// cancelled by id).
	Occurrences uint64
	// Upcoming (Get only) are the nominal times of the next occurrences,
	// the pending one first, up to five.
	Upcoming []time.Time
	// Existing (Create only): the schedule existed with the same content.
	Existing bool
}

// RecurringUpdate is the change Recurring.Update makes.
type RecurringUpdate struct {
	// Rule, when set, replaces the rule, whole (its start, end, limits
	// too); nil keeps it.
	Rule *Rule
	// Target, when set, replaces the target, whole; nil keeps it.
	Target *Target
	// IfVersion, when not 0, applies the update only while the schedule is
	// at this version (else *ConflictError).
	IfVersion uint64
}

// Create stores a schedule and its first occurrence. id is 1 to 256 bytes
// without '@'; empty, Create picks one (NewID). It is idempotent by id: the
// same id with the same rule and target returns the schedule with Existing
// set; with other content, *ConflictError.
func (r *Recurring) Create(ctx context.Context, id string, rule Rule, target Target) (RecurringSchedule, error) {
	if id == "" {
		id = NewID()
	}
	req := &chimev1.CreateRecurringRequest{Id: id, Rule: ruleProto(rule), Target: targetProto(target)}
	s, ambiguous, tried, err := r.do(ctx, id, func(ctx context.Context, rc chimev1.RecurringClient) (*chimev1.RecurringSchedule, error) {
		return rc.Create(ctx, req)
	})
	if err == nil {
		return s, nil
	}
	if ambiguous && mayHaveApplied(err) {
		// Read back: the schedule as created, or an id taken otherwise.
		got, gerr := r.Get(ctx, id)
		if gerr == nil {
			if sameRecurring(req, got) {
				got.Existing = true
				return got, nil
			}
			return RecurringSchedule{ID: id}, &ConflictError{ID: id, Version: got.Version,
				st: status.Newf(codes.AlreadyExists, "recurring schedule %q exists with another rule or target (read back after an unanswered attempt)", id)}
		}
		if status.Code(gerr) != codes.NotFound {
			return RecurringSchedule{ID: id}, unknownOutcome("recurring.create", id, finish("recurring.create", id, err, tried))
		}
	}
	return RecurringSchedule{ID: id}, finish("recurring.create", id, err, tried)
}

// Update replaces a schedule's rule, target, or both. The pending
// occurrence is cancelled and the next one follows the new rule from the
// time of the update.
func (r *Recurring) Update(ctx context.Context, id string, u RecurringUpdate) (RecurringSchedule, error) {
	req := &chimev1.UpdateRecurringRequest{Id: id, ExpectedVersion: u.IfVersion}
	if u.Rule != nil {
		req.Rule = ruleProto(*u.Rule)
	}
	if u.Target != nil {
		req.Target = targetProto(*u.Target)
	}
	s, ambiguous, tried, err := r.do(ctx, id, func(ctx context.Context, rc chimev1.RecurringClient) (*chimev1.RecurringSchedule, error) {
		return rc.Update(ctx, req)
	})
	if err == nil {
		return s, nil
	}
	// An unanswered attempt that took effect shows as the next version.
	if ambiguous && u.IfVersion != 0 && status.Code(err) == codes.FailedPrecondition {
		if got, gerr := r.Get(ctx, id); gerr == nil && got.Version == u.IfVersion+1 {
			return got, nil
		}
	}
	return RecurringSchedule{ID: id}, finish("recurring.update", id, err, tried)
}

// Delete removes a schedule and cancels its pending occurrence: once it
// returns, no further occurrence is produced. Occurrences already produced
// stay readable as events until the retention removes them. ErrNotFound
// for an unknown id.
func (r *Recurring) Delete(ctx context.Context, id string) error {
	_, ambiguous, tried, err := r.do(ctx, id, func(ctx context.Context, rc chimev1.RecurringClient) (*chimev1.RecurringSchedule, error) {
		_, err := rc.Delete(ctx, &chimev1.DeleteRecurringRequest{Id: id})
		return nil, err
	})
	if ambiguous && status.Code(err) == codes.NotFound {
		return nil // an unanswered attempt deleted it
	}
	return finish("recurring.delete", id, err, tried)
}

// Get returns one schedule and its next occurrence times (Upcoming).
func (r *Recurring) Get(ctx context.Context, id string) (RecurringSchedule, error) {
	s, _, tried, err := r.do(ctx, id, func(ctx context.Context, rc chimev1.RecurringClient) (*chimev1.RecurringSchedule, error) {
		return rc.Get(ctx, &chimev1.GetRecurringRequest{Id: id})
	})
	return s, finish("recurring.get", id, err, tried)
}

// List returns the schedules whose id starts with idPrefix ("" for all),
// in id order, from every shard, fetching pages as the loop asks for more.
// An error ends the sequence.
func (r *Recurring) List(ctx context.Context, idPrefix string) iter.Seq2[RecurringSchedule, error] {
	return func(yield func(RecurringSchedule, error) bool) {
		req := &chimev1.ListRecurringRequest{IdPrefix: idPrefix, Limit: listPage}
		for {
			var resp *chimev1.ListRecurringResponse
			_, tried, err := r.c.call(ctx, "", false, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
				resp, err = chimev1.NewRecurringClient(cc).List(ctx, req)
				return err
			})
			if err != nil {
				yield(RecurringSchedule{}, finish("recurring.list", "", err, tried))
				return
			}
			for _, s := range resp.Schedules {
				if !yield(scheduleFrom(s), nil) {
					return
				}
			}
			if resp.NextPageToken == "" {
				return
			}
			req.PageToken = resp.NextPageToken
		}
	}
}

// Pause cancels the pending occurrence and creates none until Resume: once
// it returns, no occurrence is produced. Pausing a paused schedule changes
// nothing.
func (r *Recurring) Pause(ctx context.Context, id string) (RecurringSchedule, error) {
	s, _, tried, err := r.do(ctx, id, func(ctx context.Context, rc chimev1.RecurringClient) (*chimev1.RecurringSchedule, error) {
		return rc.Pause(ctx, &chimev1.PauseRecurringRequest{Id: id})
	})
	return s, finish("recurring.pause", id, err, tried)
}

// Resume makes a paused schedule create occurrences again; its rule's
// CatchUp says which of those that fell due while paused happen.
// ErrNotPaused for a schedule that is not paused.
func (r *Recurring) Resume(ctx context.Context, id string) (RecurringSchedule, error) {
	s, ambiguous, tried, err := r.do(ctx, id, func(ctx context.Context, rc chimev1.RecurringClient) (*chimev1.RecurringSchedule, error) {
		return rc.Resume(ctx, &chimev1.ResumeRecurringRequest{Id: id})
	})
	if err != nil && ambiguous && status.Code(err) == codes.FailedPrecondition {
		// An unanswered attempt may have resumed it.
		if got, gerr := r.Get(ctx, id); gerr == nil && got.State != RecurringPaused {
			return got, nil
		}
	}
	return s, finish("recurring.resume", id, err, tried)
}

// Occurrence is the occurrence Recurring.Trigger made, or found.
type Occurrence struct {
	// EventID is its event's id, "<schedule id>@<At Unix ms>": Client.Get
	// and Cancel take it.
	EventID string
	// At is its time, to the millisecond (its chime-occurrence-unix-ms
	// header), and Due when it is produced: At, or the server's clock when
	// that is later.
	At, Due time.Time
	// Existing: the event existed already, made by an attempt of this call
	// that went unanswered, or an occurrence of the rule at that very
	// millisecond. Nothing more was created.
	Existing bool
}

// Trigger produces one extra occurrence of schedule id now, with its
// target, as an ordinary event "<id>@<unix ms>". It leaves the schedule's
// own sequence alone: the pending occurrence stays pending, and the
// triggered one neither moves the schedule on nor counts in Occurrences or
// MaxOccurrences. A paused schedule may be triggered, and stays paused.
// The occurrence's time is chosen once, from this machine's clock, before
// the first attempt, and every retry sends it again, so that retries make
// one occurrence. ErrNotFound for an unknown schedule, ErrCompleted for a
// completed one.
func (r *Recurring) Trigger(ctx context.Context, id string) (Occurrence, error) {
	return r.TriggerAt(ctx, id, time.Now())
}

// TriggerAt is Trigger with the occurrence's time chosen by the caller: at
// most a minute ahead of the server's clock and at most a day behind it.
// The same id and at (to the millisecond) name the same occurrence, so a
// caller that retries on its own (a form submitted twice) sends the at it
// chose the first time.
func (r *Recurring) TriggerAt(ctx context.Context, id string, at time.Time) (Occurrence, error) {
	req := &chimev1.TriggerRecurringRequest{Id: id, At: timestamppb.New(at)}
	var resp *chimev1.TriggerRecurringResponse
	_, tried, err := r.c.call(ctx, id, true, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewRecurringClient(cc).Trigger(ctx, req)
		return err
	})
	if err != nil {
		return Occurrence{}, finish("recurring.trigger", id, err, tried)
	}
	return Occurrence{EventID: resp.GetEventId(), At: timeOf(resp.GetOccurrence()), Due: timeOf(resp.GetDue()), Existing: resp.GetExisting()}, nil
}

// BackfillResult is what Recurring.Backfill did.
type BackfillResult struct {
	// Created are the nominal times of the occurrences it created, in
	// order.
	Created []time.Time
	// Existing counts the nominal times in the range whose occurrence had
	// an event already (fired, dead-lettered or pending, while the retention
	// keeps it, or made by an attempt of this call that went unanswered). A
	// cancelled occurrence is created anew and counts in Created.
	Existing int
}

// MaxBackfill is the most nominal times one Backfill covers; a payload
// above 64 KiB lowers it (64 MiB of targets per call).
const MaxBackfill = 1000

// Backfill creates one occurrence of schedule id for each nominal time of
// its rule in [from, to), each "<id>@<nominal unix ms>" with
// chime-occurrence-unix-ms the nominal time, due now: occurrences missed
// while the schedule was paused, or that a catch-up policy skipped. A
// nominal time whose event exists, and was not cancelled, is not made again
// (Existing counts it),
// so a retry is safe and retries run as for the other changes. It covers at
// most MaxBackfill nominal times (*InvalidError naming to: split the
// range); to may be at most a minute after the server's clock, and for an
// active schedule not past its pending occurrence (*InvalidError naming
// to), which the schedule makes itself with those after it. For a paused
// schedule, what is backfilled counts as passed: a Resume does not catch it
// up again. Backfilled occurrences do not count in Occurrences or
// MaxOccurrences. ErrNotFound for an unknown schedule, ErrCompleted for a
// completed one.
func (r *Recurring) Backfill(ctx context.Context, id string, from, to time.Time) (BackfillResult, error) {
	req := &chimev1.BackfillRecurringRequest{Id: id, From: timestamppb.New(from), To: timestamppb.New(to)}
	var resp *chimev1.BackfillRecurringResponse
	_, tried, err := r.c.call(ctx, id, true, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewRecurringClient(cc).Backfill(ctx, req)
		return err
	})
	if err != nil {
		return BackfillResult{}, finish("recurring.backfill", id, err, tried)
	}
	out := BackfillResult{Existing: int(resp.GetExisting())}
	for _, t := range resp.GetCreatedOccurrences() {
		out.Created = append(out.Created, t.AsTime())
	}
	return out, nil
}

// do runs one call of the Recurring service about schedule id.
func (r *Recurring) do(ctx context.Context, id string, f func(context.Context, chimev1.RecurringClient) (*chimev1.RecurringSchedule, error)) (RecurringSchedule, bool, []string, error) {
	var resp *chimev1.RecurringSchedule
	ambiguous, tried, err := r.c.call(ctx, id, true, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = f(ctx, chimev1.NewRecurringClient(cc))
		return err
	})
	if err != nil || resp == nil {
		return RecurringSchedule{ID: id}, ambiguous, tried, err
	}
	return scheduleFrom(resp), ambiguous, tried, nil
}

var catchUpProto = map[CatchUp]chimev1.CatchUp{
	CatchUpLast: chimev1.CatchUp_CATCH_UP_LAST,
	CatchUpSkip: chimev1.CatchUp_CATCH_UP_SKIP,
	CatchUpAll:  chimev1.CatchUp_CATCH_UP_ALL,
}

func ruleProto(r Rule) *chimev1.RecurringRule {
	p := &chimev1.RecurringRule{TimeZone: r.TimeZone, MaxOccurrences: r.MaxOccurrences}
	switch {
	case r.Every != 0:
		p.Rule = &chimev1.RecurringRule_Every{Every: durationpb.New(r.Every)}
	case r.Cron != "":
		p.Rule = &chimev1.RecurringRule_Cron{Cron: r.Cron}
	}
	if !r.Start.IsZero() {
		p.Start = timestamppb.New(r.Start)
	}
	if !r.End.IsZero() {
		p.End = timestamppb.New(r.End)
	}
	if r.Jitter != 0 {
		p.Jitter = durationpb.New(r.Jitter)
	}
	if cu, ok := catchUpProto[r.CatchUp]; ok {
		p.CatchUp = cu
	} else {
		p.CatchUp = chimev1.CatchUp(r.CatchUp + 100) // unknown: the server says so
	}
	return p
}

func ruleFrom(p *chimev1.RecurringRule) Rule {
	r := Rule{
		Cron:           p.GetCron(),
		TimeZone:       p.GetTimeZone(),
		Start:          timeOf(p.GetStart()),
		End:            timeOf(p.GetEnd()),
		MaxOccurrences: p.GetMaxOccurrences(),
		Jitter:         p.GetJitter().AsDuration(),
	}
	if e := p.GetEvery(); e != nil {
		r.Every = e.AsDuration()
	}
	for c, pc := range catchUpProto {
		if pc == p.GetCatchUp() {
			r.CatchUp = c
		}
	}
	return r
}

func targetProto(t Target) *chimev1.RecurringTarget {
	p := &chimev1.RecurringTarget{Topic: t.Topic, Key: t.Key, Payload: t.Payload, Headers: headersProto(t.Headers)}
	if t.Priority != nil {
		v := uint32(max(*t.Priority, 0))
		if *t.Priority < 0 {
			v = 1 << 20 // out of range: the server names the rule
		}
		p.Priority = &v
	}
	return p
}

func targetFrom(p *chimev1.RecurringTarget) Target {
	t := Target{Topic: p.GetTopic(), Key: p.GetKey(), Payload: p.GetPayload(), Headers: headersFrom(p.GetHeaders())}
	if p.Priority != nil {
		v := int(*p.Priority)
		t.Priority = &v
	}
	return t
}

func scheduleFrom(p *chimev1.RecurringSchedule) RecurringSchedule {
	s := RecurringSchedule{
		ID:             p.GetId(),
		Rule:           ruleFrom(p.GetRule()),
		Target:         targetFrom(p.GetTarget()),
		State:          RecurringState(p.GetState()),
		Version:        p.GetVersion(),
		CreatedAt:      timeOf(p.GetCreatedAt()),
		UpdatedAt:      timeOf(p.GetUpdatedAt()),
		PausedAt:       timeOf(p.GetPausedAt()),
		ResumesFrom:    timeOf(p.GetResumesFrom()),
		NextOccurrence: timeOf(p.GetNextOccurrence()),
		NextEventID:    p.GetNextEventId(),
		NextDue:        timeOf(p.GetNextDue()),
		Occurrences:    p.GetOccurrences(),
		Existing:       p.GetExisting(),
	}
	for _, u := range p.GetUpcoming() {
		s.Upcoming = append(s.Upcoming, u.AsTime())
	}
	return s
}

// sameRecurring reports whether the stored schedule got has the rule and
// target req creates (as far as the stored form tells).
func sameRecurring(req *chimev1.CreateRecurringRequest, got RecurringSchedule) bool {
	want := ruleFrom(req.Rule)
	t := req.Target
	return want.Cron == got.Rule.Cron && want.Every == got.Rule.Every && want.TimeZone == got.Rule.TimeZone &&
		t.Topic == got.Target.Topic && bytes.Equal(t.Key, got.Target.Key) && bytes.Equal(t.Payload, got.Target.Payload) &&
		sameHeaders(t.Headers, headersProto(got.Target.Headers))
}
