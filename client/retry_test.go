package client_test

import (
	"context"
	"errors"
	"net"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// faults sits in front of the real server: it counts and records calls, and
// can answer a call with a chosen error instead of handling it (before) or
// replace the answer of a call it handled (after).
type faults struct {
	mu    sync.Mutex
	calls map[string]int
	reqs  map[string][]proto.Message
	// before returns the error to answer the n-th call (from 1) of method
	// with, unhandled; nil handles it.
	before func(ctx context.Context, method string, n int) error
	// after returns the error to answer a handled call with; nil keeps the
	// answer.
	after func(method string, n int, err error) error
}

func newFaults() *faults {
	return &faults{calls: map[string]int{}, reqs: map[string][]proto.Message{}}
}

func (f *faults) opts() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.UnaryInterceptor(f.unary), grpc.StreamInterceptor(f.stream)}
}

func (f *faults) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	return f.calls[method]
}

func (f *faults) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := path.Base(info.FullMethod)
	n := f.count(m)
	f.mu.Lock()
	f.reqs[m] = append(f.reqs[m], proto.Clone(req.(proto.Message)))
	before, after := f.before, f.after
	f.mu.Unlock()
	if before != nil {
		if err := before(ctx, m, n); err != nil {
			return nil, err
		}
	}
	resp, err := handler(ctx, req)
	if after != nil {
		if e := after(m, n, err); e != nil {
			return nil, e
		}
	}
	return resp, err
}

func (f *faults) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	m := path.Base(info.FullMethod)
	n := f.count(m)
	f.mu.Lock()
	before := f.before
	f.mu.Unlock()
	if before != nil {
		if err := before(ss.Context(), m, n); err != nil {
			return err
		}
	}
	return handler(srv, ss)
}

func (f *faults) n(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *faults) requests(method string) []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.reqs[method]...)
}

// failFirst answers the first k calls of method from now on with err.
func failFirst(method string, k int, err error) func(context.Context, string, int) error {
	var mu sync.Mutex
	seen := 0
	return func(_ context.Context, m string, _ int) error {
		if m != method {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if seen++; seen <= k {
			return err
		}
		return nil
	}
}

// fastRetry retries quickly, so that tests of retries are quick.
var fastRetry = client.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, ExhaustedBackoff: time.Millisecond}

func TestRetriesRetryableCodes(t *testing.T) {
	exhausted, _ := status.New(codes.ResourceExhausted, "over its rate").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(20 * time.Millisecond)})
	for _, err := range []error{
		status.Error(codes.Unavailable, "not leader (leadership is moving); retry in a moment"),
		status.Error(codes.Aborted, "firing; nothing was changed: retry in a moment"),
		exhausted.Err(),
	} {
		t.Run(status.Code(err).String(), func(t *testing.T) {
			f := newFaults()
			h := newHarness(t, f.opts()...)
			c := h.dial(t, client.WithRetry(fastRetry))
			ctx := testCtx(t)
			if _, err := c.Schedule(ctx, client.Event{ID: "r1", Topic: "t"}, client.In(time.Hour)); err != nil {
				t.Fatal(err)
			}
			f.before = failFirst("Cancel", 2, err)
			start := time.Now()
			if err := c.Cancel(ctx, "r1"); err != nil {
				t.Fatalf("Cancel after 2 failures: %v", err)
			}
			if n := f.n("Cancel"); n != 3 {
				t.Errorf("Cancel reached the server %d times, want 3", n)
			}
			if status.Code(err) == codes.ResourceExhausted && time.Since(start) < 40*time.Millisecond {
				t.Errorf("RESOURCE_EXHAUSTED retried after %v, before the server's delay", time.Since(start))
			}
		})
	}
}

func TestRetriesNotRetried(t *testing.T) {
	for _, tc := range []struct {
		err error
		is  error
	}{
		{status.Error(codes.InvalidArgument, "id: required"), client.ErrInvalid},
		{status.Error(codes.AlreadyExists, "taken"), client.ErrConflict},
		{status.Error(codes.FailedPrecondition, `id: event "r1" has already fired; it can no longer be cancelled`), client.ErrAlreadyFired},
		{status.Error(codes.PermissionDenied, "no"), client.ErrPermissionDenied},
		{status.Error(codes.Unauthenticated, "who"), client.ErrUnauthenticated},
		{status.Error(codes.NotFound, "no event"), client.ErrNotFound},
		{status.Error(codes.ResourceExhausted, "at most 10 schedules: delete one first"), nil},
	} {
		t.Run(status.Code(tc.err).String(), func(t *testing.T) {
			f := newFaults()
			h := newHarness(t, f.opts()...)
			c := h.dial(t, client.WithRetry(fastRetry))
			f.before = failFirst("Cancel", 100, tc.err)
			err := c.Cancel(testCtx(t), "r1")
			if n := f.n("Cancel"); n != 1 {
				t.Errorf("Cancel reached the server %d times, want 1", n)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if status.Code(err) != status.Code(tc.err) {
				t.Errorf("status.Code(%v) = %v, want %v", err, status.Code(err), status.Code(tc.err))
			}
		})
	}
}

func TestRetriesBounded(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	f.before = failFirst("Get", 1000, status.Error(codes.Unavailable, "down"))

	p := fastRetry
	p.MaxAttempts = 4
	c := h.dial(t, client.WithRetry(p))
	_, err := c.Get(testCtx(t), "x")
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("error %v is not ErrUnavailable", err)
	}
	if n := f.n("Get"); n != 4 {
		t.Errorf("Get reached the server %d times, want MaxAttempts = 4", n)
	}

	// The context's deadline stops retries that MaxAttempts would allow.
	p = client.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	c = h.dial(t, client.WithRetry(p))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Get(ctx, "x")
	if el := time.Since(start); el > 400*time.Millisecond {
		t.Errorf("Get returned after %v, past its 300ms deadline", el)
	}
	if !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("error %v: want the last answer, UNAVAILABLE", err)
	}
}

