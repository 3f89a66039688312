package rpc

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// fieldError is one broken rule: the field's path in the request
// ("event.topic", "events[3].headers[2].key") and the rule, worded for the
// person who sent it.
type fieldError struct {
	path string
	rule string
}

func (e *fieldError) Error() string { return e.path + ": " + e.rule }

func invalid(path, format string, args ...any) *fieldError {
	return &fieldError{path: path, rule: fmt.Sprintf(format, args...)}
}

// The instants an int64 of Unix nanoseconds can hold; deliver_at must lie
// between them because due times are stored that way.
var (
	minDue = time.Unix(0, math.MinInt64).UTC()
	maxDue = time.Unix(0, math.MaxInt64).UTC()
)

// topicRule is the rule publish.ValidTopic enforces, worded for a message.
const topicRule = `1-249 characters of [a-zA-Z0-9._-], not "." or ".."`

// eventPath names the event a request carries, for errors: "event" in a Schedule, "events[i]"
// in a BatchSchedule. It is formatted only when there is an error to report (formatting every
// event's path up front was 1.7% of an ingesting cluster's CPU).
type eventPath int

// singleEvent is the path of a Schedule's one event; topLevel is the path
// of fields of the request itself (an Update's).
const (
	singleEvent eventPath = -1
	topLevel    eventPath = -2
	// recurringTarget is the target of a recurring schedule's request.
	recurringTarget eventPath = -3
)

func (p eventPath) String() string {
	switch p {
	case singleEvent:
		return "event"
	case topLevel:
		return "request"
	case recurringTarget:
		return "target"
	}
	return "events[" + strconv.Itoa(int(p)) + "]"
}

// field is the path of the event's field name.
func (p eventPath) field(name string) string {
	if p == topLevel {
		return name
	}
	return p.String() + "." + name
}

// checkEvent validates ev (found at path in the request) against every rule
// and, if it passes, returns the shard.Request to schedule: id generated if
// empty, ContentHash computed. It reports the first rule broken, in field
// order. Nothing here has side effects beyond reading the clock value now.
// validTopic, if not nil, is the last topic this call found valid, and is
// set to ev's when it is: the events of a batch mostly share one topic, and
// checking it against the reserved patterns was a tenth of the request path.
func (s *Server) checkEvent(path eventPath, ev *chimev1.Event, now time.Time, validTopic *string, ingest bool) (shard.Request, *fieldError) {
	lim := &s.limits
	if ev == nil {
		return shard.Request{}, invalid(path.String(), "required")
	}
	if n := len(ev.Id); n > lim.MaxIDBytes {
		return shard.Request{}, invalid(path.field("id"), "%d bytes, at most %d allowed", n, lim.MaxIDBytes)
	}
	if validTopic == nil || ev.Topic == "" || ev.Topic != *validTopic {
		if err := lim.checkTopic(path, ev.Topic); err != nil {
			return shard.Request{}, err
		}
		if validTopic != nil {
			*validTopic = ev.Topic
		}
	}
	req := shard.Request{ID: ev.Id, Topic: ev.Topic}
	switch ev.OnConflict {
	case chimev1.OnConflict_ON_CONFLICT_UNSPECIFIED, chimev1.OnConflict_ON_CONFLICT_REJECT:
	case chimev1.OnConflict_ON_CONFLICT_REPLACE:
		req.Replace = true
	default:
		return shard.Request{}, invalid(path.field("on_conflict"), "unknown value %d (ON_CONFLICT_REJECT or ON_CONFLICT_REPLACE)", ev.OnConflict)
	}
	if err := lim.checkDue(path, ev, now, &req); err != nil {
		return shard.Request{}, err
	}
	if err := lim.checkContent(path, ev, ingest); err != nil {
		return shard.Request{}, err
	}
	p, err := checkPolicy(path, ev.Priority, ev.Window)
	if err != nil {
		return shard.Request{}, err
	}
	req.Policy = p
	if req.Output, err = checkOutput(path, ev); err != nil {
		return shard.Request{}, err
	}

	req.Key = ev.Key
	req.Payload = ev.Payload
	if len(ev.Headers) > 0 {
		req.Headers = make([]raftfsm.Header, len(ev.Headers))
		for i, h := range ev.Headers {
			req.Headers[i] = raftfsm.Header{Key: h.Key, Value: h.Value}
		}
	}
	req.ContentHash = raftfsm.ContentHash(req.Topic, req.Key, req.Payload, req.Headers,
		req.DeliverAt, int64(req.Delay), req.HasDeliverAt, req.HasDelay, req.Policy, req.Output)
	if req.ID == "" {
		req.ID = newID()
	}
	return req, nil
}

