package chimetest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2030, 1, 2, 9, 0, 0, 0, time.UTC)

func newFake(t *testing.T) *chimetest.Fake {
	t.Helper()
	f := chimetest.NewFake(chimetest.StartTime(t0))
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ids(recs []chimetest.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Event.ID)
	}
	return out
}

// The Fake fires each event at its due time, in due order (then id), and
// never before.
func TestFakeFiresInDueOrderNeverEarly(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	for _, e := range []struct {
		id  string
		opt client.ScheduleOption
	}{
		{"c", client.In(2 * time.Second)},
		{"b", client.At(t0.Add(time.Second))},
		{"a", client.In(2 * time.Second)},
		{"late", client.In(time.Hour)},
		{"past", client.At(t0.Add(-time.Minute))},
	} {
		if _, err := f.Schedule(ctx, client.Event{ID: e.id, Topic: "t", Payload: []byte(e.id)}, e.opt); err != nil {
			t.Fatalf("schedule %s: %v", e.id, err)
		}
	}
	// An event due in the past fires at once, at Now; nothing else is due.
	got := f.Advance(0)
	if fmt.Sprint(ids(got)) != "[past]" || !got[0].Event.FiredAt.Equal(t0) {
		t.Fatalf("Advance(0) fired %v; want [past] at t0", ids(got))
	}
	if got := f.Advance(time.Second - time.Millisecond); len(got) != 0 {
		t.Fatalf("fired early: %v", ids(got))
	}
	got = f.Advance(59*time.Minute + 59*time.Second)
	if fmt.Sprint(ids(got)) != "[b a c]" {
		t.Fatalf("fired %v, want [b a c]", ids(got))
	}
	for _, r := range got {
		if !r.Event.FiredAt.Equal(r.Event.Due) {
			t.Errorf("%s fired at %v, due %v: want its due time exactly", r.Event.ID, r.Event.FiredAt, r.Event.Due)
		}
	}
	if now := f.Now(); !now.Equal(t0.Add(time.Hour - time.Millisecond)) {
		t.Errorf("Now = %v after the advances, want t0+1h-1ms", now)
	}
	if got := f.Advance(time.Millisecond); fmt.Sprint(ids(got)) != "[late]" {
		t.Errorf("fired %v at t0+1h, want [late]", ids(got))
	}
	if all := f.Fired(); fmt.Sprint(ids(all)) != "[past b a c late]" {
		t.Errorf("Fired() = %v", ids(all))
	}
}

