package main

import (
	"testing"
	"time"
)

// TestRetentionFlag: --retention takes Go durations and days, refuses what
// is neither or negative, and prints days back when it is whole days.
func TestRetentionFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour, "36h": 36 * time.Hour, "2m": 2 * time.Minute, "0": 0, "0d": 0,
	} {
		var d daysDuration
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for _, in := range []string{"", "7 days", "-1h", "-2d", "d", "1e9d"} {
		var d daysDuration
		if err := d.Set(in); err == nil {
			t.Errorf("Set(%q) = %v, want an error", in, time.Duration(d))
		}
	}
	if s := (daysDuration(7 * 24 * time.Hour)).String(); s != "7d" {
		t.Errorf("7 days prints %q, want 7d", s)
	}
	if s := (daysDuration(90 * time.Minute)).String(); s != "1h30m0s" {
		t.Errorf("90 minutes prints %q", s)
	}
}
