// Command reminders is what a Go service does with Chime: it schedules a
// reminder, then reads it from Kafka when Chime fires it.
//
// With `go run ./cmd/chimed dev` running in the Chime repository:
//
//	go run . -in 2s -text 'renew your passport'
//
// Remind, the business logic, takes a client.Scheduler, so that its test
// runs it on chimetest.NewFake() and a virtual clock instead of a cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/client"
)

// Topic is where Chime produces the reminders when they are due.
const Topic = "reminders"

// Remind schedules a reminder of text for user, due after d. The reminder's
// id is the event's id, so a retried call (after a timeout, a crash)
// returns the first call's result rather than schedule a second reminder.
func Remind(ctx context.Context, s client.Scheduler, id, user, text string, d time.Duration) (client.Result, error) {
	return s.Schedule(ctx, client.Event{
		ID:      "reminder-" + id,
		Topic:   Topic,
		Key:     []byte(user),
		Payload: []byte(text),
	}, client.In(d))
}

// Reminder is a reminder as Chime fired it.
type Reminder struct {
	User, Text string
	Fired      client.Fired // its id, version, due and fire times
}

// Await reads Topic from Kafka (from its start: it may not exist until
// Chime first produces to it) until the reminder with event id id arrives.
func Await(ctx context.Context, brokers []string, id string) (Reminder, error) {
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(250*time.Millisecond)) // notice the new topic promptly
	if err != nil {
		return Reminder{}, err
	}
	defer kc.Close()
	for {
		fetches := kc.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return Reminder{}, err
		}
		for _, fe := range fetches.Errors() {
			if errors.Is(fe.Err, kgo.ErrClientClosed) {
				return Reminder{}, fe.Err
			}
			log.Printf("kafka: %s[%d]: %v (retrying)", fe.Topic, fe.Partition, fe.Err)
		}
		for _, rec := range fetches.Records() {
			f, err := client.ParseFired(rec.Headers)
			if err != nil || f.ID != id {
				continue // not ours: another run's reminder, or not from Chime
			}
			return Reminder{User: string(rec.Key), Text: string(rec.Value), Fired: f}, nil
		}
	}
}

func main() {
	addr := flag.String("chime", "127.0.0.1:7070", "Chime `addresses`, comma-separated")
	brokers := flag.String("kafka", "127.0.0.1:9092", "Kafka bootstrap `addresses`, comma-separated")
	user := flag.String("user", "ana", "who the reminder is for")
	text := flag.String("text", "renew your passport", "what it says")
	in := flag.Duration("in", 2*time.Second, "how long until it is due")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var opts []client.Option
	if token := os.Getenv("CHIME_TOKEN"); token != "" { // a cluster run with --auth-file
		opts = append(opts, client.WithToken(token))
	}
	c, err := client.Dial(ctx, *addr, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }() // fails only for a client already closed

	res, err := Remind(ctx, c, strconv.FormatInt(time.Now().UnixNano(), 36), *user, *text, *in)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("scheduled %s, due %s\n", res.ID, res.Due.Format(time.RFC3339Nano))
	r, err := Await(ctx, strings.Split(*brokers, ","), res.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reminder for %s: %s (fired %v after its due time)\n", r.User, r.Text, r.Fired.Late())
}