func TestRetriesAttemptTimeout(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	// The first attempt hangs until the client gives up on it.
	f.before = func(ctx context.Context, m string, n int) error {
		if m == "Get" && n == 1 {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		return nil
	}
	p := fastRetry
	p.AttemptTimeout = 100 * time.Millisecond
	c := h.dial(t, client.WithRetry(p))
	_, err := c.Get(testCtx(t), "x")
	if !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Get = %v, want the second attempt's NOT_FOUND", err)
	}
	if n := f.n("Get"); n != 2 {
		t.Errorf("Get reached the server %d times, want 2", n)
	}
}

func TestScheduleIDStableAcrossRetries(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	f.before = failFirst("Schedule", 2, status.Error(codes.Unavailable, "down"))
	c := h.dial(t, client.WithRetry(fastRetry))
	res, err := c.Schedule(testCtx(t), client.Event{Topic: "t"}, client.In(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests("Schedule")
	if len(reqs) != 3 {
		t.Fatalf("%d attempts, want 3", len(reqs))
	}
	for i, r := range reqs {
		if id := r.(*chimev1.ScheduleRequest).GetEvent().GetId(); id != res.ID {
			t.Errorf("attempt %d sent id %q, want %q", i+1, id, res.ID)
		}
	}
	u, err := uuid.Parse(res.ID)
	if err != nil || u.Version() != 7 {
		t.Errorf("id %q is not a UUIDv7: %v", res.ID, err)
	}
	if res.Existing {
		t.Error("a new event reported as existing")
	}
	// A batch too.
	f.before = failFirst("BatchSchedule", 1, status.Error(codes.Unavailable, "down"))
	rs, err := c.ScheduleBatch(testCtx(t), []client.Event{{Topic: "t"}, {Topic: "t"}}, client.In(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	breqs := f.requests("BatchSchedule")
	if len(breqs) != 2 {
		t.Fatalf("%d batch attempts, want 2", len(breqs))
	}
	for _, r := range breqs {
		for i, ev := range r.(*chimev1.BatchScheduleRequest).Events {
			if ev.Id != rs[i].ID || ev.Id == "" {
				t.Errorf("batch attempt sent id %q for event %d, want %q", ev.Id, i, rs[i].ID)
			}
		}
	}
	if rs[0].ID == rs[1].ID {
		t.Error("two events got the same id")
	}
}

func TestScheduleUnknownOutcome(t *testing.T) {
	lost := status.Error(codes.Unknown, "leadership changed while the entry was proposed")
	single := client.RetryPolicy{MaxAttempts: 1}

	t.Run("applied", func(t *testing.T) {
		f := newFaults()
		h := newHarness(t, f.opts()...)
		// The server schedules it, but the answer is lost.
		f.after = func(m string, n int, err error) error {
			if m == "Schedule" && n == 1 {
				return lost
			}
			return nil
		}
		c := h.dial(t, client.WithRetry(fastRetry))
		res, err := c.Schedule(testCtx(t), client.Event{ID: "u1", Topic: "t", Payload: []byte("p")}, client.In(time.Hour))
		if err != nil {
			t.Fatalf("Schedule = %v, want it resolved by a Get", err)
		}
		if !res.Existing || res.Version != 1 || res.ID != "u1" || !res.Due.Equal(harnessStart.Add(time.Hour)) {
			t.Errorf("got %+v", res)
		}
		if f.n("Schedule") != 1 || f.n("Get") != 1 {
			t.Errorf("%d Schedule and %d Get calls, want 1 and 1", f.n("Schedule"), f.n("Get"))
		}
	})
	t.Run("not applied", func(t *testing.T) {
		f := newFaults()
		h := newHarness(t, f.opts()...)
		f.before = failFirst("Schedule", 1, lost)
		c := h.dial(t, client.WithRetry(single))
		_, err := c.Schedule(testCtx(t), client.Event{ID: "u2", Topic: "t"}, client.In(time.Hour))
		if status.Code(err) != codes.Unknown || errors.Is(err, client.ErrUnknownOutcome) {
			t.Errorf("Schedule = %v, want the UNKNOWN, settled as not scheduled", err)
		}
		if f.n("Get") != 1 {
			t.Errorf("%d Get calls, want 1", f.n("Get"))
		}
	})
	t.Run("other content", func(t *testing.T) {
		f := newFaults()
		h := newHarness(t, f.opts()...)
		c := h.dial(t, client.WithRetry(single))
		if _, err := c.Schedule(testCtx(t), client.Event{ID: "u3", Topic: "t"}, client.In(time.Hour)); err != nil {
			t.Fatal(err)
		}
		f.before = failFirst("Schedule", 2, lost)
		_, err := c.Schedule(testCtx(t), client.Event{ID: "u3", Topic: "other"}, client.In(time.Hour))
		var ce *client.ConflictError
		if !errors.As(err, &ce) || ce.Version != 1 {
			t.Errorf("Schedule = %v, want a conflict at version 1", err)
		}
	})
	t.Run("read fails", func(t *testing.T) {
		f := newFaults()
		h := newHarness(t, f.opts()...)
		f.before = func(_ context.Context, m string, n int) error {
			switch m {
			case "Schedule":
				return lost
			case "Get":
				return status.Error(codes.Unavailable, "down")
			}
			return nil
		}
		p := fastRetry
		p.MaxAttempts = 2
		c := h.dial(t, client.WithRetry(p))
		res, err := c.Schedule(testCtx(t), client.Event{ID: "u4", Topic: "t"}, client.In(time.Hour))
		if !errors.Is(err, client.ErrUnknownOutcome) || res.ID != "u4" {
			t.Errorf("Schedule = %+v, %v; want ErrUnknownOutcome with the id", res, err)
		}
	})
	t.Run("deadline of an attempt", func(t *testing.T) {
		f := newFaults()
		h := newHarness(t, f.opts()...)
		// Applied, but the attempt's deadline passes before the answer.
		f.after = func(m string, n int, err error) error {
			if m == "Schedule" && n == 1 {
				return status.Error(codes.DeadlineExceeded, "Schedule: context deadline exceeded")
			}
			return nil
		}
		c := h.dial(t, client.WithRetry(fastRetry))
		res, err := c.Schedule(testCtx(t), client.Event{ID: "u5", Topic: "t"}, client.In(time.Hour))
		if err != nil || !res.Existing {
			t.Errorf("Schedule = %+v, %v; want the retry's existing = true", res, err)
		}
		if f.n("Schedule") != 2 {
			t.Errorf("%d Schedule calls, want 2", f.n("Schedule"))
		}
	})
}

func TestUpdateUnknownOutcome(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	c := h.dial(t, client.WithRetry(fastRetry))
	ctx := testCtx(t)
	if _, err := c.Schedule(ctx, client.Event{ID: "v1", Topic: "t"}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// The update commits, its answer is lost; the retry finds version 2.
	f.after = func(m string, n int, err error) error {
		if m == "Update" && n == 1 {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	}
	res, err := c.Update(ctx, "v1", client.SetPayload([]byte("new")), client.IfVersion(1))
	if err != nil {
		t.Fatalf("Update = %v, want it resolved as applied", err)
	}
	if res.Version != 2 {
		t.Errorf("version %d, want 2", res.Version)
	}
	if f.n("Update") != 2 {
		t.Errorf("%d Update calls, want 2", f.n("Update"))
	}
	// A real conflict stays one.
	_, err = c.Update(ctx, "v1", client.SetPayload([]byte("newer")), client.IfVersion(1))
	var ce *client.ConflictError
	if !errors.As(err, &ce) || ce.Version != 2 {
		t.Errorf("Update = %v, want a conflict at version 2", err)
	}
}

func TestFailFastNoNode(t *testing.T) {
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.Dial(context.Background(), strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.Schedule(ctx, client.Event{Topic: "t"}, client.In(time.Hour))
	if el := time.Since(start); el > 2100*time.Millisecond {
		t.Errorf("Schedule failed after %v, past its 2s deadline", el)
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrUnknownOutcome) {
		t.Errorf("error %v: want ErrUnavailable, and no doubt: nothing was sent", err)
	}
	for _, a := range addrs {
		if !strings.Contains(err.Error(), a) {
			t.Errorf("error %q does not name %s", err, a)
		}
	}

	// Without a deadline, the RetryPolicy bounds it.
	c2, err := client.Dial(context.Background(), addrs[0], client.WithRetry(client.RetryPolicy{MaxAttempts: 3}))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	start = time.Now()
	if _, err := c2.Get(context.Background(), "x"); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("Get = %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Get without a deadline failed after %v", el)
	}
}
