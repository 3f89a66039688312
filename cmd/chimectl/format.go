package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// printBlock prints label/value rows with the values aligned.
func printBlock(w io.Writer, rows [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// localTime formats t for people: RFC 3339 with nanoseconds, in c.loc.
func (c *cli) localTime(t time.Time) string {
	return t.In(c.loc).Format(time.RFC3339Nano)
}

// relative says "in 2s" or "3m20s ago", rounded to what a person cares about.
func relative(d time.Duration) string {
	switch {
	case d > 0:
		return "in " + humanDuration(d)
	case d < 0:
		return humanDuration(-d) + " ago"
	}
	return "now"
}

// humanDuration rounds d to about three significant units and prints it
// without trailing zero units: 2s, 1.5s, 250ms, 1h30m, 3d4h.
func humanDuration(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d < time.Second:
		d = d.Round(time.Millisecond)
	case d < time.Minute:
		d = d.Round(100 * time.Millisecond)
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	var b strings.Builder
	if d >= 2*day {
		fmt.Fprintf(&b, "%dd", d/day)
		d %= day
		if d == 0 {
			return b.String()
		}
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	b.WriteString(s)
	return b.String()
}

// printable reports whether b is UTF-8 text that prints on one line.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// showBytes renders bytes for text output: as they are when printable,
// otherwise "base64:" and their standard base64. With max > 0, more than
// max bytes are cut, and the total length is added.
func showBytes(b []byte, max int) string {
	cut := b
	if max > 0 && len(b) > max {
		cut = b[:max]
		if utf8.Valid(b) { // don't split a rune of text
			for !utf8.Valid(cut) {
				cut = cut[:len(cut)-1]
			}
		}
	}
	var s string
	if printable(cut) {
		s = string(cut)
	} else {
		s = "base64:" + base64.StdEncoding.EncodeToString(cut)
	}
	if len(cut) < len(b) {
		s += fmt.Sprintf("... (%d bytes)", len(b))
	}
	return s
}

// jsonBytes renders bytes for JSON output: text when valid UTF-8, otherwise
// base64, with the encoding used.
func jsonBytes(b []byte) (value, encoding string) {
	if utf8.Valid(b) {
		return string(b), "utf8"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}
