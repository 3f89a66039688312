// Package topiclimit holds a node's per-topic fire rate limits and enforces
// one shard leader's share of them.
//
// # What it owns and what it must never do
//
// It owns the rules ("reports=5000/s,billing.*=1000/s": a topic name or a
// glob, and a rate), their parsing, and a token bucket per rule for each
// shard leader, filling at the rule's rate divided by the cluster's shard
// count: every shard leader enforces its share, so the cluster as a whole
// produces at most the rate to a topic whose events are spread over the
// shards (a topic's events land on every shard by their ids). It decides,
// for one record about to be produced, whether it goes now or when it may
// go; it never holds, reads or produces events, and starts no goroutine.
package topiclimit

import (
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Rule limits the records produced to the topics Pattern matches, together,
// to PerSecond.
type Rule struct {
	// Pattern is a topic name, or a glob of path.Match: * matches any run
	// of characters, ? one, [a-z] a class (Kafka topic names have no '/').
	Pattern   string
	PerSecond float64
}

// Rules apply in order: a topic takes the first rule that matches it.
type Rules []Rule

// Parse reads rules written as comma-separated PATTERN=N/UNIT, UNIT being
// s, m or h: "reports=5000/s,billing.*=1000/s". An empty string is no rule.
func Parse(s string) (Rules, error) {
	var rs Rules
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		pattern, limit, ok := strings.Cut(part, "=")
		if !ok || pattern == "" {
			return nil, fmt.Errorf("%q: want TOPIC=N/s (a topic name or a glob such as billing.*, then a rate)", part)
		}
		if _, err := path.Match(pattern, ""); err != nil {
			return nil, fmt.Errorf("%q: %q is not a valid pattern: %v", part, pattern, err)
		}
		if seen[pattern] {
			return nil, fmt.Errorf("%q: %q has a rule already", part, pattern)
		}
		seen[pattern] = true
		num, unit, ok := strings.Cut(limit, "/")
		if !ok {
			return nil, fmt.Errorf("%q: the rate %q has no unit: write N/s, N/m or N/h", part, limit)
		}
		n, err := strconv.ParseFloat(num, 64)
		if err != nil || n <= 0 || math.IsInf(n, 0) || math.IsNaN(n) {
			return nil, fmt.Errorf("%q: the rate %q is not a positive number", part, num)
		}
		switch unit {
		case "s":
		case "m":
			n /= 60
		case "h":
			n /= 3600
		default:
			return nil, fmt.Errorf("%q: unknown unit %q: write N/s, N/m or N/h", part, unit)
		}
		rs = append(rs, Rule{Pattern: pattern, PerSecond: n})
	}
	return rs, nil
}

// String writes rs as Parse reads them, rates per second.
func (rs Rules) String() string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Pattern + "=" + strconv.FormatFloat(r.PerSecond, 'f', -1, 64) + "/s"
	}
	return strings.Join(parts, ",")
}

// Match returns the index of the first rule that matches topic, or -1.
func (rs Rules) Match(topic string) int {
	for i, r := range rs {
		if ok, _ := path.Match(r.Pattern, topic); ok {
			return i
		}
	}
	return -1
}

// Table is a node's rules, which an operator may change while it runs. It is
// safe for concurrent use.
type Table struct {
	v atomic.Pointer[version]
}

type version struct {
	rules Rules
	n     uint64
}

// NewTable returns a table holding rs.
func NewTable(rs Rules) *Table {
	t := &Table{}
	t.v.Store(&version{rules: rs, n: 1})
	return t
}

// Set replaces the rules.
func (t *Table) Set(rs Rules) {
	for {
		old := t.v.Load()
		if t.v.CompareAndSwap(old, &version{rules: rs, n: old.n + 1}) {
			return
		}
	}
}

// Rules returns the rules in force.
func (t *Table) Rules() Rules { return t.v.Load().rules }

// ReserveAhead is how far ahead a Limiter books a record's slot: a record
// over the limit whose slot is at most this far off, and with no record of
// its priority or higher told to ask again before it, holds it (it goes
// then, whatever falls due meanwhile). Any other is told when to ask again:
// after the slots of those of its priority or higher already waiting, so
// that a record of higher priority that falls due meanwhile goes before
// it. Asking again, a record books whatever slot is free (Admit's again),
// so it is never sent back twice. A record of lower priority may go before
// one of higher priority for at most this long (the slots booked before
// the latter fell due).
const ReserveAhead = 250 * time.Millisecond

// numPriorities bounds the priorities a Limiter tells apart; a higher one
// counts as the highest.
const numPriorities = 16

