package recurrence

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// TestDSTTransitions pins the occurrences of rules around transitions to
// instants worked out by hand from the zones' published rules: a civil time
// in a spring-forward gap occurs once, at the first instant after the gap;
// one repeated by a fall-back occurs once, at its first pass; an every rule
// ignores the zone.
func TestDSTTransitions(t *testing.T) {
	cases := []struct {
		name string
		spec Spec
		from string
		want []string // UTC
	}{
		// America/New_York 2026: EST→EDT at 02:00 on Sunday 8 March
		// (07:00Z); EDT→EST at 02:00 on Sunday 1 November (06:00Z).
		{"new york daily in the gap", Spec{Cron: "30 2 * * *", TimeZone: "America/New_York"}, "2026-03-07T00:00:00Z",
			[]string{"2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"new york every 20 min of the skipped hour, once", Spec{Cron: "*/20 2 * * *", TimeZone: "America/New_York"}, "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z"}},
		{"new york hourly over the gap", Spec{Cron: "0 * * * *", TimeZone: "America/New_York"}, "2026-03-08T04:30:00Z",
			[]string{"2026-03-08T05:00:00Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"new york daily in the overlap", Spec{Cron: "30 1 * * *", TimeZone: "America/New_York"}, "2026-10-31T00:00:00Z",
			[]string{"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"new york hourly over the overlap", Spec{Cron: "0 * * * *", TimeZone: "America/New_York"}, "2026-11-01T03:30:00Z",
			[]string{"2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"}},
		{"new york from inside the second pass", Spec{Cron: "*/15 * * * *", TimeZone: "America/New_York"}, "2026-11-01T06:20:00Z",
			[]string{"2026-11-01T07:00:00Z", "2026-11-01T07:15:00Z"}},
		{"new york seconds field over the gap", Spec{Cron: "58,59 59 1 * * *", TimeZone: "America/New_York"}, "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T06:59:58Z", "2026-03-08T06:59:59Z", "2026-03-09T05:59:58Z"}},
		{"new york every hour ignores the zone", Spec{Every: time.Hour, Start: time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC), TimeZone: "America/New_York"}, "2026-03-08T05:30:00Z",
			[]string{"2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"new york @every is anchored at start", Spec{Cron: "@every 90m", Start: time.Date(2026, 11, 1, 4, 0, 0, 0, time.UTC), TimeZone: "America/New_York"}, "2026-11-01T00:00:00Z",
			[]string{"2026-11-01T04:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z"}},

		// Past New York's last listed transition Go derives offsets from
		// its POSIX rule a year at a time, and in the last day of a leap
		// year reports a zone period that ends before the instant asked
		// about (zoneBounds mends it).
		{"new york over the end of a leap year", Spec{Cron: "0 * * * *", TimeZone: "America/New_York"}, "2028-12-30T23:30:00Z",
			[]string{"2028-12-31T00:00:00Z", "2028-12-31T01:00:00Z", "2028-12-31T02:00:00Z"}},

		// Europe/Paris 2026: CET→CEST at 02:00 on Sunday 29 March (01:00Z);
		// CEST→CET at 03:00 on Sunday 25 October (01:00Z).
		{"paris daily in the gap", Spec{Cron: "30 2 * * *", TimeZone: "Europe/Paris"}, "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"paris daily in the overlap", Spec{Cron: "30 2 * * *", TimeZone: "Europe/Paris"}, "2026-10-24T00:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"paris sundays at 2:00", Spec{Cron: "0 2 * * SUN", TimeZone: "Europe/Paris"}, "2026-03-20T00:00:00Z",
			[]string{"2026-03-22T01:00:00Z", "2026-03-29T01:00:00Z", "2026-04-05T00:00:00Z"}},

		// Australia/Lord_Howe 2026, a 30-minute shift: +11:00→+10:30 at
		// 02:00 on Sunday 5 April (15:00Z, 01:30-02:00 repeats);
		// +10:30→+11:00 at 02:00 on Sunday 4 October (15:30Z, 02:00-02:30
		// is skipped).
		{"lord howe daily in the gap", Spec{Cron: "15 2 * * *", TimeZone: "Australia/Lord_Howe"}, "2026-10-02T00:00:00Z",
			[]string{"2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"}},
		{"lord howe daily in the overlap", Spec{Cron: "45 1 * * *", TimeZone: "Australia/Lord_Howe"}, "2026-04-03T00:00:00Z",
			[]string{"2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"}},
		{"lord howe every 10 min through the overlap", Spec{Cron: "*/10 1 * * *", TimeZone: "Australia/Lord_Howe"}, "2026-04-04T14:25:00Z",
			[]string{"2026-04-04T14:30:00Z", "2026-04-04T14:40:00Z", "2026-04-04T14:50:00Z", "2026-04-05T14:30:00Z"}},

		// Pacific/Apia changed its rules: it left -10:00 (daylight time
		// of -11) for +14:00 at the end of 29 December 2011 (10:00Z), and
		// 30 December 2011 never happened there.
		{"apia's missing day", Spec{Cron: "0 12 * * *", TimeZone: "Pacific/Apia"}, "2011-12-29T00:00:00Z",
			[]string{"2011-12-29T22:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"}},
		// America/Sao_Paulo sprang forward at midnight, so that 4 November
		// 2018 began at 01:00 (03:00Z); it kept -03:00 all year from 2019.
		{"sao paulo's missing midnight", Spec{Cron: "0 0 * * *", TimeZone: "America/Sao_Paulo"}, "2018-11-02T12:00:00Z",
			[]string{"2018-11-03T03:00:00Z", "2018-11-04T03:00:00Z", "2018-11-05T02:00:00Z"}},
		{"sao paulo after it dropped daylight time", Spec{Cron: "0 0 * * *", TimeZone: "America/Sao_Paulo"}, "2019-11-02T12:00:00Z",
			[]string{"2019-11-03T03:00:00Z", "2019-11-04T03:00:00Z", "2019-11-05T03:00:00Z"}},
		{"sao paulo's last overlap", Spec{Cron: "30 23 * * *", TimeZone: "America/Sao_Paulo"}, "2019-02-15T12:00:00Z",
			[]string{"2019-02-16T01:30:00Z", "2019-02-17T01:30:00Z", "2019-02-18T02:30:00Z"}},

		// Start and end bound the occurrences, both inclusive.
		{"start and end", Spec{Cron: "0 0 * * *", Start: time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 1, 4, 0, 0, 0, 0, time.UTC)}, "2025-06-01T00:00:00Z",
			[]string{"2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"}},
		{"every stops at end", Spec{Every: 40 * time.Second, Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 1, 1, 0, 2, 0, 0, time.UTC)}, "2026-01-01T00:00:30Z",
			[]string{"2026-01-01T00:00:40Z", "2026-01-01T00:01:20Z", "2026-01-01T00:02:00Z"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Parse(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			at := mustTime(t, c.from)
			var got []string
			for range len(c.want) + 1 {
				next, ok := r.Next(at)
				if !ok {
					break
				}
				got = append(got, next.UTC().Format(time.RFC3339))
				at = next
			}
			if !c.spec.End.IsZero() {
				// The rule has no occurrence past the ones listed.
				if len(got) != len(c.want) {
					t.Fatalf("got %v, want %v and no more", got, c.want)
				}
			} else {
				got = got[:len(c.want)]
			}
			if strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Fatalf("got  %v\nwant %v", got, c.want)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		spec  Spec
		field string
		rule  string
	}{
		{Spec{}, "cron", "needs cron or every"},
		{Spec{Cron: "* * * * *", Every: time.Minute, Start: start}, "every", "both set"},
		{Spec{Cron: "@every 1m", Every: time.Minute, Start: start}, "cron", "both set"},
		{Spec{Cron: "61 * * * *"}, "cron", "above maximum"},
		{Spec{Cron: "* * * *"}, "cron", "expected 5 to 6 fields"},
		{Spec{Cron: "0 0 30 2 *"}, "cron", "matches no date"},
		{Spec{Cron: "CRON_TZ=Europe/Paris 0 0 * * *"}, "cron", "set time_zone"},
		{Spec{Cron: "@every soon", Start: start}, "cron", "not a duration"},
		{Spec{Every: 500 * time.Millisecond, Start: start}, "every", "shorter than 1s"},
		{Spec{Every: time.Second + time.Microsecond, Start: start}, "every", "whole number of milliseconds"},
		{Spec{Every: time.Minute}, "start", "needs a start"},
		{Spec{Every: time.Minute, Start: start.Add(time.Microsecond)}, "start", "whole millisecond"},
		{Spec{Cron: "@daily", TimeZone: "Mars/Olympus_Mons"}, "time_zone", "not an IANA time zone name"},
		{Spec{Cron: "@daily", TimeZone: "Local"}, "time_zone", "not an IANA time zone name"},
		{Spec{Cron: "@daily", Start: time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC)}, "start", "outside"},
		{Spec{Cron: "@daily", Start: start, End: start.Add(-time.Second)}, "end", "before start"},
		{Spec{Cron: "@daily", Jitter: -time.Second}, "jitter", "outside"},
		{Spec{Cron: "@daily", Jitter: 25 * time.Hour}, "jitter", "outside"},
	}
	for _, c := range cases {
		_, err := Parse(c.spec)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(fe.Rule, c.rule) {
			t.Errorf("Parse(%+v) = %v, want a %s error containing %q", c.spec, err, c.field, c.rule)
		}
	}
}

// TestLatest checks Latest against Next: the latest occurrence at or
// before t is the one Next gives from just before it, and Next of it is
// after t.
func TestLatest(t *testing.T) {
	for _, spec := range []Spec{
		{Cron: "*/7 * * * * *", TimeZone: "Europe/Paris"},
		{Cron: "30 2 * * *", TimeZone: "America/New_York"},
		{Cron: "0 0 29 2 *"},
		{Every: 90 * time.Second, Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		r, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"2026-03-08T07:00:00Z", "2026-03-08T07:00:01Z", "2026-11-01T06:30:00Z", "2026-02-01T00:00:00Z"} {
			at := mustTime(t, s)
			latest, ok := r.Latest(at)
			if !ok {
				t.Fatalf("%+v: no occurrence before %v", spec, at)
			}
			if latest.After(at) {
				t.Fatalf("%+v: Latest(%v) = %v, after it", spec, at, latest)
			}
			if next, _ := r.Next(latest); !next.After(at) {
				t.Fatalf("%+v: Latest(%v) = %v, but %v is later and not after it", spec, at, latest, next)
			}
			if again, _ := r.Next(latest.Add(-1)); !again.Equal(latest) {
				t.Fatalf("%+v: Latest(%v) = %v is not an occurrence (Next before it is %v)", spec, at, latest, again)
			}
		}
	}
	// Before the start there is none.
	r, _ := Parse(Spec{Cron: "@hourly", Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	if at, ok := r.Latest(time.Date(2025, 12, 31, 23, 0, 0, 0, time.UTC)); ok {
		t.Fatalf("Latest before the start = %v", at)
	}
}

func TestJitter(t *testing.T) {
	r, err := Parse(Spec{Cron: "* * * * * *", Jitter: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	seen := map[time.Duration]bool{}
	for i := range 1000 {
		at := base.Add(time.Duration(i) * time.Second)
		j := r.Jitter("s", at)
		if j < 0 || j >= 10*time.Second {
			t.Fatalf("jitter %v outside [0, 10s)", j)
		}
		if r.Jitter("s", at) != j {
			t.Fatal("jitter differs for the same occurrence")
		}
		seen[j] = true
	}
	if len(seen) < 990 {
		t.Fatalf("%d distinct delays in 1000 occurrences: not spread", len(seen))
	}
	if r.Jitter("s", base) == r.Jitter("t", base) {
		t.Fatal("two schedules share a delay for one occurrence")
	}
	none, _ := Parse(Spec{Cron: "@daily"})
	if none.Jitter("s", base) != 0 {
		t.Fatal("jitter without a jitter")
	}
}
