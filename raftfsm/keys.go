package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Key tags; see the key layout in doc.go. They must stay below 0xff, the end of a shard span.
const (
	tagCursor     = 'C' // a recurring schedule's cursor
	tagDefinition = 'R' // a recurring schedule's definition
	tagBody       = 'b'
	tagDue        = 'd'
	tagID         = 'i'
	tagMeta       = 'm'
	tagRestoring  = 'r'
	tagStatus     = 's'
	tagSettled    = 'x'
)

const shardPrefixLen = 4

// formatV1 is the leading byte of every status value, and of the body of an event's first
// version. formatV2 leads the body of a later version (an Update or a REPLACE made it): format
// 1 followed by the version as a uvarint. The first version, which almost every event keeps,
// spends no byte on it. formatV3 leads the body of an event with a policy other than the
// default: format 2 (whatever the version) followed by the priority and the window.
// formatV4 leads the body of an event with an Output other than the zero value: format 3
// followed by the output's flags byte (outputPartition, outputTombstone) and, with
// outputPartition, the partition as a uvarint. An event without one is stored in the format
// it was stored in before events had one, byte for byte.
const (
	formatV1 = 1
	formatV2 = 2
	formatV3 = 3
	formatV4 = 4
)

// The flags of a format 4 body's Output.
const (
	outputPartition  = 1 << 0
	outputTombstone  = 1 << 1
	knownOutputFlags = outputPartition | outputTombstone
)

// The key layout of a whole shard is named by the meta value's first byte; see doc.go.
// Layout 1 kept bodies under their seq and a status for every event. Layout 2 had no
// settled-time index ('x') and no expired counter; a shard in it is converted on open
// (upgradeLayout). Layout 4 is layout 3 with two more counters in the meta (replaced and
// renewed) and bodies of format 2: a layout 3 shard is layout 4 with both counters at zero and
// every body of format 1, so it needs no conversion, and its meta is written in layout 4 by
// the next apply.
const (
	layoutV2 = 2
	layoutV3 = 3
	layoutV4 = 4
)

// ErrCorrupt wraps errors about stored bytes that do not decode. During apply it panics
// instead (see doc.go, invariant 2).
var ErrCorrupt = errors.New("raftfsm: corrupt stored value")

func appendShardTag(dst []byte, shard uint32, tag byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, shard)
	return append(dst, tag)
}

// shardSpan returns [start, end) covering every key of shard and nothing else.
func shardSpan(shard uint32) (start, end []byte) {
	return appendShardTag(nil, shard, 0x00), appendShardTag(nil, shard, 0xff)
}

func appendIDKey(dst []byte, shard uint32, id string) []byte {
	return append(appendShardTag(dst, shard, tagID), id...)
}

// appendBodyKey appends the key of an event's body: shard|'b'|due|seq, in the order the
// events fall due, so that a fire batch reads neighbouring keys.
func appendBodyKey(dst []byte, shard uint32, due int64, seq uint64) []byte {
	return appendDueSeq(appendShardTag(dst, shard, tagBody), due, seq)
}

func appendDueKey(dst []byte, shard uint32, due int64, seq uint64) []byte {
	return appendDueSeq(appendShardTag(dst, shard, tagDue), due, seq)
}

func appendDueSeq(dst []byte, due int64, seq uint64) []byte {
	dst = binary.BigEndian.AppendUint64(dst, orderedDue(due))
	return binary.BigEndian.AppendUint64(dst, seq)
}

func appendStatusKey(dst []byte, shard uint32, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(appendShardTag(dst, shard, tagStatus), seq)
}

// appendSettledKey appends the key of an event's entry in the settled-time index:
// shard|'x'|settledAt|seq, so that the clean-up walks events in the order they expire. The
// value is the event's due time (8 BE), which with the seq names its body.
func appendSettledKey(dst []byte, shard uint32, settledAt int64, seq uint64) []byte {
	return appendDueSeq(appendShardTag(dst, shard, tagSettled), settledAt, seq)
}

