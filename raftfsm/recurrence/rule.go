package recurrence

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Spec is a rule as a client writes it. Exactly one of Cron and Every is
// set.
type Spec struct {
	// Cron is a cron expression: five fields (minute, hour, day of month,
	// month, day of week), an optional leading seconds field, or a
	// descriptor (@yearly, @monthly, @weekly, @daily, @hourly, @every D).
	Cron string
	// Every is a fixed interval, anchored at Start.
	Every time.Duration
	// TimeZone is the IANA zone Cron's fields are read in; "" is UTC.
	TimeZone string
	// Start is the first instant an occurrence may have, and an every
	// rule's anchor (required for it). Zero means no bound for cron.
	Start time.Time
	// End is the last instant an occurrence may have. Zero means none.
	End time.Time
	// Jitter delays each occurrence by an amount in [0, Jitter).
	Jitter time.Duration
}

// Limits of a Spec.
const (
	// MinEvery is the shortest interval an every rule may have; cron's
	// resolution is a second too.
	MinEvery = time.Second
	// MaxJitter is the longest jitter: a day, as long as the longest
	// flexible window EventBridge offers.
	MaxJitter = 24 * time.Hour
)

// Instants an occurrence may have: Chime stores times as Unix nanoseconds,
// and occurrences are named by their Unix milliseconds.
var (
	minInstant = time.Unix(0, 0).UTC()
	maxInstant = time.Unix(0, math.MaxInt64).UTC().Truncate(time.Millisecond)
)

// FieldError is a rule a Spec breaks, naming the field.
type FieldError struct {
	Field string // cron, every, time_zone, start, end or jitter
	Rule  string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Rule }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// cronParser reads the standard fields with an optional seconds field
// first, and the descriptors.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Rule is a parsed Spec. It is immutable and safe for concurrent use.
type Rule struct {
	// civil is the cron rule's fields, matched against civil time: it is
	// only ever asked about wall-clock times written as UTC instants,
	// where no transition exists. nil for an every rule.
	civil  *cron.SpecSchedule
	every  time.Duration
	loc    *time.Location
	start  time.Time // the zero time when unbounded (cron only)
	end    time.Time // maxInstant when unbounded
	jitter time.Duration
}

