package raftfsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/chimehq/chime/raftfsm/recurrence"
)

// Recurring schedules. A schedule is a rule and a target, stored under its id as a
// definition ('R', rewritten only when the schedule is created or updated) and a cursor ('C',
// rewritten at every occurrence: where the schedule is). At most one of its occurrences is
// pending at a time, as an ordinary event of this shard whose id is the schedule's, '@', and
// the occurrence's nominal instant in Unix milliseconds. When that event settles (fired,
// dead-lettered or cancelled by its id) the same apply derives the next occurrence from the
// rule and creates its event, so no leader, and no leader change, stands between one
// occurrence and the next: a committed log holds every occurrence's creation, once.

// Headers every occurrence carries after the schedule's own.
const (
	HeaderRecurringID    = "chime-recurring-id"
	HeaderOccurrenceUnix = "chime-occurrence-unix-ms"
)

// OccurrenceSeparator joins a schedule's id and an occurrence's Unix milliseconds into the
// occurrence's event id. A schedule id never contains it.
const OccurrenceSeparator = "@"

// OccurrenceID is the event id of the occurrence of schedule id at nominal instant at.
func OccurrenceID(id string, at time.Time) string {
	return id + OccurrenceSeparator + strconv.FormatInt(at.UnixMilli(), 10)
}

// CatchUp says which occurrences a schedule produces of those that fell due while it could
// not (the cluster was down, a fire was late, or it was paused).
type CatchUp uint8

const (
	// CatchUpLast: the latest missed occurrence, then the future ones.
	CatchUpLast CatchUp = 1
	// CatchUpSkip: only future occurrences.
	CatchUpSkip CatchUp = 2
	// CatchUpAll: every missed occurrence in order, at most Definition.MaxCatchUp of them in a
	// row, then the future ones.
	CatchUpAll CatchUp = 3
)

func (c CatchUp) String() string {
	switch c {
	case CatchUpLast:
		return "last"
	case CatchUpSkip:
		return "skip"
	case CatchUpAll:
		return "all"
	}
	return fmt.Sprintf("CatchUp(%d)", uint8(c))
}

// Definition is a recurring schedule as its client wrote it: one rule, and the target each
// occurrence is produced to.
type Definition struct {
	Cron     string // a cron expression (recurrence.Spec.Cron), or ""
	Every    int64  // ns, or 0
	TimeZone string // IANA name; "" is UTC
	// Start and End bound the occurrences (unix ns; 0: none). An every rule's Start is its
	// anchor; a Create without one is anchored at its ProposedAt, to the millisecond.
	Start, End     int64
	Jitter         int64  // ns
	MaxOccurrences uint64 // 0: no limit
	CatchUp        CatchUp
	MaxCatchUp     uint32 // with CatchUpAll

	Topic   string
	Key     []byte
	Payload []byte
	Headers []Header
	// Priority is each occurrence's (NewEvent.Priority).
	Priority uint8
}

// Spec is the rule of d, for recurrence.Parse.
func (d *Definition) Spec() recurrence.Spec {
	s := recurrence.Spec{Cron: d.Cron, Every: time.Duration(d.Every), TimeZone: d.TimeZone, Jitter: time.Duration(d.Jitter)}
	if d.Start != 0 {
		s.Start = time.Unix(0, d.Start).UTC()
	}
	if d.End != 0 {
		s.End = time.Unix(0, d.End).UTC()
	}
	return s
}

// ScheduleState is where a recurring schedule is.
type ScheduleState uint8

const (
	// ScheduleActive: its next occurrence is pending.
	ScheduleActive ScheduleState = 1
	// SchedulePaused: no occurrence is pending until a Resume.
	SchedulePaused ScheduleState = 2
	// ScheduleCompleted: its rule has no further occurrence (past End, or MaxOccurrences
	// reached). An Update may give it some.
	ScheduleCompleted ScheduleState = 3
)

func (s ScheduleState) String() string {
	switch s {
	case ScheduleActive:
		return "active"
	case SchedulePaused:
		return "paused"
	case ScheduleCompleted:
		return "completed"
	}
	return fmt.Sprintf("ScheduleState(%d)", uint8(s))
}

// cursor is where a schedule is: the value under shard|'C'|id.
type cursor struct {
	state     ScheduleState
	version   uint64 // 1 at creation, one more per Update
	hash      uint64 // the content hash of the Create or Update that wrote the definition
	createdAt int64
	updatedAt int64
	// after: the next occurrence is the rule's first strictly after it. The creation (or
	// last update) time, then the nominal instant of each occurrence that settled.
	after int64
	// pendingSeq is the seq of the pending occurrence (0: none), pendingAt its nominal
	// instant and pendingDue its due time (unix ns; the nominal instant plus jitter, or
	// where an Update of its id moved it).
	pendingSeq uint64
	pendingAt  int64
	pendingDue int64
	count      uint64 // occurrences settled: fired, dead-lettered or cancelled by id
	run        uint32 // missed occurrences created in a row (CatchUpAll)
	pausedAt   int64
}

// RecurringOp is what a Recurring command does.
type RecurringOp uint8

const (
	RecurringCreate RecurringOp = 1
	RecurringUpdate RecurringOp = 2
	RecurringDelete RecurringOp = 3
	RecurringPause  RecurringOp = 4
	RecurringResume RecurringOp = 5
	// RecurringTrigger creates one extra occurrence at At, outside the schedule's sequence.
	RecurringTrigger RecurringOp = 6
	// RecurringBackfill creates the occurrences of the rule's nominal times in [From, To)
	// that have no event, outside the schedule's sequence.
	RecurringBackfill RecurringOp = 7
)

func (o RecurringOp) String() string {
	switch o {
	case RecurringCreate:
		return "Create"
	case RecurringUpdate:
		return "Update"
	case RecurringDelete:
		return "Delete"
	case RecurringPause:
		return "Pause"
	case RecurringResume:
		return "Resume"
	case RecurringTrigger:
		return "Trigger"
	case RecurringBackfill:
		return "Backfill"
	}
	return fmt.Sprintf("RecurringOp(%d)", uint8(o))
}

