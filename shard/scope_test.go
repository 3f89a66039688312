package shard

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// topicScope permits the ids that start with prefix on topics that start
// with topic: one tenant of a shared cluster.
type topicScope struct{ name, prefix, topic string }

func (s topicScope) Permits(id, topic string) bool {
	return strings.HasPrefix(id, s.prefix) && strings.HasPrefix(topic, s.topic)
}
func (s topicScope) Credential() string { return s.name }

// TestScopeGuardsTheStoredEvent: a credential that may act on an id by its
// own rules (here, any id) still cannot replace, update, cancel or collide
// with an event stored by another on a topic outside its scope; each gets
// the same refusal, naming neither the event's topic nor its state, and
// writes nothing to the Raft log. The other tenant's event fires untouched.
func TestScopeGuardsTheStoredEvent(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) { tu.ClockSkewBound = 10 * time.Millisecond })
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	a := topicScope{name: "tenant-a", topic: "a."}
	b := delayed("b-1", "b.orders", 1500*time.Millisecond)
	b.Scope = topicScope{name: "tenant-b", topic: "b."}
	if res, err := n.host.Schedule(ctx, []Request{b}); err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("tenant B's Schedule = %+v, %v", res, err)
	}
	applied := s.fsm.AppliedIndex()

	refused := func(what string, err error) {
		t.Helper()
		var np *NotPermittedError
		if !errors.As(err, &np) || err.Error() != `id "b-1": not permitted for credential "tenant-a"` {
			t.Errorf("%s: %v; want the refusal for tenant-a", what, err)
		}
	}
	takeover := replacing("b-1", "a.x", "a's payload", time.Hour)
	takeover.Scope = a
	res, err := s.Schedule(ctx, []Request{takeover})
	if err != nil {
		t.Fatal(err)
	}
	refused("Replace", res[0].Err)
	// A Replace is refused on the read (pinReplaced), without an entry.
	if got := s.fsm.AppliedIndex(); got != applied {
		t.Errorf("a refused Replace moved the applied index from %d to %d", applied, got)
	}

	squat := delayed("b-1", "a.x", time.Hour)
	squat.Scope = a
	if res, err = s.Schedule(ctx, []Request{squat}); err != nil {
		t.Fatal(err)
	}
	refused("a create that collides", res[0].Err)
	// The collision was an entry (a create is decided by the FSM); the
	// refusals decided on the read are not.
	applied = s.fsm.AppliedIndex()

	ch := moveTo("b-1", time.Hour)
	ch.Scope = a
	_, err = s.Update(ctx, ch)
	refused("Update", err)
	_, err = s.Cancel(ctx, "b-1", a)
	refused("Cancel", err)
	if got := s.fsm.AppliedIndex(); got != applied {
		t.Errorf("refused requests moved the applied index from %d to %d", applied, got)
	}
	// An unknown id is answered from the read too, without an entry.
	if res, err := s.Cancel(ctx, "a-404", a); err != nil || res.Outcome != raftfsm.NotFound {
		t.Errorf("scoped Cancel of an unknown id = %+v, %v", res, err)
	}
	if got := s.fsm.AppliedIndex(); got != applied {
		t.Errorf("a scoped cancel of an unknown id moved the applied index from %d to %d", applied, got)
	}

	// Within its scope the same credential's calls go through.
	own := replacing("a-1", "a.x", "mine", time.Hour)
	own.Scope = a
	if res, err := s.Schedule(ctx, []Request{own}); err != nil || res[0].Err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("tenant A's own Replace = %+v, %v", res, err)
	}
	if res, err := s.Cancel(ctx, "a-1", a); err != nil || res.Outcome != raftfsm.Cancelled {
		t.Fatalf("tenant A's own Cancel = %+v, %v", res, err)
	}

	got := publishtest.Consume(t, brokers, 1, 10*time.Second, "b.orders")
	if r, ok := got.ByID["b-1"]; !ok || r.Version != 1 || r.Value() != "v1-b-1" {
		t.Fatalf("tenant B's event was not produced as B scheduled it: %+v", got.Records)
	}
}

// everySecond is a recurring schedule's definition: one occurrence a second
// on topic.
func everySecond(topic, payload string) raftfsm.Definition {
	return raftfsm.Definition{Every: int64(time.Second), CatchUp: raftfsm.CatchUpLast, Topic: topic, Payload: []byte(payload)}
}

func createSchedule(t *testing.T, s *Shard, id string, d raftfsm.Definition) {
	t.Helper()
	res, err := s.Recurring(context.Background(), raftfsm.Recurring{Op: raftfsm.RecurringCreate, ID: id, Hash: raftfsm.DefinitionHash(&d), Def: d}, nil)
	if err != nil || res.Outcome != raftfsm.RecurringCreated {
		t.Fatalf("Create %q = %+v, %v", id, res, err)
	}
}

