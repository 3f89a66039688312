package client_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/chimehq/chime/client"
)

// TestFilterByPriority: List, ListPage, Count, ShiftMatching and
// CancelMatching select by
// priority through the server, an event scheduled without a priority being
// one of priority 5, and a priority outside 0..9 is refused by field before
// anything is sent.
func TestFilterByPriority(t *testing.T) {
	h := newHarness(t)
	c := h.dial(t)
	ctx := testCtx(t)
	schedule := func(id, topic string, opts ...client.ScheduleOption) {
		t.Helper()
		if _, err := c.Schedule(ctx, client.Event{ID: id, Topic: topic}, append(opts, client.In(time.Hour))...); err != nil {
			t.Fatalf("schedule %s: %v", id, err)
		}
	}
	schedule("pr-default", "payments")
	schedule("pr-9", "payments", client.Priority(9))
	schedule("pr-9-other", "mail", client.Priority(9))
	schedule("pr-0", "payments", client.Priority(0))
	schedule("pr-5", "payments", client.Priority(5))

	ids := func(f client.Filter) []string {
		t.Helper()
		var out []string
		for ev, err := range c.List(ctx, f) {
			if err != nil {
				t.Fatalf("List(%+v): %v", f, err)
			}
			out = append(out, ev.ID)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		f    client.Filter
		want []string
	}{
		{client.Filter{IDPrefix: "pr-", Priorities: []int{5}}, []string{"pr-5", "pr-default"}},
		{client.Filter{Topic: "payments", Priorities: []int{9}}, []string{"pr-9"}},
		{client.Filter{IDPrefix: "pr-", Priorities: []int{0, 9}}, []string{"pr-0", "pr-9", "pr-9-other"}},
		{client.Filter{IDPrefix: "pr-", Priorities: []int{1}}, nil},
		{client.Filter{IDPrefix: "pr-"}, []string{"pr-0", "pr-5", "pr-9", "pr-9-other", "pr-default"}},
	} {
		if got := ids(tc.f); !slices.Equal(got, tc.want) {
			t.Errorf("List(%+v) = %v, want %v", tc.f, got, tc.want)
		}
		if n, err := c.Count(ctx, tc.f); err != nil || n != int64(len(tc.want)) {
			t.Errorf("Count(%+v) = %d, %v; want %d", tc.f, n, err, len(tc.want))
		}
	}
	p, err := c.ListPage(ctx, client.Filter{IDPrefix: "pr-", Priorities: []int{9}}, 1, "")
	if err != nil || len(p.Events) != 1 || p.Next == "" {
		t.Fatalf("ListPage of priority 9 = %+v, %v; want one event and a token", p, err)
	}
	// A token belongs to its filter, priorities included.
	if _, err := c.ListPage(ctx, client.Filter{IDPrefix: "pr-", Priorities: []int{0}}, 1, p.Next); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("ListPage with the token of another priority = %v, want ErrInvalid", err)
	}
	if p2, err := c.ListPage(ctx, client.Filter{IDPrefix: "pr-", Priorities: []int{9}}, 1, p.Next); err != nil || len(p2.Events) != 1 || p2.Events[0].ID == p.Events[0].ID {
		t.Errorf("the second page of priority 9 = %+v, %v", p2, err)
	}

	sh, err := c.ShiftMatching(ctx, client.Filter{IDPrefix: "pr-", Priorities: []int{0}}, time.Hour, nil)
	if err != nil || sh.Matched != 1 || sh.Moved != 1 {
		t.Fatalf("ShiftMatching of priority 0 = %+v, %v; want the one event moved", sh, err)
	}
	if ev, err := c.Get(ctx, "pr-0"); err != nil || ev.Version != 2 {
		t.Fatalf("pr-0 after the shift: %+v, %v; want version 2", ev, err)
	}

	res, err := c.CancelMatching(ctx, client.Filter{Topic: "payments", Priorities: []int{9, 5}})
	if err != nil || res.Matched != 3 || res.Cancelled != 3 || !res.Done {
		t.Fatalf("CancelMatching of priorities 9 and 5 of payments = %+v, %v; want 3 cancelled", res, err)
	}
	if got, want := ids(client.Filter{IDPrefix: "pr-", States: []client.State{client.StateScheduled}}), []string{"pr-0", "pr-9-other"}; !slices.Equal(got, want) {
		t.Errorf("pending after the cancel: %v, want %v", got, want)
	}

	for _, bad := range [][]int{{10}, {5, -1}} {
		f := client.Filter{IDPrefix: "pr-", Priorities: bad}
		var ie *client.InvalidError
		if _, err := c.Count(ctx, f); !errors.As(err, &ie) || ie.Field != "filter.priorities["+string(rune('0'+len(bad)-1))+"]" {
			t.Errorf("Count with priorities %v = %v, want an InvalidError naming the field", bad, err)
		}
		if _, err := c.CancelMatching(ctx, f); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("CancelMatching with priorities %v = %v, want ErrInvalid", bad, err)
		}
	}
}
