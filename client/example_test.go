package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/chimehq/chime/client"
)

func ExampleClient_Schedule() {
	ctx := context.Background()
	c, err := client.Dial(ctx, chimeAddr()) // or "n1:7443,n2:7443,n3:7443"
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	reminder := client.Event{
		ID:      "invoice-42/reminder", // the idempotency key
		Topic:   "billing.reminders",
		Key:     []byte("customer-7"),
		Payload: []byte(`{"invoice":42}`),
	}
	res, err := c.Schedule(ctx, reminder, client.In(72*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.ID, "due", res.Due.UTC().Format(time.RFC3339), "existing:", res.Existing)

	// Sending the same event again (a retry after a crash, say) stores
	// nothing new.
	res, err = c.Schedule(ctx, reminder, client.In(72*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("existing:", res.Existing)

	// The same id with other content is a conflict.
	reminder.Payload = []byte(`{"invoice":43}`)
	_, err = c.Schedule(ctx, reminder, client.In(72*time.Hour))
	fmt.Println(errors.Is(err, client.ErrConflict))
	// Output:
	// invoice-42/reminder due 2030-01-05T09:00:00Z existing: false
	// existing: true
	// true
}

func ExampleClient_Update() {
	ctx := context.Background()
	c, err := client.Dial(ctx, chimeAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.Schedule(ctx, client.Event{ID: "trial-7/expiry", Topic: "trials"}, client.In(14*24*time.Hour)); err != nil {
		log.Fatal(err)
	}
	// Extend the trial: only the due time changes.
	res, err := c.Update(ctx, "trial-7/expiry", client.In(30*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("version", res.Version, "due", res.Due.UTC().Format(time.DateOnly))

	// A change conditioned on a version that is no longer current.
	_, err = c.Update(ctx, "trial-7/expiry", client.SetPayload([]byte("late")), client.IfVersion(1))
	var conflict *client.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println("conflict: stored version is", conflict.Version)
	}

	// Read, modify, write, retried if another change gets there first.
	res, err = c.UpdateFunc(ctx, "trial-7/expiry", func(ev *client.Event) error {
		ev.Due = ev.Due.Add(24 * time.Hour)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("version", res.Version, "due", res.Due.UTC().Format(time.DateOnly))
	// Output:
	// version 2 due 2030-02-01
	// conflict: stored version is 2
	// version 3 due 2030-02-02
}

func ExampleClient_List() {
	ctx := context.Background()
	c, err := client.Dial(ctx, chimeAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var batch []client.Event
	for i, in := range []time.Duration{3 * time.Hour, time.Hour, 2 * time.Hour} {
		batch = append(batch, client.Event{ID: fmt.Sprintf("cart-%d/abandoned", i), Topic: "carts", Due: harnessStart.Add(in)})
	}
	if _, err := c.ScheduleBatch(ctx, batch); err != nil {
		log.Fatal(err)
	}

	// List pages by itself; events come in due order.
	for ev, err := range c.List(ctx, client.Filter{IDPrefix: "cart-", States: []client.State{client.StateScheduled}}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.ID, ev.Due.UTC().Format(time.TimeOnly))
	}
	n, err := c.Count(ctx, client.Filter{IDPrefix: "cart-"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "events")
	// Output:
	// cart-1/abandoned 10:00:00
	// cart-2/abandoned 11:00:00
	// cart-0/abandoned 12:00:00
	// 3 events
}

func ExampleClient_Cancel() {
	ctx := context.Background()
	c, err := client.Dial(ctx, chimeAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.Schedule(ctx, client.Event{ID: "order-9/timeout", Topic: "orders"}, client.In(15*time.Minute)); err != nil {
		log.Fatal(err)
	}
	// Once Cancel returns, the record is not produced.
	if err := c.Cancel(ctx, "order-9/timeout"); err != nil {
		log.Fatal(err)
	}
	ev, err := c.Get(ctx, "order-9/timeout")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ev.ID, ev.State)

	err = c.Cancel(ctx, "order-10/timeout")
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output:
	// order-9/timeout cancelled
	// true
}

func ExampleRecurring() {
	ctx := context.Background()
	c, err := client.Dial(ctx, chimeAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	rec := c.Recurring()
	s, err := rec.Create(ctx, "daily-report",
		client.Cron("0 9 * * *", "Europe/Paris", client.WithCatchUp(client.CatchUpSkip)),
		client.Target{Topic: "reports", Payload: []byte(`{"report":"daily"}`)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.ID, s.State, "next", s.NextOccurrence.UTC().Format(time.RFC3339), "as event", s.NextEventID)

	if s, err = rec.Pause(ctx, "daily-report"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.State)
	if s, err = rec.Resume(ctx, "daily-report"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.State)

	for s, err := range rec.List(ctx, "daily-") {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(s.ID, s.Rule.Cron, s.Rule.TimeZone)
	}
	if err := rec.Delete(ctx, "daily-report"); err != nil {
		log.Fatal(err)
	}
	_, err = rec.Get(ctx, "daily-report")
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output:
	// daily-report active next 2030-01-03T08:00:00Z as event daily-report@1893657600000
	// paused
	// active
	// daily-report 0 9 * * * Europe/Paris
	// true
}
