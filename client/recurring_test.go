package client_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/client"
)

func TestRecurring(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	c := h.dial(t, client.WithRetry(fastRetry))
	ctx := testCtx(t)
	rec := c.Recurring()

	start := harnessStart.Add(time.Hour)
	rule := client.Every(time.Hour, client.StartAt(start), client.MaxOccurrences(3), client.Jitter(time.Second), client.WithCatchUp(client.CatchUpAll))
	target := client.Target{Topic: "ticks", Key: []byte("k"), Payload: []byte("p"), Headers: []client.Header{{Key: "h", Value: []byte("v")}}, Priority: new(7)}
	s, err := rec.Create(ctx, "hourly", rule, target)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != "hourly" || s.State != client.RecurringActive || s.Version != 1 || s.Existing ||
		!s.NextOccurrence.Equal(start) || s.NextEventID == "" || s.NextDue.Before(start) {
		t.Errorf("Create = %+v", s)
	}
	if s.Rule.Every != time.Hour || !s.Rule.Start.Equal(start) || s.Rule.MaxOccurrences != 3 || s.Rule.Jitter != time.Second || s.Rule.CatchUp != client.CatchUpAll {
		t.Errorf("rule %+v", s.Rule)
	}
	if s.Target.Topic != "ticks" || string(s.Target.Payload) != "p" || s.Target.Priority == nil || *s.Target.Priority != 7 || len(s.Target.Headers) != 1 {
		t.Errorf("target %+v", s.Target)
	}
	// Idempotent by id.
	s, err = rec.Create(ctx, "hourly", rule, target)
	if err != nil || !s.Existing {
		t.Errorf("Create again = %+v, %v", s, err)
	}
	var ce *client.ConflictError
	if _, err := rec.Create(ctx, "hourly", client.Cron("*/5 * * * * *", "Europe/Paris"), target); !errors.As(err, &ce) || ce.Version != 1 {
		t.Errorf("Create with another rule = %v", err)
	}

	g, err := rec.Get(ctx, "hourly")
	if err != nil || len(g.Upcoming) != 3 || !g.Upcoming[0].Equal(start) || !g.Upcoming[2].Equal(start.Add(2*time.Hour)) {
		t.Errorf("Get = %+v, %v", g, err)
	}

	// Update: the whole rule, conditioned on the version.
	cron := client.Cron("0 9 * * *", "Europe/Paris")
	if _, err := rec.Update(ctx, "hourly", client.RecurringUpdate{Rule: &cron, IfVersion: 7}); !errors.As(err, &ce) || ce.Version != 1 {
		t.Errorf("Update at the wrong version = %v", err)
	}
	s, err = rec.Update(ctx, "hourly", client.RecurringUpdate{Rule: &cron, IfVersion: 1})
	if err != nil || s.Version != 2 || s.Rule.Cron != "0 9 * * *" || s.Rule.TimeZone != "Europe/Paris" || s.Target.Topic != "ticks" {
		t.Errorf("Update = %+v, %v", s, err)
	}
	if _, err := rec.Update(ctx, "hourly", client.RecurringUpdate{Rule: &client.Rule{Cron: "not cron"}}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Update with a bad cron = %v", err)
	}

	// Pause and Resume.
	pending := s.NextOccurrence
	if s, err = rec.Pause(ctx, "hourly"); err != nil || s.State != client.RecurringPaused || s.PausedAt.IsZero() || !s.ResumesFrom.Equal(pending) {
		t.Errorf("Pause = %+v, %v", s, err)
	}
	if s, err = rec.Pause(ctx, "hourly"); err != nil || s.State != client.RecurringPaused {
		t.Errorf("Pause again = %+v, %v", s, err)
	}
	if s, err = rec.Resume(ctx, "hourly"); err != nil || s.State != client.RecurringActive {
		t.Errorf("Resume = %+v, %v", s, err)
	}
	if _, err = rec.Resume(ctx, "hourly"); !errors.Is(err, client.ErrNotPaused) {
		t.Errorf("Resume of an active schedule = %v", err)
	}
	// A Resume whose answer was lost, retried, is a success.
	f.after = func(m string, n int, err error) error {
		if m == "Resume" && err == nil {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	}
	if _, err := rec.Pause(ctx, "hourly"); err != nil {
		t.Fatal(err)
	}
	if s, err = rec.Resume(ctx, "hourly"); err != nil || s.State != client.RecurringActive {
		t.Errorf("Resume after a lost answer = %+v, %v", s, err)
	}
	f.after = nil

	// List pages by itself.
	for _, id := range []string{"a-1", "a-2", "b-1"} {
		if _, err := rec.Create(ctx, id, client.Every(time.Minute), client.Target{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for s, err := range rec.List(ctx, "a-") {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if len(ids) != 2 || ids[0] != "a-1" || ids[1] != "a-2" {
		t.Errorf("List(a-) = %v", ids)
	}

	// Delete.
	if err := rec.Delete(ctx, "hourly"); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Get(ctx, "hourly"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Get after Delete = %v", err)
	}
	if err := rec.Delete(ctx, "hourly"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Delete again = %v", err)
	}
	// An id is picked when none is given.
	s, err = rec.Create(ctx, "", client.Every(time.Minute), client.Target{Topic: "t"})
	if err != nil || s.ID == "" {
		t.Errorf("Create without an id = %+v, %v", s, err)
	}
}
