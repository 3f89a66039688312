package client_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestRecurringTriggerAndBackfill: Trigger sends one occurrence time on every attempt, so a
// Trigger whose first answer was lost makes one occurrence; Backfill returns what it made,
// and a retry after a lost answer counts it as existing; each refusal is typed.
func TestRecurringTriggerAndBackfill(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	c := h.dial(t, client.WithRetry(fastRetry))
	ctx := testCtx(t)
	rec := c.Recurring()
	target := client.Target{Topic: "ticks", Payload: []byte("p")}
	if _, err := rec.Create(ctx, "hourly", client.Every(time.Hour, client.StartAt(harnessStart.Add(-10*time.Hour))), target); err != nil {
		t.Fatal(err)
	}

	// The first answer is lost: the retry carries the same time and finds the occurrence.
	f.after = func(m string, n int, err error) error {
		if m == "Trigger" && n == 1 && err == nil {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	}
	at := harnessStart.Add(-time.Second)
	o, err := rec.TriggerAt(ctx, "hourly", at)
	f.after = nil
	want := fmt.Sprintf("hourly@%d", at.UnixMilli())
	if err != nil || o.EventID != want || !o.At.Equal(at) || !o.Due.Equal(harnessStart) || !o.Existing {
		t.Fatalf("TriggerAt after a lost answer = %+v, %v; want %s, existing (made by the lost attempt)", o, err, want)
	}
	f.mu.Lock()
	reqs := f.reqs["Trigger"]
	f.mu.Unlock()
	if len(reqs) != 2 || !reqs[0].(*chimev1.TriggerRecurringRequest).At.AsTime().Equal(reqs[1].(*chimev1.TriggerRecurringRequest).At.AsTime()) {
		t.Fatalf("Trigger attempts %v: want two with the same at", reqs)
	}
	if ev, err := c.Get(ctx, want); err != nil || string(ev.Payload) != "p" {
		t.Fatalf("Get of the triggered occurrence = %+v, %v", ev, err)
	}
	// Trigger takes this machine's clock, years before the harness's fixed one: refused,
	// naming at.
	var ie *client.InvalidError
	if _, err := rec.Trigger(ctx, "hourly"); !errors.As(err, &ie) || ie.Field != "at" {
		t.Fatalf("Trigger with a clock far behind the server's = %v; want an InvalidError naming at", err)
	}

	// Backfill, its answer lost once: the retry finds what the first attempt made.
	f.after = func(m string, n int, err error) error {
		if m == "Backfill" && n == 1 && err == nil {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	}
	res, err := rec.Backfill(ctx, "hourly", harnessStart.Add(-10*time.Hour), harnessStart.Add(-7*time.Hour))
	f.after = nil
	if err != nil || len(res.Created) != 0 || res.Existing != 3 {
		t.Fatalf("Backfill after a lost answer = %+v, %v; want the three instants existing", res, err)
	}
	res, err = rec.Backfill(ctx, "hourly", harnessStart.Add(-7*time.Hour), harnessStart.Add(-5*time.Hour))
	if err != nil || len(res.Created) != 2 || !res.Created[0].Equal(harnessStart.Add(-7*time.Hour)) || res.Existing != 0 {
		t.Fatalf("Backfill = %+v, %v", res, err)
	}

	// Typed refusals.
	if _, err := rec.Backfill(ctx, "hourly", harnessStart, harnessStart.Add(-time.Hour)); !errors.As(err, &ie) || ie.Field != "to" {
		t.Errorf("Backfill of an empty range = %v; want an InvalidError naming to", err)
	}
	if _, err := rec.Create(ctx, "long", client.Every(time.Hour, client.StartAt(harnessStart.Add(-3000*time.Hour))), target); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Backfill(ctx, "long", harnessStart.Add(-2000*time.Hour), harnessStart); !errors.As(err, &ie) || ie.Field != "to" {
		t.Errorf("Backfill of 2,000 instants = %v; want an InvalidError naming to", err)
	}
	if _, err := rec.TriggerAt(ctx, "nope", harnessStart); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Trigger of an unknown schedule = %v", err)
	}
	if _, err := rec.Create(ctx, "once", client.Every(time.Hour, client.StartAt(harnessStart.Add(time.Minute)), client.MaxOccurrences(1)), target); err != nil {
		t.Fatal(err)
	}
	h.Backend.FireUntil(harnessStart.Add(2 * time.Hour))
	if _, err := rec.TriggerAt(ctx, "once", harnessStart); !errors.Is(err, client.ErrCompleted) {
		t.Errorf("Trigger of a completed schedule = %v", err)
	}
	if _, err := rec.Backfill(ctx, "once", harnessStart.Add(-time.Hour), harnessStart); !errors.Is(err, client.ErrCompleted) {
		t.Errorf("Backfill of a completed schedule = %v", err)
	}
}
