package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestCancelMatching: a dry run counts and changes nothing; the steps, run to
// the end, cancel exactly the pending events of the prefix, including one a
// fire batch already holds (which the batch then leaves out), and nothing
// else; running it again finds nothing.
func TestCancelMatching(t *testing.T) {
	const lead = 400 * time.Millisecond
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.FireLead = lead
		tu.ClockSkewBound = 10 * time.Millisecond
	})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	var reqs []Request
	for i := range 23 {
		reqs = append(reqs, delayed(fmt.Sprintf("order-42/%02d", i), "t", time.Hour))
	}
	reqs = append(reqs, delayed("order-420/other", "t", time.Hour), delayed("order-43/00", "t", time.Hour),
		delayed("order-42/held", "t", 700*time.Millisecond))
	res, err := n.host.Schedule(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, s, res[len(res)-1].Seq)
	q := raftfsm.Query{Prefix: "order-42/", Due: raftfsm.AnyDue}

	run := func(dryRun bool) (total CancelStep, steps int) {
		t.Helper()
		var after *raftfsm.Position
		for {
			step, err := s.CancelMatching(ctx, q, after, 5, dryRun)
			if err != nil {
				t.Fatal(err)
			}
			steps++
			total.Matched += step.Matched
			total.Cancelled += step.Cancelled
			total.Fired += step.Fired
			total.Held += step.Held
			if after = step.Next; after == nil {
				return total, steps
			}
		}
	}
	if got, steps := run(true); got != (CancelStep{Matched: 24}) || steps != 5 {
		t.Fatalf("dry run: %+v in %d steps, want 24 matched in 5", got, steps)
	}
	if n, err := s.Count(ctx, raftfsm.Query{States: raftfsm.StatesOf(raftfsm.StateScheduled), Due: raftfsm.AnyDue}, false); err != nil || n != 26 {
		t.Fatalf("pending after the dry run: %d, %v; want 26", n, err)
	}
	if got, _ := run(false); got != (CancelStep{Matched: 24, Cancelled: 24}) {
		t.Fatalf("bulk cancel: %+v, want 24 matched and cancelled", got)
	}
	left, err := s.List(ctx, raftfsm.Query{States: raftfsm.StatesOf(raftfsm.StateScheduled), Due: raftfsm.AnyDue}, nil, 100, false)
	if err != nil || len(left) != 2 || left[0].ID != "order-420/other" || left[1].ID != "order-43/00" {
		t.Fatalf("pending after the bulk cancel: %v, %v", left, err)
	}
	if got, _ := run(false); got != (CancelStep{}) {
		t.Fatalf("second run: %+v, want nothing", got)
	}
	got := publishtest.Consume(t, brokers, 1, 2*time.Second, "t")
	if len(got.Records) != 0 {
		t.Fatalf("records produced after the bulk cancel: %+v", got.Records)
	}
}
