package ingest

// The etf1 format is the contract of github.com/etf1/kafka-message-scheduler
// as read at v0.0.9 (commit 7e86af40c3f84b371e6e18afa2139c65aaba7319):
// README.md ("How does it work ?"), schedule/kafka/schedule.go (the headers
// a schedule is read from; the first of a repeated name wins; a tombstone
// deletes the schedule) and runner/kafka/handler.go, produceTargetMessage
// (what a fired record carries: the schedule's headers, all of them and in
// order, scheduler-* included, then scheduler-timestamp, scheduler-key and
// scheduler-topic; the key is scheduler-target-key, nil when absent).
//
// Where Chime differs from etf1, on purpose:
//   - A missing or malformed scheduler-epoch is an error; etf1 reads it as 0,
//     an outdated schedule, and drops it. A past epoch fires at once; etf1
//     drops one older than its grace interval.
//   - etf1 produces history and tombstone copies only for a non-empty value;
//     Chime's companions follow DecodeOptions whatever the value.
//   - etf1 partitions the fired record with librdkafka's default
//     (consistent_random, CRC32) unless configured murmur2_random; Chime
//     always uses murmur2 (the Java client's), and gives a keyless record
//     the event id as its key.

import (
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// etf1's headers: read from a schedule, and added to the record it fires.
const (
	etf1Epoch       = "scheduler-epoch"        // due time, Unix seconds
	etf1TargetTopic = "scheduler-target-topic" // the topic to fire to
	etf1TargetKey   = "scheduler-target-key"   // the fired record's key
	etf1Timestamp   = "scheduler-timestamp"    // on the fired record: the schedule record's timestamp, Unix seconds
	etf1Key         = "scheduler-key"          // on the fired record: the schedule's key
	etf1Topic       = "scheduler-topic"        // on the fired record: the schedules topic
)

type etf1Decoder struct{ common }

// decode decodes the schedule r is, as etf1 reads it.
func (d etf1Decoder) decode(r *Record, id string) (Op, error) {
	epoch, topic, key := etf1Header(r, etf1Epoch), etf1Header(r, etf1TargetTopic), etf1Header(r, etf1TargetKey)
	if len(epoch) == 0 {
		return Op{}, &RecordError{Field: etf1Epoch, Rule: "required"}
	}
	secs, err := parseSeconds(etf1Epoch, epoch)
	if err != nil {
		return Op{}, err
	}
	if len(topic) == 0 {
		return Op{}, &RecordError{Field: etf1TargetTopic, Rule: "required"}
	}
	hs, err := copyHeaders(make([]*chimev1.Header, 0, len(r.Headers)+3), r)
	if err != nil {
		return Op{}, err
	}
	hs = append(hs,
		&chimev1.Header{Key: etf1Timestamp, Value: strconv.AppendInt(nil, r.Timestamp.Unix(), 10)},
		&chimev1.Header{Key: etf1Key, Value: r.Key},
		&chimev1.Header{Key: etf1Topic, Value: []byte(r.Topic)})
	ev := &chimev1.Event{
		DeliverAt: &timestamppb.Timestamp{Seconds: secs},
		Topic:     string(topic),
		Key:       key,
		Payload:   r.Value,
		Headers:   hs,
		// etf1 keeps one schedule per key: a new record replaces it.
		OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
	}
	return d.schedule(r, id, ev), nil
}

// etf1Header is the value of the first header named name, nil if none, as
// etf1's Schedule.getHeaderValue reads it.
func etf1Header(r *Record, name string) []byte {
	for _, h := range r.Headers {
		if h.Key == name {
			return h.Value
		}
	}
	return nil
}
