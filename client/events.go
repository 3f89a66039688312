package client

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Event is a record to produce to a Kafka topic at a time.
//
// Schedule reads ID, Topic, Key, Payload and Headers, and, when no At or In
// option says otherwise, Due, Priority (0 for the default, 5: use the
// Priority option for 0), Window, Partition (with HasPartition) and
// Tombstone; the Partition and Tombstone options set them too. Get fills
// every field.
type Event struct {
	// ID is the idempotency key, unique in the cluster, at most 256 bytes.
	// Empty, Schedule picks a time-ordered unique one (a UUIDv7) before the
	// first attempt, so every retry carries the same.
	ID      string
	Topic   string
	Key     []byte
	Payload []byte
	Headers []Header

	State   State
	Version uint64    // 1 as scheduled, one more per Update or replace
	Due     time.Time // when it fires (or fired, or would have)
	// CreatedAt is when the server accepted the Schedule.
	CreatedAt time.Time
	// FiredAt is when the record was produced (StateFired) or
	// dead-lettered (StateDeadLettered).
	FiredAt   time.Time
	Attempts  int    // produce attempts so far
	LastError string // of the latest failed produce attempt
	Priority  int
	Window    time.Duration
	// Partition, when HasPartition, is the partition of Topic the record
	// is produced to; otherwise Kafka's partitioner picks it from the key.
	Partition    int32
	HasPartition bool
	// Tombstone: the record has a null value (Payload is empty).
	Tombstone bool
	// CancelledAt is when it was cancelled (StateCancelled).
	CancelledAt time.Time
	// DeadLetterTopic is where the record went (StateDeadLettered).
	DeadLetterTopic string
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// State is where an event is in its life: StateScheduled, then exactly one
// of the others, which never changes again.
type State int

const (
	StateScheduled    State = iota + 1 // waiting for its due time, or being produced
	StateFired                         // produced to its topic
	StateCancelled                     // cancelled before it fired
	StateDeadLettered                  // produced to the dead-letter topic after failing
)

// String is the state in lower case: "scheduled", "fired", ...
func (s State) String() string {
	switch s {
	case StateScheduled:
		return "scheduled"
	case StateFired:
		return "fired"
	case StateCancelled:
		return "cancelled"
	case StateDeadLettered:
		return "dead-lettered"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Result is what a Schedule or Update did.
type Result struct {
	ID      string
	Version uint64 // the version the call made; 0 when Existing
	Due     time.Time
	// Existing is true when the id was already scheduled with the same
	// content (an earlier send of the same event): nothing new was stored.
	Existing bool
	// Err is ScheduleBatch's error for this event; nil for Schedule and
	// Update, which return theirs.
	Err error
}

// ScheduleOption sets when and how an event fires (At, In, Priority,
// Window, Partition, Tombstone, Replace).
type ScheduleOption interface{ applySchedule(*scheduleOptions) }

type scheduleOptions struct {
	at        time.Time
	in        time.Duration
	hasIn     bool
	priority  *int
	window    time.Duration
	partition *int
	tombstone bool
	replace   bool
	// The options' due time and window as the API's messages, made once by
	// ScheduleBatch and shared by every event of the call (read only).
	inPB, windowPB *durationpb.Duration
	atPB           *timestamppb.Timestamp
}

// UpdateOption is a change Update makes (At, In, SetPayload, SetKey,
// SetHeaders) or its condition (IfVersion). Fields no option names keep
// their stored value.
type UpdateOption interface{ applyUpdate(*updateOptions) }

type updateOptions struct {
	at        time.Time
	in        time.Duration
	hasIn     bool
	payload   []byte
	hasPay    bool
	key       []byte
	hasKey    bool
	headers   []Header
	hasHdrs   bool
	ifVersion uint64
}

// DueOption is At or In: the due time, for Schedule and Update alike.
type DueOption struct {
	at    time.Time
	in    time.Duration
	hasIn bool
}

func (o DueOption) applySchedule(s *scheduleOptions) { s.at, s.in, s.hasIn = o.at, o.in, o.hasIn }
func (o DueOption) applyUpdate(u *updateOptions)     { u.at, u.in, u.hasIn = o.at, o.in, o.hasIn }

// At makes the event due at t; a time in the past fires at once.
func At(t time.Time) DueOption { return DueOption{at: t} }

// In makes the event due d after the server accepts the call. Retries of
// the call send the same d, and the server recognises them as the same
// event.
func In(d time.Duration) DueOption { return DueOption{in: d, hasIn: true} }

type scheduleFunc func(*scheduleOptions)

func (f scheduleFunc) applySchedule(s *scheduleOptions) { f(s) }

type updateFunc func(*updateOptions)

func (f updateFunc) applyUpdate(u *updateOptions) { f(u) }

// Priority is 0 (lowest) to 9 (highest), 5 by default. When more events are
// due than a shard can produce at once, higher priorities go first; an
// event never fires before it is due.
func Priority(p int) ScheduleOption {
	return scheduleFunc(func(s *scheduleOptions) { s.priority = &p })
}

// Window lets the event fire anywhere in [due, due+d] (at most 24h), so
// that many events due at one time reach the topic as an even flow.
func Window(d time.Duration) ScheduleOption {
	return scheduleFunc(func(s *scheduleOptions) { s.window = d })
}

// Partition produces the record to partition p of the event's topic (0 or
// more), instead of the one Kafka's partitioner picks from the key. If the
// topic has no partition p when the event fires, the record goes to the
// dead-letter topic.
func Partition(p int) ScheduleOption {
	return scheduleFunc(func(s *scheduleOptions) { s.partition = &p })
}

// Tombstone produces the record with a null value (a Kafka tombstone: a
// compacted topic deletes the key). The event's payload must be empty.
func Tombstone() ScheduleOption {
	return scheduleFunc(func(s *scheduleOptions) { s.tombstone = true })
}

// Replace makes Schedule replace the event the id names (an upsert): a
// pending one becomes this one, as its next version (no record of the
// replaced version is produced afterwards); a settled one is scheduled
// anew.
func Replace() ScheduleOption { return scheduleFunc(func(s *scheduleOptions) { s.replace = true }) }

// SetPayload sets the record value.
func SetPayload(p []byte) UpdateOption {
	return updateFunc(func(u *updateOptions) { u.payload, u.hasPay = p, true })
}

// SetKey sets the record key; nil or empty removes it.
func SetKey(k []byte) UpdateOption {
	return updateFunc(func(u *updateOptions) { u.key, u.hasKey = k, true })
}

// SetHeaders sets all the record's headers; nil removes them.
func SetHeaders(h []Header) UpdateOption {
	return updateFunc(func(u *updateOptions) { u.headers, u.hasHdrs = h, true })
}

// IfVersion applies the update only while the event is at version v;
// otherwise it fails with ErrConflict.
func IfVersion(v uint64) UpdateOption { return updateFunc(func(u *updateOptions) { u.ifVersion = v }) }

// NewID returns a new event id as Schedule picks one: a UUIDv7, unique and
// ordered by creation time.
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// Schedule stores ev durably: it returns once a quorum of replicas has it.
// Its due time is At or In, else ev.Due.
//
// Schedule is idempotent by id, and it is retried (see RetryPolicy) with
// the id fixed before the first attempt. When the last attempt's outcome is
// unknown (no answer before the deadline, a lost connection), Schedule
// reads the event back before it answers: it returns the event as created
// or existing (Result.Existing), or an error, never "maybe". An error
// wrapping ErrUnknownOutcome says even that read failed; scheduling the
// same event again, with Result.ID, is then safe.
//
// Errors: *InvalidError for input the server refuses; *ConflictError when
// the id is taken by an event with other content (unless Replace);
// ErrPermissionDenied; ErrUnavailable when no node could take it.
func (c *Client) Schedule(ctx context.Context, ev Event, opts ...ScheduleOption) (Result, error) {
	pe, err := eventProto(ev, scheduleOpts(opts), -1)
	res := Result{ID: pe.GetId()}
	if err != nil {
		return res, err
	}
	var resp *chimev1.ScheduleResponse
	ambiguous, tried, err := c.call(ctx, pe.Id, true, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewSchedulerClient(cc).Schedule(ctx, &chimev1.ScheduleRequest{Event: pe})
		return err
	})
	if err == nil {
		return Result{ID: resp.Id, Version: resp.Version, Due: resp.Due.AsTime(), Existing: resp.Existing}, nil
	}
	return c.scheduleFailed(ctx, pe, err, ambiguous, tried)
}

// scheduleFailed turns the last error of a Schedule of pe into the answer:
// the stored version of a conflict, and an unknown outcome read back.
func (c *Client) scheduleFailed(ctx context.Context, pe *chimev1.Event, err error, ambiguous bool, tried []string) (Result, error) {
	res := Result{ID: pe.Id}
	switch {
	case status.Code(err) == codes.AlreadyExists:
		cerr := mapError("schedule", pe.Id, err).(*ConflictError)
		if got, gerr := c.getProto(ctx, pe.Id); gerr == nil {
			cerr.Version = got.Version
		}
		return res, cerr
	case ambiguous && mayHaveApplied(err):
		got, gerr := c.getProto(ctx, pe.Id)
		switch {
		case gerr == nil && sameEvent(pe, got):
			return Result{ID: pe.Id, Version: got.Version, Due: got.Due.AsTime(), Existing: pe.OnConflict != chimev1.OnConflict_ON_CONFLICT_REPLACE}, nil
		case gerr == nil && pe.OnConflict != chimev1.OnConflict_ON_CONFLICT_REPLACE:
			return res, &ConflictError{ID: pe.Id, Version: got.Version, st: status.Newf(codes.AlreadyExists,
				"event.id: %q is scheduled with different content (read back after an unanswered attempt)", pe.Id)}
		case gerr == nil, status.Code(gerr) == codes.NotFound:
			return res, finish("schedule", pe.Id, err, tried) // it did not take effect
		}
		return res, unknownOutcome("schedule", pe.Id, finish("schedule", pe.Id, err, tried))
	}
	return res, finish("schedule", pe.Id, err, tried)
}

// ScheduleBatch schedules many events, each on its own, exactly as
// Schedule would (ids picked, retries, unknown outcomes read back), in as
// few calls as it can: with leader routing, one per shard leader, sent in
// parallel.
//
// It returns one Result per event, in order, always. When some events
// failed, their Result.Err says why and the error is a *BatchError listing
// the same per-event errors (errors.Is(err, ErrConflict) asks whether any
// event was a conflict); when all succeeded it is nil.
func (c *Client) ScheduleBatch(ctx context.Context, evs []Event, opts ...ScheduleOption) ([]Result, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	so := scheduleOpts(opts)
	so.share()
	n := len(evs)
	var (
		pes       = make([]*chimev1.Event, n)
		ids       = make([]string, n)
		results   = make([]Result, n)
		done      = make([]bool, n) // results[i] is final
		lastErr   = make([]error, n)
		ambiguous = make([]bool, n)
		pending   []int
	)
	for i, ev := range evs {
		pe, err := eventProto(ev, so, i)
		pes[i], ids[i], results[i].ID = pe, pe.GetId(), pe.GetId()
		if err != nil {
			results[i].Err, done[i] = err, true
			continue
		}
		pending = append(pending, i)
	}
	a := newAttempts(ctx, c.retry, true)
	for len(pending) > 0 {
		conns, groups := c.router.split(ids, pending)
		resps, errs := make([]*chimev1.BatchScheduleResponse, len(groups)), make([]error, len(groups))
		actx, cancel := a.attempt()
		var wg sync.WaitGroup
		for g := range groups {
			wg.Go(func() {
				req := &chimev1.BatchScheduleRequest{Events: make([]*chimev1.Event, len(groups[g]))}
				for j, i := range groups[g] {
					req.Events[j] = pes[i]
				}
				resps[g], errs[g] = chimev1.NewSchedulerClient(conns[g]).BatchSchedule(actx, req)
				if errs[g] == nil && len(resps[g].GetResults()) != len(req.Events) {
					errs[g] = status.Errorf(codes.Internal, "the server answered %d results for %d events", len(resps[g].GetResults()), len(req.Events))
				}
			})
		}
		wg.Wait()
		cancel()
		var next []int
		var retryErr error // an error that the next round retries
		fail := func(i int, err error) {
			lastErr[i] = err
			ambiguous[i] = ambiguous[i] || mayHaveApplied(err)
			if _, ok := retryable(err, ctx); ok {
				next, retryErr = append(next, i), err
			}
		}
		for g, idx := range groups {
			if err := errs[g]; err != nil {
				if conns[g].leader != "" && leaderTrouble(ctx, err) {
					c.router.leaderFailed(conns[g].leader)
				}
				for _, i := range idx {
					fail(i, err)
				}
				continue
			}
			for j, r := range resps[g].Results {
				i := idx[j]
				if r.Code == 0 {
					results[i] = Result{ID: r.Id, Version: r.Version, Due: r.Due.AsTime(), Existing: r.Existing}
					done[i] = true
					continue
				}
				fail(i, status.Error(codes.Code(r.Code), renumber(r.Message, j, i)))
			}
		}
		pending = next
		if len(next) == 0 || !a.retry(retryErr) {
			break
		}
	}
	// Settle what failed: conflicts learn the stored version, unknown
	// outcomes are read back. (Only those: a goroutine per event of a
	// batch that all went through would cost more than the call.)
	var failed []int
	for i := range n {
		if !done[i] {
			failed = append(failed, i)
		}
	}
	parallel(len(failed), resolveParallel, func(j int) {
		i := failed[j]
		r, err := c.scheduleFailed(ctx, pes[i], lastErr[i], ambiguous[i], nil)
		if err != nil {
			r.Err = err
		}
		results[i] = r
	})
	var errs []error
	for i, r := range results {
		if r.Err != nil {
			if errs == nil {
				errs = make([]error, n)
			}
			errs[i] = r.Err
		}
	}
	if errs != nil {
		return results, &BatchError{Errs: errs}
	}
	return results, nil
}

// resolveParallel bounds the reads one ScheduleBatch makes at once to
// settle its failed events.
const resolveParallel = 8

// parallel runs f(0) to f(n-1), at most limit at a time, and returns when
// all have.
func parallel(n, limit int, f func(i int)) {
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// renumber rewrites the path of a per-event message, "events[j]..." in
// the part of a batch sent to one shard, to the index i the caller gave.
func renumber(msg string, j, i int) string {
	if j == i {
		return msg
	}
	if rest, ok := strings.CutPrefix(msg, "events["+strconv.Itoa(j)+"]"); ok {
		return "events[" + strconv.Itoa(i) + "]" + rest
	}
	return msg
}

// share makes the messages of the options' due time and window once, for
// every event of a ScheduleBatch to point to, rather than one copy per
// event.
func (so *scheduleOptions) share() {
	switch {
	case so.hasIn:
		so.inPB = durationpb.New(so.in)
	case !so.at.IsZero():
		so.atPB = timestamppb.New(so.at)
	}
	if so.window != 0 {
		so.windowPB = durationpb.New(so.window)
	}
}

func scheduleOpts(opts []ScheduleOption) scheduleOptions {
	var so scheduleOptions
	for _, o := range opts {
		if o != nil {
			o.applySchedule(&so)
		}
	}
	return so
}

// eventProto is the API's event for ev, its id picked when empty. i is
// ev's index in a batch, for errors ("events[i]"); -1 for Schedule's one
// ("event").
func eventProto(ev Event, so scheduleOptions, i int) (*chimev1.Event, error) {
	pe := &chimev1.Event{Id: ev.ID, Topic: ev.Topic, Key: ev.Key, Payload: ev.Payload, Headers: headersProto(ev.Headers)}
	if pe.Id == "" {
		pe.Id = NewID()
	}
	switch {
	case so.inPB != nil:
		pe.Delay = so.inPB
	case so.atPB != nil:
		pe.DeliverAt = so.atPB
	case so.hasIn:
		pe.Delay = durationpb.New(so.in)
	case !so.at.IsZero():
		pe.DeliverAt = timestamppb.New(so.at)
	case !ev.Due.IsZero():
		pe.DeliverAt = timestamppb.New(ev.Due)
	}
	prio := so.priority
	if prio == nil && ev.Priority != 0 {
		prio = &ev.Priority
	}
	if prio != nil {
		if *prio < 0 {
			path := "event"
			if i >= 0 {
				path = "events[" + strconv.Itoa(i) + "]"
			}
			return pe, invalidf(path+".priority", "%d, must be 0 (lowest) to 9 (highest)", *prio)
		}
		p := uint32(min(*prio, 1<<20))
		pe.Priority = &p
	}
	switch {
	case so.windowPB != nil:
		pe.Window = so.windowPB
	case so.window != 0 || ev.Window != 0:
		pe.Window = durationpb.New(cmpOr(so.window, ev.Window))
	}
	switch {
	case so.partition != nil:
		if *so.partition < math.MinInt32 || *so.partition > math.MaxInt32 {
			// Out of the API's int32; the server words the rest of the rule.
			path := "event"
			if i >= 0 {
				path = "events[" + strconv.Itoa(i) + "]"
			}
			return pe, invalidf(path+".partition", "%d, must be 0 or more and at most %d", *so.partition, math.MaxInt32)
		}
		p := int32(*so.partition)
		pe.Partition = &p
	case ev.HasPartition:
		p := ev.Partition
		pe.Partition = &p
	}
	pe.Tombstone = so.tombstone || ev.Tombstone
	if so.replace {
		pe.OnConflict = chimev1.OnConflict_ON_CONFLICT_REPLACE
	}
	return pe, nil
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func headersProto(hs []Header) []*chimev1.Header {
	if hs == nil {
		return nil
	}
	out := make([]*chimev1.Header, len(hs))
	for i, h := range hs {
		out[i] = &chimev1.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

func headersFrom(hs []*chimev1.Header) []Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]Header, len(hs))
	for i, h := range hs {
		out[i] = Header{Key: h.GetKey(), Value: h.GetValue()}
	}
	return out
}

func sameHeaders(a []*chimev1.Header, b []*chimev1.Header) bool {
	return slices.EqualFunc(a, b, func(x, y *chimev1.Header) bool {
		return x.GetKey() == y.GetKey() && bytes.Equal(x.GetValue(), y.GetValue())
	})
}

// sameEvent reports whether the stored event got is what pe scheduled, as
// far as the stored form tells (a delay resolved to a due time cannot be
// compared).
func sameEvent(pe *chimev1.Event, got *chimev1.GetResponse) bool {
	ge := got.GetEvent()
	switch {
	case ge.GetTopic() != pe.Topic, !bytes.Equal(ge.GetKey(), pe.Key), !bytes.Equal(ge.GetPayload(), pe.Payload),
		!sameHeaders(ge.GetHeaders(), pe.Headers):
		return false
	case pe.DeliverAt != nil && !got.GetDue().AsTime().Equal(pe.DeliverAt.AsTime()):
		return false
	case pe.Priority != nil && ge.Priority != nil && *pe.Priority != *ge.Priority:
		return false
	case pe.Window != nil && ge.GetWindow().AsDuration() != pe.Window.AsDuration():
		return false
	case (pe.Partition == nil) != (ge.Partition == nil), pe.Partition != nil && *pe.Partition != *ge.Partition,
		pe.Tombstone != ge.GetTombstone():
		return false
	}
	return true
}

func stateFrom(s chimev1.EventState) State { return State(s) }

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func eventFrom(g *chimev1.GetResponse) Event {
	ge := g.GetEvent()
	return Event{
		ID:              ge.GetId(),
		Topic:           ge.GetTopic(),
		Key:             ge.GetKey(),
		Payload:         ge.GetPayload(),
		Headers:         headersFrom(ge.GetHeaders()),
		State:           stateFrom(g.GetState()),
		Version:         g.GetVersion(),
		Due:             timeOf(g.GetDue()),
		CreatedAt:       timeOf(g.GetCreatedAt()),
		FiredAt:         timeOf(g.GetFiredAt()),
		Attempts:        int(g.GetAttempts()),
		LastError:       g.GetLastError(),
		Priority:        int(ge.GetPriority()),
		Window:          ge.GetWindow().AsDuration(),
		Partition:       ge.GetPartition(),
		HasPartition:    ge.Partition != nil,
		Tombstone:       ge.GetTombstone(),
		CancelledAt:     timeOf(g.GetCancelledAt()),
		DeadLetterTopic: g.GetDeadLetterTopic(),
	}
}

// Get returns the event id names and where it is in its life. ErrNotFound
// for an id with no event (never scheduled, or settled longer ago than the
// cluster's retention).
func (c *Client) Get(ctx context.Context, id string) (Event, error) {
	g, err := c.getProto(ctx, id)
	if err != nil {
		return Event{}, err
	}
	return eventFrom(g), nil
}

func (c *Client) getProto(ctx context.Context, id string) (*chimev1.GetResponse, error) {
	var resp *chimev1.GetResponse
	_, tried, err := c.call(ctx, id, false, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewSchedulerClient(cc).Get(ctx, &chimev1.GetRequest{Id: id})
		return err
	})
	if err != nil {
		return nil, finish("get", id, err, tried)
	}
	return resp, nil
}

// Cancel stops a scheduled event from being produced: once it returns nil,
// no record of the event is produced. Cancelling a cancelled event
// succeeds again. ErrNotFound for an unknown id; ErrAlreadyFired when it
// fired (or was dead-lettered) first.
func (c *Client) Cancel(ctx context.Context, id string) error {
	_, tried, err := c.call(ctx, id, false, func(ctx context.Context, cc grpc.ClientConnInterface) error {
		_, err := chimev1.NewSchedulerClient(cc).Cancel(ctx, &chimev1.CancelRequest{Id: id})
		return err
	})
	return finish("cancel", id, err, tried)
}

// Update changes a pending event: only the fields its options name (At or
// In, SetKey, SetPayload, SetHeaders), as the event's next version. Once it
// returns, no record of an earlier version is produced. With IfVersion, it
// applies only while the event is at that version (else *ConflictError,
// with the current version).
//
// Errors: ErrNotFound; ErrAlreadyFired or ErrCancelled for an event no
// longer pending; *InvalidError (an Update with no change is one). When an
// attempt went unanswered, Update reads the event back before it answers,
// as Schedule does. An attempt repeated after a lost answer sets the same
// fields again, which costs a version; with IfVersion the read back tells
// the first attempt's success from a conflict.
func (c *Client) Update(ctx context.Context, id string, opts ...UpdateOption) (Result, error) {
	var uo updateOptions
	for _, o := range opts {
		if o != nil {
			o.applyUpdate(&uo)
		}
	}
	req := &chimev1.UpdateRequest{Id: id, ExpectedVersion: uo.ifVersion}
	switch {
	case uo.hasIn:
		req.Delay = durationpb.New(uo.in)
	case !uo.at.IsZero():
		req.DeliverAt = timestamppb.New(uo.at)
	}
	if uo.hasKey {
		req.Key = nonNil(uo.key)
	}
	if uo.hasPay {
		req.Payload = nonNil(uo.payload)
	}
	if uo.hasHdrs {
		req.Headers = &chimev1.HeaderList{Headers: headersProto(uo.headers)}
	}
	var resp *chimev1.UpdateResponse
	ambiguous, tried, err := c.call(ctx, id, true, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		resp, err = chimev1.NewSchedulerClient(cc).Update(ctx, req)
		return err
	})
	if err == nil {
		return Result{ID: id, Version: resp.Version, Due: resp.Due.AsTime()}, nil
	}
	// An unanswered attempt may have applied the update: the attempt after
	// it then finds the event a version on, or the call ends in doubt.
	mismatch := req.ExpectedVersion != 0 && status.Code(err) == codes.FailedPrecondition &&
		strings.HasPrefix(status.Convert(err).Message(), "expected_version:")
	if ambiguous && (mismatch || mayHaveApplied(err)) {
		got, gerr := c.getProto(ctx, id)
		if gerr == nil {
			applied, known := updateApplied(req, got)
			switch {
			case applied:
				return Result{ID: id, Version: got.Version, Due: got.Due.AsTime()}, nil
			case !known && !mismatch:
				return Result{ID: id}, unknownOutcome("update", id, finish("update", id, err, tried))
			}
		} else if status.Code(gerr) != codes.NotFound && !mismatch {
			return Result{ID: id}, unknownOutcome("update", id, finish("update", id, err, tried))
		}
	}
	return Result{ID: id}, finish("update", id, err, tried)
}

// nonNil keeps a set-but-empty value set on the wire (proto optional bytes
// tells nil, unset, from empty).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// updateApplied reports whether the stored event got shows the update req
// as applied: at the version after the expected one, if req named one, and
// with the content req sets. known is false when the stored event cannot
// tell (an update of the delay alone, without an expected version).
func updateApplied(req *chimev1.UpdateRequest, got *chimev1.GetResponse) (applied, known bool) {
	ge := got.GetEvent()
	if req.ExpectedVersion != 0 && got.Version != req.ExpectedVersion+1 {
		return false, true
	}
	if (req.DeliverAt != nil && !got.GetDue().AsTime().Equal(req.DeliverAt.AsTime())) ||
		(req.Key != nil && !bytes.Equal(ge.GetKey(), req.Key)) ||
		(req.Payload != nil && !bytes.Equal(ge.GetPayload(), req.Payload)) ||
		(req.Headers != nil && !sameHeaders(ge.GetHeaders(), req.Headers.Headers)) {
		return false, true
	}
	known = req.ExpectedVersion != 0 || req.DeliverAt != nil || req.Key != nil || req.Payload != nil || req.Headers != nil
	return known, known
}

// updateFuncAttempts bounds how often UpdateFunc reads again after another
// change won the race to the event.
const updateFuncAttempts = 5

// UpdateFunc changes a pending event by a function of its current state:
// it reads the event (Get), calls fn with a copy, and sends what fn changed
// (Due, Key, Payload, Headers) as an Update conditioned on the version it
// read. When another change got there first, it reads again and calls fn
// again, a few times, before it returns *ConflictError. fn may change
// nothing (then UpdateFunc returns the event's current version without an
// update) or return an error (returned as it is, nothing updated); changing
// any other field is an *InvalidError.
func (c *Client) UpdateFunc(ctx context.Context, id string, fn func(*Event) error) (Result, error) {
	var err error
	for range updateFuncAttempts {
		var cur Event
		cur, err = c.Get(ctx, id)
		if err != nil {
			return Result{ID: id}, err
		}
		ev := cloneEvent(cur)
		if err := fn(&ev); err != nil {
			return Result{ID: id}, err
		}
		opts, derr := diffEvent(cur, ev)
		if derr != nil {
			return Result{ID: id}, derr
		}
		if len(opts) == 0 {
			return Result{ID: id, Version: cur.Version, Due: cur.Due}, nil
		}
		var res Result
		res, err = c.Update(ctx, id, append(opts, IfVersion(cur.Version))...)
		if !errors.Is(err, ErrConflict) || ctx.Err() != nil {
			return res, err
		}
	}
	return Result{ID: id}, err
}

func cloneEvent(e Event) Event {
	e.Key, e.Payload = slices.Clone(e.Key), slices.Clone(e.Payload)
	e.Headers = slices.Clone(e.Headers)
	for i := range e.Headers {
		e.Headers[i].Value = slices.Clone(e.Headers[i].Value)
	}
	return e
}

// diffEvent is the update from a to b.
func diffEvent(a, b Event) ([]UpdateOption, error) {
	switch {
	case a.ID != b.ID:
		return nil, invalidf("id", "UpdateFunc cannot change an event's id")
	case a.Topic != b.Topic:
		return nil, invalidf("topic", "an update cannot change an event's topic; schedule it anew with Replace")
	case a.Priority != b.Priority, a.Window != b.Window:
		return nil, invalidf("priority", "an update cannot change an event's priority or window; schedule it anew with Replace")
	}
	var opts []UpdateOption
	if !a.Due.Equal(b.Due) {
		opts = append(opts, At(b.Due))
	}
	if !bytes.Equal(a.Key, b.Key) {
		opts = append(opts, SetKey(b.Key))
	}
	if !bytes.Equal(a.Payload, b.Payload) {
		opts = append(opts, SetPayload(b.Payload))
	}
	if !slices.EqualFunc(a.Headers, b.Headers, func(x, y Header) bool { return x.Key == y.Key && bytes.Equal(x.Value, y.Value) }) {
		opts = append(opts, SetHeaders(b.Headers))
	}
	return opts, nil
}