func parseSettled(k, v []byte) (settledAt int64, seq uint64, due int64, err error) {
	if len(k) != dueKeyLen || k[shardPrefixLen] != tagSettled || len(v) != 8 {
		return 0, 0, 0, fmt.Errorf("%w: settled index entry %x = %x", ErrCorrupt, k, v)
	}
	settledAt = int64(binary.BigEndian.Uint64(k[shardPrefixLen+1:]) ^ 1<<63)
	seq = binary.BigEndian.Uint64(k[shardPrefixLen+9:])
	return settledAt, seq, int64(binary.BigEndian.Uint64(v)), nil
}

const dueKeyLen = shardPrefixLen + 1 + 8 + 8

// orderedDue maps int64 to uint64 preserving order (flip the sign bit), so big-endian keys
// sort by due even before 1970.
func orderedDue(due int64) uint64 { return uint64(due) ^ 1<<63 }

// appendDueValue encodes the value under a due-index key: the event's policy, so that the
// firing path learns it without reading the body. Nothing for the default policy (as every
// event had before events had one); else the priority byte, then the window as a uvarint
// if there is one.
func appendDueValue(dst []byte, p Policy) []byte {
	if p == DefaultPolicy {
		return dst
	}
	dst = append(dst, p.Priority)
	if p.Window != 0 {
		dst = binary.AppendUvarint(dst, uint64(p.Window))
	}
	return dst
}

func decodeDueValue(v []byte) (Policy, error) {
	if len(v) == 0 {
		return DefaultPolicy, nil
	}
	d := decoder{b: v}
	p := Policy{Priority: d.priority()}
	if len(d.b) > 0 {
		p.Window = d.window()
	}
	if err := d.finish(); err != nil {
		return Policy{}, fmt.Errorf("%w: due-index value %x: %v", ErrCorrupt, v, err)
	}
	return p, nil
}

func parseDueKey(k []byte) (due int64, seq uint64, err error) {
	if len(k) != dueKeyLen || k[shardPrefixLen] != tagDue {
		return 0, 0, fmt.Errorf("%w: due index key %x", ErrCorrupt, k)
	}
	due = int64(binary.BigEndian.Uint64(k[shardPrefixLen+1:]) ^ 1<<63)
	return due, binary.BigEndian.Uint64(k[shardPrefixLen+9:]), nil
}

// idRef is the value under shard|'i'|id. The hash lives here rather than only in the body so
// that an idempotent re-send is answered without reading the payload; the due time, because
// it is half of the body's key.
type idRef struct {
	seq  uint64
	hash uint64
	due  int64
}

const idRefLen = 24

func (r idRef) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, r.seq)
	dst = binary.BigEndian.AppendUint64(dst, r.hash)
	return binary.BigEndian.AppendUint64(dst, uint64(r.due))
}

func decodeIDRef(b []byte) (idRef, error) {
	if len(b) != idRefLen {
		return idRef{}, fmt.Errorf("%w: id entry of %d bytes", ErrCorrupt, len(b))
	}
	return idRef{seq: binary.BigEndian.Uint64(b), hash: binary.BigEndian.Uint64(b[8:]), due: int64(binary.BigEndian.Uint64(b[16:]))}, nil
}

// meta is the value under shard|'m', rewritten in every applied batch.
type meta struct {
	appliedIndex uint64
	appliedTerm  uint64
	nextSeq      uint64 // the seq the next created event gets; starts at 1

	pending          uint64
	fired            uint64
	cancelled        uint64
	deadLettered     uint64
	refired          uint64 // MarkFired for an event already fired: a duplicate delivery
	firedAfterCancel uint64 // MarkFired for a cancelled event: produced although cancelled
	expired          uint64 // settled events removed by Expire
	// replaced counts the versions of pending events that an Update or a REPLACE superseded:
	// each version is an event of its own seq, removed when the next one takes its place.
	replaced uint64
	// renewed counts the settled events that a REPLACE removed to schedule their id anew.
	renewed uint64

	// layout is the key layout the shard is stored in: layoutV4 or layoutV3 (the same keys)
	// once written by this version, layoutV2 until upgradeLayout has converted it. Not a
	// counter.
	layout byte
}