// TestScopeGuardsTheStoredSchedule: a credential cannot update, delete,
// pause, resume, trigger or backfill another's recurring schedule by naming
// its id; each is
// refused in the same words from the leader's read, and like every outcome
// that read decides (an unknown id, a Pause of a paused schedule, a Resume
// of an active one), writes nothing to the Raft log. A schedule deleted and
// created again on another tenant's topic between the read that permitted
// a change and the change's entry is not changed: the entry names the
// definition that was checked.
func TestScopeGuardsTheStoredSchedule(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	// window, once set, runs (once) between a change's read and its proposal.
	var window atomic.Pointer[func()]
	knobs := Knobs{RecurringRead: func() {
		if f := window.Swap(nil); f != nil {
			(*f)()
		}
	}}
	n := openNodeWith(t, t.TempDir(), "", brokers, 1, knobs, func(tu *Tuning) { tu.ClockSkewBound = 10 * time.Millisecond })
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	a := topicScope{name: "tenant-a", topic: "a."}
	createSchedule(t, s, "b-s", everySecond("b.orders", "b's"))
	createSchedule(t, s, "a-s", everySecond("a.x", "a's"))
	applied := s.fsm.AppliedIndex()

	for _, op := range []raftfsm.RecurringOp{raftfsm.RecurringUpdate, raftfsm.RecurringDelete, raftfsm.RecurringPause, raftfsm.RecurringResume,
		raftfsm.RecurringTrigger, raftfsm.RecurringBackfill} {
		c := raftfsm.Recurring{Op: op, ID: "b-s"}
		if op == raftfsm.RecurringUpdate {
			c.Def = everySecond("a.x", "taken")
			c.Hash = raftfsm.DefinitionHash(&c.Def)
		}
		_, err := s.Recurring(ctx, c, a)
		var np *NotPermittedError
		if !errors.As(err, &np) || err.Error() != `id "b-s": not permitted for credential "tenant-a"` {
			t.Errorf("%v of another tenant's schedule: %v; want the refusal for tenant-a", op, err)
		}
	}
	decided := []struct {
		c    raftfsm.Recurring
		want raftfsm.RecurringOutcome
	}{
		{raftfsm.Recurring{Op: raftfsm.RecurringResume, ID: "a-404"}, raftfsm.RecurringNotFound},
		{raftfsm.Recurring{Op: raftfsm.RecurringPause, ID: "a-404"}, raftfsm.RecurringNotFound},
		{raftfsm.Recurring{Op: raftfsm.RecurringDelete, ID: "a-404"}, raftfsm.RecurringNotFound},
		{raftfsm.Recurring{Op: raftfsm.RecurringTrigger, ID: "a-404", At: 1}, raftfsm.RecurringNotFound},
		{raftfsm.Recurring{Op: raftfsm.RecurringBackfill, ID: "a-404", From: 1, To: 2, Limit: 1}, raftfsm.RecurringNotFound},
		{raftfsm.Recurring{Op: raftfsm.RecurringResume, ID: "a-s"}, raftfsm.RecurringNotPaused},
		{raftfsm.Recurring{Op: raftfsm.RecurringDelete, ID: "a-s", IfVersion: 7}, raftfsm.RecurringVersionMismatch},
	}
	for _, d := range decided {
		if res, err := s.Recurring(ctx, d.c, a); err != nil || res.Outcome != d.want {
			t.Errorf("%v of %q: %+v, %v; want %v", d.c.Op, d.c.ID, res, err, d.want)
		}
	}
	if got := s.fsm.AppliedIndex(); got != applied {
		t.Errorf("refused and read-decided calls moved the applied index from %d to %d", applied, got)
	}
	if res, err := s.Recurring(ctx, raftfsm.Recurring{Op: raftfsm.RecurringPause, ID: "a-s"}, a); err != nil || res.Outcome != raftfsm.RecurringPaused {
		t.Fatalf("tenant A's Pause of its own schedule = %+v, %v", res, err)
	}
	applied = s.fsm.AppliedIndex()
	if res, err := s.Recurring(ctx, raftfsm.Recurring{Op: raftfsm.RecurringPause, ID: "a-s"}, a); err != nil || res.Outcome != raftfsm.RecurringPaused {
		t.Fatalf("a second Pause = %+v, %v", res, err)
	}
	if got := s.fsm.AppliedIndex(); got != applied {
		t.Errorf("a Pause of a paused schedule moved the applied index from %d to %d", applied, got)
	}

	// Between A's permitted read of a-s and its Resume's entry, a-s is
	// deleted and created again on tenant B's topic.
	changeHands := func() {
		if res, err := s.Recurring(ctx, raftfsm.Recurring{Op: raftfsm.RecurringDelete, ID: "a-s"}, nil); err != nil || res.Outcome != raftfsm.RecurringDeleted {
			t.Errorf("Delete in the window = %+v, %v", res, err)
		}
		createSchedule(t, s, "a-s", everySecond("b.orders", "b's too"))
	}
	window.Store(&changeHands)
	_, err := s.Recurring(ctx, raftfsm.Recurring{Op: raftfsm.RecurringResume, ID: "a-s"}, a)
	if window.Load() != nil {
		t.Fatal("the Resume did not pass between its read and its proposal: the test did not reach its case")
	}
	if err == nil || err.Error() != `id "a-s": not permitted for credential "tenant-a"` {
		t.Errorf("a Resume whose schedule changed hands after the read: %v; want the refusal for tenant-a", err)
	}
	if sched, found, err := s.fsm.GetSchedule("a-s"); err != nil || !found || sched.Definition.Topic != "b.orders" || string(sched.Definition.Payload) != "b's too" || sched.State != raftfsm.ScheduleActive {
		t.Fatalf("the schedule created in the window: %+v, %v, %v", sched, found, err)
	}

	// B's schedule fired untouched all along.
	got := publishtest.Consume(t, brokers, 2, 10*time.Second, "b.orders")
	for _, r := range got.Records {
		if r.Value() != "b's" && r.Value() != "b's too" {
			t.Fatalf("a record on b.orders that B did not define: %q", r.Value())
		}
	}
}
