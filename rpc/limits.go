package rpc

import (
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/chimehq/chime/publish"
)

// Limits bound what one event may carry. A zero field means its default
// (DefaultLimits); negative values are rejected by Validate.
//
// The gRPC server's maximum receive message size bounds a whole request
// before any of these are checked: a request larger than it fails with
// RESOURCE_EXHAUSTED from gRPC itself. MaxRequestBytes is the size a node
// sets, from these limits; it, not MaxBatch, is what usually bounds a
// BatchSchedule.
type Limits struct {
	// MaxPayloadBytes bounds Event.payload (chimed --max-payload). Default
	// 1 MiB, Kafka's default max.message.bytes: a larger record would be
	// refused by a default topic and end up dead-lettered.
	MaxPayloadBytes int
	// MaxHorizon is how far ahead of the server's clock an event may be due
	// (chimed --max-horizon): deliver_at at most now+MaxHorizon, delay at
	// most MaxHorizon. Default 10 years (of 365 days).
	MaxHorizon time.Duration
	// MaxIDBytes bounds Event.id. Default 256, the limit the API documents;
	// raising it breaks that promise to clients.
	MaxIDBytes int
	// MaxKeyBytes bounds Event.key. Default 16 KiB.
	MaxKeyBytes int
	// MaxHeaders bounds the number of Event.headers. Default 64.
	MaxHeaders int
	// MaxHeaderBytes bounds the header keys and values of one event taken
	// together, so headers cannot carry what the payload limit forbids.
	// Default 64 KiB.
	MaxHeaderBytes int
	// MaxBatch bounds the number of events in one BatchSchedule. Default
	// 10,000.
	MaxBatch int
	// ReservedTopics are path.Match patterns of topics no event may target
	// (chimed --reserved-topics, plus its dead-letter topic, so that a
	// client cannot forge what looks like a dead-lettered record), besides
	// Kafka's internal ones: a name starting with "__" is always reserved.
	ReservedTopics []string
	// AllowTopics are reserved topics events may target all the same
	// (chimed --allow-topic), for the rare client that must.
	AllowTopics []string
	// MaxCatchUp bounds how many missed occurrences a recurring schedule
	// with CATCH_UP_ALL produces in a row before it goes on with the future
	// ones (chimed --max-catch-up). Default 1,000. It is stored with each
	// schedule when it is created or updated.
	MaxCatchUp int
}

// DefaultReservedTopics are the topics chimed --reserved-topics reserves
// by default: Kafka's internal topics, the Schema Registry's and Kafka
// Connect's, and Chime's own namespace.
var DefaultReservedTopics = []string{"__*", "_schemas", "connect-*", "chime.*"}

// ReservedTopic says why topic may not be a target (a name starting with
// "__", one of ReservedTopics or a topic one of them matches, and not one of
// AllowTopics), or "" when it may be. Every event a client schedules is
// checked with it, and chimed restore checks every event of a backup with
// it too, so that a backup cannot bring in what the API refuses.
func (l *Limits) ReservedTopic(topic string) string {
	if slices.Contains(l.AllowTopics, topic) {
		return ""
	}
	switch {
	case strings.HasPrefix(topic, "__"):
		return "names starting with \"__\" are Kafka's internal topics"
	case slices.Contains(l.ReservedTopics, topic):
		if why, ok := reservedBecause[topic]; ok {
			return why
		}
		return "it is one of Chime's own topics" // the dead-letter topic, or one the operator named
	}
	for _, p := range l.ReservedTopics {
		if ok, _ := path.Match(p, topic); ok {
			if why, ok := reservedBecause[p]; ok {
				return why
			}
			return fmt.Sprintf("it matches the reserved pattern %q", p)
		}
	}
	return ""
}

// reservedBecause says why each of DefaultReservedTopics is reserved.
var reservedBecause = map[string]string{
	"__*":       "names starting with \"__\" are Kafka's internal topics",
	"_schemas":  "it is the Schema Registry's topic",
	"connect-*": "names starting with \"connect-\" are Kafka Connect's topics",
	"chime.*":   "names starting with \"chime.\" are Chime's own topics",
}

// year is the year MaxHorizon is counted and printed in: 365 days.
const year = 365 * 24 * time.Hour

// DefaultLimits returns the limits a zero Limits stands for.
func DefaultLimits() Limits {
	return Limits{
		MaxPayloadBytes: 1 << 20,
		MaxHorizon:      10 * year,
		MaxIDBytes:      256,
		MaxKeyBytes:     16 << 10,
		MaxHeaders:      64,
		MaxHeaderBytes:  64 << 10,
		MaxBatch:        10000,
		ReservedTopics:  append(slices.Clone(DefaultReservedTopics), publish.DefaultDeadLetterTopic),
		MaxCatchUp:      1000,
	}
}

