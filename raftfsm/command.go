package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// CommandType is the first byte of every Raft log entry this FSM applies. It names both the
// command and the layout of the body after it: a changed layout gets a new byte, and the old
// bytes stay decodable for as long as a log or a snapshot may hold them.
type CommandType byte

// The command types. Zero is never valid, so a zeroed buffer does not decode.
const (
	TypeScheduleBatch    CommandType = 1
	TypeCancel           CommandType = 2
	TypeMarkFired        CommandType = 3
	TypeMarkDeadLettered CommandType = 4
	// TypeMarkFiredDue is MarkFired with each event's due time, so that apply need not read
	// the event (MarkFired.DueKnown).
	TypeMarkFiredDue CommandType = 5
	// TypeMarkDeadLetteredDue is MarkDeadLettered with each event's due time
	// (MarkDeadLettered.DueKnown).
	TypeMarkDeadLetteredDue CommandType = 6
	// TypeExpire removes settled events whose retention has passed (Expire).
	TypeExpire CommandType = 7
	// TypeScheduleBatchFlags is ScheduleBatch with a flags byte after each event's content
	// hash (NewEvent.Replace). A batch with no flag set encodes as TypeScheduleBatch, so
	// that what every replica of the version before can apply stays so.
	TypeScheduleBatchFlags CommandType = 8
	// TypeUpdate changes pending events (Update).
	TypeUpdate CommandType = 9
	// TypeRecurring creates, changes or removes a recurring schedule (Recurring).
	TypeRecurring CommandType = 10
)

func (t CommandType) String() string {
	switch t {
	case TypeScheduleBatch:
		return "ScheduleBatch"
	case TypeCancel:
		return "Cancel"
	case TypeMarkFired:
		return "MarkFired"
	case TypeMarkDeadLettered:
		return "MarkDeadLettered"
	case TypeMarkFiredDue:
		return "MarkFiredDue"
	case TypeMarkDeadLetteredDue:
		return "MarkDeadLetteredDue"
	case TypeExpire:
		return "Expire"
	case TypeScheduleBatchFlags:
		return "ScheduleBatchFlags"
	case TypeUpdate:
		return "Update"
	case TypeRecurring:
		return "Recurring"
	}
	return fmt.Sprintf("CommandType(%d)", byte(t))
}

// Command is a decoded log entry: *ScheduleBatch, *Cancel, *MarkFired, *MarkDeadLettered,
// *Expire, *Update or *Recurring.
type Command interface {
	Type() CommandType
}

// ErrMalformedCommand wraps every DecodeCommand error. Apply panics on it: a committed entry
// that does not decode cannot be applied identically on every replica.
var ErrMalformedCommand = errors.New("raftfsm: malformed command")

// Header is a Kafka record header. Order is significant, as it is in Kafka.
type Header struct {
	Key   string
	Value []byte
}

// NewEvent is one event of a ScheduleBatch, as the leader resolved it.
type NewEvent struct {
	ID      string // idempotency key; rpc has validated it
	Due     int64  // unix ns, absolute; relative delays were resolved by the leader
	Topic   string
	Key     []byte
	Payload []byte
	Headers []Header
	// ContentHash is ContentHash() over the request as the client sent it, so that a
	// re-send with the same relative delay matches even though Due differs.
	ContentHash uint64
	// Replace makes an event whose id is bound already take that id's place instead of
	// being compared with it: a pending event is superseded by this one as its next
	// version (an Update of every field), a settled one is removed and its id scheduled
	// anew, with the version after its own. Without it the id's binding holds
	// (invariant 6).
	Replace bool
	// CheckPending makes a Replace apply only while the id's pending event is seq Pending
	// (0: none is pending); otherwise the event is Moved and nothing changes. A leader sets
	// it to what it took out of its wheel for the change, so that a Replace never
	// supersedes a version a fire batch may hold.
	CheckPending bool
	Pending      uint64
	Policy
	Output
}