// checkPolicy: a priority from 0 to 9 (DefaultPriority when unset), and a
// window that is a valid, non-negative Duration of at most MaxWindow.
func checkPolicy(path eventPath, priority *uint32, window *durationpb.Duration) (raftfsm.Policy, *fieldError) {
	p := raftfsm.DefaultPolicy
	if priority != nil {
		if *priority > raftfsm.MaxPriority {
			return p, invalid(path.field("priority"), "%d is not a priority: 0 (lowest) to %d (highest), %d when unset", *priority, raftfsm.MaxPriority, raftfsm.DefaultPriority)
		}
		p.Priority = uint8(*priority)
	}
	if window != nil {
		if err := window.CheckValid(); err != nil {
			return p, invalid(path.field("window"), "not a valid Duration: %v", err)
		}
		w := window.AsDuration()
		if w < 0 {
			return p, invalid(path.field("window"), "must not be negative (got %s)", durationText(window.Seconds, window.Nanos))
		}
		if w > time.Duration(raftfsm.MaxWindow) {
			return p, invalid(path.field("window"), "%s is longer than %s", w, time.Duration(raftfsm.MaxWindow))
		}
		p.Window = int64(w)
	}
	return p, nil
}

// checkOutput: a partition of 0 or more (the topic's partition count is
// Kafka's to know: a record for a partition the topic lacks is dead-lettered
// when it fires), and no payload with a tombstone, whose record's value is
// null.
func checkOutput(path eventPath, ev *chimev1.Event) (raftfsm.Output, *fieldError) {
	var o raftfsm.Output
	if ev.Partition != nil {
		if *ev.Partition < 0 {
			return o, invalid(path.field("partition"), "%d, must be 0 or more (unset: Kafka's partitioner picks one from the key)", *ev.Partition)
		}
		o.Partition, o.HasPartition = *ev.Partition, true
	}
	if ev.Tombstone {
		if n := len(ev.Payload); n > 0 {
			return o, invalid(path.field("payload"), "%d bytes with tombstone set, must be empty (a tombstone's record has a null value)", n)
		}
		o.Tombstone = true
	}
	return o, nil
}

// checkTopic: the topic is required, must be a valid Kafka topic name, and
// must not be reserved (Kafka's internal topics, Chime's own) unless allowed.
func (l *Limits) checkTopic(path eventPath, topic string) *fieldError {
	switch {
	case topic == "":
		return invalid(path.field("topic"), "required")
	case len(topic) > 249:
		return invalid(path.field("topic"), "%d characters is not a valid Kafka topic name (%s)", len(topic), topicRule)
	case publish.ValidTopic(topic) != nil:
		return invalid(path.field("topic"), "%q is not a valid Kafka topic name (%s)", topic, topicRule)
	}
	if why := l.ReservedTopic(topic); why != "" {
		return invalid(path.field("topic"), "%q is reserved: %s (chimed --allow-topic %s lets events target it)", topic, why, topic)
	}
	return nil
}

