package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMapError(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		msg  string
		is   error
	}{
		{codes.NotFound, `id: no event "x"`, ErrNotFound},
		{codes.AlreadyExists, `event.id: "x" already scheduled with different content`, ErrConflict},
		{codes.FailedPrecondition, `expected_version: event "x" is at version 7, not 6`, ErrConflict},
		{codes.FailedPrecondition, `id: event "x" already fired at 2030-01-01T00:00:00Z; it can no longer be cancelled`, ErrAlreadyFired},
		{codes.FailedPrecondition, `id: event "x" was already dead-lettered to "dlq" at 2030-01-01T00:00:00Z; it can no longer be cancelled`, ErrAlreadyFired},
		{codes.FailedPrecondition, `id: event "x" has already fired; only a scheduled event can be updated`, ErrAlreadyFired},
		{codes.FailedPrecondition, `id: event "x" has been cancelled; only a scheduled event can be updated`, ErrCancelled},
		{codes.FailedPrecondition, `recurring schedule "r" is active, not paused`, ErrNotPaused},
		{codes.PermissionDenied, `credential "a" may not`, ErrPermissionDenied},
		{codes.Unauthenticated, `no token`, ErrUnauthenticated},
		{codes.Unavailable, `not leader`, ErrUnavailable},
		{codes.InvalidArgument, `event.topic: required`, ErrInvalid},
		{codes.DeadlineExceeded, `Schedule: context deadline exceeded`, context.DeadlineExceeded},
		{codes.Canceled, `context canceled`, context.Canceled},
	} {
		src := status.Error(tc.code, tc.msg)
		err := mapError("op", "x", src)
		if !errors.Is(err, tc.is) {
			t.Errorf("%v %q: %v is not %v", tc.code, tc.msg, err, tc.is)
		}
		if st, ok := status.FromError(err); !ok || st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%v %q: status of %v = %v, %v", tc.code, tc.msg, err, st, ok)
		}
		if status.Code(err) != tc.code {
			t.Errorf("status.Code(%v) = %v, want %v", err, status.Code(err), tc.code)
		}
		for _, other := range []error{ErrNotFound, ErrConflict, ErrAlreadyFired, ErrPermissionDenied} {
			if other != tc.is && errors.Is(err, other) {
				t.Errorf("%v %q: %v is also %v", tc.code, tc.msg, err, other)
			}
		}
	}
}

func TestMapErrorDetails(t *testing.T) {
	var conflict *ConflictError
	err := mapError("update", "x", status.Error(codes.FailedPrecondition, `expected_version: event "x" is at version 7, not 6`))
	if !errors.As(err, &conflict) || conflict.Version != 7 || conflict.ID != "x" {
		t.Fatalf("got %#v", err)
	}
	err = mapError("recurring.create", "r", status.Error(codes.AlreadyExists, `recurring schedule "r" exists with another rule or target (version 3); Update changes it`))
	if !errors.As(err, &conflict) || conflict.Version != 3 {
		t.Fatalf("got %#v", err)
	}

	var inv *InvalidError
	err = mapError("schedule", "x", status.Error(codes.InvalidArgument, `events[3].headers[0].key: "chime-id" starts with the reserved prefix "chime-"`))
	if !errors.As(err, &inv) || inv.Field != "events[3].headers[0].key" || !strings.HasPrefix(inv.Rule, `"chime-id" starts`) {
		t.Fatalf("got %#v", err)
	}
	err = mapError("schedule", "x", status.Error(codes.InvalidArgument, `a sentence: with a colon`))
	if !errors.As(err, &inv) || inv.Field != "" || inv.Rule != "a sentence: with a colon" {
		t.Fatalf("got %#v", err)
	}

	if err := mapError("get", "x", context.Canceled); err != context.Canceled {
		t.Errorf("a plain context error = %v", err)
	}
	if mapError("get", "x", nil) != nil {
		t.Error("nil is not nil")
	}
	u := unknownOutcome("schedule", "x", mapError("schedule", "x", status.Error(codes.DeadlineExceeded, "late")))
	if !errors.Is(u, ErrUnknownOutcome) || !errors.Is(u, context.DeadlineExceeded) || !strings.Contains(u.Error(), "outcome unknown") {
		t.Errorf("unknownOutcome = %v", u)
	}
}

func TestBatchError(t *testing.T) {
	conflict := mapError("schedule", "b", status.Error(codes.AlreadyExists, "taken"))
	be := &BatchError{Errs: []error{nil, conflict, nil}}
	if !errors.Is(be, ErrConflict) || errors.Is(be, ErrNotFound) {
		t.Errorf("errors.Is through BatchError: %v", be)
	}
	var ce *ConflictError
	if !errors.As(be, &ce) || ce.ID != "b" {
		t.Errorf("errors.As through BatchError: %v", be)
	}
	if !strings.Contains(be.Error(), "1 of 3 events failed; first, events[1]") {
		t.Errorf("message %q", be.Error())
	}
}

