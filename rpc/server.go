package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/chimehq/chime/cluster"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/shard"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Server implements chimev1.SchedulerServer on top of a Backend. It holds no
// state of its own and is safe for concurrent use.
type Server struct {
	chimev1.UnimplementedSchedulerServer

	backend Backend
	limits  Limits
	now     func() time.Time
	logger  *slog.Logger

	validated prometheus.Counter
}

// NewServer returns a Server that validates requests against lim (zero fields
// take their DefaultLimits value) and hands valid ones to b. now is the clock
// used for the horizon check (nil: time.Now); logger receives the errors
// reported to clients as INTERNAL (nil: slog.Default()).
//
// NewServer panics if lim.Validate fails: check user-supplied limits with
// Validate first.
func NewServer(b Backend, lim Limits, now func() time.Time, logger *slog.Logger) *Server {
	if err := lim.Validate(); err != nil {
		panic(err)
	}
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Server{backend: b, limits: lim.withDefaults(), now: now, logger: logger,
		validated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_rpc_validated_events_total",
			Help: "Events of Schedule and BatchSchedule calls this node validated. Each event is validated once, on the node its client called, which hands it to its shard's leader validated.",
		})}
}

// Collector exposes the server's metrics.
func (s *Server) Collector() prometheus.Collector { return s.validated }

// Register registers s on gs as the chime.v1.Scheduler and chime.v1.Recurring
// services, together with
// gRPC server reflection (v1 and v1alpha), so that grpcurl and similar tools
// can list and call the API. Reflection must not be registered on gs again:
// a second registration of the same service panics in grpc. Services added
// to gs later (an Admin service) are visible through it too, because
// reflection reads gs's service list on each request.
func Register(gs *grpc.Server, s *Server) {
	chimev1.RegisterSchedulerServer(gs, s)
	chimev1.RegisterRecurringServer(gs, s.Recurring())
	reflection.Register(gs)
}

// Schedule validates one event and schedules it.
func (s *Server) Schedule(ctx context.Context, in *chimev1.ScheduleRequest) (*chimev1.ScheduleResponse, error) {
	s.validated.Inc()
	req, ferr := s.checkEvent(singleEvent, in.GetEvent(), s.now(), nil, fromIngest(ctx))
	if ferr != nil {
		return nil, status.Error(codes.InvalidArgument, ferr.Error())
	}
	req.Scope = ScopeOf(ctx)
	results, err := s.backend.Schedule(ctx, []shard.Request{req})
	if err != nil {
		return nil, s.backendStatus("Schedule", err)
	}
	if len(results) != 1 {
		return nil, s.backendStatus("Schedule", fmt.Errorf("backend returned %d results for 1 request", len(results)))
	}
	var res chimev1.ScheduleResult
	var due timestamppb.Timestamp
	if rerr := s.scheduleResult(singleEvent, req, results[0], &res, &due); rerr != nil {
		return nil, rerr
	}
	return &chimev1.ScheduleResponse{Id: res.Id, Due: res.Due, Existing: res.Existing, Version: res.Version}, nil
}

