package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// flaky answers the first `fail` calls of each method with code, then OK,
// and keeps every Schedule request it received.
type flaky struct {
	chimev1.UnimplementedSchedulerServer
	chimev1.UnimplementedAdminServer
	fail int
	code codes.Code

	mu    sync.Mutex
	calls map[string]int
	ids   []string
}

func (f *flaky) answer(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if f.calls[method] <= f.fail {
		return status.Error(f.code, "no leader for shard 3 yet")
	}
	return nil
}

func (f *flaky) Schedule(_ context.Context, req *chimev1.ScheduleRequest) (*chimev1.ScheduleResponse, error) {
	f.mu.Lock()
	f.ids = append(f.ids, req.GetEvent().GetId())
	f.mu.Unlock()
	if err := f.answer("Schedule"); err != nil {
		return nil, err
	}
	return &chimev1.ScheduleResponse{Id: req.GetEvent().GetId(), Due: timestamppb.New(t0.Add(2e9))}, nil
}

func (f *flaky) TransferLeader(context.Context, *chimev1.TransferLeaderRequest) (*chimev1.TransferLeaderResponse, error) {
	if err := f.answer("TransferLeader"); err != nil {
		return nil, err
	}
	return &chimev1.TransferLeaderResponse{}, nil
}

func startFlaky(t *testing.T, fail int, code codes.Code) (string, *flaky) {
	t.Helper()
	f := &flaky{fail: fail, code: code, calls: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	chimev1.RegisterSchedulerServer(gs, f)
	chimev1.RegisterAdminServer(gs, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	t.Cleanup(func() { gs.Stop(); <-done })
	return ln.Addr().String(), f
}

func TestScheduleRetriesUnavailableWithOneID(t *testing.T) {
	addr, f := startFlaky(t, 3, codes.Unavailable)
	r := chimectl(t, nil, "", "--addr", addr, "--json", "schedule", "--topic", "t", "--in", "2s")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if len(f.ids) != 4 {
		t.Fatalf("the server saw %d Schedule calls, want 3 answered Unavailable and 1 OK", len(f.ids))
	}
	id := f.ids[0]
	if len(id) != 26 || strings.ToLower(id) != id {
		t.Errorf("chimectl picked id %q, want 26 lower-case base32 characters", id)
	}
	for _, got := range f.ids {
		if got != id {
			t.Fatalf("the retries sent different ids %v: a retry would schedule a second event", f.ids)
		}
	}
	if !strings.Contains(r.stdout, `"id":"`+id+`"`) {
		t.Errorf("the picked id is not printed: %s", r.stdout)
	}
}

func TestRetryStopsAtTimeoutWithTheServersError(t *testing.T) {
	addr, f := startFlaky(t, 1000, codes.Unavailable)
	r := chimectl(t, nil, "", "--addr", addr, "--timeout", "1s", "schedule", "--topic", "t", "--in", "2s", "--id", "x")
	if r.code != 1 || !strings.Contains(r.stderr, "Unavailable: no leader for shard 3 yet") {
		t.Errorf("exit %d, stderr %q; want 1 and the last Unavailable", r.code, r.stderr)
	}
	if n := len(f.ids); n < 3 || n > 12 {
		t.Errorf("%d attempts in 1 s; want a few, backing off from 100 ms", n)
	}
}

func TestRetryOnlyRepeatableCallsOnUnavailable(t *testing.T) {
	addr, f := startFlaky(t, 1, codes.Unavailable)
	r := chimectl(t, nil, "", "--addr", addr, "transfer-leader", "0", "n2")
	if r.code != 1 || f.calls["TransferLeader"] != 1 {
		t.Errorf("transfer-leader: exit %d after %d calls (%s); want 1 after exactly 1: it is not repeatable", r.code, f.calls["TransferLeader"], r.stderr)
	}
	addr, f = startFlaky(t, 1, codes.Internal)
	r = chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "2s", "--id", "x")
	if r.code != 1 || len(f.ids) != 1 {
		t.Errorf("schedule answered Internal: exit %d after %d calls; want 1 after exactly 1", r.code, len(f.ids))
	}
}
