package ingest

import (
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Record is one record of a source topic, as the consumer read it.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	// Value is nil for a tombstone; an empty value is not a tombstone.
	Value   []byte
	Headers []Header
	// Timestamp is the record's Kafka timestamp.
	Timestamp time.Time
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Op is what one record asks for.
type Op struct {
	// Cancel: the record cancels the events IDs names (the schedule its key
	// names, then its companions). Events is empty.
	Cancel bool
	IDs    []string
	// Events, when not Cancel: the event the record schedules, then its
	// companions (the history copy, the tombstone back), each with its id
	// set. ON_CONFLICT_REPLACE (every format's default) means "replace when
	// newer": the consumer schedules with REJECT, and turns a conflict into
	// a replace only when the record is newer than the one that made the
	// stored event (its chime-source header), so a redelivered or older
	// record changes nothing. ON_CONFLICT_REJECT keeps the stored event and
	// rejects the record.
	Events []*chimev1.Event
	// Skip: the record asks for nothing (a tombstone Chime produced back to
	// the schedules topic); it is committed as applied.
	Skip bool
}

// RecordError is a record that cannot become an operation. Field names the
// key, header or Avro field; Rule says what it broke, worded as the gRPC API
// words its field errors.
type RecordError struct {
	Field, Rule string
}

func (e *RecordError) Error() string { return e.Field + ": " + e.Rule }

// Decoder turns the records of one source topic into operations.
type Decoder interface {
	Decode(r *Record) (Op, error)
}

// DecodeOptions are a source topic's settings that every format reads.
type DecodeOptions struct {
	// IDFromKey makes the event id the record key as it is; otherwise it is
	// "<topic>/<key>", so two source topics cannot collide.
	IDFromKey bool
	// HistoryTopic, when set, adds a companion event that produces a copy of
	// the fired record to it (etf1's history topic), due with the event.
	HistoryTopic string
	// TombstoneBack adds a companion event that produces a tombstone with
	// the record's key back to the source topic, due with the event, so a
	// compacted schedules topic forgets fired schedules as the scheduler
	// Chime replaces did.
	TombstoneBack bool
	// SchemaRegistry is the URL of a Confluent schema registry (sky's Avro
	// records in the registry's wire format); empty: the schemas committed
	// with Chime.
	SchemaRegistry string
}
