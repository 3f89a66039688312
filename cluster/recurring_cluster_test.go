package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// TestRecurringTriggerAndBackfillThroughANonLeader: a Trigger and a Backfill sent to a node
// that does not lead the schedule's shard are applied by its leader, and the answer comes
// back whole over the Peer service: the triggered occurrence's due time and whether it
// existed, the backfill's created times and existing count. A retry through the leader
// finds what the first made, and the schedule's own pending occurrence never moves.
func TestRecurringTriggerAndBackfillThroughANonLeader(t *testing.T) {
	const shards = 2
	c := nodetest.MakeCluster(t, 3, nodetest.Options{Shards: shards})
	c.WaitSettled(60 * time.Second)
	rid := ""
	for j := 0; rid == ""; j++ {
		if s := fmt.Sprintf("tick-%d", j); shard.For(s, shards) == 0 {
			rid = s
		}
	}
	leader := c.Node(c.Leader(0))
	var via *nodetest.Node
	for _, n := range c.IDs() {
		if n != leader.ID {
			via = c.Node(n)
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Every hour from a day ago: the past 24 hours' instants are there to backfill.
	now := time.Now()
	start := now.Truncate(time.Hour).Add(-24 * time.Hour)
	created, err := via.Recurring().Create(ctx, &chimev1.CreateRecurringRequest{Id: rid,
		Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Hour)}, Start: timestamppb.New(start)},
		Target: &chimev1.RecurringTarget{Topic: "route", Payload: []byte("tick")}})
	if err != nil {
		t.Fatalf("recurring create through %s: %v", via.ID, err)
	}

	at := now.Add(-time.Second)
	if at.UnixMilli()%1000 == 0 {
		at = at.Add(time.Millisecond) // off the rule's instants
	}
	trig := &chimev1.TriggerRecurringRequest{Id: rid, At: timestamppb.New(at)}
	tr, err := via.Recurring().Trigger(ctx, trig)
	want := fmt.Sprintf("%s@%d", rid, at.UnixMilli())
	if err != nil || tr.EventId != want || tr.Existing || tr.Due.AsTime().Before(at.Truncate(time.Millisecond)) {
		t.Fatalf("trigger through %s: %v, %v; want %s, created, due at or after its time", via.ID, tr, err, want)
	}
	ev, err := leader.Scheduler().Get(ctx, &chimev1.GetRequest{Id: want})
	if err != nil || string(ev.Event.GetPayload()) != "tick" || !ev.Due.AsTime().Equal(tr.Due.AsTime()) {
		t.Fatalf("the triggered occurrence on the leader: %v, %v", ev, err)
	}
	if again, err := leader.Recurring().Trigger(ctx, trig); err != nil || !again.Existing || !again.Due.AsTime().Equal(tr.Due.AsTime()) {
		t.Fatalf("the trigger retried on the leader: %v, %v; want existing, the same due", again, err)
	}

	bf := &chimev1.BackfillRecurringRequest{Id: rid, From: timestamppb.New(start), To: timestamppb.New(start.Add(5 * time.Hour))}
	b, err := via.Recurring().Backfill(ctx, bf)
	if err != nil || b.Created != 5 || b.Existing != 0 || len(b.CreatedOccurrences) != 5 || !b.CreatedOccurrences[4].AsTime().Equal(start.Add(4*time.Hour)) {
		t.Fatalf("backfill through %s: %v, %v; want five created", via.ID, b, err)
	}
	if b, err := leader.Recurring().Backfill(ctx, bf); err != nil || b.Created != 0 || b.Existing != 5 {
		t.Fatalf("the backfill retried on the leader: %v, %v; want five existing", b, err)
	}
	// Refused by the leader's state machine (1,500 instants of an every-second rule, over
	// the limit), answered through the peer with its code, nothing made.
	sec := rid + "-sec"
	if _, err := via.Recurring().Create(ctx, &chimev1.CreateRecurringRequest{Id: sec,
		Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Second)}, Start: timestamppb.New(start)},
		Target: &chimev1.RecurringTarget{Topic: "route", Payload: []byte("tick")}}); err != nil {
		t.Fatal(err)
	}
	_, err = via.Recurring().Backfill(ctx, &chimev1.BackfillRecurringRequest{Id: sec, From: timestamppb.New(start), To: timestamppb.New(start.Add(1500 * time.Second))})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a backfill of too many instants through %s: %v; want INVALID_ARGUMENT", via.ID, err)
	}
	if _, err := via.Scheduler().Get(ctx, &chimev1.GetRequest{Id: fmt.Sprintf("%s@%d", sec, start.UnixMilli())}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused backfill made an occurrence: %v", err)
	}

	g, err := via.Recurring().Get(ctx, &chimev1.GetRecurringRequest{Id: rid})
	if err != nil || g.NextEventId != created.NextEventId || g.Occurrences != 0 {
		t.Fatalf("the schedule after a trigger and a backfill: %v, %v; want its pending %s untouched", g, err, created.NextEventId)
	}
}
