package main

import (
	"strings"
	"testing"
)

// TestForecast: chimectl forecast prints the pending events by the minute,
// hour and day they are due in, leaving out the ranges with none; --json
// has every range.
func TestForecast(t *testing.T) {
	addr, _ := startChime(t)
	for _, ev := range [][]string{{"a", "10m"}, {"b", "10m30s"}, {"c", "2h"}, {"d", "72h"}} {
		chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--id", ev[0], "--in", ev[1])
	}
	r := chimectl(t, nil, "", "--addr", addr, "forecast")
	r.want(t, 0, forecastText, "")
	r = chimectl(t, nil, "", "--addr", addr, "forecast", "--json")
	if r.code != 0 || !strings.HasPrefix(r.stdout, `{"pending":4,"overdue":0,"earliest_due":"2026-03-01T12:10:00Z","latest_due":"2026-03-04T12:00:00Z","series":[{"per":"minute","ranges":[{"from":"2026-03-01T12:00:00Z","count":0},`) ||
		strings.Count(r.stdout, `"from"`) != 60+24+31 {
		t.Fatalf("forecast --json: %+v", r)
	}
}

const forecastText = `pending   4
overdue   0
earliest  2026-03-01T13:10:00+01:00 (in 10m)
latest    2026-03-04T13:00:00+01:00 (in 3d)

per minute from 2026-03-01T13:00:00+01:00: 2 due
FROM   DUE
13:10  2

per hour from 2026-03-01T13:00:00+01:00: 3 due
FROM          DUE
Mar 01 13:00  2
Mar 01 15:00  1

per day from 2026-03-01T01:00:00+01:00: 4 due
FROM        DUE
2026-03-01  3
2026-03-04  1
`