// Output is how an event's record is produced besides its topic, key, payload and headers.
// The zero value is what every event had before events had one: the partitioner picks the
// partition (murmur2 of the key), and the payload is the value.
type Output struct {
	// Partition, when HasPartition, is the partition of the topic the record is produced
	// to: 0 or more (rpc checks it). A topic without that partition cannot take the record,
	// which is then dead-lettered.
	Partition    int32
	HasPartition bool
	// Tombstone makes the record's value null (a Kafka tombstone, which a compacted topic
	// reads as the key's deletion). rpc refuses a payload with it, and shard an Update that
	// gives it one.
	Tombstone bool
}

// Policy is how an event fires besides when it is due.
type Policy struct {
	// Priority orders the due events of a shard whose leader is behind: higher first. 0 to
	// MaxPriority; DefaultPriority for an event whose request named none.
	Priority uint8
	// Window lets the event fire anywhere in [due, due+Window] (ns, at most MaxWindow); the
	// firing leader picks a point in it per event, to spread a burst.
	Window int64
}

// DefaultPolicy is the policy of an event whose request named none.
var DefaultPolicy = Policy{Priority: DefaultPriority}

// DefaultPriority is an event's priority when its request names none; MaxPriority the
// highest.
const (
	DefaultPriority = 5
	MaxPriority     = 9
)

// MaxWindow is the longest window an event may have.
const MaxWindow = int64(24 * time.Hour)

// NewEvent flags, in the byte after the content hash of a TypeScheduleBatchFlags event.
// With flagCheckPending, NewEvent.Pending follows as a uvarint; then with flagPriority, the
// priority as one byte; then with flagWindow, the window as a uvarint; then with
// flagPartition, the partition as a uvarint (at most MaxInt32). flagTombstone carries no
// bytes. An event without flagPriority has DefaultPriority. An entry written before
// partitions and tombstones has neither of their flags, and decodes as it always did.
const (
	flagReplace      = 1 << 0
	flagCheckPending = 1 << 1
	flagPriority     = 1 << 2
	flagWindow       = 1 << 3
	flagPartition    = 1 << 4
	flagTombstone    = 1 << 5
	knownFlags       = flagReplace | flagCheckPending | flagPriority | flagWindow | flagPartition | flagTombstone
)

// ScheduleBatch creates events. Apply returns *ScheduleBatchResult.
type ScheduleBatch struct {
	ProposedAt int64 // unix ns, leader clock; becomes Record.CreatedAt
	Events     []NewEvent
}

// Cancel cancels pending events by id. Apply returns *CancelBatchResult.
type Cancel struct {
	ProposedAt int64 // unix ns, leader clock; becomes Record.CancelledAt
	IDs        []string
}

// Fired reports that the leader produced the event to Kafka.
type Fired struct {
	Seq      uint64
	FiredAt  int64 // unix ns, when the produce was acknowledged
	Attempts uint32
	// Due is the event's due time as the leader read it (Record.Due); used only when
	// MarkFired.DueKnown.
	Due int64
}

// MarkFired records produced events. Apply returns *MarkBatchResult.
//
// With DueKnown, every entry carries the due time the leader read with the event, and apply
// settles an event that is still pending without reading it: it knows which events are
// pending from memory, and with the due time it can delete the due-index key and write the
// final status blind. A due time that does not match the stored one would leave a stray
// due-index key, so only a due read from this shard's state may be sent (an event's due
// never changes while it is pending). It encodes as TypeMarkFiredDue; without DueKnown, as
// TypeMarkFired, and apply reads each event.
type MarkFired struct {
	ProposedAt int64
	DueKnown   bool
	Entries    []Fired
}

// DeadLettered reports that the leader gave up producing the event and wrote it to the
// dead-letter topic.
type DeadLettered struct {
	Seq      uint64
	At       int64 // unix ns
	Attempts uint32
	Error    string // the last produce error
	Topic    string // the dead-letter topic
	// Due is the event's due time as the leader read it; used only when
	// MarkDeadLettered.DueKnown.
	Due int64
}