// Recurring creates, updates, deletes, pauses, resumes, triggers or backfills one recurring
// schedule. Apply returns *RecurringResult.
//
// Trigger and Backfill create ordinary events from the definition as this entry finds it,
// with the occurrence id scheme and headers, and never touch the cursor's pending
// occurrence or count: the occurrence map does not name their events, so their settling
// moves nothing. They are entries of their own, not Schedules the leader builds from a read
// of the target, so that they see exactly the definition and state they apply to: one that
// a Delete, Update or Pause committed before them cannot be produced from a stale read.
//
// Update, Delete and Pause remove the schedule's pending occurrence, as a Cancel of it would
// (it becomes Cancelled); with CheckPending they apply only while that occurrence is seq
// Pending (0: none is pending), which a leader sets to what it took out of its wheel for the
// change, so that no fire batch holds the occurrence the change removes.
type Recurring struct {
	Op         RecurringOp
	ProposedAt int64 // unix ns, leader clock
	ID         string
	// IfVersion, when not 0, makes an Update or Delete apply only to that version.
	IfVersion uint64
	// IfHash, when not 0, makes any operation but Create apply only while the stored
	// definition has that hash (RecurringVersionMismatch otherwise): the leader sets it from
	// the read in which it found the caller may act on the schedule, so a schedule deleted
	// and created again, or moved to another topic, before the entry applies is not changed
	// on the strength of a check made against what it was.
	IfHash       uint64
	CheckPending bool
	Pending      uint64
	// Hash and Def are a Create's or Update's: the content hash of the request (a re-sent
	// Create with the same hash is Existing) and the whole new definition.
	Hash uint64
	Def  Definition
	// At is a Trigger's occurrence instant (unix ns, a whole millisecond): its event id is
	// OccurrenceID(ID, At), and it is due at At or ProposedAt, whichever is later.
	At int64
	// From and To (unix ns) bound a Backfill's nominal times, [From, To). Limit and
	// LimitBytes bound what one Backfill creates: at most Limit nominal times in the range,
	// and at most LimitBytes of targets over them (RecurringTooMany otherwise, nothing
	// created), so that one entry's Pebble batch stays bounded whatever the payload.
	From, To   int64
	Limit      uint32
	LimitBytes uint64
}

func (*Recurring) Type() CommandType { return TypeRecurring }

// RecurringOutcome says what a Recurring command did.
type RecurringOutcome uint8

const (
	RecurringCreated RecurringOutcome = 1
	// RecurringExisting: a Create of an id that holds a schedule with the same hash.
	RecurringExisting RecurringOutcome = 2
	// RecurringConflict: a Create of an id that holds a schedule with another hash.
	RecurringConflict RecurringOutcome = 3
	RecurringUpdated  RecurringOutcome = 4
	RecurringDeleted  RecurringOutcome = 5
	RecurringPaused   RecurringOutcome = 6
	RecurringResumed  RecurringOutcome = 7
	// RecurringNotFound: no schedule has the id.
	RecurringNotFound RecurringOutcome = 8
	// RecurringVersionMismatch: the schedule is at another version than IfVersion, or its
	// definition's hash is not IfHash.
	RecurringVersionMismatch RecurringOutcome = 9
	// RecurringMoved: with CheckPending, the pending occurrence is not seq Pending.
	RecurringMoved RecurringOutcome = 10
	// RecurringNotPaused: a Resume of a schedule that is not paused; a Pause of one that
	// is already paused is RecurringPaused again, changing nothing.
	RecurringNotPaused RecurringOutcome = 11
	// RecurringInvalid: the definition's rule does not parse here (the leader checked it:
	// a node built with another zone database may know other zones). Nothing changed.
	RecurringInvalid RecurringOutcome = 12
	// RecurringTriggered: a Trigger's occurrence was created (Created holds At) or existed
	// (Existing is 1); Due is its due time.
	RecurringTriggered RecurringOutcome = 13
	// RecurringBackfilled: a Backfill created the occurrences of Created and found Existing
	// others.
	RecurringBackfilled RecurringOutcome = 14
	// RecurringCompletedState: a Trigger or Backfill of a completed schedule. Nothing changed.
	RecurringCompletedState RecurringOutcome = 15
	// RecurringTooMany: a Backfill's range holds more than Limit nominal times, or more than
	// LimitBytes of targets (Error says which). Nothing changed.
	RecurringTooMany RecurringOutcome = 16
	// RecurringBeyondPending: a Backfill of an active schedule whose range holds a nominal
	// time after its pending occurrence's, which the schedule makes itself (Error names
	// both). Nothing changed.
	RecurringBeyondPending RecurringOutcome = 17
)

func (o RecurringOutcome) String() string {
	switch o {
	case RecurringCreated:
		return "Created"
	case RecurringExisting:
		return "Existing"
	case RecurringConflict:
		return "Conflict"
	case RecurringUpdated:
		return "Updated"
	case RecurringDeleted:
		return "Deleted"
	case RecurringPaused:
		return "Paused"
	case RecurringResumed:
		return "Resumed"
	case RecurringNotFound:
		return "NotFound"
	case RecurringVersionMismatch:
		return "VersionMismatch"
	case RecurringMoved:
		return "Moved"
	case RecurringNotPaused:
		return "NotPaused"
	case RecurringInvalid:
		return "Invalid"
	case RecurringTriggered:
		return "Triggered"
	case RecurringBackfilled:
		return "Backfilled"
	case RecurringCompletedState:
		return "CompletedState"
	case RecurringTooMany:
		return "TooMany"
	case RecurringBeyondPending:
		return "BeyondPending"
	}
	return fmt.Sprintf("RecurringOutcome(%d)", uint8(o))
}

// RecurringResult is the response to a Recurring entry: the outcome and the schedule as it
// is after the entry (as it was before, if nothing changed; the zero Schedule if there is
// none). Error is set with RecurringInvalid, RecurringTooMany and RecurringBeyondPending.
type RecurringResult struct {
	Outcome  RecurringOutcome
	Schedule Schedule
	Error    string
	// Trigger and Backfill: the nominal instants (unix ns) of the occurrences created, in
	// order; how many of the instants asked for had an event already; and a Trigger's
	// occurrence's due time.
	Created  []int64
	Existing uint32
	Due      int64
}

