package ingest

// # Formats of a schedules topic
//
// A source topic is read in one format; its Decoder turns each record into
// an Op: events to schedule, ids to cancel, or nothing (Skip). A record it
// cannot decode is a *RecordError naming the key or header and the rule.
// Decoders check only what they must to decode; the events then pass the
// same validation as a Schedule call (topic names, sizes, horizon).
//
// chime, Chime's own: the record key is the event id, the value the
// payload, and these headers say the rest:
//
//	chime-deliver-at         RFC 3339, or Unix milliseconds (decimal; 1 to 10^11-1,
//	                         times before 1973, are refused as seconds by mistake)
//	chime-delay              a Go duration (90s, 1h30m) from when Chime accepts it
//	                         (exactly one of chime-deliver-at and chime-delay)
//	chime-topic              the target topic (required)
//	chime-key                the target record key (default: the record key)
//	chime-partition          the target partition, a decimal int32 >= 0 (default: by key)
//	chime-priority           one digit, 0 (lowest) to 9 (highest)
//	chime-window             a Go duration: fire anywhere in [due, due+window]
//	chime-on-conflict        replace (default): a newer record with the key reschedules;
//	                         reject: a different schedule under a used id is rejected
//	chime-deliver-tombstone  true: fire a tombstone (null value); the value must be empty
//
// Every other header is copied, in order, to the fired record; any other
// header starting "chime-" (any case) is an error, so a typo such as
// chime-delivr-at is not silently copied. A tombstone record cancels the id.
//
// etf1, github.com/etf1/kafka-message-scheduler: the key is the id, the
// value the payload; scheduler-epoch (Unix seconds), scheduler-target-topic
// and scheduler-target-key (absent: no key). The fired record carries every
// header of the schedule, then scheduler-key and scheduler-topic (the
// schedule's key and topic), as etf1's does (not yet its
// scheduler-timestamp: see etf1.go). A tombstone cancels.
//
// karafka, Karafka Pro's scheduled messages (schema 1.0.0): the proxy
// record's key is the id, its value the payload (a null value fires a
// tombstone); schedule_source_type is schedule, cancel or tombstone (the
// last two cancel the key); schedule_target_epoch (Unix seconds),
// schedule_target_topic, and optionally schedule_target_key,
// schedule_target_partition and schedule_target_partition_key. The fired
// record carries every header of the proxy record plus
// schedule_source_topic, _partition, _offset and _key, as Karafka's
// dispatcher adds them. See karafka.go.
//
// In both, a header named chime-* (any case) is an error rather than
// copied: the prefix is Chime's.
//
// sky: sky-uk/kafka-message-scheduler's Avro records (sky.go).
//
// Common to every format:
//
//   - The event id is the record key as it is (DecodeOptions.IDFromKey), or
//     "<topic>/<key>" so that two source topics cannot collide. A record
//     without a key is an error: there is no id to schedule or cancel.
//   - Every event carries a chime-source header, "<topic>/<partition>/<offset>"
//     of its record; the consumer tells a record read again from a newer
//     one by it.
//   - Companions, due with the event, with the same priority, window and
//     conflict rule: with DecodeOptions.HistoryTopic, "<id>#history", a copy
//     of the fired record to that topic; with DecodeOptions.TombstoneBack,
//     "<id>#tombstone-back", a tombstone with the record's key to the
//     record's own topic and partition (so compaction drops the fired
//     schedule), marked chime-tombstone-back: true.
//   - A cancel cancels the id, then the ids of the companions configured.
//   - A tombstone carrying chime-tombstone-back is Chime's own tombstone
//     back, read again: it is skipped, and cancels nothing.
//   - The conflict rule: ON_CONFLICT_REPLACE means a record newer than the
//     one the stored event came from replaces it (the consumer compares
//     their chime-source headers and leaves the event alone when the record
//     is the same one, read again); ON_CONFLICT_REJECT means a different
//     event under a used id rejects the record. etf1, Karafka and sky keep
//     one schedule per key, overwritten by a new record with the key, so
//     their events ask for REPLACE; Chime's format says with
//     chime-on-conflict (REPLACE by default).
//
// Decoders are safe for concurrent use (the consumer decodes partitions in
// parallel). Events alias the record's key, value and header values: the
// record must not be reused while they are in use.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The suffixes of the companion events' ids.
const (
	historySuffix       = "#history"
	tombstoneBackSuffix = "#tombstone-back"
)

