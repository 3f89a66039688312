package shard

import (
	"context"
	"errors"
	"strings"
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
