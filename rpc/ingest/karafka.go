package ingest

// The karafka format is the envelope of Karafka Pro's scheduled messages,
// as read in github.com/karafka/karafka at 2.6.1 (commit
// 65f74b77cb3f288b7e71973a3b91ace9942afbd1), lib/karafka/pro/scheduled_messages/:
//
//   - proxy.rb: Proxy.schedule wraps a message in a proxy record whose key is
//     the envelope's (or "<topic>-<uuid>"), whose value is the message's
//     payload and whose headers are the message's plus
//     schedule_schema_version "1.0.0", schedule_target_epoch (Unix seconds),
//     schedule_source_type "schedule" and schedule_target_topic,
//     schedule_target_partition, schedule_target_key and
//     schedule_target_partition_key for the attributes the message has.
//     Proxy.cancel is a null value under the key with schedule_source_type
//     "cancel"; Proxy.tombstone, produced after a dispatch to the record's
//     own partition, is a null value with the record's headers and
//     schedule_source_type "tombstone".
//   - daily_buffer.rb: a "schedule" record replaces the key's schedule; any
//     other type deletes it.
//   - dispatcher.rb: the dispatched record has the proxy record's value and
//     all its headers (schedule_* included), merged with
//     schedule_source_topic, schedule_source_partition,
//     schedule_source_offset and schedule_source_key (the proxy record's
//     place and key); its topic, partition, key and partition key are the
//     schedule_target_* headers.
//   - schema_validator.rb: a schema version above 1.0.0 stops the consumer.
//
// WaterDrop hands partition_key to karafka-rdkafka (lib/rdkafka/producer.rb
// at 0.28.0), which hashes it with the producer's partitioner
// (consistent_random, CRC32, by default) to choose the partition, ignoring
// a partition also given, while the record keeps its own key (none when
// schedule_target_key is absent). Chime cannot hash with the partitioner of
// another producer, nor send a key other than the one it places by, so it
// places the record by the partition key: it becomes the record's key when
// schedule_target_key is absent or equal to it, and a record whose
// schedule_target_key differs is rejected. Records with one partition key
// stay together and in order, as with Karafka, though not necessarily on
// the partition Karafka would have chosen.
//
// Where Chime differs from Karafka, besides: a past epoch fires at once
// (Karafka's proxy refuses one more than 10 s old, its consumer dispatches
// at once what it finds due), and Chime gives a keyless record the event id
// as its key.

import (
	"bytes"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Karafka's headers, on a proxy record and on the record dispatched.
const (
	karafkaSchemaVersion      = "schedule_schema_version"
	karafkaSourceType         = "schedule_source_type"
	karafkaTargetEpoch        = "schedule_target_epoch"
	karafkaTargetTopic        = "schedule_target_topic"
	karafkaTargetPartition    = "schedule_target_partition"
	karafkaTargetKey          = "schedule_target_key"
	karafkaTargetPartitionKey = "schedule_target_partition_key"
	karafkaSourceTopic        = "schedule_source_topic"
	karafkaSourcePartition    = "schedule_source_partition"
	karafkaSourceOffset       = "schedule_source_offset"
	karafkaSourceKey          = "schedule_source_key"

	// karafkaSchema is the one version of the envelope (SCHEMA_VERSION in
	// lib/karafka/pro/scheduled_messages.rb).
	karafkaSchema = "1.0.0"
)

// karafkaControl lists the headers a proxy record is read from; a repeated
// one is an error, since Karafka's header hash would keep only one.
var karafkaControl = [...]string{
	karafkaSchemaVersion, karafkaSourceType, karafkaTargetEpoch, karafkaTargetTopic,
	karafkaTargetPartition, karafkaTargetKey, karafkaTargetPartitionKey,
}

type karafkaDecoder struct{ common }

// Decode decodes r as Karafka's scheduled messages consumer reads a proxy
// record.
func (d karafkaDecoder) Decode(r *Record) (Op, error) {
	if isTombstoneBack(r) {
		return Op{Skip: true}, nil
	}
	id, err := d.id(r)
	if err != nil {
		return Op{}, err
	}
	var ctl [len(karafkaControl)][]byte
	var has [len(karafkaControl)]bool
	for _, h := range r.Headers {
		for i, name := range karafkaControl {
			if h.Key != name {
				continue
			}
			if has[i] {
				return Op{}, &RecordError{Field: name, Rule: "set more than once"}
			}
			ctl[i], has[i] = h.Value, true
		}
	}
	version, typ, epoch, topic := ctl[0], ctl[1], ctl[2], ctl[3]
	switch {
	case !has[0]:
		return Op{}, &RecordError{Field: karafkaSchemaVersion, Rule: "required"}
	case string(version) != karafkaSchema:
		return Op{}, &RecordError{Field: karafkaSchemaVersion, Rule: fmt.Sprintf("%q is not a schema version Chime reads (%s)", version, karafkaSchema)}
	case !has[1]:
		return Op{}, &RecordError{Field: karafkaSourceType, Rule: "required"}
	}
	switch string(typ) {
	case "schedule":
	case "cancel", "tombstone":
		// A tombstone is Karafka's own, after it dispatched the schedule:
		// Karafka forgets the key, and so does Chime, so that a schedule
		// Karafka fired before Chime took over does not fire again.
		return d.cancel(id), nil
	default:
		return Op{}, &RecordError{Field: karafkaSourceType, Rule: fmt.Sprintf("%q is not schedule, cancel or tombstone", typ)}
	}
	if !has[2] {
		return Op{}, &RecordError{Field: karafkaTargetEpoch, Rule: "required"}
	}
	secs, err := parseSeconds(karafkaTargetEpoch, epoch)
	if err != nil {
		return Op{}, err
	}
	if len(topic) == 0 {
		return Op{}, &RecordError{Field: karafkaTargetTopic, Rule: "required"}
	}
	ev := &chimev1.Event{
		DeliverAt: &timestamppb.Timestamp{Seconds: secs},
		Topic:     string(topic),
		Key:       ctl[5],
		Payload:   r.Value,
		// A null value dispatches a null value.
		Tombstone: r.Value == nil,
		// Karafka keeps one schedule per key: a new record replaces it.
		OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE,
	}
	if has[4] {
		if ev.Partition, err = parsePartition(karafkaTargetPartition, ctl[4]); err != nil {
			return Op{}, err
		}
	}
	if has[6] {
		pk := ctl[6]
		if has[5] && !bytes.Equal(pk, ctl[5]) {
			return Op{}, &RecordError{Field: karafkaTargetPartitionKey, Rule: fmt.Sprintf(
				"%q differs from schedule_target_key %q: Chime places a record by its key, so it cannot place it by another (drop one of them, or set schedule_target_partition instead)", pk, ctl[5])}
		}
		ev.Key = pk
		ev.Partition = nil // as rdkafka: the partition key wins
	}
	// Karafka's dispatcher merges its schedule_source_* headers into the
	// record's: one already there is replaced.
	ev.Headers, err = copyHeaders(make([]*chimev1.Header, 0, len(r.Headers)+5), r,
		karafkaSourceTopic, karafkaSourcePartition, karafkaSourceOffset, karafkaSourceKey)
	if err != nil {
		return Op{}, err
	}
	ev.Headers = append(ev.Headers,
		&chimev1.Header{Key: karafkaSourceTopic, Value: []byte(r.Topic)},
		&chimev1.Header{Key: karafkaSourcePartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		&chimev1.Header{Key: karafkaSourceOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
		&chimev1.Header{Key: karafkaSourceKey, Value: r.Key},
	)
	return d.schedule(r, id, ev), nil
}