// MarkDeadLettered records dead-lettered events. Apply returns *MarkBatchResult.
//
// DueKnown means what it means for MarkFired, and encodes as TypeMarkDeadLetteredDue. An entry
// without due times (TypeMarkDeadLettered, as chimed wrote before key layout 2) makes apply
// search the due index for each pending event it names.
type MarkDeadLettered struct {
	ProposedAt int64
	DueKnown   bool
	Entries    []DeadLettered
}

// Expire removes the events that settled (fired, were cancelled or dead-lettered) strictly
// before Before, oldest first, at most Limit of them: their bodies, ids, statuses and index
// entries. An expired id is free: a later Schedule with it creates a new event. The leader
// proposes it with Before = its clock minus the retention, so what every replica removes is
// decided by the entry and the state, never by a replica's clock. Apply returns
// *ExpireResult.
type Expire struct {
	Before int64 // unix ns
	Limit  uint32
}

// Update changes pending events by id. Each change makes the event's next version: a new
// seq with the new due time and content, in the place of the old one, which is removed
// (the old seq's due time never changes, so what the firing path read under it stays
// true of it: a MarkFired naming it finds it gone). Apply returns *UpdateResult.
type Update struct {
	ProposedAt int64 // unix ns, leader clock
	Changes    []Change
}

// Change is one event's update: the fields whose flag is set replace the event's own; the
// rest are kept.
type Change struct {
	ID string
	// IfVersion, when not 0, makes the change apply only to that version of the event.
	IfVersion uint64
	Fields    ChangeFields
	Due       int64 // unix ns, absolute; relative delays were resolved by the leader
	Key       []byte
	Payload   []byte
	Headers   []Header
	// With ChangeCheckPending in Fields, the change applies only while the id's pending
	// event is seq Pending (0: none is pending), as NewEvent.CheckPending.
	Pending uint64
}

// ChangeFields says which fields of a Change replace the event's, and whether it checks
// Pending.
type ChangeFields uint8

const (
	ChangeDue ChangeFields = 1 << iota
	ChangeKey
	ChangePayload
	ChangeHeaders
	ChangeCheckPending

	knownChangeFields = ChangeDue | ChangeKey | ChangePayload | ChangeHeaders | ChangeCheckPending
)

// UpdateOutcome says what an Update did with one change.
type UpdateOutcome uint8

const (
	// Updated: the event was pending and now is its next version.
	Updated UpdateOutcome = 1
	// UpdateNotFound: no event has this id (or it expired).
	UpdateNotFound UpdateOutcome = 2
	// UpdateNotPending: the event has settled (UpdateResult.State says how); nothing changed.
	UpdateNotPending UpdateOutcome = 3
	// VersionMismatch: the event is at another version than IfVersion; nothing changed.
	VersionMismatch UpdateOutcome = 4
	// UpdateMoved: with ChangeCheckPending, the id's pending event is not seq Pending;
	// nothing changed.
	UpdateMoved UpdateOutcome = 5
)

func (o UpdateOutcome) String() string {
	switch o {
	case Updated:
		return "Updated"
	case UpdateNotFound:
		return "UpdateNotFound"
	case UpdateNotPending:
		return "UpdateNotPending"
	case VersionMismatch:
		return "VersionMismatch"
	case UpdateMoved:
		return "UpdateMoved"
	}
	return fmt.Sprintf("UpdateOutcome(%d)", uint8(o))
}

// ChangeResult is the result for one Change, at the same position. Seq, Due and Version are
// the event's after the change (its current ones if nothing changed); State is set when the
// event was found.
type ChangeResult struct {
	Outcome UpdateOutcome
	State   State
	Seq     uint64
	Due     int64
	Version uint64
}

// UpdateResult is the response to an Update entry.
type UpdateResult struct {
	Results []ChangeResult
}

// ExpireResult is the response to an Expire entry.
type ExpireResult struct {
	// Expired is how many events the entry removed; fewer than Limit means none older than
	// Before is left.
	Expired uint32
}

