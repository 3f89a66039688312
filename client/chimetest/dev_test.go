package chimetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

// StartDev's node schedules through the returned client and fires into the
// returned broker: the record read back carries the chime-* headers, and
// the node refuses bad input exactly as the Fake does.
func TestStartDev(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node; skipped with -short")
	}
	c, broker := chimetest.StartDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := c.Schedule(ctx, client.Event{ID: "dev-1", Topic: "chimetest.dev", Payload: []byte("hello"),
		Headers: []client.Header{{Key: "trace", Value: []byte("abc")}}}, client.In(0))
	if err != nil {
		t.Fatal(err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics("chimetest.dev"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var rec *kgo.Record
	for rec == nil {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("no record within the deadline: %v", err)
		}
		for _, fe := range fs.Errors() {
			// The topic is created when the node first produces to it.
			if !errors.Is(fe.Err, kgo.ErrClientClosed) {
				t.Logf("fetch: %v", fe.Err)
			}
		}
		if rs := fs.Records(); len(rs) > 0 {
			rec = rs[0]
		}
	}
	f, err := client.ParseFired(rec.Headers)
	if err != nil {
		t.Fatal(err)
	}
	if f.ID != "dev-1" || f.Version != 1 || f.Attempt != 1 || !f.Due.Equal(res.Due.Truncate(time.Millisecond)) || f.FiredAt.Before(f.Due) {
		t.Errorf("fired %+v; scheduled %+v", f, res)
	}
	if string(rec.Value) != "hello" || string(rec.Key) != "dev-1" || rec.Headers[0].Key != "trace" {
		t.Errorf("record key %q value %q headers %v", rec.Key, rec.Value, rec.Headers)
	}
	// The leader records the event as fired once Kafka acknowledged the
	// record, a commit after it: the record can be read before that.
	waitFor(t, 10*time.Second, func() (bool, string) {
		ev, err := c.Get(ctx, "dev-1")
		return err == nil && ev.State == client.StateFired, fmt.Sprintf("Get after the record arrived: %+v, %v; want fired", ev, err)
	})

	// The Fake's validation is the node's own.
	fake := chimetest.NewFake()
	defer fake.Close()
	bad := client.Event{ID: "x", Topic: "bad topic!"}
	_, devErr := c.Schedule(ctx, bad, client.In(time.Second))
	_, fakeErr := fake.Schedule(ctx, bad, client.In(time.Second))
	var devIE, fakeIE *client.InvalidError
	if !errors.As(devErr, &devIE) || !errors.As(fakeErr, &fakeIE) || devIE.Field != fakeIE.Field || devIE.Rule != fakeIE.Rule ||
		devErr.Error() != fakeErr.Error() {
		t.Errorf("bad topic: node %v, fake %v; want the same *InvalidError", devErr, fakeErr)
	}
}

// waitFor polls cond until it holds, and fails the test with cond's
// description if it does not within d.
func waitFor(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, what := cond()
		if ok {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("not within %v: %s", d, what)
		}
	}
}
