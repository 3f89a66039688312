package rpctest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc/rpctest"
	"github.com/chimehq/chime/shard"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func schedule(t *testing.T, b *rpctest.Backend, id string, due time.Time) {
	t.Helper()
	res, err := b.Schedule(context.Background(), []shard.Request{{
		ID: id, Topic: "t", DeliverAt: due.UnixNano(), HasDeliverAt: true, ContentHash: uint64(len(id)),
	}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("schedule %s: %v %v", id, err, res)
	}
}

func ids(recs []raftfsm.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func TestFireDueInDueOrderNeverEarly(t *testing.T) {
	b := rpctest.New(func() time.Time { return t0 })
	schedule(t, b, "c", t0.Add(2*time.Second))
	schedule(t, b, "b", t0.Add(time.Second))
	schedule(t, b, "a", t0.Add(2*time.Second))
	schedule(t, b, "z", t0.Add(3*time.Second))
	schedule(t, b, "gone", t0.Add(time.Second))
	if _, err := b.Cancel(context.Background(), "gone", nil); err != nil {
		t.Fatal(err)
	}
	if got := b.FireDue(t0.Add(time.Second - 1)); len(got) != 0 {
		t.Fatalf("fired early: %v", ids(got))
	}
	now := t0.Add(2 * time.Second)
	got := b.FireDue(now)
	if fmt.Sprint(ids(got)) != "[b a c]" {
		t.Fatalf("fired %v, want [b a c]", ids(got))
	}
	for _, r := range got {
		if r.State != raftfsm.StateFired || r.FiredAt != now.UnixNano() || r.Attempts != 1 {
			t.Errorf("%s: state %v fired at %v attempts %d", r.ID, r.State, time.Unix(0, r.FiredAt), r.Attempts)
		}
	}
	if again := b.FireDue(now); len(again) != 0 {
		t.Errorf("fired twice: %v", ids(again))
	}
	if rec, _, _ := b.Get(context.Background(), "a"); rec.State != raftfsm.StateFired {
		t.Errorf("Get(a) state %v, want fired", rec.State)
	}
	if got := b.FireDue(t0.Add(time.Hour)); fmt.Sprint(ids(got)) != "[z]" {
		t.Errorf("fired %v, want [z]", ids(got))
	}
}

func createEvery(t *testing.T, b *rpctest.Backend, id string, def raftfsm.Definition) {
	t.Helper()
	res, err := b.Recurring(context.Background(), raftfsm.Recurring{Op: raftfsm.RecurringCreate, ID: id, Def: def, Hash: 1}, nil)
	if err != nil || res.Outcome != raftfsm.RecurringCreated {
		t.Fatalf("create %s: %v %v", id, res, err)
	}
}

func getSchedule(t *testing.T, b *rpctest.Backend, id string) raftfsm.Schedule {
	t.Helper()
	s, ok, err := b.GetSchedule(context.Background(), id, false)
	if err != nil || !ok {
		t.Fatalf("get schedule %s: %v %v", id, ok, err)
	}
	return s
}

func TestFireDueRecurring(t *testing.T) {
	b := rpctest.New(func() time.Time { return t0 })
	createEvery(t, b, "tick", raftfsm.Definition{Every: int64(time.Minute), Topic: "ticks", Payload: []byte("p"),
		Headers: []raftfsm.Header{{Key: "h", Value: []byte("v")}}, CatchUp: raftfsm.CatchUpAll, MaxCatchUp: 10})
	schedule(t, b, "between", t0.Add(90*time.Second))

	got := b.FireDue(t0.Add(time.Minute))
	first := raftfsm.OccurrenceID("tick", t0.Add(time.Minute))
	if fmt.Sprint(ids(got)) != "["+first+"]" {
		t.Fatalf("fired %v, want [%s]", ids(got), first)
	}
	occ := got[0]
	wantHeaders := fmt.Sprint([]raftfsm.Header{{Key: "h", Value: []byte("v")},
		{Key: "chime-recurring-id", Value: []byte("tick")},
		{Key: "chime-occurrence-unix-ms", Value: []byte(fmt.Sprint(t0.Add(time.Minute).UnixMilli()))}})
	if fmt.Sprint(occ.Headers) != wantHeaders || occ.Topic != "ticks" || string(occ.Payload) != "p" || occ.Version != 1 ||
		occ.Due != t0.Add(time.Minute).UnixNano() {
		t.Errorf("occurrence %+v", occ)
	}
	if rec, ok, _ := b.Get(context.Background(), first); !ok || rec.State != raftfsm.StateFired {
		t.Errorf("Get(%s): %v, %v; want it fired", first, rec.State, ok)
	}
	s := getSchedule(t, b, "tick")
	if s.Occurrences != 1 || s.Next != t0.Add(2*time.Minute).UnixNano() || s.State != raftfsm.ScheduleActive {
		t.Errorf("after one occurrence: %+v", s)
	}

	// Three minutes on: the occurrences at 2m and 3m interleave with the
	// event at 1m30s, in due order.
	got = b.FireDue(t0.Add(3 * time.Minute))
	want := fmt.Sprint([]string{"between", raftfsm.OccurrenceID("tick", t0.Add(2*time.Minute)), raftfsm.OccurrenceID("tick", t0.Add(3*time.Minute))})
	if fmt.Sprint(ids(got)) != want {
		t.Fatalf("fired %v, want %v", ids(got), want)
	}
	if s := getSchedule(t, b, "tick"); s.Occurrences != 3 || s.Next != t0.Add(4*time.Minute).UnixNano() {
		t.Errorf("after three occurrences: %+v", s)
	}
}

func TestFireDueRecurringCatchUpAndLimits(t *testing.T) {
	b := rpctest.New(func() time.Time { return t0 })
	for id, cu := range map[string]raftfsm.CatchUp{"skip": raftfsm.CatchUpSkip, "last": raftfsm.CatchUpLast, "all": raftfsm.CatchUpAll} {
		createEvery(t, b, id, raftfsm.Definition{Every: int64(time.Minute), Topic: "t", CatchUp: cu, MaxCatchUp: 3})
	}
	createEvery(t, b, "twice", raftfsm.Definition{Every: int64(time.Minute), Topic: "t", CatchUp: raftfsm.CatchUpAll, MaxCatchUp: 100, MaxOccurrences: 2})
	count := map[string]int{}
	for _, r := range b.FireDue(t0.Add(10*time.Minute + 30*time.Second)) {
		count[string(r.Headers[0].Value)]++
	}
	// skip and last fire the occurrence at 1m, which was due, then one
	// more: skip none of the missed ones, last the latest (10m); all fires
	// 1m and 3 missed ones in a row, then goes on from now.
	if want := map[string]int{"skip": 1, "last": 2, "all": 4, "twice": 2}; fmt.Sprint(count) != fmt.Sprint(want) {
		t.Errorf("fired %v, want %v", count, want)
	}
	for id, want := range map[string]time.Duration{"skip": 11 * time.Minute, "last": 11 * time.Minute, "all": 11 * time.Minute} {
		if s := getSchedule(t, b, id); s.Next != t0.Add(want).UnixNano() {
			t.Errorf("%s: next %v, want t0+%v", id, time.Unix(0, s.Next).UTC(), want)
		}
	}
	if s := getSchedule(t, b, "twice"); s.State != raftfsm.ScheduleCompleted || s.Occurrences != 2 {
		t.Errorf("twice: %+v; want completed after 2", s)
	}
}

func TestFireDueSkipsPausedSchedules(t *testing.T) {
	b := rpctest.New(func() time.Time { return t0 })
	createEvery(t, b, "p", raftfsm.Definition{Every: int64(time.Minute), Topic: "t"})
	if _, err := b.Recurring(context.Background(), raftfsm.Recurring{Op: raftfsm.RecurringPause, ID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := b.FireDue(t0.Add(time.Hour)); len(got) != 0 {
		t.Errorf("a paused schedule fired %v", ids(got))
	}
	if got := b.FireUntil(t0.Add(time.Hour)); len(got) != 0 {
		t.Errorf("a paused schedule fired %v", ids(got))
	}
}

// FireUntil fires each event and occurrence at its own due time (events due
// before the clock's now at now), so a recurring schedule misses none.
func TestFireUntilOnTime(t *testing.T) {
	now := t0.Add(10 * time.Second)
	b := rpctest.New(func() time.Time { return now })
	schedule(t, b, "past", t0)
	schedule(t, b, "later", now.Add(90*time.Second))
	createEvery(t, b, "tick", raftfsm.Definition{Every: int64(time.Minute), Start: t0.UnixNano(), Topic: "t", CatchUp: raftfsm.CatchUpSkip})
	got := b.FireUntil(now.Add(200 * time.Second)) // to t0+3m30s
	var lines []string
	for _, r := range got {
		lines = append(lines, fmt.Sprintf("%s@%v", r.ID, time.Unix(0, r.FiredAt).Sub(t0)))
	}
	want := fmt.Sprint([]string{"past@10s", raftfsm.OccurrenceID("tick", t0.Add(time.Minute)) + "@1m0s", "later@1m40s",
		raftfsm.OccurrenceID("tick", t0.Add(2*time.Minute)) + "@2m0s", raftfsm.OccurrenceID("tick", t0.Add(3*time.Minute)) + "@3m0s"})
	if fmt.Sprint(lines) != want {
		t.Errorf("fired %v\nwant  %v", lines, want)
	}
	if s := getSchedule(t, b, "tick"); s.Occurrences != 3 || s.Next != t0.Add(4*time.Minute).UnixNano() {
		t.Errorf("schedule after FireUntil: %+v", s)
	}
}
