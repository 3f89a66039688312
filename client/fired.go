package client

import (
	"errors"
	"fmt"
	"sync"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Fired is what a Kafka record Chime produced says about the event it came
// from, read from the record's chime-* headers by ParseFired.
//
// Delivery is at least once: the same event may reach a topic more than
// once (a produce retried after a lost acknowledgement, a leader change).
// Every copy carries the same ID and Version; a Deduper drops the extra
// copies.
type Fired struct {
	// ID is the event's id (chime-id), the idempotency key.
	ID string
	// Version is the version of the event the record was produced from
	// (chime-version): 1 as scheduled, one more per Update or Replace. It
	// is 0 on records of servers that did not send it.
	Version uint64
	// Due is when the event was due (chime-due-unix-ms), to the millisecond.
	Due time.Time
	// FiredAt is when this copy was sent (chime-fired-unix-ms), to the
	// millisecond.
	FiredAt time.Time
	// Attempt is the 1-based number of the produce attempt that sent this
	// copy (chime-attempt).
	Attempt int
	// RecurringID and Occurrence are set on the occurrences of a recurring
	// schedule only: the schedule's id (chime-recurring-id) and the
	// occurrence's nominal time (chime-occurrence-unix-ms), before any
	// jitter.
	RecurringID string
	Occurrence  time.Time
}

// Late is how long after its due time the record was sent (FiredAt - Due),
// or 0 when either is unknown. Chime never fires early, so it is not
// negative but for clock skew between nodes.
func (f Fired) Late() time.Duration {
	if f.Due.IsZero() || f.FiredAt.IsZero() {
		return 0
	}
	return f.FiredAt.Sub(f.Due)
}

// ErrNotFired is returned by ParseFired for a record without a chime-id
// header: Chime did not produce it.
var ErrNotFired = errors.New("client: record has no " + chimev1.HeaderID + " header: Chime did not produce it")

// ParseFired reads the chime-* headers of a record Chime produced. It takes
// the header slice of any Kafka client whose header type is a
// {Key string; Value []byte} struct, as it is, without copying:
// kafka-go's kafka.Header, franz-go's kgo.RecordHeader, or this package's
// Header. Other headers are ignored.
//
// It returns ErrNotFired when there is no chime-id header. A chime-* header
// whose number does not parse is reported as an error too; the Fired
// returned with it holds the headers that did parse, with that field left
// zero.
//
//	for _, r := range fetches.Records() { // franz-go
//		f, err := client.ParseFired(r.Headers)
//		if err != nil { ... }
//		if dedup.Seen(f) { continue }
//		...
//	}
func ParseFired[H ~struct {
	Key   string
	Value []byte
}](headers []H) (Fired, error) {
	h, err := chimev1.ParseHeaders(headers)
	f := Fired{
		ID:          h.ID,
		Version:     h.Version,
		Due:         h.Due,
		FiredAt:     h.Fired,
		Attempt:     h.Attempt,
		RecurringID: h.RecurringID,
		Occurrence:  h.Occurrence,
	}
	if f.ID == "" {
		return f, ErrNotFired
	}
	if err != nil {
		return f, fmt.Errorf("client: record %q: %w", f.ID, err)
	}
	return f, nil
}

// Deduper drops the extra copies of fired events a consumer may read:
// it remembers the (ID, Version) pairs of the last size distinct records
// it was shown, so memory stays bounded whatever the stream's length. A
// copy that arrives after size other records have been seen is no longer
// recognised; size should cover the records a consumer reads in the time
// a duplicate can lag (a few seconds' worth is ample: duplicates come from
// retries of one produce).
//
// A Deduper is safe for concurrent use. It holds no goroutine.
type Deduper struct {
	mu   sync.Mutex
	seen map[dedupKey]struct{}
	ring []dedupKey // the remembered keys, oldest at next once the ring is full
	next int
}

type dedupKey struct {
	id      string
	version uint64
}

// NewDeduper returns a Deduper that remembers the last size records. It
// panics if size is less than 1.
func NewDeduper(size int) *Deduper {
	if size < 1 {
		panic(fmt.Sprintf("client: NewDeduper(%d): size must be at least 1", size))
	}
	return &Deduper{seen: make(map[dedupKey]struct{}, size), ring: make([]dedupKey, 0, size)}
}

// Seen reports whether a record with f's ID and Version was shown to d
// among the last size distinct ones, and remembers f's: the first copy of
// an event reports false, later copies true. A new Version of an event (it
// was updated or replaced after one version fired) is a different record.
func (d *Deduper) Seen(f Fired) bool {
	k := dedupKey{id: f.ID, version: f.Version}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.seen[k]; ok {
		return true
	}
	if len(d.ring) < cap(d.ring) {
		d.ring = append(d.ring, k)
	} else {
		delete(d.seen, d.ring[d.next])
		d.ring[d.next] = k
		d.next = (d.next + 1) % len(d.ring)
	}
	d.seen[k] = struct{}{}
	return false
}
