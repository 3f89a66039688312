package main

import (
	"context"
	"testing"
	"time"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

// Remind on a Fake: the reminder fires at its due time on the virtual
// clock, not before, and a retried call does not schedule it twice.
func TestRemindFiresWhenDue(t *testing.T) {
	ctx := context.Background()
	fake := chimetest.NewFake()
	defer fake.Close()

	res, err := Remind(ctx, fake, "42", "ana", "renew your passport", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Remind(ctx, fake, "42", "ana", "renew your passport", time.Hour) // a retry
	if err != nil || !again.Existing || again.ID != res.ID {
		t.Fatalf("retry: %+v, %v; want the first call's result, Existing", again, err)
	}

	if fired := fake.Advance(59 * time.Minute); len(fired) != 0 {
		t.Fatalf("fired %d records an hour before the reminder was due", len(fired))
	}
	fake.Advance(time.Minute)
	fired := fake.Fired()
	if len(fired) != 1 {
		t.Fatalf("fired %d records, want the reminder", len(fired))
	}
	rec := fired[0]
	f, err := client.ParseFired(rec.Headers)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Topic != Topic || string(rec.Key) != "ana" || string(rec.Value) != "renew your passport" ||
		f.ID != "reminder-42" || !f.Due.Equal(res.Due) || f.Late() != 0 {
		t.Fatalf("fired %s key=%s value=%s %+v; want the reminder for ana, due %v", rec.Topic, rec.Key, rec.Value, f, res.Due)
	}
}

// Remind and Await on a real node and its Kafka broker, as main runs them.
func TestRemindAndAwaitOnADevNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	c, broker := chimetest.StartDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Remind(ctx, c, "dev-1", "ana", "renew your passport", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Await(ctx, []string{broker}, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.User != "ana" || r.Text != "renew your passport" || r.Fired.ID != res.ID || r.Fired.FiredAt.Before(res.Due) {
		t.Fatalf("read %+v; want the reminder, fired no earlier than %v", r, res.Due)
	}
	t.Logf("fired %v late", r.Fired.Late())
}