func (c *ScheduleBatch) Type() CommandType {
	for i := range c.Events {
		if e := &c.Events[i]; e.Replace || e.Priority != DefaultPriority || e.Window != 0 || e.Output != (Output{}) {
			return TypeScheduleBatchFlags
		}
	}
	return TypeScheduleBatch
}
func (*Expire) Type() CommandType { return TypeExpire }
func (*Update) Type() CommandType { return TypeUpdate }
func (*Cancel) Type() CommandType { return TypeCancel }
func (c *MarkFired) Type() CommandType {
	if c.DueKnown {
		return TypeMarkFiredDue
	}
	return TypeMarkFired
}
func (c *MarkDeadLettered) Type() CommandType {
	if c.DueKnown {
		return TypeMarkDeadLetteredDue
	}
	return TypeMarkDeadLettered
}

// Encoding. Integers are encoding/binary varints (signed ones zig-zag), strings and byte
// slices are uvarint-length-prefixed, content hashes are 8 fixed little-endian bytes (they are
// uniformly random, a varint would be longer). Lists are a uvarint count then the items.

// AppendScheduleBatch appends the log entry encoding of c to dst.
func AppendScheduleBatch(dst []byte, c *ScheduleBatch) []byte {
	t := c.Type()
	dst = append(dst, byte(t))
	dst = binary.AppendVarint(dst, c.ProposedAt)
	dst = binary.AppendUvarint(dst, uint64(len(c.Events)))
	for i := range c.Events {
		e := &c.Events[i]
		dst = appendString(dst, e.ID)
		dst = binary.AppendVarint(dst, e.Due)
		dst = appendString(dst, e.Topic)
		dst = appendBytes(dst, e.Key)
		dst = appendBytes(dst, e.Payload)
		dst = appendHeaders(dst, e.Headers)
		dst = binary.LittleEndian.AppendUint64(dst, e.ContentHash)
		if t == TypeScheduleBatchFlags {
			var flags byte
			if e.Replace {
				flags |= flagReplace
			}
			if e.CheckPending {
				flags |= flagCheckPending
			}
			if e.Priority != DefaultPriority {
				flags |= flagPriority
			}
			if e.Window != 0 {
				flags |= flagWindow
			}
			if e.HasPartition {
				flags |= flagPartition
			}
			if e.Tombstone {
				flags |= flagTombstone
			}
			dst = append(dst, flags)
			if e.CheckPending {
				dst = binary.AppendUvarint(dst, e.Pending)
			}
			if e.Priority != DefaultPriority {
				dst = append(dst, e.Priority)
			}
			if e.Window != 0 {
				dst = binary.AppendUvarint(dst, uint64(e.Window))
			}
			if e.HasPartition {
				dst = binary.AppendUvarint(dst, uint64(uint32(e.Partition)))
			}
		}
	}
	return dst
}

// AppendUpdate appends the log entry encoding of c to dst.
func AppendUpdate(dst []byte, c *Update) []byte {
	dst = append(dst, byte(TypeUpdate))
	dst = binary.AppendVarint(dst, c.ProposedAt)
	dst = binary.AppendUvarint(dst, uint64(len(c.Changes)))
	for i := range c.Changes {
		ch := &c.Changes[i]
		dst = appendString(dst, ch.ID)
		dst = binary.AppendUvarint(dst, ch.IfVersion)
		dst = append(dst, byte(ch.Fields))
		if ch.Fields&ChangeDue != 0 {
			dst = binary.AppendVarint(dst, ch.Due)
		}
		if ch.Fields&ChangeKey != 0 {
			dst = appendBytes(dst, ch.Key)
		}
		if ch.Fields&ChangePayload != 0 {
			dst = appendBytes(dst, ch.Payload)
		}
		if ch.Fields&ChangeHeaders != 0 {
			dst = appendHeaders(dst, ch.Headers)
		}
		if ch.Fields&ChangeCheckPending != 0 {
			dst = binary.AppendUvarint(dst, ch.Pending)
		}
	}
	return dst
}

// AppendCancel appends the log entry encoding of c to dst.
func AppendCancel(dst []byte, c *Cancel) []byte {
	dst = append(dst, byte(TypeCancel))
	dst = binary.AppendVarint(dst, c.ProposedAt)
	dst = binary.AppendUvarint(dst, uint64(len(c.IDs)))
	for _, id := range c.IDs {
		dst = appendString(dst, id)
	}
	return dst
}

