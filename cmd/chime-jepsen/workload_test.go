package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// fakeScheduler answers List with pages of one event each from events (failing the page
// listFailAt, 1-based, when set, and never ending when endless), and CancelMatching with
// the progress messages progress, then err (nil: the stream just ends).
type fakeScheduler struct {
	chimev1.UnimplementedSchedulerServer
	mu         sync.Mutex
	events     []*chimev1.GetResponse
	listFailAt int
	endless    bool
	lists      []*chimev1.ListRequest
	progress   []*chimev1.CancelMatchingProgress
	err        error
	cancels    []*chimev1.CancelMatchingRequest
	schedules  []*chimev1.ScheduleRequest
	batches    []*chimev1.BatchScheduleRequest
	// result answers event i of the batch-th BatchSchedule (1-based); batchErr fails
	// every call.
	result   func(batch, i int, e *chimev1.Event) *chimev1.ScheduleResult
	batchErr error
}

func (f *fakeScheduler) List(_ context.Context, in *chimev1.ListRequest) (*chimev1.ListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists = append(f.lists, in)
	page := 0
	if in.PageToken != "" {
		if _, err := fmt.Sscanf(in.PageToken, "page-%d", &page); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "page token %q: %v", in.PageToken, err)
		}
	}
	if f.listFailAt == page+1 {
		return nil, status.Error(codes.Unavailable, "no leader")
	}
	resp := &chimev1.ListResponse{}
	if page < len(f.events) {
		resp.Events = []*chimev1.GetResponse{f.events[page]}
	}
	if page+1 < len(f.events) || f.endless {
		resp.NextPageToken = fmt.Sprintf("page-%d", page+1)
	}
	return resp, nil
}

func (f *fakeScheduler) Schedule(_ context.Context, in *chimev1.ScheduleRequest) (*chimev1.ScheduleResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedules = append(f.schedules, in)
	due := in.Event.GetDeliverAt()
	if due == nil {
		due = timestamppb.New(time.Now().Add(in.Event.GetDelay().AsDuration()))
	}
	return &chimev1.ScheduleResponse{Id: in.Event.Id, Due: due, Version: 1}, nil
}