// MaxPayloadLimit is the largest MaxPayloadBytes Validate accepts.
const MaxPayloadLimit = 16 << 20

// Validate reports negative limits, naming the field (and chimed's flag where
// there is one). Zero is fine: it means the default.
func (l Limits) Validate() error {
	var errs []error
	check := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("rpc: Limits.%s must not be negative (got %d)", name, v))
		}
	}
	check("MaxPayloadBytes (--max-payload)", int64(l.MaxPayloadBytes))
	check("MaxHorizon (--max-horizon)", int64(l.MaxHorizon))
	check("MaxIDBytes", int64(l.MaxIDBytes))
	check("MaxKeyBytes", int64(l.MaxKeyBytes))
	check("MaxHeaders", int64(l.MaxHeaders))
	check("MaxHeaderBytes", int64(l.MaxHeaderBytes))
	check("MaxBatch", int64(l.MaxBatch))
	check("MaxCatchUp (--max-catch-up)", int64(l.MaxCatchUp))
	for _, p := range l.ReservedTopics {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			errs = append(errs, fmt.Errorf("rpc: Limits.ReservedTopics (--reserved-topics): %q is not a topic pattern (path.Match syntax: * ? [a-z])", p))
		}
	}
	// One request becomes one Raft log entry, and the log (raft-wal) cannot read back an
	// entry above 64 MiB: MaxRequestBytes, twice the largest event, must stay below.
	if l.MaxPayloadBytes > MaxPayloadLimit {
		errs = append(errs, fmt.Errorf("rpc: Limits.MaxPayloadBytes (--max-payload) must be at most %d (16 MiB; got %d): a request of two such events must fit one Raft log entry", MaxPayloadLimit, l.MaxPayloadBytes))
	}
	if l.MaxCatchUp > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("rpc: Limits.MaxCatchUp (--max-catch-up) must be at most %d (got %d)", uint32(math.MaxUint32), l.MaxCatchUp))
	}
	return errors.Join(errs...)
}

// MaxRequestBytes is the largest request a node reads: room for two events
// of the largest size the limits allow, and at least 16 MiB, so a batch of
// ordinary events is bounded by MaxBatch while one client cannot make the
// node hold more than this per call in flight. (The default limits give
// 16 MiB; --max-payload 32 MiB gives about 64 MiB.)
func (l Limits) MaxRequestBytes() int {
	l = l.withDefaults()
	event := l.MaxPayloadBytes + l.MaxKeyBytes + l.MaxHeaderBytes + l.MaxIDBytes + 64<<10 // topic, times, framing
	return max(16<<20, 2*event)
}

// withDefaults replaces every zero field by its default.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxPayloadBytes == 0 {
		l.MaxPayloadBytes = d.MaxPayloadBytes
	}
	if l.MaxHorizon == 0 {
		l.MaxHorizon = d.MaxHorizon
	}
	if l.MaxIDBytes == 0 {
		l.MaxIDBytes = d.MaxIDBytes
	}
	if l.MaxKeyBytes == 0 {
		l.MaxKeyBytes = d.MaxKeyBytes
	}
	if l.MaxHeaders == 0 {
		l.MaxHeaders = d.MaxHeaders
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.MaxBatch == 0 {
		l.MaxBatch = d.MaxBatch
	}
	if l.ReservedTopics == nil {
		l.ReservedTopics = d.ReservedTopics
	}
	if l.MaxCatchUp == 0 {
		l.MaxCatchUp = d.MaxCatchUp
	}
	return l
}

// formatHorizon renders a horizon for people: whole years (of 365 days) and
// days when it is at least a day, "10y", "1y30d", "90d", and Go's duration
// syntax without trailing zero units below that, "36h" is "1d12h", "90m" is
// "1h30m". Parts below a second are dropped when there are days in it.
func formatHorizon(d time.Duration) string {
	if d < 0 {
		return "-" + formatHorizon(-d)
	}
	const day = 24 * time.Hour
	var b strings.Builder
	if y := d / year; y > 0 {
		fmt.Fprintf(&b, "%dy", y)
		d -= y * year
	}
	if dd := d / day; dd > 0 {
		fmt.Fprintf(&b, "%dd", dd)
		d -= dd * day
	}
	if b.Len() > 0 {
		d = d.Truncate(time.Second)
		if d == 0 {
			return b.String()
		}
	}
	if d == 0 {
		return "0s"
	}
	s := d.String() // e.g. 1h30m0s, 2h0m0s, 10m0s, 1.5s
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	b.WriteString(s)
	return b.String()
}