// BatchSchedule validates every event on its own, reports the invalid ones
// in their results (code 3), and schedules the valid ones in one Backend
// call, in request order.
func (s *Server) BatchSchedule(ctx context.Context, in *chimev1.BatchScheduleRequest) (*chimev1.BatchScheduleResponse, error) {
	events := in.GetEvents()
	switch n := len(events); {
	case n == 0:
		return nil, status.Error(codes.InvalidArgument, "events: required (at least one event)")
	case n > s.limits.MaxBatch:
		return nil, status.Errorf(codes.InvalidArgument, "events: %d events, at most %d allowed", n, s.limits.MaxBatch)
	}

	now, scope, ingest := s.now(), ScopeOf(ctx), fromIngest(ctx)
	s.validated.Add(float64(len(events)))
	out := make([]*chimev1.ScheduleResult, len(events))
	reqs := make([]shard.Request, 0, len(events))
	at := make([]int, 0, len(events)) // at[j] is the index in events of reqs[j]
	var validTopic string
	for i, ev := range events {
		req, ferr := s.checkEvent(eventPath(i), ev, now, &validTopic, ingest)
		if ferr != nil {
			out[i] = &chimev1.ScheduleResult{Id: ev.GetId(), Code: int32(codes.InvalidArgument), Message: ferr.Error()}
			continue
		}
		req.Scope = scope
		reqs = append(reqs, req)
		at = append(at, i)
	}
	if len(reqs) > 0 && dryRun(ctx) {
		for j, req := range reqs {
			out[at[j]] = &chimev1.ScheduleResult{Id: req.ID}
		}
		return &chimev1.BatchScheduleResponse{Results: out}, nil
	}
	if len(reqs) > 0 {
		results, err := s.backend.Schedule(ctx, reqs)
		if err != nil {
			return nil, s.backendStatus("BatchSchedule", err)
		}
		if len(results) != len(reqs) {
			return nil, s.backendStatus("BatchSchedule", fmt.Errorf("backend returned %d results for %d requests", len(results), len(reqs)))
		}
		// Two allocations for the whole batch, not two per event: the results
		// and their due times were a fifth of an ingesting node's allocations.
		rs, dues := make([]chimev1.ScheduleResult, len(results)), make([]timestamppb.Timestamp, len(results))
		for j, r := range results {
			i := at[j]
			if rerr := s.scheduleResult(eventPath(i), reqs[j], r, &rs[j], &dues[j]); rerr != nil {
				st := status.Convert(rerr)
				rs[j].Id, rs[j].Code, rs[j].Message = reqs[j].ID, int32(st.Code()), st.Message()
			}
			out[i] = &rs[j]
		}
	}
	return &chimev1.BatchScheduleResponse{Results: out}, nil
}

// scheduleResult turns one Backend result into the client's answer, in res
// (its due time in due), or a status error (ALREADY_EXISTS for a Conflict).
func (s *Server) scheduleResult(path eventPath, req shard.Request, r shard.Result, res *chimev1.ScheduleResult, due *timestamppb.Timestamp) error {
	if r.Err != nil {
		return s.backendStatus("Schedule", r.Err)
	}
	switch r.Outcome {
	case raftfsm.Created, raftfsm.Existing, raftfsm.Replaced, raftfsm.Renewed:
		due.Seconds, due.Nanos = r.Due/1e9, int32(r.Due%1e9)
		if due.Nanos < 0 { // before 1970: Nanos is never negative
			due.Seconds, due.Nanos = due.Seconds-1, due.Nanos+1e9
		}
		res.Id, res.Due, res.Existing, res.Version = req.ID, due, r.Outcome == raftfsm.Existing, r.Version
		return nil
	case raftfsm.Conflict:
		return status.Errorf(codes.AlreadyExists, "%s.id: %q already scheduled with different content", path, req.ID)
	default:
		return s.backendStatus("Schedule", fmt.Errorf("backend returned unknown schedule outcome %d for id %q", r.Outcome, req.ID))
	}
}

// Cancel cancels one event.
func (s *Server) Cancel(ctx context.Context, in *chimev1.CancelRequest) (*chimev1.CancelResponse, error) {
	id := in.GetId()
	if ferr := s.checkID(id); ferr != nil {
		return nil, status.Error(codes.InvalidArgument, ferr.Error())
	}
	res, err := s.backend.Cancel(ctx, id, ScopeOf(ctx))
	if err != nil {
		return nil, s.backendStatus("Cancel", err)
	}
	switch res.Outcome {
	case raftfsm.Cancelled, raftfsm.AlreadyCancelled:
		return &chimev1.CancelResponse{Id: id, State: chimev1.EventState_EVENT_STATE_CANCELLED}, nil
	case raftfsm.NotFound:
		return nil, notFound(id)
	case raftfsm.AlreadyFired, raftfsm.AlreadyDeadLettered:
		return nil, status.Error(codes.FailedPrecondition, s.tooLateToCancel(ctx, id, res.Outcome))
	default:
		return nil, s.backendStatus("Cancel", fmt.Errorf("backend returned unknown cancel outcome %d for id %q", res.Outcome, id))
	}
}