// Schedule is a recurring schedule as reads report it.
type Schedule struct {
	ID         string
	Definition Definition
	State      ScheduleState
	Version    uint64
	// Hash is the content hash of the Create or Update that wrote Definition: what a
	// Recurring command's IfHash names.
	Hash      uint64
	CreatedAt int64
	UpdatedAt int64
	PausedAt  int64 // while paused
	// Next is the nominal instant (unix ns) of the pending occurrence, NextDue its event's
	// due time and NextSeq its seq; all 0 when none is pending.
	Next    int64
	NextDue int64
	NextSeq uint64
	// Occurrences counts the occurrences that settled.
	Occurrences uint64
	// ResumesFrom, while paused, is the first of the rule's instants after the last one the
	// schedule made or counts as passed: what a Resume makes first (or catches up from), and
	// so where a Backfill must start for the Pause to have skipped nothing. 0 when the rule
	// has no instant left.
	ResumesFrom int64
}

// schedule is the schedule id as c and its definition d say; r is d's rule, parsed, or nil
// to parse it here if it is needed.
func (c *cursor) schedule(id string, d *Definition, r *recurrence.Rule) Schedule {
	s := Schedule{ID: id, State: c.state, Version: c.version, Hash: c.hash, CreatedAt: c.createdAt, UpdatedAt: c.updatedAt,
		Occurrences: c.count, NextSeq: c.pendingSeq}
	if d != nil {
		s.Definition = *d
	}
	if c.state == SchedulePaused {
		s.PausedAt = c.pausedAt
		if r == nil && d != nil {
			r, _ = recurrence.Parse(d.Spec()) // unparseable: a zone this build lacks, nothing to resume
		}
		if r != nil && d != nil && (d.MaxOccurrences == 0 || c.count < d.MaxOccurrences) {
			if next, ok := r.Next(time.Unix(0, c.after)); ok {
				s.ResumesFrom = next.UnixNano()
			}
		}
	}
	if c.pendingSeq != 0 {
		s.Next, s.NextDue = c.pendingAt, c.pendingDue
	}
	return s
}

// Encoding of a definition, in a command and (after a format byte) stored.

func appendDefinition(dst []byte, d *Definition) []byte {
	dst = appendString(dst, d.Cron)
	dst = binary.AppendVarint(dst, d.Every)
	dst = appendString(dst, d.TimeZone)
	dst = binary.AppendVarint(dst, d.Start)
	dst = binary.AppendVarint(dst, d.End)
	dst = binary.AppendVarint(dst, d.Jitter)
	dst = binary.AppendUvarint(dst, d.MaxOccurrences)
	dst = append(dst, byte(d.CatchUp))
	dst = binary.AppendUvarint(dst, uint64(d.MaxCatchUp))
	dst = appendString(dst, d.Topic)
	dst = appendBytes(dst, d.Key)
	dst = appendBytes(dst, d.Payload)
	dst = appendHeaders(dst, d.Headers)
	return append(dst, d.Priority)
}

func (d *decoder) definition() Definition {
	def := Definition{
		Cron:           d.str("cron"),
		Every:          d.varint("every"),
		TimeZone:       d.str("timeZone"),
		Start:          d.varint("start"),
		End:            d.varint("end"),
		Jitter:         d.varint("jitter"),
		MaxOccurrences: d.uvarint("maxOccurrences"),
		CatchUp:        CatchUp(d.byte1("catchUp")),
		MaxCatchUp:     d.uint32("maxCatchUp"),
		Topic:          d.str("topic"),
		Key:            d.bytes("key"),
		Payload:        d.bytes("payload"),
		Headers:        d.headers(),
		Priority:       d.priority(),
	}
	if d.err == nil && (def.CatchUp < CatchUpLast || def.CatchUp > CatchUpAll) {
		d.fail("catchUp", "unknown catch-up %d", def.CatchUp)
	}
	return def
}

const (
	recurringCheckPending = 1 << 0
	recurringIfHash       = 1 << 1
)

// AppendRecurring appends the log entry encoding of c to dst.
func AppendRecurring(dst []byte, c *Recurring) []byte {
	dst = append(dst, byte(TypeRecurring), byte(c.Op))
	dst = binary.AppendVarint(dst, c.ProposedAt)
	dst = appendString(dst, c.ID)
	dst = binary.AppendUvarint(dst, c.IfVersion)
	var flags byte
	if c.CheckPending {
		flags |= recurringCheckPending
	}
	if c.IfHash != 0 {
		flags |= recurringIfHash
	}
	dst = append(dst, flags)
	if c.CheckPending {
		dst = binary.AppendUvarint(dst, c.Pending)
	}
	if c.IfHash != 0 {
		dst = binary.LittleEndian.AppendUint64(dst, c.IfHash)
	}
	switch c.Op {
	case RecurringCreate, RecurringUpdate:
		dst = binary.LittleEndian.AppendUint64(dst, c.Hash)
		dst = appendDefinition(dst, &c.Def)
	case RecurringTrigger:
		dst = binary.AppendVarint(dst, c.At)
	case RecurringBackfill:
		dst = binary.AppendVarint(dst, c.From)
		dst = binary.AppendVarint(dst, c.To)
		dst = binary.AppendUvarint(dst, uint64(c.Limit))
		dst = binary.AppendUvarint(dst, c.LimitBytes)
	}
	return dst
}

