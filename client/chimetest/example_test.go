package chimetest_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

// remindLater is the code under test: it takes a client.Scheduler, so a
// *client.Client runs it in production and a Fake in tests.
func remindLater(ctx context.Context, s client.Scheduler, user string) error {
	_, err := s.Schedule(ctx, client.Event{ID: "remind-" + user, Topic: "reminders", Payload: []byte(user)}, client.In(time.Hour))
	return err
}

func ExampleNewFake() {
	fake := chimetest.NewFake()
	defer fake.Close()
	start := fake.Now()
	if err := remindLater(context.Background(), fake, "ada"); err != nil {
		log.Fatal(err)
	}

	fmt.Println("after 59m:", len(fake.Advance(59*time.Minute)), "fired")
	for _, r := range fake.Advance(time.Minute) {
		f, err := client.ParseFired(r.Headers) // as a consumer of the topic would
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("after 1h: %s fired to %s with %q, %v after the call\n", f.ID, r.Topic, r.Value, f.FiredAt.Sub(start))
	}
	// Output:
	// after 59m: 0 fired
	// after 1h: remind-ada fired to reminders with "ada", 1h0m0s after the call
}
