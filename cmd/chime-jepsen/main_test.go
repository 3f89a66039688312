package main

import (
	"strings"
	"testing"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
)

// TestSummaryShowsBursts: the summary line says how many bursts check 12 judged and skipped,
// and its count.
func TestSummaryShowsBursts(t *testing.T) {
	s := summary(checker.Results{Valid: false, BurstsChecked: 7, BurstsSkipped: 3, PriorityViolations: 2})
	if !strings.HasPrefix(s, "INVALID: ") ||
		!strings.Contains(s, "\nbursts: 7 checked, 3 skipped (a fault overlapped them, or nothing of them was acked or read back); priority_violations=2\n") {
		t.Errorf("summary:\n%s", s)
	}
}