// Parse checks s and returns its rule. An error is a *FieldError.
func Parse(s Spec) (*Rule, error) {
	r := &Rule{jitter: s.Jitter, end: maxInstant}
	cronExpr := strings.TrimSpace(s.Cron)
	if d, ok := strings.CutPrefix(cronExpr, "@every "); ok {
		if s.Every != 0 {
			return nil, fieldErr("cron", "@every and every are both set; set one")
		}
		every, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil {
			return nil, fieldErr("cron", "@every %q: not a duration such as 90s or 1h30m", strings.TrimSpace(d))
		}
		s.Every, cronExpr = every, ""
	}
	switch {
	case cronExpr == "" && s.Every == 0:
		return nil, fieldErr("cron", "a rule needs cron or every")
	case cronExpr != "" && s.Every != 0:
		return nil, fieldErr("every", "cron and every are both set; set one")
	case cronExpr != "":
		if strings.HasPrefix(cronExpr, "TZ=") || strings.HasPrefix(cronExpr, "CRON_TZ=") {
			return nil, fieldErr("cron", "a zone inside the expression is not read; set time_zone")
		}
		sched, err := cronParser.Parse(cronExpr)
		if err != nil {
			return nil, fieldErr("cron", "%q: %v", cronExpr, err)
		}
		spec, ok := sched.(*cron.SpecSchedule)
		if !ok {
			return nil, fieldErr("cron", "%q is not a calendar rule", cronExpr)
		}
		civil := *spec
		civil.Location = time.UTC
		// Every calendar rule that can occur does within five years of a
		// leap day: February 30 never does.
		if civil.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
			return nil, fieldErr("cron", "%q matches no date", cronExpr)
		}
		r.civil = &civil
	default:
		if s.Every < MinEvery {
			return nil, fieldErr("every", "%v is shorter than %v", s.Every, MinEvery)
		}
		if s.Every%time.Millisecond != 0 {
			return nil, fieldErr("every", "%v is not a whole number of milliseconds", s.Every)
		}
		if s.Start.IsZero() {
			return nil, fieldErr("start", "an every rule needs a start, its anchor")
		}
		r.every = s.Every
	}

	loc, err := LoadZone(s.TimeZone)
	if err != nil {
		return nil, fieldErr("time_zone", "%v", err)
	}
	r.loc = loc

	if !s.Start.IsZero() {
		if s.Start.Before(minInstant) || s.Start.After(maxInstant) {
			return nil, fieldErr("start", "%v is outside [%v, %v]", s.Start.UTC(), minInstant, maxInstant)
		}
		r.start = s.Start.UTC()
		if r.every != 0 && r.start.Nanosecond()%int(time.Millisecond) != 0 {
			return nil, fieldErr("start", "%v, an every rule's anchor, is not a whole millisecond", r.start)
		}
	}
	if !s.End.IsZero() {
		if s.End.Before(minInstant) || s.End.After(maxInstant) {
			return nil, fieldErr("end", "%v is outside [%v, %v]", s.End.UTC(), minInstant, maxInstant)
		}
		if s.End.Before(s.Start) {
			return nil, fieldErr("end", "%v is before start %v", s.End.UTC(), s.Start.UTC())
		}
		r.end = s.End.UTC()
	}
	if s.Jitter < 0 || s.Jitter > MaxJitter {
		return nil, fieldErr("jitter", "%v is outside [0, %v]", s.Jitter, MaxJitter)
	}
	return r, nil
}

// Location is the rule's zone.
func (r *Rule) Location() *time.Location { return r.loc }

// Next returns the first occurrence strictly after t, and false when the
// rule has none (past End, or a calendar rule with no further date).
func (r *Rule) Next(t time.Time) (time.Time, bool) {
	// The first occurrence may be Start itself.
	if !r.start.IsZero() && t.Before(r.start) {
		t = r.start.Add(-1)
	}
	var next time.Time
	if r.civil == nil {
		// An every rule: Start + k×Every, k ≥ 0, the first after t.
		k := t.Sub(r.start)/r.every + 1
		if d := t.Sub(r.start); d < 0 {
			k = 0
		}
		if k > time.Duration(maxInstant.Sub(r.start)/r.every) {
			return time.Time{}, false
		}
		next = r.start.Add(k * r.every)
	} else {
		var ok bool
		if next, ok = r.nextCivil(t); !ok {
			return time.Time{}, false
		}
	}
	if next.After(r.end) {
		return time.Time{}, false
	}
	return next, true
}

// nextCivil is Next for a calendar rule, unbounded by End.
func (r *Rule) nextCivil(t time.Time) (time.Time, bool) {
	if r.loc == time.UTC {
		n := r.civil.Next(t.UTC())
		return n, !n.IsZero() && !n.After(maxInstant)
	}
	c := r.civilAfter(t)
	// Civil times after c map to instants after t, but for the end of a
	// transition's overlap civilAfter steps over; the loop is the
	// guarantee, and it turns at most a few times.
	for i := 0; i < 1<<16; i++ {
		c = r.civil.Next(c)
		if c.IsZero() {
			return time.Time{}, false
		}
		u := r.instant(c)
		if u.After(maxInstant) {
			return time.Time{}, false
		}
		if u.After(t) {
			return u, true
		}
	}
	return time.Time{}, false
}