const (
	metaLenV2 = 1 + 9*8
	metaLenV3 = 1 + 10*8
	metaLen   = 1 + 12*8
)

func freshMeta() meta { return meta{nextSeq: 1, layout: layoutV4} }

// retained is the number of settled events still stored.
func (m *meta) retained() uint64 {
	return m.fired + m.cancelled + m.deadLettered - m.expired - m.renewed
}

// append encodes m in layout 4 (whatever m.layout says: only upgradeLayout writes a meta
// of a layout 2 shard, and it writes it once the shard is converted).
func (m *meta) append(dst []byte) []byte {
	dst = append(dst, layoutV4)
	for _, v := range [...]uint64{m.appliedIndex, m.appliedTerm, m.nextSeq, m.pending, m.fired,
		m.cancelled, m.deadLettered, m.refired, m.firedAfterCancel, m.expired, m.replaced, m.renewed} {
		dst = binary.BigEndian.AppendUint64(dst, v)
	}
	return dst
}

// ErrOldLayout is returned for a shard stored in layout 1 (written before November 2026).
// This version cannot read it; nothing converts it.
var ErrOldLayout = errors.New("raftfsm: the shard is stored in key layout 1, which this version cannot read; start the node on an empty --data-dir (the other replicas send it the shard)")

func decodeMeta(b []byte) (meta, error) {
	if len(b) == metaLenV2 && b[0] == 1 {
		return meta{}, ErrOldLayout
	}
	known := (len(b) == metaLenV2 && b[0] == layoutV2) || (len(b) == metaLenV3 && b[0] == layoutV3) ||
		(len(b) == metaLen && b[0] == layoutV4)
	if !known {
		return meta{}, fmt.Errorf("%w: meta of %d bytes, layout %x", ErrCorrupt, len(b), b[:min(len(b), 1)])
	}
	var v [12]uint64
	for i := range (len(b) - 1) / 8 {
		v[i] = binary.BigEndian.Uint64(b[1+8*i:])
	}
	return meta{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], b[0]}, nil
}

// State is where an event is in its lifecycle. Only Scheduled is pending; the others are
// final.
type State uint8

// The states. Zero is never stored.
const (
	StateScheduled    State = 1
	StateFired        State = 2
	StateCancelled    State = 3
	StateDeadLettered State = 4
)