// tooLateToCancel words the FAILED_PRECONDITION of a Cancel, with the time
// the event fired when one more read can tell it. The cancel outcome is the
// answer; the read only decorates it, so its failure is not an error.
func (s *Server) tooLateToCancel(ctx context.Context, id string, o raftfsm.CancelOutcome) string {
	verb := "fired"
	if o == raftfsm.AlreadyDeadLettered {
		verb = "been dead-lettered"
	}
	msg := fmt.Sprintf("id: event %q has already %s; it can no longer be cancelled", id, verb)
	rec, found, err := s.backend.Get(ctx, id)
	if err != nil || !found {
		return msg
	}
	switch {
	case o == raftfsm.AlreadyFired && rec.FiredAt != 0:
		msg = fmt.Sprintf("id: event %q already fired at %s; it can no longer be cancelled",
			id, time.Unix(0, rec.FiredAt).UTC().Format(time.RFC3339Nano))
	case o == raftfsm.AlreadyDeadLettered && rec.DeadLetteredAt != 0:
		msg = fmt.Sprintf("id: event %q was already dead-lettered to %q at %s; it can no longer be cancelled",
			id, rec.DeadLetterTopic, time.Unix(0, rec.DeadLetteredAt).UTC().Format(time.RFC3339Nano))
	}
	return msg
}

// notFound is the NOT_FOUND of an id with no event: it may never have been
// scheduled, or it settled longer ago than the retention and was removed.
func notFound(id string) error {
	return status.Errorf(codes.NotFound, "id: no event %q (never scheduled, or settled longer ago than the cluster's retention and removed)", id)
}

// Get returns one event.
func (s *Server) Get(ctx context.Context, in *chimev1.GetRequest) (*chimev1.GetResponse, error) {
	id := in.GetId()
	if ferr := s.checkID(id); ferr != nil {
		return nil, status.Error(codes.InvalidArgument, ferr.Error())
	}
	rec, found, err := s.backend.Get(ctx, id)
	if err != nil {
		return nil, s.backendStatus("Get", err)
	}
	if !found {
		return nil, notFound(id)
	}
	if scope := ScopeOf(ctx); scope != nil && !scope.Permits(rec.ID, rec.Topic) {
		return nil, s.backendStatus("Get", shard.Refuse(scope, id))
	}
	resp, err := cluster.GetResponse(&rec)
	if err != nil {
		return nil, s.backendStatus("Get", err)
	}
	return resp, nil
}

// backendStatus is the gRPC status of a Backend error (cluster.StatusOf).
func (s *Server) backendStatus(op string, err error) error {
	return cluster.StatusOf(s.logger, op, err)
}

type ingestKey struct{}

// ingestCall is what IngestContext put in a context.
type ingestCall struct{ dryRun bool }

// IngestContext marks ctx as a call of this node's Kafka ingest path
// (package rpc/ingest), made in process: its events may carry the headers
// that path adds, chime-source and chime-tombstone-back, which any other
// caller is refused as Chime's. With dryRun, a BatchSchedule validates its
// events and schedules none (chimed --ingest-dry-run). A remote caller
// cannot set it: context values do not cross the wire.
func IngestContext(ctx context.Context, dryRun bool) context.Context {
	return context.WithValue(ctx, ingestKey{}, ingestCall{dryRun: dryRun})
}

func fromIngest(ctx context.Context) bool {
	_, ok := ctx.Value(ingestKey{}).(ingestCall)
	return ok
}

func dryRun(ctx context.Context) bool {
	c, _ := ctx.Value(ingestKey{}).(ingestCall)
	return c.dryRun
}

// ScopeOf is the shard.Scope of the caller of ctx, as the node's authorizer put it: its grant
// when one limits it, else nil.
func ScopeOf(ctx context.Context) shard.Scope {
	if g := auth.Scope(ctx); g != nil {
		return g
	}
	return nil
}

// checkID validates the id of a Cancel or Get.
func (s *Server) checkID(id string) *fieldError {
	switch {
	case id == "":
		return invalid("id", "required")
	case len(id) > s.limits.MaxIDBytes:
		return invalid("id", "%d bytes, at most %d allowed", len(id), s.limits.MaxIDBytes)
	}
	return nil
}
