package recurrence

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// propertyZones have transitions of every kind: an hour each way at 02:00
// or 03:00, at midnight (Santiago, Sao Paulo), by 30 minutes (Lord Howe),
// from +12:45 (Chatham), by two hours (Troll), a day skipped (Apia), and
// daylight time suspended for Ramadan (Casablanca).
var propertyZones = []string{
	"America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Pacific/Apia",
	"America/Sao_Paulo", "America/Santiago", "Pacific/Chatham", "Antarctica/Troll",
	"Africa/Casablanca", "Europe/London", "UTC",
}

// TestOccurrencesMatchStepByStep compares Next, for random rules and
// ranges around transitions, with an independent computation that walks
// the range one second at a time: an instant is an occurrence when its
// wall-clock time matches the fields and that wall-clock time has not
// been seen before (the first pass through an overlap), or when the zone
// jumps forward at it over a wall-clock time that matches (a gap).
func TestOccurrencesMatchStepByStep(t *testing.T) {
	seed := rand.Uint64() // new cases each run; failures print the seed that replays them
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	cases := 40
	if testing.Short() {
		cases = 10
	}
	for i := range cases {
		zone := propertyZones[rng.IntN(len(propertyZones))]
		loc, err := LoadZone(zone)
		if err != nil {
			t.Fatal(err)
		}
		expr := randomCron(rng)
		from := nearTransition(rng, loc)
		to := from.Add(time.Duration(1+rng.IntN(36*60)) * time.Minute)
		spec := Spec{Cron: expr, TimeZone: zone}
		if rng.IntN(3) == 0 {
			spec.Start = from.Add(time.Duration(rng.IntN(6*3600)) * time.Second)
		}
		if rng.IntN(3) == 0 {
			spec.End = to.Add(-time.Duration(rng.IntN(6*3600)) * time.Second)
			if spec.End.Before(spec.Start) {
				spec.End = spec.Start
			}
		}
		r, err := Parse(spec)
		if err != nil {
			if strings.Contains(err.Error(), "matches no date") {
				continue
			}
			t.Fatalf("seed %d: Parse(%q): %v", seed, expr, err)
		}
		desc := fmt.Sprintf("seed %d case %d: %q in %s over [%v, %v], start %v, end %v", seed, i, expr, zone, from, to, spec.Start, spec.End)

		var got []time.Time
		for at := from.Add(-1); ; {
			next, ok := r.Next(at)
			if !ok || next.After(to) {
				break
			}
			if !next.After(at) {
				t.Fatalf("%s: Next(%v) = %v, not after it", desc, at, next)
			}
			if (!spec.Start.IsZero() && next.Before(spec.Start)) || (!spec.End.IsZero() && next.After(spec.End)) {
				t.Fatalf("%s: occurrence %v outside [start, end]", desc, next)
			}
			got = append(got, next)
			at = next
		}
		want := stepByStep(r, loc, from, to, spec.Start, spec.End)
		if !slices.EqualFunc(got, want, time.Time.Equal) {
			t.Fatalf("%s:\n got  %d %v\n want %d %v", desc, len(got), brief(got), len(want), brief(want))
		}
	}
}

// stepByStep is the reference: it reads r's fields but none of its code.
func stepByStep(r *Rule, loc *time.Location, from, to, start, end time.Time) []time.Time {
	wall := func(u time.Time) int64 {
		_, off := u.In(loc).Zone()
		return u.Unix() + int64(off)
	}
	// Walking from a day before the range sees the first pass of any
	// overlap the range begins in.
	lead := from.Add(-26 * time.Hour).Truncate(time.Second)
	seen := make(map[int64]bool)
	prev := wall(lead.Add(-time.Second))
	var out []time.Time
	for u := lead; !u.After(to); u = u.Add(time.Second) {
		w := wall(u)
		occurs := false
		if !seen[w] {
			seen[w] = true
			occurs = fieldsMatch(r, w)
		}
		for skipped := prev + 1; skipped < w && !occurs; skipped++ {
			occurs = fieldsMatch(r, skipped)
		}
		prev = w
		if occurs && !u.Before(from) && (start.IsZero() || !u.Before(start)) && (end.IsZero() || !u.After(end)) {
			out = append(out, u)
		}
	}
	return out
}

