package recurrence

import (
	"testing"
	"time"
)

// FuzzParse: a rule as a client writes it (a cron expression, an interval, a zone name)
// never makes Parse panic; a rule it accepts yields strictly increasing occurrences inside
// its bounds, and Latest of an occurrence is that occurrence. cron/v3 parses the expression;
// the rest is this package's, and the state machine runs it on apply, where a panic would
// stop the replica.
func FuzzParse(f *testing.F) {
	for _, c := range []string{"* * * * *", "*/7 * * * * *", "0 30 2 * * SUN", "@daily", "@every 90s", "0 0 29 2 *",
		"15-20 */13 1,2,3 * 2 0", "TZ=UTC * * * * *", "61 * * * *", "@every -1s", ""} {
		f.Add(c, int64(0), "Europe/Paris", int64(1767225600), int64(0))
	}
	f.Add("", int64(time.Second), "Australia/Lord_Howe", int64(1767225600), int64(1767225700))
	f.Add("", int64(1500*time.Millisecond), "", int64(0), int64(0))
	f.Fuzz(func(t *testing.T, cron string, every int64, zone string, startSec, endSec int64) {
		spec := Spec{Cron: cron, Every: time.Duration(every), TimeZone: zone}
		if startSec != 0 {
			spec.Start = time.Unix(startSec, 0)
		}
		if endSec != 0 {
			spec.End = time.Unix(endSec, 0)
		}
		r, err := Parse(spec)
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("Parse error %v is not a *FieldError", err)
			}
			return
		}
		at := time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)
		if !spec.Start.IsZero() {
			at = spec.Start.Add(-time.Second)
		}
		for range 5 {
			next, ok := r.Next(at)
			if !ok {
				return
			}
			if !next.After(at) || !spec.Start.IsZero() && next.Before(spec.Start) || !spec.End.IsZero() && next.After(spec.End) {
				t.Fatalf("%+v: Next(%v) = %v", spec, at, next)
			}
			if latest, ok := r.Latest(next); !ok || !latest.Equal(next) {
				t.Fatalf("%+v: Latest(%v) = %v, %v", spec, next, latest, ok)
			}
			at = next
		}
	})
}
