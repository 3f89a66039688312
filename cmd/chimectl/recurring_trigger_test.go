package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRecurringTriggerAndBackfill drives chimectl recurring trigger (the same time on a
// retry: one occurrence) and backfill (relative and RFC 3339 times, a retry finding what
// the first made), and their usage errors.
func TestRecurringTriggerAndBackfill(t *testing.T) {
	addr, _ := startChime(t)
	env := map[string]string{"CHIME_ADDR": addr}
	if r := chimectl(t, env, "", "recurring", "create", "--id", "hourly", "--topic", "reports", "--every", "1h", "--start", "2026-03-01T02:00:00Z"); r.code != 0 {
		t.Fatalf("create: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	eid := fmt.Sprintf("hourly@%d", t0.UnixMilli())
	r := chimectl(t, env, "", "recurring", "trigger", "hourly")
	if r.code != 0 || !strings.Contains(r.stdout, "triggered occurrence "+eid+" of recurring schedule hourly") || !strings.Contains(r.stdout, "due") {
		t.Fatalf("trigger: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// This test's clock does not move: the same time, so the same occurrence.
	if r := chimectl(t, env, "", "recurring", "trigger", "hourly"); r.code != 0 || !strings.Contains(r.stdout, "exists already, not triggered again: occurrence "+eid) {
		t.Fatalf("trigger again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "--json", "recurring", "trigger", "hourly"); r.code != 0 || !strings.Contains(r.stdout, `"event_id":"`+eid+`"`) || !strings.Contains(r.stdout, `"existing":true`) {
		t.Fatalf("trigger --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// -10h to -5h: 02:00 to 06:00, five hourly times.
	r = chimectl(t, env, "", "recurring", "backfill", "hourly", "--from", "-10h", "--to", "-5h")
	if r.code != 0 || !strings.Contains(r.stdout, "backfilled recurring schedule hourly from 2026-03-01T02:00:00Z to 2026-03-01T07:00:00Z: 5 created, 0 existed already") ||
		!strings.Contains(r.stdout, fmt.Sprintf("2026-03-01T02:00:00Z  hourly@%d", time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC).UnixMilli())) {
		t.Fatalf("backfill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "backfill", "hourly", "--from", "2026-03-01T02:00:00Z", "--to", "2026-03-01T07:00:00Z"); r.code != 0 || !strings.Contains(r.stdout, "0 created, 5 existed already") {
		t.Fatalf("backfill again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// --to defaults to now: 07:00 to 11:00 are new, 12:00 (now) is not in [from, now).
	if r := chimectl(t, env, "", "--json", "recurring", "backfill", "hourly", "--from", "-5h"); r.code != 0 || !strings.Contains(r.stdout, `"created":5`) || !strings.Contains(r.stdout, `"created_occurrences":[`) {
		t.Fatalf("backfill --json to now: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "backfill", "hourly", "--from", "-1h", "--to", "2h"); r.code != 1 || !strings.Contains(r.stderr, "InvalidArgument") || !strings.Contains(r.stderr, "to:") {
		t.Fatalf("backfill into the future: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "trigger", "nope"); r.code != 1 || !strings.Contains(r.stderr, "NotFound") {
		t.Fatalf("trigger of an unknown schedule: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"recurring", "trigger"}, "exactly one schedule id"},
		{[]string{"recurring", "trigger", "hourly", "--from", "-1h"}, "recurring trigger does not take --from"},
		{[]string{"recurring", "backfill", "hourly"}, "wants --from"},
		{[]string{"recurring", "backfill", "hourly", "--from", "yesterday"}, `--from "yesterday" is neither an RFC 3339 time`},
		{[]string{"recurring", "backfill", "hourly", "--from", "-1h", "--to", "-2h"}, "is not before --to"},
		{[]string{"recurring", "get", "hourly", "--to", "-1h"}, "recurring get does not take --to"},
	} {
		r := chimectl(t, env, "", c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 2 with %q", c.args, r.code, r.stderr, c.msg)
		}
	}
}