// A fired record carries what a consumer reads: key (or id), value, the
// event's headers, then the chime-* headers ParseFired reads.
func TestFakeRecords(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	res, err := f.Schedule(ctx, client.Event{ID: "k", Topic: "orders", Key: []byte("cust-1"), Payload: []byte("v"),
		Headers: []client.Header{{Key: "trace", Value: []byte("abc")}}}, client.In(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Schedule(ctx, client.Event{ID: "nokey", Topic: "orders"}, client.In(time.Second)); err != nil {
		t.Fatal(err)
	}
	got := f.Advance(2 * time.Second)
	if len(got) != 2 {
		t.Fatalf("fired %v", ids(got))
	}
	if r := got[0]; string(r.Key) != "nokey" || r.Topic != "orders" {
		t.Errorf("a record without a key: key %q topic %q; want its id as key", r.Key, r.Topic)
	}
	r := got[1]
	if string(r.Key) != "cust-1" || string(r.Value) != "v" || r.Headers[0].Key != "trace" {
		t.Errorf("record %+v", r)
	}
	fired, err := client.ParseFired(r.Headers)
	if err != nil {
		t.Fatal(err)
	}
	want := client.Fired{ID: "k", Version: 1, Due: t0.Add(1500 * time.Millisecond), FiredAt: t0.Add(1500 * time.Millisecond), Attempt: 1}
	if !fired.Due.Equal(want.Due) || !fired.FiredAt.Equal(want.FiredAt) || fired.ID != want.ID || fired.Version != want.Version || fired.Attempt != 1 {
		t.Errorf("ParseFired = %+v, want %+v", fired, want)
	}
	if !r.Event.Due.Equal(res.Due) || r.Event.State != client.StateFired || r.Event.Attempts != 1 || r.Event.Version != 1 {
		t.Errorf("record's event %+v; want fired, due %v", r.Event, res.Due)
	}
	// Get agrees with the record.
	ev, err := f.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if ev.State != client.StateFired || !ev.FiredAt.Equal(r.Event.FiredAt) || ev.Version != 1 {
		t.Errorf("Get after firing: %+v", ev)
	}
}

// Update and Cancel on the Fake answer as the server does: an update moves
// the due time and the version, a cancelled event never fires, and a fired
// one can be neither updated nor cancelled.
func TestFakeUpdateAndCancel(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	for _, id := range []string{"moved", "cancelled"} {
		if _, err := f.Schedule(ctx, client.Event{ID: id, Topic: "t"}, client.In(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.Update(ctx, "moved", client.In(2*time.Hour), client.SetPayload([]byte("v2")))
	if err != nil {
		t.Fatal(err)
	}
	if res.Version != 2 || !res.Due.Equal(t0.Add(2*time.Hour)) {
		t.Errorf("Update: %+v; want version 2 due t0+2h", res)
	}
	if _, err := f.Update(ctx, "moved", client.In(time.Minute), client.IfVersion(1)); !errors.Is(err, client.ErrConflict) {
		t.Errorf("Update IfVersion(1) of version 2: %v; want ErrConflict", err)
	}
	if err := f.Cancel(ctx, "cancelled"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Update(ctx, "cancelled", client.In(time.Minute)); !errors.Is(err, client.ErrCancelled) {
		t.Errorf("Update of a cancelled event: %v; want ErrCancelled", err)
	}
	if got := f.Advance(time.Hour); len(got) != 0 {
		t.Fatalf("fired %v at the old due time or cancelled", ids(got))
	}
	got := f.Advance(time.Hour)
	if len(got) != 1 || got[0].Event.ID != "moved" || got[0].Event.Version != 2 || string(got[0].Value) != "v2" {
		t.Fatalf("fired %+v; want moved, version 2, payload v2", got)
	}
	if fired, _ := client.ParseFired(got[0].Headers); fired.Version != 2 {
		t.Errorf("chime-version %d, want 2", fired.Version)
	}
	if err := f.Cancel(ctx, "moved"); !errors.Is(err, client.ErrAlreadyFired) {
		t.Errorf("Cancel of a fired event: %v; want ErrAlreadyFired", err)
	}
	if _, err := f.Update(ctx, "moved", client.In(time.Minute)); !errors.Is(err, client.ErrAlreadyFired) {
		t.Errorf("Update of a fired event: %v; want ErrAlreadyFired", err)
	}
	if err := f.Cancel(ctx, "nothing"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Cancel of an unknown id: %v; want ErrNotFound", err)
	}
	if n, err := f.Count(ctx, client.Filter{States: []client.State{client.StateFired}}); err != nil || n != 1 {
		t.Errorf("Count(fired) = %d, %v; want 1", n, err)
	}
}

// Validation is the server's: a bad topic is an *InvalidError naming the
// field, and an event beyond the horizon is refused by the virtual clock.
func TestFakeValidation(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	_, err := f.Schedule(ctx, client.Event{Topic: "bad topic!"}, client.In(time.Second))
	var ie *client.InvalidError
	if !errors.As(err, &ie) || ie.Field != "event.topic" {
		t.Fatalf("bad topic: %v; want an *InvalidError on event.topic", err)
	}
	t.Logf("bad topic: %v", err)
	_, err = f.ScheduleBatch(ctx, []client.Event{{Topic: "ok"}, {Topic: "bad topic!"}}, client.In(time.Second))
	var be *client.BatchError
	if !errors.As(err, &be) || be.Errs[0] != nil || !errors.As(be.Errs[1], &ie) || ie.Field != "events[1].topic" {
		t.Fatalf("batch with a bad topic: %v; want events[1].topic refused alone", err)
	}
	if _, err := f.Schedule(ctx, client.Event{Topic: "t"}, client.At(t0.AddDate(50, 0, 0))); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("an event 50 years ahead: %v; want ErrInvalid (beyond the horizon)", err)
	}
}

// Idempotency is the server's: the same event again is Existing, other
// content under its id a conflict.
func TestFakeIdempotency(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	ev := client.Event{ID: "once", Topic: "t", Payload: []byte("p")}
	if _, err := f.Schedule(ctx, ev, client.At(t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if res, err := f.Schedule(ctx, ev, client.At(t0.Add(time.Minute))); err != nil || !res.Existing {
		t.Errorf("the same event again: %+v, %v; want Existing", res, err)
	}
	ev.Payload = []byte("other")
	if _, err := f.Schedule(ctx, ev, client.At(t0.Add(time.Minute))); !errors.Is(err, client.ErrConflict) {
		t.Errorf("other content under the id: %v; want ErrConflict", err)
	}
}

// A recurring schedule's occurrences fire on the virtual clock, each at its
// time, with the recurring headers.
func TestFakeRecurring(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	if _, err := f.Recurring().Create(ctx, "tick", client.Every(time.Minute, client.MaxOccurrences(3)),
		client.Target{Topic: "ticks", Payload: []byte("tick")}); err != nil {
		t.Fatal(err)
	}
	got := f.Advance(90 * time.Second)
	if len(got) != 1 {
		t.Fatalf("fired %v in 90s of an every-minute schedule; want 1", ids(got))
	}
	fired, err := client.ParseFired(got[0].Headers)
	if err != nil {
		t.Fatal(err)
	}
	if fired.RecurringID != "tick" || !fired.Occurrence.Equal(t0.Add(time.Minute)) || !fired.FiredAt.Equal(t0.Add(time.Minute)) ||
		string(got[0].Value) != "tick" || got[0].Topic != "ticks" {
		t.Errorf("occurrence %+v, parsed %+v", got[0], fired)
	}
	got = f.Advance(time.Hour)
	var at []time.Duration
	for _, r := range got {
		at = append(at, r.Event.FiredAt.Sub(t0))
	}
	if !slices.Equal(at, []time.Duration{2 * time.Minute, 3 * time.Minute}) {
		t.Errorf("later occurrences fired at %v; want 2m and 3m (3 at most)", at)
	}
	s, err := f.Recurring().Get(ctx, "tick")
	if err != nil {
		t.Fatal(err)
	}
	if s.State != client.RecurringCompleted || s.Occurrences != 3 {
		t.Errorf("schedule after its 3 occurrences: %+v", s)
	}
}

func TestFakeConcurrentUse(t *testing.T) {
	f, ctx := newFake(t), testCtx(t)
	done := make(chan error, 8)
	for g := range 8 {
		go func() {
			var err error
			for i := range 20 {
				if _, err = f.Schedule(ctx, client.Event{ID: fmt.Sprintf("g%d-%d", g, i), Topic: "t"}, client.In(time.Duration(i)*time.Second)); err != nil {
					break
				}
				f.Advance(100 * time.Millisecond)
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	f.Advance(time.Minute)
	all := f.Fired()
	if len(all) != 160 {
		t.Fatalf("fired %d, want 160", len(all))
	}
	for i, r := range all {
		if r.Event.FiredAt.Before(r.Event.Due) {
			t.Errorf("%s fired early", r.Event.ID)
		}
		if i > 0 && r.Event.FiredAt.Before(all[i-1].Event.FiredAt) {
			t.Errorf("%s fired before the one fired ahead of it", r.Event.ID)
		}
	}
}

func TestFakeCloseTwiceAndAdvancePanics(t *testing.T) {
	f := chimetest.NewFake()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
	if _, err := f.Schedule(context.Background(), client.Event{Topic: "t"}); err == nil {
		t.Error("Schedule after Close succeeded")
	}
	defer func() {
		if recover() == nil {
			t.Error("Advance(-1) did not panic")
		}
	}()
	f.Advance(-1)
}
