package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

var batcherStart = time.Date(2030, 1, 2, 9, 0, 0, 0, time.UTC)

// counting is a Scheduler that counts ScheduleBatch calls and their sizes,
// and holds every call while its gate is shut.
type counting struct {
	client.Scheduler

	mu    sync.Mutex
	sizes []int
	gate  chan struct{} // nil: open
}

func (c *counting) ScheduleBatch(ctx context.Context, evs []client.Event, opts ...client.ScheduleOption) ([]client.Result, error) {
	c.mu.Lock()
	c.sizes = append(c.sizes, len(evs))
	gate := c.gate
	c.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return c.Scheduler.ScheduleBatch(ctx, evs, opts...)
}

func (c *counting) calls() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.sizes...)
}

func newFakeScheduler(t *testing.T) (*chimetest.Fake, *counting) {
	t.Helper()
	f := chimetest.NewFake(chimetest.StartTime(batcherStart))
	t.Cleanup(func() { f.Close() })
	return f, &counting{Scheduler: f}
}

// noLeaks checks, at the end of the test and after its other cleanups (a
// Fake's Close), that the test left no goroutine running.
func noLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// 64 goroutines add single events: every one is scheduled, in far fewer
// calls than events, none larger than MaxEvents.
func TestBatcherConcurrentAdds(t *testing.T) {
	noLeaks(t)
	f, s := newFakeScheduler(t)
	ctx := waitCtx(t)
	b := client.NewBatcher(s, client.BatcherConfig{MaxEvents: 100})
	const goroutines, each = 64, 50
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				p := b.Add(ctx, client.Event{ID: fmt.Sprintf("g%d-%d", g, i), Topic: "t"}, client.In(time.Minute))
				res, err := p.Wait(ctx)
				if err == nil && (res.ID != fmt.Sprintf("g%d-%d", g, i) || res.Version != 1) {
					err = fmt.Errorf("result %+v for g%d-%d", res, g, i)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, err := f.Count(ctx, client.Filter{}); err != nil || n != goroutines*each {
		t.Fatalf("Count = %d, %v; want %d", n, err, goroutines*each)
	}
	sizes, total := s.calls(), 0
	for _, n := range sizes {
		total += n
		if n > 100 {
			t.Errorf("a call of %d events; MaxEvents is 100", n)
		}
	}
	if total != goroutines*each || len(sizes) >= goroutines*each/2 {
		t.Errorf("%d events in %d calls; want %d in far fewer", total, len(sizes), goroutines*each)
	}
	t.Logf("%d events in %d calls", total, len(sizes))
	if got := len(f.Advance(time.Minute)); got != goroutines*each {
		t.Errorf("%d fired after a minute, want %d", got, goroutines*each)
	}
}

// At MaxPending unanswered events Add waits for room: until its context is
// done (the Pending then reports the context's error and nothing is sent),
// or until an answer frees a slot.
func TestBatcherBackPressure(t *testing.T) {
	noLeaks(t)
	f, s := newFakeScheduler(t)
	ctx := waitCtx(t)
	gate := make(chan struct{})
	s.gate = gate
	b := client.NewBatcher(s, client.BatcherConfig{MaxPending: 4, MaxEvents: 2, Linger: time.Millisecond})
	defer b.Close()
	var held []*client.Pending
	for i := range 4 {
		held = append(held, b.Add(ctx, client.Event{ID: fmt.Sprint("held-", i), Topic: "t"}, client.In(time.Minute)))
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.Add(short, client.Event{ID: "refused", Topic: "t"}, client.In(time.Minute)).Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Add beyond MaxPending: %v; want the context's deadline", err)
	}

	waiting := make(chan *client.Pending)
	go func() { waiting <- b.Add(ctx, client.Event{ID: "waited", Topic: "t"}, client.In(time.Minute)) }()
	select {
	case <-waiting:
		t.Fatal("Add beyond MaxPending returned before an answer freed room")
	case <-time.After(50 * time.Millisecond):
	}
	s.mu.Lock()
	s.gate = nil
	s.mu.Unlock()
	close(gate)
	p := <-waiting
	for _, p := range append(held, p) {
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Get(ctx, "refused"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("the refused Add was sent: %v", err)
	}
	if n, _ := f.Count(ctx, client.Filter{}); n != 5 {
		t.Errorf("Count = %d, want 5", n)
	}
}

// Close sends what is queued, however long its linger, and answers it;
// later Adds fail with ErrBatcherClosed. Flush sends without closing.
func TestBatcherFlushAndClose(t *testing.T) {
	noLeaks(t)
	f, s := newFakeScheduler(t)
	ctx := waitCtx(t)
	b := client.NewBatcher(s, client.BatcherConfig{Linger: time.Hour})
	first := b.Add(ctx, client.Event{ID: "flushed", Topic: "t"}, client.In(time.Minute))
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	default:
		t.Fatal("Flush returned before the event it sent was answered")
	}
	var ps []*client.Pending
	for i := range 10 {
		ps = append(ps, b.Add(ctx, client.Event{ID: fmt.Sprint("closed-", i), Topic: "t"}, client.In(time.Minute)))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		select {
		case <-p.Done():
		default:
			t.Fatal("Close returned before the events it flushed were answered")
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := f.Count(ctx, client.Filter{}); n != 11 {
		t.Errorf("Count = %d, want 11", n)
	}
	if got := s.calls(); len(got) != 2 {
		t.Errorf("calls %v; want one per Flush and Close", got)
	}
	if _, err := b.Add(ctx, client.Event{Topic: "t"}).Wait(ctx); !errors.Is(err, client.ErrBatcherClosed) {
		t.Errorf("Add after Close: %v; want ErrBatcherClosed", err)
	}
	if err := b.Flush(ctx); err != nil {
		t.Errorf("Flush after Close: %v", err)
	}
	if err := b.Close(); err != nil { // again: nothing
		t.Errorf("Close again: %v", err)
	}
}

// Each event is answered with its own result or error: a refused event
// fails alone, with the server's error, and empty ids come back filled.
func TestBatcherPerEventErrors(t *testing.T) {
	noLeaks(t)
	_, s := newFakeScheduler(t)
	ctx := waitCtx(t)
	b := client.NewBatcher(s, client.BatcherConfig{Linger: time.Hour})
	defer b.Close()
	good := b.Add(ctx, client.Event{Topic: "t"}, client.In(time.Minute))
	bad := b.Add(ctx, client.Event{ID: "bad", Topic: "bad topic!"}, client.In(time.Minute))
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := good.Wait(ctx); err != nil || res.ID == "" || !res.Due.Equal(batcherStart.Add(time.Minute)) {
		t.Errorf("good event: %+v, %v; want an id picked and due in a minute", res, err)
	}
	// The error is the one Schedule gives, for the one event added.
	_, err := bad.Wait(ctx)
	_, want := s.Schedule(ctx, client.Event{ID: "bad", Topic: "bad topic!"}, client.In(time.Minute))
	var ie *client.InvalidError
	if !errors.As(err, &ie) || ie.Field != "event.topic" || err.Error() != want.Error() || status.Convert(err).Message() != status.Convert(want).Message() {
		t.Errorf("bad event: %v; want %v", err, want)
	}
	if got := s.calls(); len(got) != 1 {
		t.Errorf("calls %v; want one", got)
	}
}

// Options an event can carry (At, Priority, Window) share a call; In
// durations and Replace that differ take calls of their own; every event
// gets its own options.
func TestBatcherOptions(t *testing.T) {
	noLeaks(t)
	f, s := newFakeScheduler(t)
	ctx := waitCtx(t)
	b := client.NewBatcher(s, client.BatcherConfig{Linger: time.Hour})
	defer b.Close()
	adds := []struct {
		id   string
		opts []client.ScheduleOption
		due  time.Duration
		prio int
	}{
		{"at-1", []client.ScheduleOption{client.At(batcherStart.Add(time.Hour)), client.Priority(9)}, time.Hour, 9},
		{"at-2", []client.ScheduleOption{client.At(batcherStart.Add(2 * time.Hour)), client.Priority(0)}, 2 * time.Hour, 0},
		{"due", nil, 3 * time.Hour, 5},
		{"in-1", []client.ScheduleOption{client.In(time.Minute)}, time.Minute, 5},
		{"in-2", []client.ScheduleOption{client.In(2 * time.Minute), client.Window(time.Second)}, 2 * time.Minute, 5},
		{"at-3", []client.ScheduleOption{client.At(batcherStart.Add(4 * time.Hour))}, 4 * time.Hour, 5},
	}
	var ps []*client.Pending
	for _, a := range adds {
		ev := client.Event{ID: a.id, Topic: "t"}
		if a.id == "due" {
			ev.Due = batcherStart.Add(3 * time.Hour)
		}
		ps = append(ps, b.Add(ctx, ev, a.opts...))
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, a := range adds {
		if _, err := ps[i].Wait(ctx); err != nil {
			t.Fatalf("%s: %v", a.id, err)
		}
		ev, err := f.Get(ctx, a.id)
		if err != nil {
			t.Fatal(err)
		}
		if !ev.Due.Equal(batcherStart.Add(a.due)) || ev.Priority != a.prio {
			t.Errorf("%s: due %v priority %d; want +%v, %d", a.id, ev.Due.Sub(batcherStart), ev.Priority, a.due, a.prio)
		}
		if a.id == "in-2" && ev.Window != time.Second {
			t.Errorf("in-2: window %v, want 1s", ev.Window)
		}
	}
	// at-1, due and at-3 share a call; at-2 (Priority(0)), in-1 and in-2
	// each have one.
	if got := s.calls(); fmt.Sprint(got) != "[3 1 1 1]" {
		t.Errorf("call sizes %v; want [3 1 1 1]", got)
	}
}

// Without Flush, an event goes once it has lingered.
func TestBatcherLinger(t *testing.T) {
	noLeaks(t)
	_, s := newFakeScheduler(t)
	ctx := waitCtx(t)
	b := client.NewBatcher(s, client.BatcherConfig{Linger: 10 * time.Millisecond})
	defer b.Close()
	start := time.Now()
	if _, err := b.Add(ctx, client.Event{Topic: "t"}, client.In(time.Minute)).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 10*time.Millisecond {
		t.Errorf("answered after %v, before the linger of 10ms", d)
	}
}

// A Scheduler that fails a whole call fails each of its events with the
// call's error.
func TestBatcherCallError(t *testing.T) {
	noLeaks(t)
	boom := errors.New("boom")
	b := client.NewBatcher(failing{err: boom}, client.BatcherConfig{})
	defer b.Close()
	ctx := waitCtx(t)
	p1, p2 := b.Add(ctx, client.Event{ID: "1"}), b.Add(ctx, client.Event{ID: "2"})
	for _, p := range []*client.Pending{p1, p2} {
		if res, err := p.Wait(ctx); !errors.Is(err, boom) {
			t.Errorf("%+v, %v; want boom", res, err)
		}
	}
}

// failing fails every ScheduleBatch; the Batcher calls nothing else.
type failing struct {
	client.Scheduler // nil
	err              error
}

func (f failing) ScheduleBatch(context.Context, []client.Event, ...client.ScheduleOption) ([]client.Result, error) {
	return nil, f.err
}

// A Batcher has up to MaxInFlight calls under way at once, never more: with
// every call held, full batches go out until MaxInFlight are waiting, and
// the next waits for one of them. In a synctest bubble, once every
// goroutine is blocked nothing more can happen: a third call would have
// been made by then.
func TestBatcherMaxInFlight(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		c := &counting{Scheduler: accepting{}, gate: gate}
		b := client.NewBatcher(c, client.BatcherConfig{MaxEvents: 10, MaxInFlight: 2, Linger: time.Hour})
		ctx := context.Background()
		var ps []*client.Pending
		for i := range 40 {
			ps = append(ps, b.Add(ctx, client.Event{ID: fmt.Sprintf("f-%d", i), Topic: "t", Payload: []byte("x")}, client.In(time.Hour)))
		}
		synctest.Wait()
		if got := c.calls(); len(got) != 2 {
			t.Errorf("calls under way with MaxInFlight 2: %v", got) // not Fatal: the held calls are let go below
		}
		close(gate)
		for _, p := range ps {
			if _, err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if got := c.calls(); len(got) != 4 {
			t.Fatalf("calls: %v; want 4 of 10", got)
		}
	})
}

// accepting accepts every event of a ScheduleBatch, in memory (the Fake
// serves over gRPC, which has no place in a synctest bubble); the Batcher
// calls nothing else.
type accepting struct {
	client.Scheduler // nil
}

func (accepting) ScheduleBatch(_ context.Context, evs []client.Event, _ ...client.ScheduleOption) ([]client.Result, error) {
	rs := make([]client.Result, len(evs))
	for i, ev := range evs {
		rs[i] = client.Result{ID: ev.ID, Version: 1}
	}
	return rs, nil
}
