package recurrence

import (
	"testing"
	"time"
)

// BenchmarkNext is the cost the state machine pays per occurrence it
// materialises.
func BenchmarkNext(b *testing.B) {
	for _, c := range []struct {
		name string
		spec Spec
	}{
		{"cron-seconds-utc", Spec{Cron: "* * * * * *"}},
		{"cron-seconds-new_york", Spec{Cron: "* * * * * *", TimeZone: "America/New_York"}},
		{"cron-daily-paris", Spec{Cron: "30 2 * * *", TimeZone: "Europe/Paris"}},
		{"every", Spec{Every: time.Second, Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			r, err := Parse(c.spec)
			if err != nil {
				b.Fatal(err)
			}
			at := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
			for b.Loop() {
				at, _ = r.Next(at)
			}
		})
	}
}