// keyed is the Decoder of a format whose record key is the id and whose
// tombstone cancels it (chime, etf1, sky): it does that much, skips
// Chime's own tombstone back, and leaves the rest of a schedule to decode.
type keyed struct {
	common
	decode func(r *Record, id string) (Op, error)
}

// Decode implements Decoder.
func (k keyed) Decode(r *Record) (Op, error) {
	if isTombstoneBack(r) {
		return Op{Skip: true}, nil
	}
	id, err := k.id(r)
	if err != nil {
		return Op{}, err
	}
	if r.Value == nil {
		return k.cancel(id), nil
	}
	return k.decode(r, id)
}

// NewDecoder returns the decoder of format: "chime", "etf1", "karafka" or
// "sky".
func NewDecoder(format string, opts DecodeOptions) (Decoder, error) {
	c := common{opts}
	switch format {
	case "chime":
		return keyed{c, chimeDecoder{c}.decode}, nil
	case "etf1":
		return keyed{c, etf1Decoder{c}.decode}, nil
	case "karafka":
		return karafkaDecoder{c}, nil
	case "sky":
		d, err := newSkyDecoder(opts)
		if err != nil {
			return nil, err
		}
		return keyed{c, d.decode}, nil
	}
	return nil, fmt.Errorf("unknown format %q (chime, etf1, karafka or sky)", format)
}

// common is what every format decodes the same way: the id, the
// companions, cancels and the skip of Chime's own tombstones.
type common struct {
	opts DecodeOptions
}

// isTombstoneBack reports whether r is a tombstone Chime produced back to
// its schedules topic.
func isTombstoneBack(r *Record) bool {
	if r.Value != nil {
		return false
	}
	for _, h := range r.Headers {
		if h.Key == chimev1.HeaderTombstoneBack {
			return true
		}
	}
	return false
}

// id is the event id r's key makes. The key must be valid UTF-8 because
// an event id is a protobuf string.
func (c common) id(r *Record) (string, error) {
	if len(r.Key) == 0 {
		return "", &RecordError{Field: "key", Rule: "required: the record key makes the event id"}
	}
	if !utf8.Valid(r.Key) {
		return "", &RecordError{Field: "key", Rule: fmt.Sprintf("%q is not valid UTF-8: the record key makes the event id", r.Key)}
	}
	if c.opts.IDFromKey {
		return string(r.Key), nil
	}
	return r.Topic + "/" + string(r.Key), nil
}

// cancel is the Op that cancels id and its companions.
func (c common) cancel(id string) Op {
	ids := make([]string, 1, 3)
	ids[0] = id
	if c.opts.HistoryTopic != "" {
		ids = append(ids, id+historySuffix)
	}
	if c.opts.TombstoneBack {
		ids = append(ids, id+tombstoneBackSuffix)
	}
	return Op{Cancel: true, IDs: ids}
}

