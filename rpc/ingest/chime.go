package ingest

import (
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The headers of Chime's own format ("chime"); format.go describes it.
const (
	HeaderDeliverAt        = "chime-deliver-at"
	HeaderDelay            = "chime-delay"
	HeaderTargetTopic      = "chime-topic"
	HeaderTargetKey        = "chime-key"
	HeaderTargetPartition  = "chime-partition"
	HeaderPriority         = "chime-priority"
	HeaderWindow           = "chime-window"
	HeaderOnConflict       = "chime-on-conflict"
	HeaderDeliverTombstone = "chime-deliver-tombstone"
)

// chimeHeaders lists the headers of the format in the order errors list them.
var chimeHeaders = [...]string{
	HeaderDeliverAt, HeaderDelay, HeaderTargetTopic, HeaderTargetKey, HeaderTargetPartition,
	HeaderPriority, HeaderWindow, HeaderOnConflict, HeaderDeliverTombstone,
}

// unknownChimeRule is the rule broken by a chime-* header not in the list.
var unknownChimeRule = func() string {
	s := fmt.Sprintf("not a header of Chime's format; the %q prefix is reserved (", "chime-")
	for i, h := range chimeHeaders {
		if i > 0 {
			s += ", "
		}
		s += h
	}
	return s + ")"
}()

type chimeDecoder struct{ common }

// decode decodes the schedule r is in Chime's format.
func (d chimeDecoder) decode(r *Record, id string) (Op, error) {
	ev := &chimev1.Event{
		Key:        r.Key,
		Payload:    r.Value,
		OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
	}
	// seen holds, per header of chimeHeaders, whether it came already: a
	// header set twice is ambiguous.
	var seen [len(chimeHeaders)]bool
	for _, h := range r.Headers {
		if !hasChimePrefix(h.Key) {
			if ev.Headers == nil {
				ev.Headers = make([]*chimev1.Header, 0, len(r.Headers)+1)
			}
			ev.Headers = append(ev.Headers, copyHeader(h))
			continue
		}
		i := chimeHeaderIndex(h.Key)
		if i < 0 {
			return Op{}, &RecordError{Field: h.Key, Rule: unknownChimeRule}
		}
		if seen[i] {
			return Op{}, &RecordError{Field: h.Key, Rule: "set more than once"}
		}
		seen[i] = true
		if err := setChimeHeader(ev, h); err != nil {
			return Op{}, err
		}
	}
	switch {
	case ev.DeliverAt == nil && ev.Delay == nil:
		return Op{}, &RecordError{Field: HeaderDeliverAt, Rule: "set exactly one of chime-deliver-at and chime-delay (neither is set)"}
	case ev.DeliverAt != nil && ev.Delay != nil:
		return Op{}, &RecordError{Field: HeaderDelay, Rule: "set exactly one of chime-deliver-at and chime-delay (both are set)"}
	case ev.Topic == "":
		return Op{}, &RecordError{Field: HeaderTargetTopic, Rule: "required"}
	}
	if ev.Tombstone {
		if len(r.Value) > 0 {
			return Op{}, &RecordError{Field: HeaderDeliverTombstone, Rule: fmt.Sprintf("a tombstone has no value, and the record's is %d bytes (send an empty one)", len(r.Value))}
		}
		ev.Payload = nil
	}
	return d.schedule(r, id, ev), nil
}

func chimeHeaderIndex(name string) int {
	for i, h := range chimeHeaders {
		if h == name {
			return i
		}
	}
	return -1
}

// setChimeHeader sets the field of ev that h, one of chimeHeaders, says.
func setChimeHeader(ev *chimev1.Event, h Header) error {
	v := h.Value
	switch h.Key {
	case HeaderDeliverAt:
		at, rule := parseDeliverAt(string(v))
		if rule != "" {
			return badHeader(h, rule)
		}
		ev.DeliverAt = at
	case HeaderDelay:
		d, err := time.ParseDuration(string(v))
		if err != nil {
			return badHeader(h, "is not a Go duration (such as 90s or 1h30m)")
		}
		ev.Delay = durationpb.New(d)
	case HeaderTargetTopic:
		ev.Topic = string(v)
	case HeaderTargetKey:
		ev.Key = v
	case HeaderTargetPartition:
		p, err := parsePartition(h.Key, v)
		if err != nil {
			return err
		}
		ev.Partition = p
	case HeaderPriority:
		if len(v) != 1 || v[0] < '0' || v[0] > '9' {
			return badHeader(h, "is not a priority: one digit, 0 (lowest) to 9 (highest)")
		}
		p := uint32(v[0] - '0')
		ev.Priority = &p
	case HeaderWindow:
		w, err := time.ParseDuration(string(v))
		if err != nil {
			return badHeader(h, "is not a Go duration (such as 90s or 1h30m)")
		}
		ev.Window = durationpb.New(w)
	case HeaderOnConflict:
		switch string(v) {
		case "replace":
			ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REPLACE
		case "reject":
			ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REJECT
		default:
			return badHeader(h, "is neither replace nor reject")
		}
	case HeaderDeliverTombstone:
		switch string(v) {
		case "true":
			ev.Tombstone = true
		case "false":
		default:
			return badHeader(h, "is neither true nor false")
		}
	}
	return nil
}

// badHeader is the error of a header of Chime's format whose value breaks
// rule.
func badHeader(h Header, rule string) error {
	return &RecordError{Field: h.Key, Rule: fmt.Sprintf("%q %s", h.Value, rule)}
}

// secondsAsMillis: a chime-deliver-at in Unix milliseconds below it (and
// above 0) is taken for Unix seconds, the unit of etf1 and Karafka, written
// by mistake. As milliseconds it would be a time before 1973-03-03 and fire
// at once, silently; every such time in seconds is after 1973.
const secondsAsMillis = 100_000_000_000

// parseDeliverAt reads a due time: Unix milliseconds as a decimal integer,
// or an RFC 3339 time (fractional seconds allowed). rule says what is wrong
// with s, if it cannot be read.
func parseDeliverAt(s string) (at *timestamppb.Timestamp, rule string) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms > 0 && ms < secondsAsMillis {
			return nil, fmt.Sprintf("is Unix milliseconds before 1973-03-03, Unix seconds by mistake? (%s000 in milliseconds)", s)
		}
		return timestamppb.New(time.UnixMilli(ms)), ""
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, "is neither RFC 3339 nor Unix milliseconds"
	}
	return timestamppb.New(t), ""
}
