package chimev1

import (
	"fmt"
	"strconv"
	"time"
)

// The chime-* headers Chime adds to every record it produces, after the
// event's own headers. They are part of the API contract: a consumer drops
// duplicates by HeaderID (delivery is at least once, and every copy of an
// event carries the same id) and measures lateness as
// HeaderFired - HeaderDue. Numbers are decimal strings. A client header
// whose key starts with HeaderPrefix (any case) is rejected at Schedule, so
// these cannot be forged.
//
// This file is written by hand; the generated code lives next to it.
const (
	// HeaderPrefix starts every header name below; Schedule rejects client
	// headers that start with it in any case.
	HeaderPrefix = "chime-"

	HeaderID      = "chime-id"            // the event id (the idempotency key)
	HeaderDue     = "chime-due-unix-ms"   // when the event was due, unix milliseconds
	HeaderFired   = "chime-fired-unix-ms" // when this attempt was sent, unix milliseconds
	HeaderAttempt = "chime-attempt"       // 1-based number of the attempt on the event's topic
	HeaderVersion = "chime-version"       // the event's version: 1 as scheduled, one more per change
	// Only on a recurring schedule's occurrences, which carry them as headers of
	// their own (Get shows them), after the schedule's.
	HeaderRecurringID = "chime-recurring-id"       // the schedule's id
	HeaderOccurrence  = "chime-occurrence-unix-ms" // the occurrence's nominal time, unix milliseconds
	// Only on dead-letter records.
	HeaderTopic   = "chime-topic"   // the topic the event was meant for
	HeaderError   = "chime-error"   // the last produce error
	HeaderDropped = "chime-dropped" // what the record left out to fit: "value" or "value,headers"
	// Only on events scheduled through an ingest topic, which carry them as
	// headers of their own (Get shows them), after the record's.
	HeaderSource        = "chime-source"         // "<topic>/<partition>/<offset>" of the record the event came from
	HeaderTombstoneBack = "chime-tombstone-back" // "true" on the tombstone Chime produces back to a schedules topic
)

// Headers are the chime-* headers of one produced record, parsed. A field
// holds its zero value when its header is absent.
type Headers struct {
	ID      string    // chime-id: the event id
	Due     time.Time // chime-due-unix-ms: when the event was due (ms resolution)
	Fired   time.Time // chime-fired-unix-ms: when this attempt was sent (ms resolution)
	Attempt int       // chime-attempt: 1-based attempt on the event's topic
	Version uint64    // chime-version: the version of the event this record is of
	// RecurringID and Occurrence: chime-recurring-id and
	// chime-occurrence-unix-ms (a recurring schedule's occurrences only).
	RecurringID string
	Occurrence  time.Time
	Topic       string // chime-topic: the intended topic (dead-letter records only)
	Error       string // chime-error: the last produce error (dead-letter records only)
	Dropped     string // chime-dropped: what this dead-letter record left out ("value" or "value,headers")
}

// Late is how long after its due time the record was sent (Fired - Due, at
// millisecond resolution); ok is false unless both headers were present.
func (h Headers) Late() (late time.Duration, ok bool) {
	if h.Due.IsZero() || h.Fired.IsZero() {
		return 0, false
	}
	return h.Fired.Sub(h.Due), true
}

// ParseHeaders reads the chime-* headers out of a record's headers and
// ignores the others. It takes the header slice of any Kafka client whose
// header type is a {Key string; Value []byte} struct (kafka-go's
// kafka.Header, franz-go's kgo.RecordHeader and kmsg.Header, Chime's
// publish.Header) without copying it, so this package links no Kafka
// client.
//
// When a name repeats, the last one wins: Chime's own headers follow the
// event's. A malformed number leaves its field zero; the other fields are
// still filled, and the error names the header and its value.
func ParseHeaders[H ~struct {
	Key   string
	Value []byte
}](hs []H) (Headers, error) {
	var out Headers
	var firstErr error
	bad := func(key string, v []byte, what string) {
		if firstErr == nil {
			firstErr = fmt.Errorf("chimev1: header %s: %q is not %s", key, v, what)
		}
	}
	num := func(key string, v []byte) int64 {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			bad(key, v, "a decimal integer")
			return 0
		}
		return n
	}
	// The attempt and the version are written unsigned: a version can pass
	// 2^63, and neither can be negative.
	unsigned := func(key string, v []byte, bits int) uint64 {
		n, err := strconv.ParseUint(string(v), 10, bits)
		if err != nil {
			bad(key, v, "an unsigned decimal integer")
			return 0
		}
		return n
	}
	for _, raw := range hs {
		h := struct {
			Key   string
			Value []byte
		}(raw)
		switch h.Key {
		case HeaderID:
			out.ID = string(h.Value)
		case HeaderDue:
			out.Due = msTime(num(h.Key, h.Value))
		case HeaderFired:
			out.Fired = msTime(num(h.Key, h.Value))
		case HeaderAttempt:
			out.Attempt = int(unsigned(h.Key, h.Value, strconv.IntSize-1))
		case HeaderVersion:
			out.Version = unsigned(h.Key, h.Value, 64)
		case HeaderRecurringID:
			out.RecurringID = string(h.Value)
		case HeaderOccurrence:
			out.Occurrence = msTime(num(h.Key, h.Value))
		case HeaderTopic:
			out.Topic = string(h.Value)
		case HeaderError:
			out.Error = string(h.Value)
		case HeaderDropped:
			out.Dropped = string(h.Value)
		}
	}
	return out, firstErr
}

// msTime is the time of unix milliseconds ms, or the zero time for 0 (a
// malformed header), so that IsZero means "not known".
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
