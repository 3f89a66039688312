package chimetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/client/chimetest"
)

// TestStartDevPartitionAndTombstone runs the two record options end to end,
// through a whole node (validation, Raft, Pebble, the wheel, the
// publisher) into the embedded broker, whose topics have 3 partitions: a
// record scheduled for partition 2 is read from partition 2, a tombstone
// is read with a null value and an empty payload with an empty one, and a
// record for partition 7 is dead-lettered with an error naming it and the
// topic's 3 partitions.
func TestStartDevPartitionAndTombstone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node; skipped with -short")
	}
	c, broker := chimetest.StartDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	const topic = "chimetest.output"

	for _, s := range []struct {
		ev   client.Event
		opts []client.ScheduleOption
	}{
		{client.Event{ID: "to-2", Topic: topic, Key: []byte("k"), Payload: []byte("two")}, []client.ScheduleOption{client.Partition(2)}},
		{client.Event{ID: "tomb", Topic: topic, Key: []byte("user-7")}, []client.ScheduleOption{client.Tombstone()}},
		{client.Event{ID: "empty", Topic: topic, Key: []byte("user-8")}, nil},
		{client.Event{ID: "nowhere", Topic: topic, Payload: []byte("lost")}, []client.ScheduleOption{client.Partition(7)}},
	} {
		if _, err := c.Schedule(ctx, s.ev, append(s.opts, client.In(0))...); err != nil {
			t.Fatalf("Schedule(%s): %v", s.ev.ID, err)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]*kgo.Record{}
	for len(got) < 3 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of 3 records within the deadline: %v", len(got), err)
		}
		for _, fe := range fs.Errors() {
			if !errors.Is(fe.Err, kgo.ErrClientClosed) {
				t.Logf("fetch: %v", fe.Err) // the topic is created when the node first produces to it
			}
		}
		for _, r := range fs.Records() {
			f, err := client.ParseFired(r.Headers)
			if err != nil {
				t.Fatal(err)
			}
			got[f.ID] = r
		}
	}
	if r := got["to-2"]; r == nil || r.Partition != 2 || string(r.Value) != "two" {
		t.Errorf("to-2: %+v; want partition 2, value two", r)
	}
	if r := got["tomb"]; r == nil || r.Value != nil || string(r.Key) != "user-7" {
		t.Errorf("tomb: %+v; want a null value under key user-7", r)
	}
	if r := got["empty"]; r == nil || r.Value == nil || len(r.Value) != 0 {
		t.Errorf("empty: %+v; want an empty value, not a null one", r)
	}
	if _, ok := got["nowhere"]; ok {
		t.Errorf("nowhere reached %s, which has no partition 7", topic)
	}

	waitFor(t, 20*time.Second, func() (bool, string) {
		ev, err := c.Get(ctx, "nowhere")
		want := "partition 7 of topic " + topic + " was asked for, but the topic has 3 partitions (0 to 2)"
		return err == nil && ev.State == client.StateDeadLettered && strings.Contains(ev.LastError, want) &&
				ev.HasPartition && ev.Partition == 7,
			fmt.Sprintf("Get(nowhere) = %+v, %v; want dead-lettered with an error naming %q", ev, err, want)
	})
	if ev, err := c.Get(ctx, "tomb"); err != nil || !ev.Tombstone || ev.HasPartition {
		t.Errorf("Get(tomb) = %+v, %v; want a tombstone without a partition", ev, err)
	}
}