func TestRetryable(t *testing.T) {
	ctx := context.Background()
	withInfo, _ := status.New(codes.ResourceExhausted, "over rate").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(300 * time.Millisecond)})
	for _, tc := range []struct {
		err   error
		retry bool
		wait  time.Duration
	}{
		{status.Error(codes.Unavailable, "x"), true, 0},
		{status.Error(codes.Aborted, "x"), true, 0},
		{status.Error(codes.DeadlineExceeded, "x"), true, 0},
		{withInfo.Err(), true, 300 * time.Millisecond},
		{status.Error(codes.ResourceExhausted, "quota"), false, 0},
		{status.Error(codes.InvalidArgument, "x"), false, 0},
		{status.Error(codes.AlreadyExists, "x"), false, 0},
		{status.Error(codes.FailedPrecondition, "x"), false, 0},
		{status.Error(codes.PermissionDenied, "x"), false, 0},
		{status.Error(codes.Unauthenticated, "x"), false, 0},
		{status.Error(codes.NotFound, "x"), false, 0},
		{status.Error(codes.Unknown, "x"), false, 0},
		{status.Error(codes.Canceled, "x"), false, 0},
		{errors.New("plain"), false, 0},
	} {
		wait, ok := retryable(tc.err, ctx)
		if ok != tc.retry || wait != tc.wait {
			t.Errorf("retryable(%v) = %v, %v; want %v, %v", tc.err, wait, ok, tc.wait, tc.retry)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok := retryable(status.Error(codes.Unavailable, "x"), done); ok {
		t.Error("retryable after the caller's context is done")
	}
	if mayHaveApplied(status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`)) {
		t.Error("a refused connection may have applied a call")
	}
	for _, c := range []codes.Code{codes.Unknown, codes.DeadlineExceeded, codes.Unavailable} {
		if !mayHaveApplied(status.Error(c, "lost")) {
			t.Errorf("%v: not ambiguous", c)
		}
	}
}

func TestRetryPolicyDefaults(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 3}.withDefaults()
	want := defaultRetry
	want.MaxAttempts = 3
	if p != want {
		t.Errorf("got %+v, want %+v", p, want)
	}
	if p := (RetryPolicy{InitialBackoff: 5 * time.Second}).withDefaults(); p.MaxBackoff != 5*time.Second {
		t.Errorf("MaxBackoff below InitialBackoff: %+v", p)
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in, target string
		addrs      []string
		static     bool
		bad        bool
	}{
		{in: "n1:7443", target: resolverScheme + ":///n1:7443", addrs: []string{"n1:7443"}, static: true},
		{in: " n1:7443, n2:7443 ,n3:7443", target: resolverScheme + ":///n1:7443", addrs: []string{"n1:7443", "n2:7443", "n3:7443"}, static: true},
		{in: "dns:///chime.internal:7443", target: "dns:///chime.internal:7443", addrs: []string{"dns:///chime.internal:7443"}},
		{in: "", bad: true},
		{in: "n1:1,,n2:2", bad: true},
	} {
		target, addrs, res, err := parseTarget(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("parseTarget(%q) error %v", tc.in, err)
			continue
		}
		if tc.bad {
			continue
		}
		if target != tc.target || strings.Join(addrs, " ") != strings.Join(tc.addrs, " ") || (res != nil) != tc.static {
			t.Errorf("parseTarget(%q) = %q, %q, %v", tc.in, target, addrs, res)
		}
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7443": true, "localhost:1": true, "[::1]:7443": true, "dns:///localhost:7443": true,
		"10.0.0.1:7443": false, "chime:7443": false, "127.0.0.1": false, "dns:///chime.internal:7443": false,
	} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v", addr, got)
		}
	}
}

func TestRenumber(t *testing.T) {
	if got := renumber("events[1].topic: required", 1, 7); got != "events[7].topic: required" {
		t.Error(got)
	}
	if got := renumber("events[10].topic: required", 1, 7); got != "events[10].topic: required" {
		t.Error(got)
	}
	if got := renumber("events[1].topic: required", 1, 1); got != "events[1].topic: required" {
		t.Error(got)
	}
}

func TestCodeName(t *testing.T) {
	for c, want := range map[codes.Code]string{codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.OK: "OK", codes.Unavailable: "UNAVAILABLE"} {
		if got := codeName(c); got != want {
			t.Errorf("codeName(%v) = %q", c, got)
		}
	}
}