// AppendMarkFired appends the log entry encoding of c to dst.
func AppendMarkFired(dst []byte, c *MarkFired) []byte {
	dst = append(dst, byte(c.Type()))
	dst = binary.AppendVarint(dst, c.ProposedAt)
	dst = binary.AppendUvarint(dst, uint64(len(c.Entries)))
	for _, e := range c.Entries {
		dst = binary.AppendUvarint(dst, e.Seq)
		dst = binary.AppendVarint(dst, e.FiredAt)
		dst = binary.AppendUvarint(dst, uint64(e.Attempts))
		if c.DueKnown {
			dst = binary.AppendVarint(dst, e.Due)
		}
	}
	return dst
}

// AppendMarkDeadLettered appends the log entry encoding of c to dst.
func AppendMarkDeadLettered(dst []byte, c *MarkDeadLettered) []byte {
	dst = append(dst, byte(c.Type()))
	dst = binary.AppendVarint(dst, c.ProposedAt)
	dst = binary.AppendUvarint(dst, uint64(len(c.Entries)))
	for _, e := range c.Entries {
		dst = binary.AppendUvarint(dst, e.Seq)
		dst = binary.AppendVarint(dst, e.At)
		dst = binary.AppendUvarint(dst, uint64(e.Attempts))
		dst = appendString(dst, e.Error)
		dst = appendString(dst, e.Topic)
		if c.DueKnown {
			dst = binary.AppendVarint(dst, e.Due)
		}
	}
	return dst
}

// AppendExpire appends the log entry encoding of c to dst.
func AppendExpire(dst []byte, c *Expire) []byte {
	dst = append(dst, byte(TypeExpire))
	dst = binary.AppendVarint(dst, c.Before)
	return binary.AppendUvarint(dst, uint64(c.Limit))
}

// Smallest encodings of one list item, used to reject a count that cannot fit in the bytes
// left before allocating for it (a corrupt count must not allocate gigabytes).
const (
	minEventLen        = 1 + 1 + 1 + 1 + 1 + 1 + 8 // id, due, topic, key, payload, headers, hash
	minChangeLen       = 1 + 1 + 1                 // id, if-version, fields
	minHeaderLen       = 1 + 1
	minFiredLen        = 1 + 1 + 1
	minDeadLetteredLen = 1 + 1 + 1 + 1 + 1
)

// DecodeCommand decodes one log entry. It never panics, whatever data holds; errors wrap
// ErrMalformedCommand and name the field. Byte slices in the result (Key, Payload, header
// values) alias data; empty byte slices and empty lists decode as nil.
func DecodeCommand(data []byte) (Command, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty entry", ErrMalformedCommand)
	}
	t := CommandType(data[0])
	d := decoder{b: data[1:]}
	var c Command
	switch t {
	case TypeScheduleBatch:
		c = d.scheduleBatch(false)
	case TypeScheduleBatchFlags:
		c = d.scheduleBatch(true)
	case TypeUpdate:
		c = d.update()
	case TypeCancel:
		c = d.cancel()
	case TypeMarkFired:
		c = d.markFired(false)
	case TypeMarkFiredDue:
		c = d.markFired(true)
	case TypeMarkDeadLettered:
		c = d.markDeadLettered(false)
	case TypeMarkDeadLetteredDue:
		c = d.markDeadLettered(true)
	case TypeExpire:
		c = &Expire{Before: d.varint("before"), Limit: d.uint32("limit")}
	case TypeRecurring:
		c = d.recurring()
	default:
		return nil, fmt.Errorf("%w: unknown command type %d", ErrMalformedCommand, data[0])
	}
	if err := d.finish(); err != nil {
		return nil, fmt.Errorf("%w: %v: %v", ErrMalformedCommand, t, err)
	}
	return c, nil
}