// fieldsMatch reports whether the wall-clock time w (Unix seconds of the
// wall clock read as UTC) matches every field of r, by cron's rule that
// day of month and day of week are ORed when both are restricted.
func fieldsMatch(r *Rule, w int64) bool {
	c := time.Unix(w, 0).UTC()
	s := r.civil
	bit := func(mask uint64, v int) bool { return mask&(1<<uint(v)) != 0 }
	if !bit(s.Second, c.Second()) || !bit(s.Minute, c.Minute()) || !bit(s.Hour, c.Hour()) || !bit(s.Month, int(c.Month())) {
		return false
	}
	const star = 1 << 63
	dom, dow := bit(s.Dom, c.Day()), bit(s.Dow, int(c.Weekday()))
	if s.Dom&star != 0 || s.Dow&star != 0 {
		return dom && dow
	}
	return dom || dow
}

// nearTransition returns an instant up to a day before one of loc's
// transitions between 2000 and 2035, or a random instant for a zone
// without any.
func nearTransition(rng *rand.Rand, loc *time.Location) time.Time {
	var transitions []time.Time
	for t := time.Date(2000, 1, 1, 0, 0, 0, 0, loc); t.Year() < 2035; {
		_, end := zoneBounds(t)
		if end.IsZero() {
			break
		}
		transitions = append(transitions, end)
		t = end
	}
	if len(transitions) == 0 {
		return time.Date(2000+rng.IntN(35), 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.IntN(365*24)) * time.Hour)
	}
	at := transitions[rng.IntN(len(transitions))]
	return at.Add(-time.Duration(rng.IntN(24*3600)) * time.Second).UTC()
}

// randomCron writes a cron expression dense enough to occur near a
// transition: hours leaning to the small hours, where zones change.
func randomCron(rng *rand.Rand) string {
	pick := func(opts ...string) string { return opts[rng.IntN(len(opts))] }
	var fields []string
	if rng.IntN(3) == 0 {
		fields = append(fields, pick("*", "*/7", "0,30", "15-20", "59", fmt.Sprint(rng.IntN(60))))
	}
	fields = append(fields,
		pick("*", "*/5", "*/13", "0", "30", "0,15,30,45", "10-20", fmt.Sprint(rng.IntN(60))),
		pick("*", "*", "0-4", "1", "2", "3", "1,2,3", "*/2", "0", "23", fmt.Sprint(rng.IntN(24))),
		pick("*", "*", "*", "1-15", fmt.Sprint(1+rng.IntN(31))),
		pick("*", "*", "*", "3,4,10,11", fmt.Sprint(1+rng.IntN(12))),
		pick("*", "*", "*", "0", "1-5", "SAT,SUN"),
	)
	return strings.Join(fields, " ")
}

func brief(ts []time.Time) string {
	if len(ts) > 8 {
		return fmt.Sprint(ts[:4], " ... ", ts[len(ts)-4:])
	}
	return fmt.Sprint(ts)
}

// TestEveryMatchesArithmetic checks the every rule against the anchor
// plus whole intervals.
func TestEveryMatchesArithmetic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		start := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(10 * 365 * 24 * time.Hour)))).Truncate(time.Millisecond)
		every := time.Duration(1+rng.Int64N(int64(48*time.Hour/time.Millisecond))) * time.Millisecond
		if every < MinEvery {
			every = MinEvery
		}
		r, err := Parse(Spec{Every: every, Start: start, TimeZone: "Europe/Paris"})
		if err != nil {
			t.Fatal(err)
		}
		at := start.Add(time.Duration(rng.Int64N(int64(100 * every))))
		next, ok := r.Next(at)
		k := at.Sub(start)/every + 1
		if want := start.Add(k * every); !ok || !next.Equal(want) {
			t.Fatalf("every %v from %v: Next(%v) = %v, want %v", every, start, at, next, want)
		}
		if onto, _ := r.Next(next.Add(-1)); !onto.Equal(next) {
			t.Fatalf("every %v from %v: Next just before %v is %v", every, start, next, onto)
		}
	}
}
