package publish

import (
	"fmt"
	"strconv"
	"time"
)

// Headers are the chime-* headers of one produced record, parsed. A field
// holds its zero value when its header is absent.
type Headers struct {
	ID      string    // chime-id: the event id
	Due     time.Time // chime-due-unix-ms: when the event was due (ms resolution)
	Fired   time.Time // chime-fired-unix-ms: when this attempt was sent (ms resolution)
	Attempt int       // chime-attempt: 1-based attempt on the event's topic
	Topic   string    // chime-topic: the intended topic (dead-letter records only)
	Error   string    // chime-error: the last produce error (dead-letter records only)
	Dropped string    // chime-dropped: what this dead-letter record left out ("value" or "value,headers")
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
// header type is a {Key string; Value []byte} struct (this package's Header,
// kafka-go's kafka.Header, franz-go's kgo.RecordHeader and kmsg.Header)
// without copying it.
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
	num := func(key string, v []byte) int64 {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("publish: header %s: %q is not a decimal integer", key, v)
			}
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
			out.Attempt = int(num(h.Key, h.Value))
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
