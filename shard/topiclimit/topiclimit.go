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
// over the limit whose slot is at most this far off holds it (it goes then,
// whatever falls due meanwhile); a later one is only told when to ask again,
// so that a record of higher priority that falls due meanwhile may go
// before it. It bounds how long a record of lower priority may go before an
// already-due one of higher priority under a limit.
const ReserveAhead = 250 * time.Millisecond

// Limiter is one shard leader's share of a Table's rules. It is safe for
// concurrent use.
type Limiter struct {
	table  *Table
	shares float64

	mu      sync.Mutex
	version uint64
	rules   Rules
	buckets []*rate.Limiter
	// next is, per rule, the earliest time at which Admit tells a record
	// that holds no slot to ask again: later by one slot for each such
	// record, so that a backlog comes back at the rate, not all at once.
	next   []time.Time
	topics map[string]int // each topic's rule, for the rules of version
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

// Admit decides for one record of topic that is to be produced at now.
func (l *Limiter) Admit(now time.Time, topic string) Decision {
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
	rule, b := l.rules[i].Pattern, l.buckets[i]
	if b.AllowN(now, 1) {
		return Decision{Rule: rule, At: now}
	}
	r := b.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d <= ReserveAhead {
		return Decision{Rule: rule, At: now.Add(d), Reserved: true}
	}
	r.CancelAt(now)
	at := now.Add(d)
	if l.next[i].After(at) {
		at = l.next[i]
	}
	l.next[i] = at.Add(time.Duration(float64(time.Second) / float64(b.Limit())))
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
	next := make([]time.Time, len(v.rules))
	for i, r := range v.rules {
		share := r.PerSecond / l.shares
		// A burst of a tenth of a second of the share, at least one: the
		// most a bucket lets through at once after it was idle.
		burst := max(1, int(share/10))
		if j, ok := old[r.Pattern]; ok {
			buckets[i], next[i] = l.buckets[j], l.next[j]
			buckets[i].SetLimitAt(now, rate.Limit(share))
			buckets[i].SetBurstAt(now, burst)
			continue
		}
		buckets[i] = rate.NewLimiter(rate.Limit(share), burst)
	}
	l.version, l.rules, l.buckets, l.next = v.n, v.rules, buckets, next
	l.topics = make(map[string]int)
}