func (s State) String() string {
	switch s {
	case StateScheduled:
		return "Scheduled"
	case StateFired:
		return "Fired"
	case StateCancelled:
		return "Cancelled"
	case StateDeadLettered:
		return "DeadLettered"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// status is the mutable half of an event (shard|'s'|seq). It is stored only once the event
// leaves Scheduled: a pending event's status is {Scheduled, due}, known from the due index.
type status struct {
	state           State
	due             int64
	firedAt         int64
	cancelledAt     int64
	deadLetteredAt  int64
	attempts        uint32
	lastError       string
	deadLetterTopic string
}

// settledAt is when the event left Scheduled, by the leader's clock in the entry that
// settled it: the time its retention counts from.
func (s *status) settledAt() int64 {
	switch s.state {
	case StateFired:
		return s.firedAt
	case StateCancelled:
		return s.cancelledAt
	default:
		return s.deadLetteredAt
	}
}

func (s *status) append(dst []byte) []byte {
	dst = append(dst, formatV1, byte(s.state))
	dst = binary.AppendVarint(dst, s.due)
	dst = binary.AppendVarint(dst, s.firedAt)
	dst = binary.AppendVarint(dst, s.cancelledAt)
	dst = binary.AppendVarint(dst, s.deadLetteredAt)
	dst = binary.AppendUvarint(dst, uint64(s.attempts))
	dst = appendString(dst, s.lastError)
	return appendString(dst, s.deadLetterTopic)
}

func decodeStatus(b []byte) (status, error) {
	d := decoder{b: b}
	if v := d.byte1("format"); v != formatV1 && d.err == nil {
		d.fail("format", "unknown status format %d", v)
	}
	s := status{
		state:           State(d.byte1("state")),
		due:             d.varint("due"),
		firedAt:         d.varint("firedAt"),
		cancelledAt:     d.varint("cancelledAt"),
		deadLetteredAt:  d.varint("deadLetteredAt"),
		attempts:        d.uint32("attempts"),
		lastError:       d.str("lastError"),
		deadLetterTopic: d.str("deadLetterTopic"),
	}
	if d.err == nil && (s.state < StateScheduled || s.state > StateDeadLettered) {
		d.fail("state", "unknown state %d", s.state)
	}
	if err := d.finish(); err != nil {
		return status{}, fmt.Errorf("%w: status: %v", ErrCorrupt, err)
	}
	return s, nil
}

// appendBody encodes the immutable half of an event (shard|'b'|due|seq): format 1 for its
// first version, format 2 with the version after it for a later one, format 3 with the
// version, the priority (a byte) and the window (a uvarint) after it for an event whose
// policy is not the default, format 4 with all that and then its Output for an event with
// one.
func appendBody(dst []byte, e *NewEvent, createdAt int64, version uint64) []byte {
	format := byte(formatV1)
	switch {
	case e.Output != (Output{}):
		format = formatV4
	case e.Policy != DefaultPolicy:
		format = formatV3
	case version > 1:
		format = formatV2
	}
	dst = append(dst, format)
	dst = appendString(dst, e.ID)
	dst = binary.AppendVarint(dst, createdAt)
	dst = appendString(dst, e.Topic)
	dst = appendBytes(dst, e.Key)
	dst = appendBytes(dst, e.Payload)
	dst = appendHeaders(dst, e.Headers)
	dst = binary.LittleEndian.AppendUint64(dst, e.ContentHash)
	if format >= formatV2 {
		dst = binary.AppendUvarint(dst, version)
	}
	if format >= formatV3 {
		dst = append(dst, e.Priority)
		dst = binary.AppendUvarint(dst, uint64(e.Window))
	}
	if format == formatV4 {
		var flags byte
		if e.HasPartition {
			flags |= outputPartition
		}
		if e.Tombstone {
			flags |= outputTombstone
		}
		dst = append(dst, flags)
		if e.HasPartition {
			dst = binary.AppendUvarint(dst, uint64(uint32(e.Partition)))
		}
	}
	return dst
}

// bodyFormat reads a body's format byte.
func (d *decoder) bodyFormat() byte {
	format := d.byte1("format")
	if (format < formatV1 || format > formatV4) && d.err == nil {
		d.fail("format", "unknown body format %d", format)
	}
	return format
}

// bodyTail reads what follows a body's content hash in format: the version, then the policy,
// then the output.
func (d *decoder) bodyTail(format byte) (version uint64, p Policy, o Output) {
	version, p = 1, DefaultPolicy
	if format >= formatV2 {
		version = d.uvarint("version")
		if format == formatV2 && version < 2 && d.err == nil {
			d.fail("version", "version %d in a format 2 body", version)
		}
		if version < 1 && d.err == nil {
			d.fail("version", "version 0")
		}
	}
	if format >= formatV3 {
		p.Priority = d.priority()
		if w := d.uvarint("window"); w > uint64(MaxWindow) && d.err == nil {
			d.fail("window", "window %d above %d", w, MaxWindow)
		} else {
			p.Window = int64(w)
		}
	}
	if format == formatV4 {
		flags := d.byte1("output")
		switch {
		case d.err != nil:
		case flags&^knownOutputFlags != 0:
			d.fail("output", "unknown output flags %#x", flags&^knownOutputFlags)
		case flags == 0:
			// appendBody writes format 4 only for an output other than the zero value.
			d.fail("output", "no output flag in a format 4 body")
		}
		if o.HasPartition = flags&outputPartition != 0; o.HasPartition {
			o.Partition = d.partition()
		}
		o.Tombstone = flags&outputTombstone != 0
	}
	return version, p, o
}

// body is an event's body, decoded. Its byte slices alias what it was decoded from.
type body struct {
	NewEvent  // Due is not in the body: it is half of the body's key
	createdAt int64
	version   uint64
}

func decodeBody(b []byte) (body, error) {
	d := decoder{b: b}
	format := d.bodyFormat()
	var e body
	e.ID = d.str("id")
	e.createdAt = d.varint("createdAt")
	e.Topic = d.str("topic")
	e.Key = d.bytes("key")
	e.Payload = d.bytes("payload")
	e.Headers = d.headers()
	e.ContentHash = d.fixed64("contentHash")
	e.version, e.Policy, e.Output = d.bodyTail(format)
	return e, d.finish()
}

// checkBody returns the error decodeBody would return for b, without allocating: Restore
// checks every body a stream holds. FuzzDecodeStored holds the two to the same answer.
func checkBody(b []byte) error {
	d := decoder{b: b}
	format := d.bodyFormat()
	d.bytes("id")
	d.varint("createdAt")
	d.bytes("topic")
	d.skipContent()
	d.bodyTail(format)
	return d.finish()
}

// skipContent reads past the part of a body between its topic and its tail: the key, the
// payload, the headers and the content hash, by their lengths.
func (d *decoder) skipContent() {
	d.bytes("key")
	d.bytes("payload")
	for n := d.count("headers", minHeaderLen); n > 0; n-- {
		d.bytes("headers.key")
		d.bytes("headers.value")
	}
	d.fixed64("contentHash")
}

// Record is an event as stored: what Get and ReadForFire return. Its byte slices are the
// caller's.
type Record struct {
	Seq             uint64
	ID              string
	State           State
	Due             int64 // unix ns
	CreatedAt       int64 // the ScheduleBatch's ProposedAt
	FiredAt         int64 // set when State is Fired
	CancelledAt     int64 // set when State is Cancelled
	DeadLetteredAt  int64 // set when State is DeadLettered
	Attempts        uint32
	LastError       string // set when State is DeadLettered
	DeadLetterTopic string // set when State is DeadLettered
	Topic           string
	Key             []byte
	Payload         []byte
	Headers         []Header
	ContentHash     uint64
	// Version is 1 for the event as first scheduled, and one more for each Update or
	// REPLACE of it since.
	Version uint64
	Policy
	Output
}

// decodeRecord fills rec from an event's body and status. rec keeps body (Key, Payload and
// header values alias it), so the caller passes a copy it owns.
func decodeRecord(seq uint64, b []byte, s status, rec *Record) error {
	e, err := decodeBody(b)
	*rec = Record{
		Seq:             seq,
		ID:              e.ID,
		CreatedAt:       e.createdAt,
		Topic:           e.Topic,
		Key:             e.Key,
		Payload:         e.Payload,
		Headers:         e.Headers,
		ContentHash:     e.ContentHash,
		Version:         e.version,
		Policy:          e.Policy,
		Output:          e.Output,
		State:           s.state,
		Due:             s.due,
		FiredAt:         s.firedAt,
		CancelledAt:     s.cancelledAt,
		DeadLetteredAt:  s.deadLetteredAt,
		Attempts:        s.attempts,
		LastError:       s.lastError,
		DeadLetterTopic: s.deadLetterTopic,
	}
	if err != nil {
		return fmt.Errorf("%w: seq %d: body: %v", ErrCorrupt, seq, err)
	}
	return nil
}