func (d *decoder) recurring() *Recurring {
	c := &Recurring{Op: RecurringOp(d.byte1("op"))}
	if d.err == nil && (c.Op < RecurringCreate || c.Op > RecurringBackfill) {
		d.fail("op", "unknown op %d", c.Op)
	}
	c.ProposedAt = d.varint("proposedAt")
	c.ID = d.str("id")
	c.IfVersion = d.uvarint("ifVersion")
	flags := d.byte1("flags")
	if unknown := flags &^ (recurringCheckPending | recurringIfHash); unknown != 0 {
		d.fail("flags", "unknown flags %#x", unknown)
	}
	if flags&recurringCheckPending != 0 {
		c.CheckPending, c.Pending = true, d.uvarint("pending")
	}
	if flags&recurringIfHash != 0 {
		if c.IfHash = d.fixed64("ifHash"); c.IfHash == 0 && d.err == nil {
			d.fail("ifHash", "0 with its flag set")
		}
	}
	switch c.Op {
	case RecurringCreate, RecurringUpdate:
		c.Hash = d.fixed64("hash")
		c.Def = d.definition()
	case RecurringTrigger:
		c.At = d.varint("at")
	case RecurringBackfill:
		c.From = d.varint("from")
		c.To = d.varint("to")
		c.Limit = d.uint32("limit")
		c.LimitBytes = d.uvarint("limitBytes")
	}
	return c
}

// Stored forms: a definition is formatV1 then its encoding; a cursor is formatV1 then its
// fields.

func appendStoredDefinition(dst []byte, d *Definition) []byte {
	return appendDefinition(append(dst, formatV1), d)
}

func decodeStoredDefinition(b []byte) (Definition, error) {
	if len(b) == 0 || b[0] != formatV1 {
		return Definition{}, fmt.Errorf("%w: recurring definition of format %x", ErrCorrupt, b[:min(len(b), 1)])
	}
	d := decoder{b: b[1:]}
	def := d.definition()
	if err := d.finish(); err != nil {
		return Definition{}, fmt.Errorf("%w: recurring definition: %v", ErrCorrupt, err)
	}
	return def, nil
}

func (c *cursor) append(dst []byte) []byte {
	dst = append(dst, formatV1, byte(c.state))
	dst = binary.AppendUvarint(dst, c.version)
	dst = binary.LittleEndian.AppendUint64(dst, c.hash)
	dst = binary.AppendVarint(dst, c.createdAt)
	dst = binary.AppendVarint(dst, c.updatedAt)
	dst = binary.AppendVarint(dst, c.after)
	dst = binary.AppendUvarint(dst, c.pendingSeq)
	dst = binary.AppendVarint(dst, c.pendingAt)
	dst = binary.AppendVarint(dst, c.pendingDue)
	dst = binary.AppendUvarint(dst, c.count)
	dst = binary.AppendUvarint(dst, uint64(c.run))
	return binary.AppendVarint(dst, c.pausedAt)
}

func decodeCursor(b []byte) (cursor, error) {
	if len(b) == 0 || b[0] != formatV1 {
		return cursor{}, fmt.Errorf("%w: recurring cursor of format %x", ErrCorrupt, b[:min(len(b), 1)])
	}
	d := decoder{b: b[1:]}
	c := cursor{
		state:      ScheduleState(d.byte1("state")),
		version:    d.uvarint("version"),
		hash:       d.fixed64("hash"),
		createdAt:  d.varint("createdAt"),
		updatedAt:  d.varint("updatedAt"),
		after:      d.varint("after"),
		pendingSeq: d.uvarint("pendingSeq"),
		pendingAt:  d.varint("pendingAt"),
		pendingDue: d.varint("pendingDue"),
		count:      d.uvarint("count"),
		run:        d.uint32("run"),
		pausedAt:   d.varint("pausedAt"),
	}
	switch {
	case d.err != nil:
	case c.state < ScheduleActive || c.state > ScheduleCompleted:
		d.fail("state", "unknown state %d", c.state)
	case c.version == 0:
		d.fail("version", "0")
	case (c.pendingSeq != 0) != (c.state == ScheduleActive):
		d.fail("pendingSeq", "%d in state %v: an active schedule, and only one, has a pending occurrence", c.pendingSeq, c.state)
	}
	if err := d.finish(); err != nil {
		return cursor{}, fmt.Errorf("%w: recurring cursor: %v", ErrCorrupt, err)
	}
	return c, nil
}

func appendDefinitionKey(dst []byte, shard uint32, id string) []byte {
	return append(appendShardTag(dst, shard, tagDefinition), id...)
}

func appendCursorKey(dst []byte, shard uint32, id string) []byte {
	return append(appendShardTag(dst, shard, tagCursor), id...)
}

// occurrences is, in memory, which pending event is which schedule's occurrence, and every
// schedule as committed. Settling an event looks here, not in Pebble, so that events that
// are not occurrences (nearly all) cost a map lookup, and an occurrence's settling reads
// nothing to move its schedule on (reading its cursor and definition was a third of a
// spread recurring run's CPU: BENCHMARKS.md). It is built from the cursors and definitions
// when the FSM opens and after a Restore, and kept by apply; only the apply goroutine (and
// NewFSM and Restore, which raft does not run beside it) touch it.
type occurrences struct {
	// bySeq maps seq → schedule id: exactly the cursors' pending seqs.
	bySeq map[uint64]string
	// scheds holds, by id, each schedule's cursor and definition as Pebble holds them after
	// the last commit, and its parsed rule. Apply changes copies of them (applier.scheds)
	// and puts those here only once their batch has committed (publishSchedules), so a batch
	// that never commits (an apply that panics) leaves it as it was. A schedule missing from
	// it (one that does not decode or lacks its cursor or definition in Pebble, or any after
	// a Restore that failed half way) is read from Pebble, as it always was, and kept here
	// once its batch commits.
	//
	// Memory, per schedule: a scheduleEntry of 288 bytes (a cursor of 96, a Definition of
	// 168), about 40 of map, the id and the definition's strings (cron, zone, topic), its
	// parsed rule (80 bytes, 160 for a cron rule) and the target it keeps, at most
	// maxCachedTarget bytes and about 60 of slices. Measured for 10,000 schedules with
	// 12-byte ids: 410 bytes each with no target kept (a large one), 470 with a 20-byte
	// one, 680 with a 220-byte one, rules not counted.
	scheds map[string]*scheduleEntry
}