// schedule completes ev, the event r asks for (due time, target, content,
// policy and conflict rule set by the format; REJECT if unset), into the
// Op that schedules it: its id and chime-source header set, followed by
// its companions.
func (c common) schedule(r *Record, id string, ev *chimev1.Event) Op {
	// The chime-source header, and the slices that hold it and ev, in one
	// allocation: every record of a schedules topic takes this path.
	s := &sourced{src: chimev1.Header{Key: chimev1.HeaderSource, Value: sourceBytes(r.Topic, r.Partition, r.Offset)}}
	src := &s.src
	ev.Id = id
	if ev.Headers == nil {
		s.hs[0] = src
		ev.Headers = s.hs[:]
	} else {
		ev.Headers = append(ev.Headers, src)
	}
	if ev.OnConflict == chimev1.OnConflict_ON_CONFLICT_UNSPECIFIED {
		ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REJECT
	}
	s.evs[0] = ev
	evs := s.evs[:]
	if c.opts.HistoryTopic != "" || c.opts.TombstoneBack {
		evs = slices.Grow(evs, 2)
	}
	// The companions share ev's immutable parts (times, header messages,
	// bytes) but not its slices, which the consumer may change per event.
	if c.opts.HistoryTopic != "" {
		evs = append(evs, &chimev1.Event{
			Id:         id + historySuffix,
			DeliverAt:  ev.DeliverAt,
			Delay:      ev.Delay,
			Topic:      c.opts.HistoryTopic,
			Key:        ev.Key,
			Payload:    ev.Payload,
			Headers:    slices.Clone(ev.Headers),
			OnConflict: ev.OnConflict,
			Priority:   ev.Priority,
			Window:     ev.Window,
			Tombstone:  ev.Tombstone,
		})
	}
	if c.opts.TombstoneBack {
		evs = append(evs, &chimev1.Event{
			Id:        id + tombstoneBackSuffix,
			DeliverAt: ev.DeliverAt,
			Delay:     ev.Delay,
			Topic:     r.Topic,
			Key:       r.Key,
			// The record's own partition: compaction drops the schedule only
			// if the tombstone lands where it is, whatever partitioner put it
			// there.
			Partition: proto.Int32(r.Partition),
			Tombstone: true,
			Headers: []*chimev1.Header{
				{Key: chimev1.HeaderTombstoneBack, Value: []byte("true")},
				src,
			},
			OnConflict: ev.OnConflict,
			Priority:   ev.Priority,
			Window:     ev.Window,
		})
	}
	return Op{Events: evs}
}

// sourced holds what schedule adds to an event: its chime-source header,
// the header slice when the event has no other header, and the slice of
// events.
type sourced struct {
	src chimev1.Header
	hs  [1]*chimev1.Header
	evs [1]*chimev1.Event
}

// copyHeader is h as an event header.
func copyHeader(h Header) *chimev1.Header {
	return &chimev1.Header{Key: h.Key, Value: h.Value}
}

// copyHeaders appends the headers of r, but those named in skip, to hs. A
// header named chime-* is an error: the server would refuse it, and it could
// pass for one of the headers Chime adds.
func copyHeaders(hs []*chimev1.Header, r *Record, skip ...string) ([]*chimev1.Header, error) {
	for _, h := range r.Headers {
		if slices.Contains(skip, h.Key) {
			continue
		}
		if hasChimePrefix(h.Key) {
			return nil, &RecordError{Field: h.Key, Rule: reservedRule}
		}
		hs = append(hs, copyHeader(h))
	}
	return hs, nil
}

// reservedRule is broken by a header named chime-* that a format copies.
var reservedRule = fmt.Sprintf("the %q prefix is reserved for headers Chime adds", chimev1.HeaderPrefix)

// The rules the formats share, worded once.
const (
	partitionRule = "is not a partition: a decimal integer from 0 to 2147483647"
	secondsRule   = "is not Unix seconds (a decimal integer)"
)

// parsePartition reads a target partition: a decimal int32, not negative.
func parsePartition(field string, v []byte) (*int32, error) {
	n, err := strconv.ParseInt(string(v), 10, 32)
	if err != nil || n < 0 {
		return nil, &RecordError{Field: field, Rule: fmt.Sprintf("%q %s", v, partitionRule)}
	}
	return proto.Int32(int32(n)), nil
}

// parseSeconds reads Unix seconds, a decimal integer.
func parseSeconds(field string, v []byte) (int64, error) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, &RecordError{Field: field, Rule: fmt.Sprintf("%q %s", v, secondsRule)}
	}
	return n, nil
}

// hasChimePrefix reports whether name starts with chimev1.HeaderPrefix in
// any case, as the server's rule on client headers reads it.
func hasChimePrefix(name string) bool {
	p := chimev1.HeaderPrefix
	return len(name) >= len(p) && strings.EqualFold(name[:len(p)], p)
}