func (d *decoder) scheduleBatch(flagged bool) *ScheduleBatch {
	c := &ScheduleBatch{ProposedAt: d.varint("proposedAt")}
	minLen := minEventLen
	if flagged {
		minLen++
	}
	n := d.count("events", minLen)
	if n > 0 {
		c.Events = make([]NewEvent, n)
	}
	prevTopic := ""
	for i := range c.Events {
		e := &c.Events[i]
		d.at("events", i)
		e.ID = d.str("id")
		e.Due = d.varint("due")
		e.Topic = d.strLike("topic", prevTopic)
		prevTopic = e.Topic
		e.Key = d.bytes("key")
		e.Payload = d.bytes("payload")
		e.Headers = d.headers()
		e.ContentHash = d.fixed64("contentHash")
		e.Priority = DefaultPriority
		if flagged {
			flags := d.byte1("flags")
			if flags&^knownFlags != 0 {
				d.fail("flags", "unknown flags %#x", flags&^knownFlags)
			}
			e.Replace = flags&flagReplace != 0
			if e.CheckPending = flags&flagCheckPending != 0; e.CheckPending {
				e.Pending = d.uvarint("pending")
			}
			if flags&flagPriority != 0 {
				e.Priority = d.priority()
			}
			if flags&flagWindow != 0 {
				e.Window = d.window()
			}
			if e.HasPartition = flags&flagPartition != 0; e.HasPartition {
				e.Partition = d.partition()
			}
			e.Tombstone = flags&flagTombstone != 0
		}
	}
	return c
}

// priority reads an event's priority byte.
func (d *decoder) priority() uint8 {
	p := d.byte1("priority")
	if p > MaxPriority && d.err == nil {
		d.fail("priority", "priority %d above %d", p, MaxPriority)
	}
	return p
}

// window reads an event's window.
func (d *decoder) window() int64 {
	w := d.uvarint("window")
	if (w == 0 || w > uint64(MaxWindow)) && d.err == nil {
		d.fail("window", "window %d not in (0, %d]", w, MaxWindow)
	}
	return int64(w)
}

// partition reads an event's partition: a uvarint, at most MaxInt32 (Kafka's partitions are
// int32s, and rpc refuses a negative one).
func (d *decoder) partition() int32 {
	p := d.uvarint("partition")
	if p > math.MaxInt32 && d.err == nil {
		d.fail("partition", "partition %d above %d", p, math.MaxInt32)
	}
	return int32(p)
}

func (d *decoder) update() *Update {
	c := &Update{ProposedAt: d.varint("proposedAt")}
	n := d.count("changes", minChangeLen)
	if n > 0 {
		c.Changes = make([]Change, n)
	}
	for i := range c.Changes {
		ch := &c.Changes[i]
		d.at("changes", i)
		ch.ID = d.str("id")
		ch.IfVersion = d.uvarint("ifVersion")
		ch.Fields = ChangeFields(d.byte1("fields"))
		if ch.Fields&^knownChangeFields != 0 {
			d.fail("fields", "unknown fields %#x", ch.Fields&^knownChangeFields)
		}
		if ch.Fields&ChangeDue != 0 {
			ch.Due = d.varint("due")
		}
		if ch.Fields&ChangeKey != 0 {
			ch.Key = d.bytes("key")
		}
		if ch.Fields&ChangePayload != 0 {
			ch.Payload = d.bytes("payload")
		}
		if ch.Fields&ChangeHeaders != 0 {
			ch.Headers = d.headers()
		}
		if ch.Fields&ChangeCheckPending != 0 {
			ch.Pending = d.uvarint("pending")
		}
	}
	return c
}

func (d *decoder) cancel() *Cancel {
	c := &Cancel{ProposedAt: d.varint("proposedAt")}
	n := d.count("ids", 1)
	if n > 0 {
		c.IDs = make([]string, n)
	}
	for i := range c.IDs {
		d.at("ids", i)
		c.IDs[i] = d.str("id")
	}
	return c
}

