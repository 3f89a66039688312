package client_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/client"
)

func TestScheduleOptionsAndGet(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	at := harnessStart.Add(90 * time.Minute)
	hdrs := []client.Header{{Key: "trace", Value: []byte("a")}, {Key: "trace", Value: []byte("b")}}
	res, err := c.Schedule(ctx, client.Event{ID: "g1", Topic: "t", Key: []byte("k"), Payload: []byte("p"), Headers: hdrs},
		client.At(at), client.Priority(8), client.Window(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if res.Version != 1 || !res.Due.Equal(at) || res.Existing {
		t.Errorf("Schedule = %+v", res)
	}
	ev, err := c.Get(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	want := client.Event{ID: "g1", Topic: "t", Key: []byte("k"), Payload: []byte("p"), Headers: hdrs,
		State: client.StateScheduled, Version: 1, Due: at, CreatedAt: harnessStart, Priority: 8, Window: time.Minute}
	if fmt.Sprint(ev) != fmt.Sprint(want) {
		t.Errorf("Get =\n%+v\nwant\n%+v", ev, want)
	}

	// Replace makes the next version.
	res, err = c.Schedule(ctx, client.Event{ID: "g1", Topic: "t", Payload: []byte("q")}, client.In(time.Hour), client.Replace())
	if err != nil || res.Version != 2 || res.Existing {
		t.Errorf("Schedule(Replace) = %+v, %v", res, err)
	}

	// Event.Due is the due time without At or In.
	res, err = c.Schedule(ctx, client.Event{ID: "g2", Topic: "t", Due: at})
	if err != nil || !res.Due.Equal(at) {
		t.Errorf("Schedule(Due) = %+v, %v", res, err)
	}

	// Settled states.
	h.Backend.Fire("g2", harnessStart.Add(2*time.Hour), 1)
	ev, err = c.Get(ctx, "g2")
	if err != nil || ev.State != client.StateFired || !ev.FiredAt.Equal(harnessStart.Add(2*time.Hour)) || ev.Attempts != 1 {
		t.Errorf("Get of a fired event = %+v, %v", ev, err)
	}
	if err := c.Cancel(ctx, "g2"); !errors.Is(err, client.ErrAlreadyFired) {
		t.Errorf("Cancel of a fired event = %v", err)
	}
	if _, err := c.Update(ctx, "g2", client.In(time.Hour)); !errors.Is(err, client.ErrAlreadyFired) {
		t.Errorf("Update of a fired event = %v", err)
	}
	if _, err := c.Schedule(ctx, client.Event{ID: "g3", Topic: "t"}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	h.Backend.DeadLetter("g3", harnessStart.Add(time.Hour), 5, "broker down", "t.dlq")
	ev, err = c.Get(ctx, "g3")
	if err != nil || ev.State != client.StateDeadLettered || ev.DeadLetterTopic != "t.dlq" || ev.LastError != "broker down" {
		t.Errorf("Get of a dead-lettered event = %+v, %v", ev, err)
	}
	if err := c.Cancel(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, "g1"); err != nil {
		t.Errorf("Cancel again = %v, want success", err)
	}
	ev, _ = c.Get(ctx, "g1")
	if ev.State != client.StateCancelled || !ev.CancelledAt.Equal(harnessStart) {
		t.Errorf("Get of a cancelled event = %+v", ev)
	}
	if _, err := c.Update(ctx, "g1", client.In(time.Hour)); !errors.Is(err, client.ErrCancelled) {
		t.Errorf("Update of a cancelled event = %v", err)
	}
	if _, err := c.Get(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Get of an unknown id = %v", err)
	}

	// Bad input, named.
	_, err = c.Schedule(ctx, client.Event{ID: "g4", Topic: "bad topic!"}, client.In(time.Hour))
	var inv *client.InvalidError
	if !errors.As(err, &inv) || inv.Field != "event.topic" || status.Code(err) != codes.InvalidArgument {
		t.Errorf("Schedule with a bad topic = %#v", err)
	}
	_, err = c.Schedule(ctx, client.Event{ID: "g4", Topic: "t"}, client.In(time.Hour), client.Priority(-1))
	if !errors.As(err, &inv) || inv.Field != "event.priority" {
		t.Errorf("Schedule with priority -1 = %v", err)
	}
}

// TestSchedulePartitionAndTombstone: the Partition and Tombstone options,
// and the Event fields, reach the server, Get shows them (partition 0 told
// apart from none), they are part of the content, bad ones are named, and
// an Update cannot give a tombstone a payload.
func TestSchedulePartitionAndTombstone(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	if _, err := c.Schedule(ctx, client.Event{ID: "p0", Topic: "t", Payload: []byte("v")}, client.In(time.Hour), client.Partition(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Schedule(ctx, client.Event{ID: "z", Topic: "t", Key: []byte("user-7")}, client.In(time.Hour), client.Tombstone(), client.Partition(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Schedule(ctx, client.Event{ID: "f", Topic: "t", Partition: 2, HasPartition: true, Tombstone: true}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Schedule(ctx, client.Event{ID: "n", Topic: "t", Partition: 2}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string][3]any{"p0": {int32(0), true, false}, "z": {int32(3), true, true}, "f": {int32(2), true, true}, "n": {int32(0), false, false}} {
		ev, err := c.Get(ctx, id)
		if err != nil || ev.Partition != want[0] || ev.HasPartition != want[1] || ev.Tombstone != want[2] {
			t.Errorf("Get(%s) = partition %d (%v), tombstone %v, %v; want %v", id, ev.Partition, ev.HasPartition, ev.Tombstone, err, want)
		}
	}
	// Part of the content: the same event for another partition is another one.
	_, err := c.Schedule(ctx, client.Event{ID: "p0", Topic: "t", Payload: []byte("v")}, client.In(time.Hour), client.Partition(1))
	if !errors.Is(err, client.ErrConflict) {
		t.Errorf("Schedule of p0 for partition 1 = %v, want ErrConflict", err)
	}
	var inv *client.InvalidError
	_, err = c.Schedule(ctx, client.Event{ID: "bad", Topic: "t"}, client.In(time.Hour), client.Partition(-1))
	if !errors.As(err, &inv) || inv.Field != "event.partition" || !strings.Contains(inv.Rule, "must be 0 or more") {
		t.Errorf("Schedule with partition -1 = %v", err)
	}
	_, err = c.Schedule(ctx, client.Event{ID: "bad", Topic: "t", Payload: []byte("x")}, client.In(time.Hour), client.Tombstone())
	if !errors.As(err, &inv) || inv.Field != "event.payload" {
		t.Errorf("Schedule of a tombstone with a payload = %v", err)
	}
	_, err = c.Update(ctx, "z", client.SetPayload([]byte("x")))
	if !errors.As(err, &inv) || inv.Field != "payload" || status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Update giving a tombstone a payload = %#v", err)
	}
	if res, err := c.Update(ctx, "z", client.In(2*time.Hour)); err != nil || res.Version != 2 {
		t.Fatalf("Update of the tombstone's due time = %+v, %v", res, err)
	}
	if ev, err := c.Get(ctx, "z"); err != nil || !ev.Tombstone || ev.Partition != 3 || !ev.HasPartition {
		t.Errorf("Get after the update = %+v, %v; want the tombstone on partition 3 kept", ev, err)
	}
}

func TestUpdate(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	if _, err := c.Schedule(ctx, client.Event{ID: "u", Topic: "t", Key: []byte("k"), Payload: []byte("p"),
		Headers: []client.Header{{Key: "h", Value: []byte("v")}}}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Only the named fields change.
	res, err := c.Update(ctx, "u", client.SetPayload([]byte("p2")))
	if err != nil || res.Version != 2 || !res.Due.Equal(harnessStart.Add(time.Hour)) {
		t.Fatalf("Update = %+v, %v", res, err)
	}
	ev, _ := c.Get(ctx, "u")
	if string(ev.Key) != "k" || string(ev.Payload) != "p2" || len(ev.Headers) != 1 {
		t.Errorf("after SetPayload: %+v", ev)
	}
	// Empty key and nil headers remove them.
	if _, err := c.Update(ctx, "u", client.SetKey(nil), client.SetHeaders(nil), client.At(harnessStart.Add(2*time.Hour))); err != nil {
		t.Fatal(err)
	}
	ev, _ = c.Get(ctx, "u")
	if len(ev.Key) != 0 || len(ev.Headers) != 0 || string(ev.Payload) != "p2" || !ev.Due.Equal(harnessStart.Add(2*time.Hour)) || ev.Version != 3 {
		t.Errorf("after SetKey(nil), SetHeaders(nil), At: %+v", ev)
	}
	// Nothing to change is bad input.
	if _, err := c.Update(ctx, "u"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Update with no change = %v", err)
	}
	if _, err := c.Update(ctx, "nope", client.In(time.Hour)); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Update of an unknown id = %v", err)
	}
}

func TestUpdateFuncVersionRace(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	if _, err := c.Schedule(ctx, client.Event{ID: "race", Topic: "t", Payload: []byte("0")}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	res, err := c.UpdateFunc(ctx, "race", func(ev *client.Event) error {
		if calls.Add(1) == 1 {
			// Another writer gets there between the read and the write.
			if _, err := c.Update(ctx, "race", client.SetPayload([]byte("other"))); err != nil {
				return err
			}
		}
		ev.Payload = append(ev.Payload, '+')
		ev.Due = ev.Due.Add(time.Minute)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Errorf("fn called %d times, want 2 (once more after the race)", calls.Load())
	}
	ev, _ := c.Get(ctx, "race")
	if string(ev.Payload) != "other+" || res.Version != 3 || ev.Version != 3 || !ev.Due.Equal(harnessStart.Add(61*time.Minute)) {
		t.Errorf("after UpdateFunc: %+v, result %+v", ev, res)
	}

	// No change, no update.
	res, err = c.UpdateFunc(ctx, "race", func(*client.Event) error { return nil })
	if err != nil || res.Version != 3 {
		t.Errorf("UpdateFunc without a change = %+v, %v", res, err)
	}
	// fn's error is returned as it is.
	boom := errors.New("boom")
	if _, err := c.UpdateFunc(ctx, "race", func(*client.Event) error { return boom }); err != boom {
		t.Errorf("UpdateFunc = %v, want fn's error", err)
	}
	if _, err := c.UpdateFunc(ctx, "race", func(ev *client.Event) error { ev.Topic = "x"; return nil }); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("UpdateFunc changing the topic = %v", err)
	}
	// A writer that always wins runs the retries out.
	var n atomic.Int32
	_, err = c.UpdateFunc(ctx, "race", func(ev *client.Event) error {
		n.Add(1)
		if _, err := c.Update(ctx, "race", client.SetPayload(fmt.Appendf(nil, "w%d", n.Load()))); err != nil {
			return err
		}
		ev.Payload = []byte("mine")
		return nil
	})
	if !errors.Is(err, client.ErrConflict) || n.Load() < 2 {
		t.Errorf("UpdateFunc losing every race = %v after %d tries", err, n.Load())
	}
}

func TestScheduleBatchErrors(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	if _, err := c.Schedule(ctx, client.Event{ID: "b-taken", Topic: "t"}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	evs := []client.Event{
		{ID: "b0", Topic: "t"},
		{ID: "b1", Topic: "bad topic"},
		{ID: "b-taken", Topic: "other"},
		{ID: "b-taken", Topic: "t"},
		{Topic: "t"},
	}
	rs, err := c.ScheduleBatch(ctx, evs, client.In(time.Hour))
	var be *client.BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(evs) {
		t.Fatalf("ScheduleBatch error = %v, want a *BatchError of %d", err, len(evs))
	}
	if len(rs) != len(evs) {
		t.Fatalf("%d results", len(rs))
	}
	for i, r := range rs {
		if r.Err != be.Errs[i] {
			t.Errorf("results[%d].Err = %v, BatchError says %v", i, r.Err, be.Errs[i])
		}
	}
	if rs[0].Err != nil || rs[0].ID != "b0" || rs[0].Version != 1 {
		t.Errorf("results[0] = %+v", rs[0])
	}
	var inv *client.InvalidError
	if !errors.As(rs[1].Err, &inv) || inv.Field != "events[1].topic" {
		t.Errorf("results[1] = %+v", rs[1])
	}
	var ce *client.ConflictError
	if !errors.As(rs[2].Err, &ce) || ce.Version != 1 || ce.ID != "b-taken" {
		t.Errorf("results[2] = %+v", rs[2])
	}
	if rs[3].Err != nil || !rs[3].Existing {
		t.Errorf("results[3] = %+v", rs[3])
	}
	if rs[4].Err != nil || rs[4].ID == "" {
		t.Errorf("results[4] = %+v", rs[4])
	}
	if !errors.Is(err, client.ErrConflict) || !errors.Is(err, client.ErrInvalid) || errors.Is(err, client.ErrNotFound) {
		t.Errorf("errors.Is through %v", err)
	}

	rs, err = c.ScheduleBatch(ctx, []client.Event{{ID: "b5", Topic: "t"}}, client.In(time.Hour))
	if err != nil || len(rs) != 1 || rs[0].Err != nil {
		t.Errorf("a good batch = %+v, %v", rs, err)
	}
	if rs, err := c.ScheduleBatch(ctx, nil); rs != nil || err != nil {
		t.Errorf("an empty batch = %v, %v", rs, err)
	}
}

func TestListPaging(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	c := h.dial(t)
	ctx := testCtx(t)
	const n = 2500
	evs := make([]client.Event, n)
	for i := range evs {
		// Due times repeat, so the order falls back to the id.
		evs[i] = client.Event{ID: fmt.Sprintf("l-%05d", n-i), Topic: "t", Due: harnessStart.Add(time.Duration(i%7) * time.Minute)}
	}
	if _, err := c.ScheduleBatch(ctx, evs); err != nil {
		t.Fatal(err)
	}
	var got []client.Event
	for ev, err := range c.List(ctx, client.Filter{IDPrefix: "l-"}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if len(got) != n {
		t.Fatalf("List gave %d events, want %d", len(got), n)
	}
	if !slices.IsSortedFunc(got, func(a, b client.Event) int {
		if c := a.Due.Compare(b.Due); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	}) {
		t.Error("List is not in (due, id) order")
	}
	if f.n("List") != 3 {
		t.Errorf("%d List calls for %d events, want 3 pages", f.n("List"), n)
	}

	// Stopping early stops paging.
	before := f.n("List")
	i := 0
	for _, err := range c.List(ctx, client.Filter{IDPrefix: "l-", Topic: "t", DueAfter: harnessStart.Add(time.Minute)}) {
		if err != nil {
			t.Fatal(err)
		}
		if i++; i == 5 {
			break
		}
	}
	if f.n("List") != before+1 {
		t.Errorf("%d List calls after a break at the fifth event, want 1", f.n("List")-before)
	}

	// ListPage gives the same order a page at a time, each continuing
	// where the token of the one before left off.
	var paged []client.Event
	token := ""
	for {
		p, err := c.ListPage(ctx, client.Filter{IDPrefix: "l-"}, 1000, token)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Events) > 1000 {
			t.Fatalf("a page of %d events, asked for 1000", len(p.Events))
		}
		paged = append(paged, p.Events...)
		if token = p.Next; token == "" {
			break
		}
	}
	if !slices.EqualFunc(paged, got, func(a, b client.Event) bool { return a.ID == b.ID }) {
		t.Errorf("ListPage's pages hold %d events, not List's %d in its order", len(paged), len(got))
	}
	if _, err := c.ListPage(ctx, client.Filter{}, 1001, ""); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("ListPage of 1001 = %v, want ErrInvalid", err)
	}

	cnt, err := c.Count(ctx, client.Filter{IDPrefix: "l-", DueBefore: harnessStart.Add(time.Minute)})
	if err != nil || cnt != (n+6)/7 {
		t.Errorf("Count = %d, %v; want %d", cnt, err, (n+6)/7)
	}
	// An error ends the sequence, as its last pair.
	var errs int
	for _, err := range c.List(ctx, client.Filter{DueAfter: harnessStart.Add(time.Hour), DueBefore: harnessStart}) {
		if !errors.Is(err, client.ErrInvalid) {
			t.Errorf("List with an inverted range: %v", err)
		}
		errs++
	}
	if errs != 1 {
		t.Errorf("%d pairs from a failing List, want 1", errs)
	}
}

func TestCancelMatching(t *testing.T) {
	f := newFaults()
	h := newHarness(t, f.opts()...)
	c := h.dial(t, client.WithRetry(fastRetry))
	ctx := testCtx(t)
	var evs []client.Event
	for i := range 5 {
		evs = append(evs, client.Event{ID: fmt.Sprintf("cm-%d", i), Topic: "t"})
	}
	if _, err := c.ScheduleBatch(ctx, evs, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	h.Backend.Fire("cm-0", harnessStart, 1)

	res, err := c.CancelMatching(ctx, client.Filter{IDPrefix: "cm-"}, client.DryRun(true))
	if err != nil || res != (client.CancelMatchingResult{Matched: 4, Done: true}) {
		t.Errorf("dry run = %+v, %v", res, err)
	}
	if n, _ := c.Count(ctx, client.Filter{IDPrefix: "cm-", States: []client.State{client.StateScheduled}}); n != 4 {
		t.Errorf("a dry run cancelled something: %d pending", n)
	}

	// The first run is refused as a node going away would; the client runs
	// it again.
	f.before = failFirst("CancelMatching", 1, status.Error(codes.Unavailable, "shutting down"))
	var progress []client.CancelMatchingResult
	res, err = c.CancelMatching(ctx, client.Filter{IDPrefix: "cm-"}, client.OnProgress(func(r client.CancelMatchingResult) {
		progress = append(progress, r)
	}))
	if err != nil || res != (client.CancelMatchingResult{Matched: 4, Cancelled: 4, Done: true}) {
		t.Errorf("CancelMatching = %+v, %v", res, err)
	}
	if len(progress) == 0 || progress[len(progress)-1] != res {
		t.Errorf("progress %+v does not end with the totals", progress)
	}
	if f.n("CancelMatching") != 3 {
		t.Errorf("%d CancelMatching calls, want 3 (dry run, refused, run)", f.n("CancelMatching"))
	}
	if n, _ := c.Count(ctx, client.Filter{IDPrefix: "cm-", States: []client.State{client.StateCancelled}}); n != 4 {
		t.Errorf("%d cancelled, want 4", n)
	}
	if _, err := c.CancelMatching(ctx, client.Filter{}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("CancelMatching with an empty filter = %v", err)
	}
}

func TestShiftMatching(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	const n = 1500
	evs := make([]client.Event, n)
	for i := range evs {
		evs[i] = client.Event{ID: fmt.Sprintf("s-%04d", i), Topic: "t", Due: harnessStart.Add(time.Duration(i) * time.Second)}
	}
	if _, err := c.ScheduleBatch(ctx, append(evs, client.Event{ID: "other", Topic: "t", Due: harnessStart.Add(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	// One of them is cancelled before the shift: it is not listed.
	if err := c.Cancel(ctx, "s-0007"); err != nil {
		t.Fatal(err)
	}
	var last client.ShiftResult
	res, err := c.ShiftMatching(ctx, client.Filter{IDPrefix: "s-"}, time.Hour, func(p client.ShiftResult) { last = p })
	if err != nil || res.Matched != n-1 || res.Moved != n-1 || res.Skipped != 0 || !res.Done || last != res {
		t.Fatalf("ShiftMatching = %+v, %v (last progress %+v); want %d moved, done", res, err, last, n-1)
	}
	for _, id := range []string{"s-0000", "s-1499"} {
		ev, err := c.Get(ctx, id)
		i, _ := strconv.Atoi(id[2:])
		if err != nil || !ev.Due.Equal(harnessStart.Add(time.Duration(i)*time.Second+time.Hour)) || ev.Version != 2 {
			t.Errorf("%s after the shift: %+v, %v", id, ev, err)
		}
	}
	if ev, _ := c.Get(ctx, "other"); ev.Version != 1 {
		t.Errorf("an event outside the filter moved: %+v", ev)
	}
	for _, tc := range []struct {
		name string
		f    client.Filter
		by   time.Duration
		rule string
	}{
		{"no offset", client.Filter{IDPrefix: "s-"}, 0, "by"},
		{"every event", client.Filter{}, time.Hour, "filter"},
		{"priorities alone", client.Filter{Priorities: []int{9}}, time.Hour, "filter"},
		{"fired events", client.Filter{IDPrefix: "s-", States: []client.State{client.StateFired}}, time.Hour, "filter.states"},
	} {
		var inv *client.InvalidError
		if _, err := c.ShiftMatching(ctx, tc.f, tc.by, nil); !errors.As(err, &inv) || inv.Field != tc.rule {
			t.Errorf("%s: %v, want an InvalidError of %s", tc.name, err, tc.rule)
		}
	}
}