// maxCachedTarget is the most bytes of key, payload and headers that occurrences keeps of a
// definition. A larger target (a payload may be as large as a gRPC message) is read from
// Pebble each time an occurrence of it is created, so that memory per schedule stays
// bounded whatever its payload.
const maxCachedTarget = 1 << 10

func targetSize(d *Definition) int {
	n := len(d.Key) + len(d.Payload)
	for _, h := range d.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func (f *FSM) loadOccurrences() error {
	f.occ = occurrences{bySeq: make(map[uint64]string), scheds: make(map[string]*scheduleEntry)}
	// The definitions first, then each cursor with its own. What does not pair up or
	// decode is left out, for apply to read from Pebble and stop on as it always did.
	defs := make(map[string]*scheduleEntry)
	prefix := appendShardTag(nil, f.shard, tagDefinition)
	it, err := f.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: appendShardTag(nil, f.shard, tagDefinition+1)})
	if err != nil {
		return err
	}
	defer func() { _ = it.Close() }() // its error is it.Error, checked after the loop
	for valid := it.First(); valid; valid = it.Next() {
		if d, err := decodeStoredDefinition(it.Value()); err == nil {
			e := &scheduleEntry{}
			e.setDefinition(d)
			defs[string(it.Key()[len(prefix):])] = e
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	prefix = appendShardTag(nil, f.shard, tagCursor)
	it.SetBounds(prefix, appendShardTag(nil, f.shard, tagCursor+1))
	for valid := it.First(); valid; valid = it.Next() {
		c, err := decodeCursor(it.Value())
		if err != nil {
			return fmt.Errorf("raftfsm: shard %d: schedule %q: %w", f.shard, it.Key()[len(prefix):], err)
		}
		id := string(it.Key()[len(prefix):])
		if c.pendingSeq != 0 {
			f.occ.bySeq[c.pendingSeq] = id
		}
		if e := defs[id]; e != nil {
			e.cur = c
			f.occ.scheds[id] = e
		}
	}
	return it.Error()
}

// publishSchedules puts the schedules a batch read or wrote, now committed, into
// f.occ.scheds.
func (f *FSM) publishSchedules(scheds map[string]*scheduleEntry) {
	for id, e := range scheds {
		if e.gone {
			delete(f.occ.scheds, id)
			continue
		}
		c := f.occ.scheds[id]
		if c == nil {
			c = new(scheduleEntry)
			f.occ.scheds[id] = c
		}
		*c = *e
		if c.target && targetSize(&c.def) > maxCachedTarget {
			c.def.Key, c.def.Payload, c.def.Headers, c.target = nil, nil, nil, false
		}
	}
}

// The applier's view of schedules: what this batch wrote, over what is committed.

// scheduleEntry is a schedule: in f.occ.scheds as committed, in applier.scheds as its batch
// sees it.
type scheduleEntry struct {
	cur cursor
	// def is the definition. Its Key, Payload and Headers (the target) are there only with
	// target: occurrences does not keep a large one (maxCachedTarget).
	def    Definition
	target bool
	// rule is def's rule, parsed; nil until a materialise needs it.
	rule *recurrence.Rule
	gone bool // deleted in this batch
}

// setDefinition makes d, which may alias what it was decoded from, e's definition, with its
// target unless that is too large to keep (maxCachedTarget).
func (e *scheduleEntry) setDefinition(d Definition) {
	if targetSize(&d) > maxCachedTarget {
		d.Key, d.Payload, d.Headers = nil, nil, nil
		e.def, e.target = cloneDefinition(d), false
		return
	}
	e.def, e.target = cloneDefinition(d), true
}

// sched returns the schedule of id as this batch sees it; nil if there is none. With target,
// its definition's target is loaded too. The entry is the batch's: changes to it are
// written by putCursor and putDefinition, and reach f.occ.scheds when the batch commits.
func (a *applier) sched(id string, target bool) *scheduleEntry {
	e, ok := a.scheds[id]
	if !ok {
		if c := a.f.occ.scheds[id]; c != nil {
			e = new(scheduleEntry)
			*e = *c
		} else if e = a.readSchedule(id); e == nil {
			return nil
		}
		a.scheds[id] = e
	}
	if e.gone {
		return nil
	}
	if target && !e.target {
		e.def, e.target = a.readDefinition(id), true
	}
	return e
}

// readSchedule reads schedule id from Pebble, nil if it has no cursor.
func (a *applier) readSchedule(id string) *scheduleEntry {
	a.key = appendCursorKey(a.key[:0], a.f.shard, id)
	v, found := a.get(a.key)
	if !found {
		return nil
	}
	c, err := decodeCursor(v)
	if err != nil {
		a.fatal("schedule %q: %v", id, err)
	}
	return &scheduleEntry{cur: c, def: a.readDefinition(id), target: true}
}

// readDefinition reads the whole definition of schedule id, which has a cursor, from Pebble.
func (a *applier) readDefinition(id string) Definition {
	a.key = appendDefinitionKey(a.key[:0], a.f.shard, id)
	v, found := a.get(a.key)
	if !found {
		a.fatal("schedule %q has a cursor and no definition", id)
	}
	d, err := decodeStoredDefinition(v)
	if err != nil {
		a.fatal("schedule %q: %v", id, err)
	}
	return cloneDefinition(d)
}

// cloneDefinition copies the byte slices of d, which alias what it was decoded from.
func cloneDefinition(d Definition) Definition {
	d.Key, d.Payload = cloneBytes(d.Key), cloneBytes(d.Payload)
	if d.Headers != nil {
		hs := make([]Header, len(d.Headers))
		for i, h := range d.Headers {
			hs[i] = Header{Key: h.Key, Value: cloneBytes(h.Value)}
		}
		d.Headers = hs
	}
	return d
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

func (a *applier) putCursor(id string, e *scheduleEntry) {
	a.key = appendCursorKey(a.key[:0], a.f.shard, id)
	a.val = e.cur.append(a.val[:0])
	a.set(a.key, a.val)
}

func (a *applier) putDefinition(id string, e *scheduleEntry) {
	a.key = appendDefinitionKey(a.key[:0], a.f.shard, id)
	a.val = appendStoredDefinition(a.val[:0], &e.def)
	a.set(a.key, a.val)
}

// rule parses e's rule, once per definition.
func (a *applier) rule(e *scheduleEntry) (*recurrence.Rule, error) {
	if e.rule != nil {
		return e.rule, nil
	}
	r, err := recurrence.Parse(e.def.Spec())
	if err != nil {
		return nil, err
	}
	e.rule = r
	return r, nil
}

func (a *applier) recurring(c *Recurring) *RecurringResult {
	res := &RecurringResult{}
	e := a.sched(c.ID, true)
	report := func(o RecurringOutcome) *RecurringResult {
		res.Outcome = o
		if e != nil && !e.gone {
			d := cloneDefinition(e.def) // e's may be kept in f.occ once the batch commits
			var r *recurrence.Rule
			if e.cur.state == SchedulePaused {
				r, _ = a.rule(e)
			}
			res.Schedule = e.cur.schedule(c.ID, &d, r)
		}
		return res
	}
	switch {
	case e == nil && c.Op == RecurringCreate:
	case e == nil:
		return report(RecurringNotFound)
	case c.Op == RecurringCreate && e.cur.hash == c.Hash:
		return report(RecurringExisting)
	case c.Op == RecurringCreate:
		return report(RecurringConflict)
	case c.IfVersion != 0 && c.IfVersion != e.cur.version && (c.Op == RecurringUpdate || c.Op == RecurringDelete):
		return report(RecurringVersionMismatch)
	case c.IfHash != 0 && c.IfHash != e.cur.hash:
		return report(RecurringVersionMismatch)
	case c.Op == RecurringPause && e.cur.state == SchedulePaused:
		return report(RecurringPaused)
	case c.Op == RecurringResume && e.cur.state != SchedulePaused:
		return report(RecurringNotPaused)
	case (c.Op == RecurringTrigger || c.Op == RecurringBackfill) && e.cur.state == ScheduleCompleted:
		return report(RecurringCompletedState)
	case c.CheckPending && c.Pending != e.cur.pendingSeq:
		return report(RecurringMoved)
	}

	now := c.ProposedAt
	switch c.Op {
	case RecurringCreate, RecurringUpdate:
		def := c.Def
		if def.Every != 0 && def.Start == 0 {
			def.Start = now - now%int64(time.Millisecond)
		}
		r, err := recurrence.Parse(def.Spec())
		if err != nil {
			res.Error = err.Error()
			return report(RecurringInvalid)
		}
		if e == nil {
			e = &scheduleEntry{cur: cursor{state: ScheduleActive, createdAt: now, after: now}}
			a.scheds[c.ID] = e
			res.Outcome = RecurringCreated
		} else {
			a.dropOccurrence(c.ID, e, now)
			e.cur.after = max(e.cur.after, now)
			if e.cur.state == ScheduleCompleted {
				e.cur.state = ScheduleActive
			}
			res.Outcome = RecurringUpdated
		}
		// def aliases the log entry; e keeps a copy, and its parsed rule.
		e.def, e.target, e.rule = cloneDefinition(def), true, r
		e.cur.version++
		e.cur.hash, e.cur.updatedAt, e.cur.run = c.Hash, now, 0
		a.putDefinition(c.ID, e)
		if e.cur.state == ScheduleActive {
			a.materialise(c.ID, e, now)
		}
		a.putCursor(c.ID, e)
		return report(res.Outcome)
	case RecurringDelete:
		a.dropOccurrence(c.ID, e, now)
		e.gone = true
		a.key = appendCursorKey(a.key[:0], a.f.shard, c.ID)
		a.del(a.key)
		a.key = appendDefinitionKey(a.key[:0], a.f.shard, c.ID)
		a.del(a.key)
		return report(RecurringDeleted)
	case RecurringPause:
		a.dropOccurrence(c.ID, e, now)
		e.cur.state, e.cur.pausedAt = SchedulePaused, now
		a.putCursor(c.ID, e)
		return report(RecurringPaused)
	case RecurringResume:
		// run is kept: a schedule paused and resumed part way through a catch-up goes on
		// counting the same run, so that pausing again and again never replays more than
		// MaxCatchUp of one stretch of missed occurrences.
		e.cur.state, e.cur.pausedAt = ScheduleActive, 0
		a.materialise(c.ID, e, now)
		a.putCursor(c.ID, e)
		return report(RecurringResumed)
	case RecurringTrigger:
		return report(a.trigger(c, e, res))
	case RecurringBackfill:
		return report(a.backfill(c, e, res))
	}
	a.fatal("no apply for recurring op %v", c.Op)
	return nil
}

// dropOccurrence cancels the pending occurrence of schedule id, if it has one, as a Cancel
// of its id would: it becomes Cancelled, at now. The schedule's cursor does not move: the
// occurrence did not happen.
func (a *applier) dropOccurrence(id string, e *scheduleEntry, now int64) {
	seq := e.cur.pendingSeq
	if seq == 0 {
		return
	}
	eid := OccurrenceID(id, time.Unix(0, e.cur.pendingAt))
	ref, ok := a.lookupID(eid)
	if !ok || ref.seq != seq {
		a.fatal("schedule %q names occurrence %d (%q), which its id does not (%v, %d)", id, seq, eid, ok, ref.seq)
	}
	s := a.status(seq, ref.due)
	if s.state != StateScheduled {
		a.fatal("schedule %q's occurrence %d is %v, not pending", id, seq, s.state)
	}
	a.settle(seq, s.due)
	s.state, s.cancelledAt = StateCancelled, now
	a.putStatus(seq, s)
	a.m.cancelled++
	delete(a.f.occ.bySeq, seq)
	e.cur.pendingSeq, e.cur.pendingAt, e.cur.pendingDue = 0, 0, 0
}

// occurred moves the schedule whose pending occurrence seq just settled (fired,
// dead-lettered, or cancelled by its id) to its next occurrence, at now.
func (a *applier) occurred(seq uint64, now int64) {
	id, ok := a.f.occ.bySeq[seq]
	if !ok {
		return
	}
	delete(a.f.occ.bySeq, seq)
	e := a.sched(id, false)
	if e == nil || e.cur.pendingSeq != seq {
		a.fatal("occurrence %d names schedule %q, which does not name it", seq, id)
	}
	e.cur.after = e.cur.pendingAt
	e.cur.pendingSeq, e.cur.pendingAt, e.cur.pendingDue = 0, 0, 0
	e.cur.count++
	a.materialise(id, e, now)
	a.putCursor(id, e)
}

// rebound moves schedule's pending occurrence from seq old to its next version new, due at
// due (an Update or a Replace of the occurrence's id superseded it).
func (a *applier) rebound(old, new uint64, due int64) {
	id, ok := a.f.occ.bySeq[old]
	if !ok {
		return
	}
	delete(a.f.occ.bySeq, old)
	a.f.occ.bySeq[new] = id
	e := a.sched(id, false)
	if e == nil || e.cur.pendingSeq != old {
		a.fatal("occurrence %d names schedule %q, which does not name it", old, id)
	}
	e.cur.pendingSeq, e.cur.pendingDue = new, due
	a.putCursor(id, e)
}

// materialise creates the event of the next occurrence of active schedule id, which has
// none pending, or completes the schedule if its rule has none left. now is the entry's
// time: occurrences at or before it were missed, and the definition's catch-up says which
// of them happen.
func (a *applier) materialise(id string, e *scheduleEntry, now int64) {
	complete := func() { e.cur.state, e.cur.run = ScheduleCompleted, 0 }
	if e.def.MaxOccurrences != 0 && e.cur.count >= e.def.MaxOccurrences {
		complete()
		return
	}
	r, err := a.rule(e)
	if err != nil {
		// Parsed when the definition was written, by this build or another: a zone this
		// build's database lacks. The schedule stops, identically on every replica of the
		// build, rather than the replica.
		complete()
		return
	}
	at := time.Unix(0, now)
	next, ok := r.Next(time.Unix(0, e.cur.after))
	if ok && !next.After(at) {
		switch e.def.CatchUp {
		case CatchUpSkip:
			next, ok = r.Next(at)
			e.cur.run = 0
		case CatchUpLast:
			if latest, lok := r.Latest(at); lok && latest.After(next) {
				next = latest
			}
			e.cur.run = 0
		case CatchUpAll:
			if e.cur.run >= e.def.MaxCatchUp {
				next, ok = r.Next(at)
				e.cur.run = 0
			} else {
				e.cur.run++
			}
		}
	} else {
		e.cur.run = 0
	}
	if !ok {
		complete()
		return
	}
	ev := a.occurrence(id, e, next, next.Add(r.Jitter(id, next)).UnixNano())
	var seq uint64
	if ref, bound := a.lookupID(ev.ID); bound {
		// The id of an occurrence a Pause, Delete or Update cancelled, now due again; or an
		// event a client made with it. The occurrence takes its place, as a Replace would.
		seq = a.replace(&ev, ref, now).Seq
	} else {
		seq = a.createNew(&ev, now)
	}
	e.cur.pendingSeq, e.cur.pendingAt, e.cur.pendingDue = seq, next.UnixNano(), ev.Due
	a.f.occ.bySeq[seq] = id
}

// occurrence is the event of schedule id's occurrence at nominal instant at, due at due:
// the definition's target, then the headers that name the schedule and the instant.
func (a *applier) occurrence(id string, e *scheduleEntry, at time.Time, due int64) NewEvent {
	if !e.target {
		// Too large to keep in memory (maxCachedTarget): read from the definition.
		e.def, e.target = a.readDefinition(id), true
	}
	ms := strconv.FormatInt(at.UnixMilli(), 10)
	ev := NewEvent{
		ID:      id + OccurrenceSeparator + ms,
		Due:     due,
		Topic:   e.def.Topic,
		Key:     e.def.Key,
		Payload: e.def.Payload,
		Headers: append(append(make([]Header, 0, len(e.def.Headers)+2), e.def.Headers...),
			Header{Key: HeaderRecurringID, Value: []byte(id)}, Header{Key: HeaderOccurrenceUnix, Value: []byte(ms)}),
	}
	ev.Priority = e.def.Priority
	ev.ContentHash = ContentHash(ev.Topic, ev.Key, ev.Payload, ev.Headers, ev.Due, 0, true, false, ev.Policy, ev.Output)
	return ev
}

// trigger creates the occurrence of schedule id (e, active or paused) at c.At, due at c.At
// or the entry's time, whichever is later, unless its event id is bound already: a retry
// of the same Trigger, or an occurrence of the rule at that very instant (pending, say),
// which is then that occurrence. The cursor does not change: the event is not the
// schedule's pending occurrence, so occurred never sees it settle.
func (a *applier) trigger(c *Recurring, e *scheduleEntry, res *RecurringResult) RecurringOutcome {
	at := time.Unix(0, c.At)
	if ref, bound := a.lookupID(OccurrenceID(c.ID, at)); bound {
		res.Existing, res.Due = 1, ref.due
		return RecurringTriggered
	}
	ev := a.occurrence(c.ID, e, at, max(c.At, c.ProposedAt))
	a.createNew(&ev, c.ProposedAt)
	res.Created, res.Due = []int64{at.UnixMilli() * int64(time.Millisecond)}, ev.Due
	return RecurringTriggered
}

// backfill creates an occurrence of schedule id (e, active or paused) for each nominal
// instant of its rule in [c.From, c.To) whose event id is bound to nothing or to a
// cancelled event, due at the entry's time, or at its nominal instant if that is later
// (never early). It refuses, with nothing created, a range of more than c.Limit instants
// or c.LimitBytes of targets, and for an active schedule one that reaches past its pending
// occurrence: the rule's instants after that one are the schedule's own to make, and an
// event created for one of them now would be taken over (renewed, produced again) when the
// schedule reaches it. A paused schedule's cursor moves past the last instant of the range
// instead, for the same reason: a Resume then catches up only what follows it.
func (a *applier) backfill(c *Recurring, e *scheduleEntry, res *RecurringResult) RecurringOutcome {
	r, err := a.rule(e)
	if err != nil {
		res.Error = err.Error()
		return RecurringInvalid
	}
	var times []time.Time
	to := time.Unix(0, c.To)
	for t, ok := r.Next(time.Unix(0, c.From-1)); ok && t.Before(to); t, ok = r.Next(t) {
		if len(times) == int(c.Limit) {
			res.Error = fmt.Sprintf("the range holds more than %d occurrences of the rule, the most one Backfill creates", c.Limit)
			return RecurringTooMany
		}
		if e.cur.state == ScheduleActive && t.UnixNano() > e.cur.pendingAt {
			res.Error = fmt.Sprintf("the range holds %s, after the pending occurrence at %s: the schedule makes that one and those after it itself",
				t.UTC().Format(time.RFC3339Nano), time.Unix(0, e.cur.pendingAt).UTC().Format(time.RFC3339Nano))
			return RecurringBeyondPending
		}
		times = append(times, t)
	}
	if !e.target {
		// Too large to keep in memory (maxCachedTarget): read to be weighed and copied.
		e.def, e.target = a.readDefinition(c.ID), true
	}
	if size := uint64(len(times)) * uint64(targetSize(&e.def)+len(e.def.Topic)); size > c.LimitBytes {
		res.Error = fmt.Sprintf("the range's %d occurrences carry %d bytes of targets, more than the %d one Backfill writes", len(times), size, c.LimitBytes)
		return RecurringTooMany
	}
	ids := make([]string, len(times))
	for i, t := range times {
		ids[i] = OccurrenceID(c.ID, t)
	}
	if len(ids) > 1 {
		a.preload(ids)
	}
	for i, t := range times {
		ref, bound := a.lookupID(ids[i])
		if bound && a.status(ref.seq, ref.due).state != StateCancelled {
			res.Existing++
			continue
		}
		ev := a.occurrence(c.ID, e, t, max(t.UnixNano(), c.ProposedAt))
		if bound {
			// Cancelled: by the Pause, Delete or Update that dropped it as the schedule's
			// pending occurrence, most often, which is what a backfill makes up for. It takes
			// the cancelled event's place, as materialise's would.
			a.replace(&ev, ref, c.ProposedAt)
		} else {
			a.createNew(&ev, c.ProposedAt)
		}
		res.Created = append(res.Created, t.UnixNano())
	}
	if e.cur.state == SchedulePaused && len(times) > 0 {
		e.cur.after = max(e.cur.after, times[len(times)-1].UnixNano())
		a.putCursor(c.ID, e)
	}
	return RecurringBackfilled
}

// ScheduleIDRule is the rule a recurring schedule's id follows beyond an event id's: it
// never contains OccurrenceSeparator, so that the ids of its occurrences are routed with it
// (chimev1.ShardOf).
func ScheduleIDRule(id string) error {
	if strings.Contains(id, OccurrenceSeparator) {
		return errors.New("contains \"" + OccurrenceSeparator + "\", which separates a schedule's id from an occurrence's time in the occurrence's event id")
	}
	return nil
}

// GetSchedule returns the recurring schedule with id.
func (f *FSM) GetSchedule(id string) (s Schedule, found bool, err error) {
	it, err := f.newIter(appendShardTag(nil, f.shard, tagCursor), appendShardTag(nil, f.shard, tagDefinition+1))
	if err != nil {
		return Schedule{}, false, err
	}
	defer closeIter(it, &err)
	return f.readSchedule(it, id)
}

// readSchedule reads schedule id with it, an iterator over the cursors and definitions.
func (f *FSM) readSchedule(it *pebble.Iterator, id string) (Schedule, bool, error) {
	key := appendCursorKey(nil, f.shard, id)
	if !it.SeekGE(key) || !bytes.Equal(it.Key(), key) {
		return Schedule{}, false, it.Error()
	}
	c, err := decodeCursor(it.Value())
	if err != nil {
		return Schedule{}, false, fmt.Errorf("raftfsm: shard %d: schedule %q: %w", f.shard, id, err)
	}
	key = appendDefinitionKey(key[:0], f.shard, id)
	if !it.SeekGE(key) || !bytes.Equal(it.Key(), key) {
		if err := it.Error(); err != nil {
			return Schedule{}, false, err
		}
		return Schedule{}, false, fmt.Errorf("%w: shard %d: schedule %q has a cursor and no definition", ErrCorrupt, f.shard, id)
	}
	d, err := decodeStoredDefinition(it.Value())
	if err != nil {
		return Schedule{}, false, fmt.Errorf("raftfsm: shard %d: schedule %q: %w", f.shard, id, err)
	}
	d = cloneDefinition(d)
	return c.schedule(id, &d, nil), true, nil
}

// ListSchedules returns up to limit schedules of this shard, in id order, starting after
// the id after ("" from the first) and holding prefix; more reports whether there are others
// after them.
func (f *FSM) ListSchedules(prefix, after string, limit int) (out []Schedule, more bool, err error) {
	lower := appendCursorKey(nil, f.shard, prefix)
	if after != "" && after >= prefix {
		lower = appendCursorKey(nil, f.shard, after+"\x00")
	}
	it, err := f.newIter(appendShardTag(nil, f.shard, tagCursor), appendShardTag(nil, f.shard, tagDefinition+1))
	if err != nil {
		return nil, false, err
	}
	defer closeIter(it, &err)
	cursorEnd := appendShardTag(nil, f.shard, tagCursor+1)
	var ids []string
	for valid := it.SeekGE(lower); valid && bytes.Compare(it.Key(), cursorEnd) < 0; valid = it.Next() {
		id := string(it.Key()[shardPrefixLen+1:])
		if !strings.HasPrefix(id, prefix) {
			break
		}
		if len(ids) == limit {
			more = true
			break
		}
		ids = append(ids, id)
	}
	if err := it.Error(); err != nil {
		return nil, false, err
	}
	for _, id := range ids {
		s, found, err := f.readSchedule(it, id)
		if err != nil {
			return nil, false, err
		}
		if found {
			out = append(out, s)
		}
	}
	return out, more, nil
}
