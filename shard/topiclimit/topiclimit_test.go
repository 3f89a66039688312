package topiclimit

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	rs, err := Parse(" reports=5000/s, billing.*=1000/s,slow=90/m,rare=36/h")
	if err != nil {
		t.Fatal(err)
	}
	want := Rules{{"reports", 5000}, {"billing.*", 1000}, {"slow", 1.5}, {"rare", 0.01}}
	if len(rs) != len(want) {
		t.Fatalf("Parse = %v, want %v", rs, want)
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Fatalf("rule %d = %+v, want %+v", i, rs[i], want[i])
		}
	}
	if got := rs.String(); got != "reports=5000/s,billing.*=1000/s,slow=1.5/s,rare=0.01/s" {
		t.Fatalf("String() = %q", got)
	}
	if again, err := Parse(rs.String()); err != nil || again.String() != rs.String() {
		t.Fatalf("Parse(String()) = %v, %v", again, err)
	}
	if rs, err := Parse(""); err != nil || rs != nil {
		t.Fatalf("Parse(\"\") = %v, %v; want no rule", rs, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"reports", "want TOPIC=N/s"},
		{"=5/s", "want TOPIC=N/s"},
		{"reports=5000", "has no unit"},
		{"reports=5000/d", `unknown unit "d"`},
		{"reports=-1/s", "not a positive number"},
		{"reports=0/s", "not a positive number"},
		{"reports=x/s", "not a positive number"},
		{"reports=NaN/s", "not a positive number"},
		{"bad[=1/s", "not a valid pattern"},
		{"a=1/s,a=2/s", `"a" has a rule already`},
	} {
		if _, err := Parse(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", tc.in, err, tc.want)
		}
	}
}

func TestMatchTakesTheFirstRule(t *testing.T) {
	rs, _ := Parse("billing.eu=10/s,billing.*=100/s,*=1000/s")
	for topic, want := range map[string]int{"billing.eu": 0, "billing.us": 1, "billing": 2, "reports": 2} {
		if got := rs.Match(topic); got != want {
			t.Errorf("Match(%q) = %d, want %d", topic, got, want)
		}
	}
	rs, _ = Parse("billing.*=100/s")
	if got := rs.Match("reports"); got != -1 {
		t.Errorf("Match(reports) = %d, want -1", got)
	}
}

// TestAdmitHoldsTheShare offers a limited topic far more records than its
// share lets through, in steps of simulated time, as a leader's batches
// would: over a minute, what was let go (now or at a reserved slot) must be
// the share within 1%, never more than a tenth of a second's share above it
// at any moment, and no record of an unlimited topic is held.
func TestAdmitHoldsTheShare(t *testing.T) {
	rs, _ := Parse("reports=5000/s")
	l := NewLimiter(NewTable(rs), 8) // a share of 625/s
	start := time.Unix(1_000_000, 0)
	var goes []time.Time // when each record let through goes
	for step := 0; step < 600; step++ {
		now := start.Add(time.Duration(step) * 100 * time.Millisecond)
		// Records offered: those due now (100 per step) plus, each at its
		// time, those told to ask again.
		for range 100 {
			d := l.Admit(now, "reports", 5, false)
			if d.Rule != "reports" {
				t.Fatalf("Admit(reports) names rule %q", d.Rule)
			}
			if !d.Later(now) || d.Reserved {
				goes = append(goes, d.At)
			}
		}
		if d := l.Admit(now, "other", 5, false); d.Rule != "" || d.Later(now) {
			t.Fatalf("a topic no rule matches was held: %+v", d)
		}
	}
	end := start.Add(time.Minute)
	n := 0
	for _, at := range goes {
		if at.Before(end) {
			n++
		}
	}
	want := 625.0 * 60
	if float64(n) < want*0.99 || float64(n) > want*1.01+62 {
		t.Fatalf("%d records let through in a minute, want %.0f (the share) within 1%%", n, want)
	}
	for i := range goes {
		// Any one second's worth: at most the share plus the burst.
		from := goes[i]
		c := 0
		for _, at := range goes {
			if !at.Before(from) && at.Before(from.Add(time.Second)) {
				c++
			}
		}
		if c > 625+62+1 {
			t.Fatalf("%d records go within the second from %v, more than the share 625 and burst 62", c, from)
		}
		if i > 2000 {
			break
		}
	}
}

