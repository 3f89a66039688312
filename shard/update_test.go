package shard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// delayed is a request for id due after delay.
func delayed(id, topic string, delay time.Duration) Request {
	r := Request{ID: id, Delay: delay, HasDelay: true, Topic: topic, Payload: []byte("v1-" + id)}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	return r
}

// waitInFlight waits until a fire batch of s holds seq.
func waitInFlight(t *testing.T, s *Shard, seq uint64) {
	t.Helper()
	publishtest.WaitFor(t, 10*time.Second, "the event's batch is taken out of the wheel", func() bool {
		s.firing.mu.Lock()
		defer s.firing.mu.Unlock()
		return s.firing.inflight[seq] != nil
	})
}

// moveTo is an update of id to be due after delay, with a new payload.
func moveTo(id string, delay time.Duration) Change {
	return Change{Change: raftfsm.Change{ID: id, Fields: raftfsm.ChangeDue | raftfsm.ChangePayload,
		Payload: []byte("v2-" + id)}, Delay: delay, HasDelay: true}
}

// TestUpdateMovesTheDueTime: an event moved earlier fires at its new time,
// one moved later does not fire at its old one, and each is produced once,
// as its second version with its new payload.
func TestUpdateMovesTheDueTime(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.ClockSkewBound = 10 * time.Millisecond // no predecessor to fence off
	})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	if _, err := n.host.Schedule(ctx, []Request{delayed("earlier", "move", 4*time.Second), delayed("later", "move", 500*time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, u := range []Change{moveTo("earlier", 300*time.Millisecond), moveTo("later", 2500*time.Millisecond)} {
		res, err := s.Update(ctx, u)
		if err != nil || res.Outcome != raftfsm.Updated || res.Version != 2 {
			t.Fatalf("Update(%s) = %+v, %v", u.ID, res, err)
		}
	}
	got := publishtest.Consume(t, brokers, 2, 10*time.Second, "move")
	for id, within := range map[string][2]time.Duration{"earlier": {300 * time.Millisecond, 3 * time.Second}, "later": {2500 * time.Millisecond, 4 * time.Second}} {
		r, ok := got.ByID[id]
		switch {
		case !ok:
			t.Errorf("%s was never produced", id)
		case r.Version != 2 || r.Value() != "v2-"+id:
			t.Errorf("%s: produced version %d, value %q; want the update's", id, r.Version, r.Value())
		case r.Fired.Before(r.Due) || r.Fired.Before(start.Add(within[0]).Truncate(time.Millisecond)):
			t.Errorf("%s: fired at %v, due %v, %v after the update; want no sooner than %v", id, r.Fired, r.Due, r.Fired.Sub(start), within[0])
		case r.Received.Sub(start) > within[1]:
			t.Errorf("%s: arrived %v after the update, want within %v", id, r.Received.Sub(start), within[1])
		}
	}
	if got.Dups != 0 || len(got.Records) != 2 {
		t.Errorf("read %d records (%d duplicates), want one per event: %+v", len(got.Records), got.Dups, got.Records)
	}
}

// TestUpdateRefusedWhileFiring: an event a fire batch holds is not updated
// (it could not be promised that the old version is not produced); the
// event fires as it was.
func TestUpdateRefusedWhileFiring(t *testing.T) {
	const lead = 400 * time.Millisecond
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.FireLead = lead
		tu.ClockSkewBound = 10 * time.Millisecond
	})
	defer n.close()
	s := n.host.Replica(0)
	res, err := n.host.Schedule(context.Background(), []Request{delayed("held", "held", 700*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, s, res[0].Seq)
	if u, err := s.Update(context.Background(), moveTo("held", time.Hour)); !errors.Is(err, ErrFiring) {
		t.Fatalf("Update of an event in a fire batch = %+v, %v; want ErrFiring", u, err)
	}
	got := publishtest.Consume(t, brokers, 1, 5*time.Second, "held")
	if r, ok := got.ByID["held"]; !ok || r.Version != 1 || r.Value() != "v1-held" {
		t.Fatalf("the held event was not produced as scheduled: %+v", got.Records)
	}
}

// TestUpdatePinsTheEvent: between the read of the event and the commit of
// its change, the event falls due; it must stay out of every fire batch, so
// that the version the change replaces is never produced.
func TestUpdatePinsTheEvent(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	// The update holds its pin until a witness, due just after the pinned
	// event's old due time, has been produced: the firing loop has passed
	// that time, and would have fired the pinned event had it been in the
	// wheel.
	witness := publishtest.Collect(t, brokers, "witness")
	var proposed time.Time // when the update went on to its proposal
	n := openNodeWith(t, t.TempDir(), "", brokers, 1, Knobs{UpdatePinned: func() {
		if got := witness.WaitIDs(1, 10*time.Second); len(got.ByID) != 1 {
			t.Error("the witness was not produced in 10 s")
		}
		proposed = time.Now()
	}}, func(tu *Tuning) {
		tu.ClockSkewBound = 10 * time.Millisecond
	})
	defer n.close()
	s := n.host.Replica(0)
	reqs := []Request{delayed("pinned", "pin", 300*time.Millisecond), delayed("witness", "witness", 400*time.Millisecond)}
	if _, err := n.host.Schedule(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if res, err := s.Update(context.Background(), moveTo("pinned", 2*time.Second)); err != nil || res.Outcome != raftfsm.Updated {
		t.Fatalf("Update = %+v, %v", res, err)
	}
	got := publishtest.Consume(t, brokers, 1, 10*time.Second, "pin")
	if len(got.Records) != 1 || got.Records[0].Version != 2 {
		for _, r := range got.Records {
			t.Errorf("produced version %d (%q), %v after the update began", r.Version, r.Value(), r.Fired.Sub(start))
		}
		t.Fatal("want one record, of the update")
	}
	if r := got.Records[0]; r.Fired.Before(proposed.Add(2 * time.Second).Truncate(time.Millisecond)) {
		t.Errorf("fired %v after the update was proposed, want 2 s", r.Fired.Sub(proposed))
	}
}

// replacing is a Schedule of id with Replace, due after delay, with payload.
func replacing(id, topic, payload string, delay time.Duration) Request {
	r := Request{ID: id, Delay: delay, HasDelay: true, Topic: topic, Payload: []byte(payload), Replace: true}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	return r
}

// TestReplace: a Replace of a pending event makes it the next version, which
// alone fires, at its own time; of a fired event, schedules the id anew; of
// an event a fire batch holds, is refused for that event alone.
func TestReplace(t *testing.T) {
	const lead = 400 * time.Millisecond
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1, func(tu *Tuning) {
		tu.FireLead = lead
		tu.ClockSkewBound = 10 * time.Millisecond
	})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	col := publishtest.Collect(t, brokers, "replace")
	// The witness falls due a second after the first version of debounced
	// would have: once it is produced, the firing loop has passed that time.
	witness := publishtest.Collect(t, brokers, "witness")
	res, err := s.Schedule(ctx, []Request{delayed("debounced", "replace", 3*time.Second), delayed("held", "replace", 700*time.Millisecond),
		delayed("witness", "witness", 4*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, s, res[1].Seq)
	start := time.Now()
	got, err := s.Schedule(ctx, []Request{replacing("debounced", "replace", "v2", 500*time.Millisecond), replacing("held", "replace", "v2", time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Outcome != raftfsm.Replaced || got[0].Version != 2 || got[0].Err != nil {
		t.Errorf("Replace of a pending event: %+v", got[0])
	}
	if !errors.Is(got[1].Err, ErrFiring) || got[1].Outcome != 0 {
		t.Errorf("Replace of an event in a fire batch: %+v, want ErrFiring", got[1])
	}
	recs := col.WaitIDs(2, 10*time.Second)
	d, h := recs.ByID["debounced"], recs.ByID["held"]
	if d.Version != 2 || d.Value() != "v2" || d.Fired.Before(start.Add(500*time.Millisecond).Truncate(time.Millisecond)) || d.Received.Sub(start) > 2*time.Second {
		t.Errorf("the replaced event: version %d %q, fired %v after the Replace", d.Version, d.Value(), d.Fired.Sub(start))
	}
	if h.Version != 1 || h.Value() != "v1-held" {
		t.Errorf("the held event: version %d %q, want it as scheduled", h.Version, h.Value())
	}

	// Fired: a Replace schedules it anew, as version 3.
	publishtest.WaitFor(t, 10*time.Second, "the replaced event is marked fired", func() bool {
		rec, _, _ := s.fsm.Get("debounced")
		return rec.State == raftfsm.StateFired
	})
	got, err = s.Schedule(ctx, []Request{replacing("debounced", "replace", "v3", 0)})
	if err != nil || got[0].Outcome != raftfsm.Renewed || got[0].Version != 3 {
		t.Fatalf("Replace of a fired event: %+v, %v", got, err)
	}
	publishtest.WaitFor(t, 10*time.Second, "version 3 fires", func() bool {
		for _, r := range col.Consumed().Records {
			if r.ID == "debounced" && r.Version == 3 && r.Value() == "v3" {
				return true
			}
		}
		return false
	})
	if got := witness.WaitIDs(1, 15*time.Second); len(got.ByID) != 1 {
		t.Fatal("the witness was not produced: the firing loop did not pass the first version's due time")
	}
	for _, r := range col.Consumed().Records {
		if r.ID == "debounced" && r.Version == 1 {
			t.Errorf("the replaced first version was produced")
		}
	}
}