// BatchSchedule answers each event with result(i, event) (nil: ok, due at its deliver_at),
// or the whole call with batchErr.
func (f *fakeScheduler) BatchSchedule(_ context.Context, in *chimev1.BatchScheduleRequest) (*chimev1.BatchScheduleResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, in)
	if f.batchErr != nil {
		return nil, f.batchErr
	}
	resp := &chimev1.BatchScheduleResponse{}
	for i, e := range in.Events {
		var r *chimev1.ScheduleResult
		if f.result != nil {
			r = f.result(len(f.batches), i, e)
		}
		if r == nil {
			r = &chimev1.ScheduleResult{Id: e.Id, Due: e.DeliverAt, Version: 1}
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

// serveFake serves f as node n, on port 7070 of loopback address ip (node.scheduler dials
// port 7070 of the node's address), until the test ends; it skips the test when it cannot.
func serveFake(t *testing.T, f *fakeScheduler, id, ip string) *node {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":7070")
	if err != nil {
		t.Skipf("cannot serve a fake node on %s:7070: %v", ip, err)
	}
	gs := grpc.NewServer()
	chimev1.RegisterSchedulerServer(gs, f)
	served := make(chan struct{})
	go func() {
		defer close(served)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	n := &node{id: id, ip: ip}
	t.Cleanup(func() {
		n.closeClients()
		gs.Stop()
		<-served
	})
	return n
}

func (f *fakeScheduler) CancelMatching(in *chimev1.CancelMatchingRequest, stream grpc.ServerStreamingServer[chimev1.CancelMatchingProgress]) error {
	f.mu.Lock()
	f.cancels = append(f.cancels, in)
	progress, err := f.progress, f.err
	f.mu.Unlock()
	for _, m := range progress {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return err
}

// TestListAndCancelMatchingOps: the workload records a list with every entry of every page
// (ok only when every page was), and a bulk cancel with its last totals, ok only when the
// last message (done) came, fail only when refused with INVALID_ARGUMENT.
func TestListAndCancelMatchingOps(t *testing.T) {
	// node.scheduler dials port 7070 of the node's address: a loopback address of its own.
	ln, err := net.Listen("tcp", "127.0.0.78:7070")
	if err != nil {
		t.Skipf("cannot serve a fake node on 127.0.0.78:7070: %v", err)
	}
	fake := &fakeScheduler{}
	gs := grpc.NewServer()
	chimev1.RegisterSchedulerServer(gs, fake)
	served := make(chan struct{})
	go func() {
		defer close(served)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	defer func() { gs.Stop(); <-served }()
	n8 := &node{id: "n8", ip: "127.0.0.78"}
	defer func() {
		n8.closeClients()
	}()
	w := &workload{c: &cluster{nodes: []*node{n8}}, h: &history{}, opTimeout: 5 * time.Second, versions: map[string]uint64{}}
	last := func() checker.Op { ops := w.h.snapshot(); return ops[len(ops)-1] }
	due := time.Unix(1_700_000_000, 0)
	fake.events = []*chimev1.GetResponse{
		{Event: &chimev1.Event{Id: "e4532"}, State: chimev1.EventState_EVENT_STATE_FIRED, Version: 1, Due: timestamppb.New(due)},
		{Event: &chimev1.Event{Id: "e45321"}, State: chimev1.EventState_EVENT_STATE_SCHEDULED, Version: 2, Due: timestamppb.New(due.Add(time.Second))},
	}

	// Both pages; a quarter of the lists (by the rand) filter on SCHEDULED, and say so.
	filtered, unfiltered := false, false
	for seed := uint64(0); seed < 40 && (!filtered || !unfiltered); seed++ {
		w.list(3, n8, rand.New(rand.NewPCG(seed, 1)), "e4532")
		op := last()
		sent := fake.lists[len(fake.lists)-1].Filter
		want := []checker.Listed{{ID: "e4532", State: checker.StateFired, Version: 1, DueNs: due.UnixNano()},
			{ID: "e45321", State: checker.StateScheduled, Version: 2, DueNs: due.Add(time.Second).UnixNano()}}
		if op.F != checker.FList || op.Type != checker.TypeOK || op.Prefix != "e4532" || op.Node != "n8" || op.Process != 3 ||
			op.Pages != 2 || op.More || !slices.Equal(op.Listed, want) || op.InvokeNs == 0 || op.CompleteNs < op.InvokeNs ||
			sent.IdPrefix != "e4532" || fake.lists[len(fake.lists)-1].Limit != listPageSize {
			t.Fatalf("list op %+v (filter sent %v)", op, sent)
		}
		if len(sent.States) > 0 {
			filtered = true
			if !slices.Equal(sent.States, []chimev1.EventState{chimev1.EventState_EVENT_STATE_SCHEDULED}) ||
				!slices.Equal(op.States, []string{checker.StateScheduled}) {
				t.Errorf("filtered list: sent states %v, recorded %v", sent.States, op.States)
			}
		} else {
			unfiltered = true
			if op.States != nil {
				t.Errorf("unfiltered list recorded states %v", op.States)
			}
		}
	}
	if !filtered || !unfiltered {
		t.Errorf("filtered %v, unfiltered %v: want both", filtered, unfiltered)
	}

	// A page that fails: nothing listed.
	fake.listFailAt = 2
	w.list(3, n8, rand.New(rand.NewPCG(1, 1)), "e4532")
	if op := last(); op.Type != checker.TypeInfo || op.Code != "Unavailable" || op.Listed != nil || op.Pages != 1 {
		t.Errorf("list whose second page failed: %+v", op)
	}
	// A list that never ends stops after listPages pages and says so.
	fake.listFailAt, fake.endless = 0, true
	w.list(3, n8, rand.New(rand.NewPCG(1, 1)), "e4532")
	if op := last(); op.Type != checker.TypeOK || op.Pages != listPages || !op.More || len(op.Listed) != 2 {
		t.Errorf("endless list: %+v", op)
	}

	cases := []struct {
		name     string
		progress []*chimev1.CancelMatchingProgress
		err      error
		typ      string
		code     string
	}{
		{"done", []*chimev1.CancelMatchingProgress{{Matched: 5, Cancelled: 4}, {Matched: 11, Cancelled: 9, SkippedFired: 1, SkippedHeld: 1, Done: true}},
			nil, checker.TypeOK, ""},
		{"stopped part-way", []*chimev1.CancelMatchingProgress{{Matched: 11, Cancelled: 9, SkippedFired: 1, SkippedHeld: 1}},
			status.Error(codes.Unavailable, "leadership is moving"), checker.TypeInfo, "Unavailable"},
		{"a code the other ops read as fail, after steps", []*chimev1.CancelMatchingProgress{{Matched: 11, Cancelled: 9, SkippedFired: 1, SkippedHeld: 1}},
			status.Error(codes.FailedPrecondition, "something"), checker.TypeInfo, "FailedPrecondition"},
		{"ended without done", []*chimev1.CancelMatchingProgress{{Matched: 11, Cancelled: 9, SkippedFired: 1, SkippedHeld: 1}},
			nil, checker.TypeInfo, ""},
		{"refused", nil, status.Error(codes.InvalidArgument, "filter: empty"), checker.TypeFail, "InvalidArgument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake.progress, fake.err = tc.progress, tc.err
			dry := false
			for seed := uint64(0); ; seed++ { // one wet run and one dry run each
				w.cancelMatching(4, n8, rand.New(rand.NewPCG(seed, 2)), "e4532")
				op, sent := last(), fake.cancels[len(fake.cancels)-1]
				if op.F != checker.FCancelMatching || op.Type != tc.typ || op.Code != tc.code || op.Prefix != "e4532" ||
					sent.Filter.IdPrefix != "e4532" || sent.DryRun != op.DryRun || op.CompleteNs < op.InvokeNs {
					t.Fatalf("op %+v for request %v", op, sent)
				}
				if tc.typ == checker.TypeOK || tc.typ == checker.TypeInfo {
					if op.Matched != 11 || op.Cancelled != 9 || op.SkippedFired != 1 || op.SkippedHeld != 1 {
						t.Errorf("totals %+v, want the last message's", op)
					}
				}
				if tc.typ != checker.TypeOK && op.Error == "" {
					t.Errorf("no error recorded: %+v", op)
				}
				if op.DryRun {
					dry = true
				} else if dry {
					break
				}
				if seed > 40 {
					t.Fatal("no dry run and wet run in 40 seeds")
				}
			}
		})
	}
}

// TestPrefixesSelectADozen: a list's or bulk cancel's prefix is a recent "e" id less its
// last digit, of an id as long as the newest, and never selects an upsertable id.
func TestPrefixesSelectADozen(t *testing.T) {
	w := &workload{maxDelay: time.Minute, versions: map[string]uint64{}}
	r := rand.New(rand.NewPCG(1, 2))
	for range 12345 {
		ev := w.newEvent(r, "e")
		w.events = append(w.events, ev)
		if w.seq%50 == 0 {
			w.newEvent(r, "u")
		}
	}
	if u := w.newEvent(r, "u"); !strings.HasPrefix(u.id, "u") || u.payload != "p-"+u.id {
		t.Errorf("upsertable event %+v", u)
	}
	for range 200 {
		p, ok := w.pickPrefix(r)
		if !ok || len(p) != len(fmt.Sprint(w.seq)) || !strings.HasPrefix(p, "e") {
			t.Fatalf("prefix %q (%v) with newest id number %d", p, ok, w.seq)
		}
	}
	w = &workload{maxDelay: time.Minute, versions: map[string]uint64{}}
	for range 50 {
		w.events = append(w.events, w.newEvent(r, "e"))
	}
	if p, ok := w.pickPrefix(r); ok {
		t.Errorf("prefix %q with ids of two digits, which would select hundreds later", p)
	}
}

// TestFiringPolicyShares: about 30% of new events get a priority, every one of 0-9, and
// about 10% a window, of 100 ms to 2 s.
func TestFiringPolicyShares(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 20000
	prios, windows := 0, 0
	seen := map[uint32]bool{}
	for range n {
		p, w := firingPolicy(r)
		if p != nil {
			prios++
			if *p > 9 {
				t.Fatalf("priority %d", *p)
			}
			seen[*p] = true
		}
		if w != 0 {
			windows++
			if w < 100*time.Millisecond || w > maxWindow {
				t.Fatalf("window %v", w)
			}
		}
	}
	if prios < n*27/100 || prios > n*33/100 || len(seen) != 10 || windows < n*8/100 || windows > n*12/100 {
		t.Errorf("%d of %d with a priority (%d values), %d with a window", prios, n, len(seen), windows)
	}
}

// TestScheduleSendsTheFiringPolicy: a schedule sends the event's priority and window, and
// records both in its op; an event without them sends and records none.
func TestScheduleSendsTheFiringPolicy(t *testing.T) {
	fake := &fakeScheduler{}
	n := serveFake(t, fake, "n9", "127.0.0.79")
	w := &workload{c: &cluster{nodes: []*node{n}}, h: &history{}, opTimeout: 5 * time.Second, versions: map[string]uint64{}}
	seven := uint32(7)
	zero := uint32(0)
	evs := []sent{
		{id: "e1", topic: "jepsen.a", payload: "p-e1", delay: time.Second, priority: &seven, window: 1500 * time.Millisecond},
		{id: "e2", topic: "jepsen.a", payload: "p-e2", delay: time.Second, priority: &zero},
		{id: "e3", topic: "jepsen.a", payload: "p-e3", delay: time.Second},
	}
	for _, ev := range evs {
		ev.due = time.Now().Add(ev.delay)
		if !w.schedule(1, n, ev) {
			t.Fatalf("schedule %s failed: %+v", ev.id, w.h.snapshot())
		}
	}
	ops := w.h.snapshot()
	for i, ev := range evs {
		e, op := fake.schedules[i].Event, ops[i]
		if (ev.priority == nil) != (e.Priority == nil) || (ev.priority == nil) != (op.Priority == nil) ||
			ev.priority != nil && (*e.Priority != *ev.priority || *op.Priority != *ev.priority) {
			t.Errorf("%s: sent priority %v, recorded %v, want %v", ev.id, e.Priority, op.Priority, ev.priority)
		}
		if e.GetWindow().AsDuration() != ev.window || (ev.window == 0) != (e.Window == nil) || op.WindowNs != int64(ev.window) {
			t.Errorf("%s: sent window %v, recorded %d ns, want %v", ev.id, e.Window, op.WindowNs, ev.window)
		}
	}
	if got := ops[2].EffectivePriority(); got != checker.DefaultPriority {
		t.Errorf("unset priority reads as %d", got)
	}
	// The drain waits for the end of the longest window.
	if w.maxDue.Before(time.Unix(0, ops[0].AckDueNs).Add(1500 * time.Millisecond)) {
		t.Errorf("maxDue %v does not cover e1's window", w.maxDue)
	}
}

// TestClassifyKeepsWhatMayHaveHappenedIndeterminate: only an answer that
// certainly changed nothing is a fail; an error the client marks as an
// unknown outcome is info whatever its code, as is a deadline.
func TestClassifyKeepsWhatMayHaveHappenedIndeterminate(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, checker.TypeOK},
		{status.Error(codes.FailedPrecondition, "already fired"), checker.TypeFail},
		{status.Error(codes.NotFound, "no event"), checker.TypeFail},
		{fmt.Errorf("%w: %w", client.ErrUnknownOutcome, status.Error(codes.FailedPrecondition, "expected_version: at 3")), checker.TypeInfo},
		{status.Error(codes.Unavailable, "no leader"), checker.TypeInfo},
		{context.DeadlineExceeded, checker.TypeInfo},
	} {
		if typ, _ := classify(tc.err); typ != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, typ, tc.want)
		}
	}
}