// TestAdmitReservesOnlyNearSlots: a record over the limit whose slot is
// within ReserveAhead holds it; a later one only learns when to ask again,
// and those told so are spread at the share's pace, not sent back at once.
func TestAdmitReservesOnlyNearSlots(t *testing.T) {
	rs, _ := Parse("t=10/s")
	l := NewLimiter(NewTable(rs), 1)
	now := time.Unix(1_000_000, 0)
	if d := l.Admit(now, "t", 5, false); d.Later(now) {
		t.Fatalf("the first record waits: %+v", d) // the burst of 1
	}
	d := l.Admit(now, "t", 5, false)
	if !d.Reserved || d.At.Sub(now) != 100*time.Millisecond {
		t.Fatalf("the second record: %+v, want a slot reserved 100ms on", d)
	}
	d = l.Admit(now, "t", 5, false)
	if !d.Reserved || d.At.Sub(now) != 200*time.Millisecond {
		t.Fatalf("the third record: %+v, want a slot reserved 200ms on", d)
	}
	var last time.Time
	for i := range 5 {
		d = l.Admit(now, "t", 5, false)
		if d.Reserved || d.At.Sub(now) < ReserveAhead {
			t.Fatalf("record %d: %+v, want no reservation, asked again after %v", i+4, d, ReserveAhead)
		}
		if i > 0 && d.At.Sub(last) != 100*time.Millisecond {
			t.Fatalf("record %d asks again at %v, %v after the one before; want one slot (100ms) apart", i+4, d.At, d.At.Sub(last))
		}
		last = d.At
	}
	// Asking again, a record books the next free slot, however far.
	if d = l.Admit(now, "t", 5, true); !d.Reserved || d.At.Sub(now) != 300*time.Millisecond {
		t.Fatalf("a record asking again: %+v, want the slot 300ms on booked", d)
	}
}

// TestSetChangesTheLimitsOfEveryLimiter: a rule changed at runtime applies
// at the next Admit; a rule removed holds nothing back.
func TestSetChangesTheLimitsOfEveryLimiter(t *testing.T) {
	rs, _ := Parse("t=1/s")
	table := NewTable(rs)
	l := NewLimiter(table, 1)
	now := time.Unix(1_000_000, 0)
	l.Admit(now, "t", 5, false)
	if d := l.Admit(now, "t", 5, false); !d.Later(now) {
		t.Fatal("1/s let two records go at once")
	}
	rs, _ = Parse("t=1000/s")
	table.Set(rs)
	now = now.Add(time.Second)
	l.Admit(now, "t", 5, false) // takes the token the old rate gave; from here the new rate fills
	now = now.Add(100 * time.Millisecond)
	for i := range 50 {
		if d := l.Admit(now, "t", 5, false); d.Later(now) {
			t.Fatalf("record %d held after the limit rose to 1000/s (burst 100): %+v", i, d)
		}
	}
	table.Set(nil)
	for range 1000 {
		if d := l.Admit(now, "t", 5, false); d.Later(now) || d.Rule != "" {
			t.Fatalf("held by a removed rule: %+v", d)
		}
	}
}

// TestAdmitPutsHigherPrioritiesFirst: records told to ask again are told
// times after those of their priority or higher already waiting, so one of
// higher priority that comes later is told an earlier time than the ones
// of lower priority waiting; and a record does not book a near slot ahead
// of waiting records of its priority or higher. Waiting records that never
// ask again are forgotten after a while.
func TestAdmitPutsHigherPrioritiesFirst(t *testing.T) {
	rs, _ := Parse("t=10/s")
	l := NewLimiter(NewTable(rs), 1)
	now := time.Unix(1_000_000, 0)
	l.Admit(now, "t", 3, false) // the burst of one
	l.Admit(now, "t", 3, false) // booked at 100 ms
	l.Admit(now, "t", 3, false) // booked at 200 ms
	low := []Decision{l.Admit(now, "t", 3, false), l.Admit(now, "t", 3, false)}
	for i, d := range low {
		if d.Reserved {
			t.Fatalf("low %d: %+v, want told to ask again", i, d)
		}
	}
	high := l.Admit(now, "t", 8, false)
	if high.Reserved || !high.At.Before(low[1].At) {
		t.Fatalf("a later record of priority 8 is told %v, the priority 3 ones %v and %v; want before the second", high.At, low[0].At, low[1].At)
	}
	// 250 ms on, a slot is near, but two of priority 3 wait: another of
	// priority 3 is told to ask again behind them, not booked ahead.
	now = now.Add(250 * time.Millisecond)
	if d := l.Admit(now, "t", 3, false); d.Reserved || !d.At.After(low[1].At) {
		t.Fatalf("a priority 3 record with two waiting: %+v, want told a time after %v", d, low[1].At)
	}
	// Long after, the waiting ones that never came back are forgotten.
	now = now.Add(10 * time.Second)
	l.Admit(now, "t", 3, false)
	if d := l.Admit(now, "t", 3, false); !d.Reserved {
		t.Fatalf("10 s later: %+v, want the near slot booked", d)
	}
}