func (d *decoder) markFired(dueKnown bool) *MarkFired {
	c := &MarkFired{ProposedAt: d.varint("proposedAt"), DueKnown: dueKnown}
	n := d.markCount(minFiredLen, dueKnown)
	if n > 0 {
		c.Entries = make([]Fired, n)
	}
	for i := range c.Entries {
		e := &c.Entries[i]
		d.at("entries", i)
		e.Seq = d.uvarint("seq")
		e.FiredAt = d.varint("firedAt")
		e.Attempts = d.uint32("attempts")
		if dueKnown {
			e.Due = d.varint("due")
		}
	}
	return c
}

func (d *decoder) markDeadLettered(dueKnown bool) *MarkDeadLettered {
	c := &MarkDeadLettered{ProposedAt: d.varint("proposedAt"), DueKnown: dueKnown}
	n := d.markCount(minDeadLetteredLen, dueKnown)
	if n > 0 {
		c.Entries = make([]DeadLettered, n)
	}
	for i := range c.Entries {
		e := &c.Entries[i]
		d.at("entries", i)
		e.Seq = d.uvarint("seq")
		e.At = d.varint("at")
		e.Attempts = d.uint32("attempts")
		e.Error = d.str("error")
		e.Topic = d.str("topic")
		if dueKnown {
			e.Due = d.varint("due")
		}
	}
	return c
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendHeaders(dst []byte, hs []Header) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(hs)))
	for _, h := range hs {
		dst = appendString(dst, h.Key)
		dst = appendBytes(dst, h.Value)
	}
	return dst
}

// decoder reads the encoding above from b. The first error sticks: later reads return zero
// values, so decoding code reads straight through and checks once (finish). Field names are
// constants, so a successful decode allocates nothing for error reporting. Calls inside one
// composite literal run in the order written (Go spec, "Order of evaluation"), so a literal
// may read fields in wire order.
type decoder struct {
	b   []byte
	err error
	// list and item locate the failure within a list, for the error message.
	list string
	item int
}

func (d *decoder) at(list string, item int) { d.list, d.item = list, item }

func (d *decoder) fail(field, format string, args ...any) {
	if d.err != nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if d.list != "" {
		d.err = fmt.Errorf("%s[%d].%s: %s", d.list, d.item, field, msg)
	} else {
		d.err = fmt.Errorf("%s: %s", field, msg)
	}
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.list = ""
		d.fail("end", "%d unexpected trailing bytes", len(d.b))
	}
	return d.err
}

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(field, "truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(field, "truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint32(field string) uint32 {
	v := d.uvarint(field)
	if v > 1<<32-1 {
		d.fail(field, "%d does not fit in 32 bits", v)
		return 0
	}
	return uint32(v)
}

func (d *decoder) fixed64(field string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail(field, "need 8 bytes, have %d", len(d.b))
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) byte1(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(field, "missing")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// bytes returns a length-prefixed slice aliasing the input, nil when empty.
func (d *decoder) bytes(field string) []byte {
	n := d.uvarint(field)
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(field, "length %d exceeds the %d bytes left", n, len(d.b))
		return nil
	}
	if n == 0 {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(field string) string { return string(d.bytes(field)) }

// strLike is str returning prev, without allocating, when the bytes spell it: the events of a
// batch mostly share one topic.
func (d *decoder) strLike(field, prev string) string {
	if b := d.bytes(field); string(b) != prev {
		return string(b)
	}
	return prev
}

// markCount reads the entry count of a MarkFired or MarkDeadLettered, whose entries are at
// least minLen bytes, one more when each carries its due time.
func (d *decoder) markCount(minLen int, dueKnown bool) int {
	if dueKnown {
		minLen++
	}
	return d.count("entries", minLen)
}

// count reads a list length and checks that that many items of at least minLen bytes each
// fit in what is left.
func (d *decoder) count(field string, minLen int) int {
	n := d.uvarint(field)
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.b)/minLen) {
		d.fail(field, "count %d cannot fit in the %d bytes left", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) headers() []Header {
	n := d.count("headers", minHeaderLen)
	if n == 0 {
		return nil
	}
	hs := make([]Header, n)
	for i := range hs {
		hs[i].Key = d.str("headers.key")
		hs[i].Value = d.bytes("headers.value")
	}
	return hs
}