// civilAfter is the civil time to search after for the first occurrence
// strictly after t: t's own wall-clock time, written as a UTC instant;
// or, when t is in the second pass through an overlap (after a backward
// transition), the overlap's last civil time, whose every civil time
// occurred at its first pass, before t.
func (r *Rule) civilAfter(t time.Time) time.Time {
	lt := t.In(r.loc)
	_, off := lt.Zone()
	c := civilOf(t, off)
	start, _ := zoneBounds(lt)
	if start.IsZero() {
		return c
	}
	_, prevOff := start.Add(-1).In(r.loc).Zone()
	overlap := time.Duration(prevOff-off) * time.Second
	if overlap > 0 && t.Sub(start) < overlap {
		return civilOf(start.Add(-1), prevOff)
	}
	return c
}

// civilOf is the wall-clock time of t at offset off, written as a UTC
// instant.
func civilOf(t time.Time, off int) time.Time {
	return t.UTC().Add(time.Duration(off) * time.Second)
}

// zoneWindow bounds how far an instant is from its wall-clock time: zone
// offsets stay within ±16 hours, local mean time of 19th-century zones
// included.
const zoneWindow = 48 * time.Hour

// instant maps the civil time c (a wall-clock time written as a UTC
// instant) to the instant it occurs at in r's zone: its only instant, its
// first when a backward transition repeats it, or the transition's instant
// when a forward transition skips it.
func (r *Rule) instant(c time.Time) time.Time {
	// Walk the zone's periods (spans of one offset) from well before c
	// until one holds c, or a transition skips it.
	t := c.Add(-zoneWindow).In(r.loc)
	for {
		_, off := t.Zone()
		start, end := zoneBounds(t)
		u := c.Add(-time.Duration(off) * time.Second)
		if (start.IsZero() || !u.Before(start)) && (end.IsZero() || u.Before(end)) {
			return u
		}
		if end.IsZero() || end.After(c.Add(zoneWindow)) {
			// No period holds c: unreachable for a zone whose offsets
			// stay within zoneWindow. The instant as if no transition
			// were near is the best there is.
			return u
		}
		next := end.In(r.loc)
		_, nextOff := next.Zone()
		// This period's civil times end at end+off; the next one's begin
		// at end+nextOff. Between them is the gap.
		if gapStart, gapEnd := civilOf(end, off), civilOf(end, nextOff); !c.Before(gapStart) && c.Before(gapEnd) {
			return end
		}
		t = next
	}
}

// Latest returns the last occurrence at or before t, and false when there
// is none.
func (r *Rule) Latest(t time.Time) (time.Time, bool) {
	if t.After(r.end) {
		t = r.end
	}
	if !r.start.IsZero() && t.Before(r.start) {
		return time.Time{}, false
	}
	if r.civil == nil {
		k := t.Sub(r.start) / r.every
		return r.start.Add(k * r.every), true
	}
	// Gallop back from t until some occurrence lies in (lo, t], then
	// halve (lo, t] keeping Next(lo) ≤ t: the last lo it leaves is the
	// instant before the latest occurrence. Next is non-decreasing in its
	// argument, which is all this needs.
	floor := minInstant.Add(-1)
	if !r.start.IsZero() {
		floor = r.start.Add(-1)
	}
	lo := t
	for w := time.Second; ; w *= 2 {
		lo = t.Add(-w)
		if lo.Before(floor) || w > 200*365*24*time.Hour {
			lo = floor
		}
		if n, ok := r.Next(lo); ok && !n.After(t) {
			break
		}
		if lo.Equal(floor) {
			return time.Time{}, false
		}
	}
	hi := t
	for hi.Sub(lo) > 1 {
		mid := lo.Add(hi.Sub(lo) / 2)
		if n, ok := r.Next(mid); ok && !n.After(t) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return r.Next(lo)
}

// Jitter is the delay of the occurrence at nominal instant at of the
// schedule named id: a hash of both, in [0, Jitter).
func (r *Rule) Jitter(id string, at time.Time) time.Duration {
	if r.jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	x := h.Sum64() ^ uint64(at.UnixMilli())
	// splitmix64's finaliser spreads neighbouring occurrences apart.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return time.Duration(x % uint64(r.jitter))
}