// checkDue: exactly one of deliver_at and delay, within what Chime can
// store and within MaxHorizon of now. It sets the due fields of req.
func (lim *Limits) checkDue(path eventPath, ev *chimev1.Event, now time.Time, req *shard.Request) *fieldError {
	switch {
	case ev.DeliverAt != nil && ev.Delay != nil:
		return invalid(path.String(), "set exactly one of deliver_at and delay (both are set)")
	case ev.DeliverAt == nil && ev.Delay == nil:
		return invalid(path.String(), "set exactly one of deliver_at and delay (neither is set)")
	case ev.DeliverAt != nil:
		if err := ev.DeliverAt.CheckValid(); err != nil {
			return invalid(path.field("deliver_at"), "not a valid Timestamp: %v", err)
		}
		at := ev.DeliverAt.AsTime()
		if at.Before(minDue) || at.After(maxDue) {
			return invalid(path.field("deliver_at"), "%s is outside the times Chime can store (%s to %s)",
				at.Format(time.RFC3339Nano), minDue.Format(time.RFC3339Nano), maxDue.Format(time.RFC3339Nano))
		}
		if at.Sub(now) > lim.MaxHorizon {
			return invalid(path.field("deliver_at"), "%s is more than %s ahead (--max-horizon)",
				at.Format(time.RFC3339Nano), formatHorizon(lim.MaxHorizon))
		}
		req.HasDeliverAt = true
		req.DeliverAt = at.UnixNano()
	default:
		if err := ev.Delay.CheckValid(); err != nil {
			return invalid(path.field("delay"), "not a valid Duration: %v", err)
		}
		if ev.Delay.Seconds < 0 || ev.Delay.Nanos < 0 {
			return invalid(path.field("delay"), "must not be negative (got %s)", durationText(ev.Delay.Seconds, ev.Delay.Nanos))
		}
		// AsDuration saturates at ~292 years, which is beyond any horizon
		// an int64 of nanoseconds can express, so the comparison holds.
		if d := ev.Delay.AsDuration(); d > lim.MaxHorizon {
			return invalid(path.field("delay"), "%s is more than %s (--max-horizon)",
				durationText(ev.Delay.Seconds, ev.Delay.Nanos), formatHorizon(lim.MaxHorizon))
		}
		req.HasDelay = true
		req.Delay = ev.Delay.AsDuration()
	}
	return nil
}

// checkContent: key, payload and headers within their limits, and no
// header in the namespace of the ones Chime adds. A client header whose key
// starts with chimev1.HeaderPrefix ("chime-") would be indistinguishable
// from the headers publish adds to every record (chime-id,
// chime-due-unix-ms, ...), so consumers that deduplicate on chime-id could
// be fooled. Compared case-insensitively: "Chime-Id" is a different Kafka
// header but just as misleading to a person reading it.
func (lim *Limits) checkContent(path eventPath, ev *chimev1.Event, ingest bool) *fieldError {
	if n := len(ev.Key); n > lim.MaxKeyBytes {
		return invalid(path.field("key"), "%d bytes, at most %d allowed", n, lim.MaxKeyBytes)
	}
	if n := len(ev.Payload); n > lim.MaxPayloadBytes {
		return invalid(path.field("payload"), "%d bytes, at most %d allowed (--max-payload)", n, lim.MaxPayloadBytes)
	}
	if n := len(ev.Headers); n > lim.MaxHeaders {
		return invalid(path.field("headers"), "%d headers, at most %d allowed", n, lim.MaxHeaders)
	}
	headerBytes := 0
	for i, h := range ev.Headers {
		if h == nil { // cannot come off the wire, only from an in-process caller
			return invalid(path.field(fmt.Sprintf("headers[%d]", i)), "required")
		}
		ingestHeader := ingest && (h.Key == chimev1.HeaderSource || h.Key == chimev1.HeaderTombstoneBack)
		if !ingestHeader && len(h.Key) >= len(chimev1.HeaderPrefix) && strings.EqualFold(h.Key[:len(chimev1.HeaderPrefix)], chimev1.HeaderPrefix) {
			return invalid(path.field(fmt.Sprintf("headers[%d].key", i)),
				"the %q prefix is reserved for headers Chime adds", chimev1.HeaderPrefix)
		}
		headerBytes += len(h.Key) + len(h.Value)
	}
	if headerBytes > lim.MaxHeaderBytes {
		return invalid(path.field("headers"), "%d bytes of keys and values, at most %d allowed", headerBytes, lim.MaxHeaderBytes)
	}
	return nil
}

// durationText prints a google.protobuf.Duration exactly, including the ones
// too long for a time.Duration.
func durationText(seconds int64, nanos int32) string {
	const maxSeconds = math.MaxInt64 / int64(time.Second)
	if seconds > -maxSeconds && seconds < maxSeconds {
		return (time.Duration(seconds)*time.Second + time.Duration(nanos)).String()
	}
	return fmt.Sprintf("%ds", seconds)
}