// waitAfter is how long after the latest time it gave a priority's records
// to ask again a Limiter forgets them: by then they asked again, or went
// elsewhere (cancelled, or their leader lost its place).
const waitAfter = time.Second

// Limiter is one shard leader's share of a Table's rules. It is safe for
// concurrent use.
type Limiter struct {
	table  *Table
	shares float64

	mu      sync.Mutex
	version uint64
	rules   Rules
	buckets []*rate.Limiter
	// waiting is, per rule and priority, how many records were told to ask
	// again and have not yet, and the latest time one was told: a record
	// is told to ask again after the slots of those of its priority or
	// higher, so that a backlog comes back at the rate, highest first.
	waiting []waiting
	topics  map[string]int // each topic's rule, for the rules of version
}

type waiting struct {
	n    [numPriorities]int
	last [numPriorities]time.Time
}

// ahead counts the records of priority p or higher told to ask again and
// not yet back, forgetting those told to ask long ago.
func (w *waiting) ahead(now time.Time, p int) int {
	n := 0
	for q := range numPriorities {
		if w.n[q] > 0 && now.After(w.last[q].Add(waitAfter)) {
			w.n[q] = 0
		}
		if q >= p {
			n += w.n[q]
		}
	}
	return n
}

// NewLimiter returns the share of t's limits of one of shares shard
// leaders.
func NewLimiter(t *Table, shares int) *Limiter {
	return &Limiter{table: t, shares: float64(max(shares, 1))}
}

// Decision is what Admit decided for one record.
type Decision struct {
	// Rule is the pattern of the rule that limits the topic, "" if none.
	Rule string
	// At is when the record may be produced: now, or later if it is over
	// the limit. With Reserved, the record holds a slot at At and is
	// produced then without asking again; without it, it asks again at At.
	At       time.Time
	Reserved bool
}

// Later reports whether the record must wait.
func (d Decision) Later(now time.Time) bool { return d.At.After(now) }

// Admit decides for one record of topic and priority that is to be
// produced at now; again says it was told to ask again before, and books
// its slot however far off it is.
func (l *Limiter) Admit(now time.Time, topic string, priority uint8, again bool) Decision {
	if l == nil || l.table == nil {
		return Decision{At: now}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refresh(now)
	i, ok := l.topics[topic]
	if !ok {
		i = l.rules.Match(topic)
		if len(l.topics) > 1<<16 {
			clear(l.topics) // topics come and go; keep the cache bounded
		}
		l.topics[topic] = i
	}
	if i < 0 {
		return Decision{At: now}
	}
	rule, b, w := l.rules[i].Pattern, l.buckets[i], &l.waiting[i]
	p := int(min(priority, numPriorities-1))
	if again && w.n[p] > 0 {
		w.n[p]--
	}
	if b.AllowN(now, 1) {
		return Decision{Rule: rule, At: now}
	}
	ahead := w.ahead(now, p)
	r := b.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if again || (d <= ReserveAhead && ahead == 0) {
		return Decision{Rule: rule, At: now.Add(d), Reserved: true}
	}
	r.CancelAt(now)
	at := now.Add(d + time.Duration(float64(ahead)*float64(time.Second)/float64(b.Limit())))
	w.n[p]++
	if at.After(w.last[p]) {
		w.last[p] = at
	}
	return Decision{Rule: rule, At: at}
}

// Rules returns the rules this limiter enforces a share of.
func (l *Limiter) Rules() Rules {
	if l == nil || l.table == nil {
		return nil
	}
	return l.table.Rules()
}

// refresh rebuilds the buckets when the table's rules changed. A rule that
// stays keeps its bucket, its tokens and its debts; l.mu is held.
func (l *Limiter) refresh(now time.Time) {
	v := l.table.v.Load()
	if v.n == l.version {
		return
	}
	old := make(map[string]int, len(l.rules))
	for i, r := range l.rules {
		old[r.Pattern] = i
	}
	buckets := make([]*rate.Limiter, len(v.rules))
	waits := make([]waiting, len(v.rules))
	for i, r := range v.rules {
		share := r.PerSecond / l.shares
		// A burst of a tenth of a second of the share, at least one: the
		// most a bucket lets through at once after it was idle.
		burst := max(1, int(share/10))
		if j, ok := old[r.Pattern]; ok {
			buckets[i], waits[i] = l.buckets[j], l.waiting[j]
			buckets[i].SetLimitAt(now, rate.Limit(share))
			buckets[i].SetBurstAt(now, burst)
			continue
		}
		buckets[i] = rate.NewLimiter(rate.Limit(share), burst)
	}
	l.version, l.rules, l.buckets, l.waiting = v.n, v.rules, buckets, waits
	l.topics = make(map[string]int)
}
