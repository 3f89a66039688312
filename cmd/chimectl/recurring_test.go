package main

import (
	"strings"
	"testing"
)

// TestRecurringCommands drives chimectl recurring through create, get (the next five times in
// the schedule's zone and UTC, across Paris's spring-forward), update, pause, resume, list
// and delete, and its usage errors.
func TestRecurringCommands(t *testing.T) {
	addr, _ := startChime(t)
	env := map[string]string{"CHIME_ADDR": addr}
	r := chimectl(t, env, "", "recurring", "create", "--id", "nightly", "--topic", "reports", "--cron", "30 2 * * *", "--tz", "Europe/Paris", "--payload", "run")
	if r.code != 0 || !strings.Contains(r.stdout, "created recurring schedule nightly") ||
		!strings.Contains(r.stdout, `cron "30 2 * * *" in Europe/Paris`) ||
		!strings.Contains(r.stdout, "2026-03-02 02:30:00 CET  (2026-03-02T01:30:00Z)") ||
		!strings.Contains(r.stdout, "event nightly@1772415000000") {
		t.Fatalf("create: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "create", "--id", "nightly", "--topic", "reports", "--cron", "30 2 * * *", "--tz", "Europe/Paris", "--payload", "run"); r.code != 0 || !strings.Contains(r.stdout, "exists already") {
		t.Fatalf("create again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "create", "--id", "nightly", "--topic", "reports", "--cron", "0 3 * * *"); r.code != 1 || !strings.Contains(r.stderr, "AlreadyExists") {
		t.Fatalf("create with another rule: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Starting on 26 March, the fourth occurrence is on 29 March, whose 02:30 the
	// spring-forward skips: it occurs at 03:00 CEST.
	r = chimectl(t, env, "", "recurring", "create", "--id", "spring", "--topic", "reports", "--cron", "30 2 * * *", "--tz", "Europe/Paris", "--start", "2026-03-26T00:00:00Z")
	if r.code != 0 {
		t.Fatalf("create spring: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = chimectl(t, env, "", "recurring", "get", "spring")
	for _, want := range []string{
		"2026-03-26 02:30:00 CET  (2026-03-26T01:30:00Z)",
		"2026-03-28 02:30:00 CET  (2026-03-28T01:30:00Z)",
		"2026-03-29 03:00:00 CEST  (2026-03-29T01:00:00Z)",
		"2026-03-30 02:30:00 CEST  (2026-03-30T00:30:00Z)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get lacks %q:\n%s", want, r.stdout)
		}
	}

	if r := chimectl(t, env, "", "recurring", "update", "nightly", "--topic", "reports-v2"); r.code != 0 || !strings.Contains(r.stdout, "version 2") || !strings.Contains(r.stdout, "topic reports-v2") || !strings.Contains(r.stdout, `cron "30 2 * * *" in Europe/Paris`) {
		t.Fatalf("update of the target: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "pause", "nightly"); r.code != 0 || !strings.Contains(r.stdout, "paused, version 2") || !strings.Contains(r.stdout, "resumes from") {
		t.Fatalf("pause: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "recurring", "resume", "nightly"); r.code != 0 || !strings.Contains(r.stdout, "active, version 2") {
		t.Fatalf("resume: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = chimectl(t, env, "", "recurring", "list")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "nightly ") || !strings.HasPrefix(lines[2], "spring ") {
		t.Fatalf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := chimectl(t, env, "", "--json", "recurring", "get", "nightly"); r.code != 0 || !strings.Contains(r.stdout, `"next_event_id":"nightly@`) {
		t.Fatalf("get --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	chimectl(t, env, "", "recurring", "delete", "nightly").want(t, 0, "deleted recurring schedule nightly\n", "")
	if r := chimectl(t, env, "", "recurring", "get", "nightly"); r.code != 1 || !strings.Contains(r.stderr, "NotFound") {
		t.Fatalf("get after delete: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"recurring"}, "give an action"},
		{[]string{"recurring", "explode"}, `unknown action "explode"`},
		{[]string{"recurring", "get"}, "exactly one schedule id"},
		{[]string{"recurring", "get", "x", "--cron", "* * * * *"}, "recurring get does not take --cron"},
		{[]string{"recurring", "create", "--id", "x", "--topic", "t"}, "set --cron or --every"},
		{[]string{"recurring", "create", "--id", "x", "--topic", "t", "--cron", "@daily", "--every", "1m"}, "exactly one of --cron and --every"},
		{[]string{"recurring", "create", "--id", "x", "--topic", "t", "--cron", "@daily", "--catch-up", "some"}, `--catch-up "some"`},
		{[]string{"recurring", "update", "x"}, "nothing to change"},
		{[]string{"recurring", "update", "x", "--payload", "p"}, "--topic is required"},
	} {
		r := chimectl(t, env, "", c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 2 with %q", c.args, r.code, r.stderr, c.msg)
		}
	}
}
