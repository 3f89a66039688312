package raftfsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

// Observer learns about changes to the pending set, so the shard owner can keep its timing
// wheel in step with Pebble. It is called on the apply goroutine after the Pebble batch holding
// the change has committed, in apply order. Replayed (skipped) entries do not notify.
type Observer interface {
	// Scheduled reports a newly created pending event.
	Scheduled(seq uint64, dueUnixNano int64, p Policy)
	// Settled reports that a pending event left the pending state: cancelled, fired or
	// dead-lettered.
	Settled(seq uint64)
	// Reset reports that Restore replaced the shard's state; the owner drops what it holds
	// and rebuilds from ForEachPending.
	Reset()
}

// BatchObserver is an Observer told where the calls for one applied batch of entries begin
// and end, so that it can take them in at once: what it serves then never sees part of a
// batch (a burst of events already due, half of them scheduled).
type BatchObserver interface {
	Observer
	BeginNotes()
	EndNotes()
}

type nopObserver struct{}

func (nopObserver) Scheduled(uint64, int64, Policy) {}
func (nopObserver) Settled(uint64)                  {}
func (nopObserver) Reset()                          {}

// ErrReplayed is the response for a log entry at or below the stored applied index: it was
// applied before a restart and is skipped, changing nothing and notifying nobody. Only raft's
// replay on start produces such entries, and nobody waits on their futures, so the FSM does
// not re-derive their original results.
var ErrReplayed = errors.New("raftfsm: log entry already applied; skipped")

// ErrRestoring is returned by reads while a restore of the shard is unfinished (in progress,
// or failed and left its marker); the shard's state is partial until it completes.
var ErrRestoring = errors.New("raftfsm: shard restore unfinished")

// ScheduleOutcome says what a ScheduleBatch did with one event.
type ScheduleOutcome uint8

const (
	// Created: a new event, with a new Seq.
	Created ScheduleOutcome = 1
	// Existing: the id exists with the same ContentHash; Seq and Due are the original
	// event's, whatever its state now.
	Existing ScheduleOutcome = 2
	// Conflict: the id exists with a different ContentHash; nothing changed. Seq and Due are
	// the existing event's.
	Conflict ScheduleOutcome = 3
	// Replaced: with NewEvent.Replace, the id's event was pending; this is its next version.
	Replaced ScheduleOutcome = 4
	// Renewed: with NewEvent.Replace, the id's event had settled; it was removed and the id
	// scheduled anew, with the version after its own.
	Renewed ScheduleOutcome = 5
	// Moved: with NewEvent.CheckPending, the id's pending event is not seq Pending; nothing
	// changed. Seq and Due are the id's event's, if it has one.
	Moved ScheduleOutcome = 6
)

func (o ScheduleOutcome) String() string {
	switch o {
	case Created:
		return "Created"
	case Existing:
		return "Existing"
	case Conflict:
		return "Conflict"
	case Replaced:
		return "Replaced"
	case Renewed:
		return "Renewed"
	case Moved:
		return "Moved"
	}
	return fmt.Sprintf("ScheduleOutcome(%d)", uint8(o))
}

// ScheduleResult is the result for one NewEvent, at the same position.
type ScheduleResult struct {
	Outcome ScheduleOutcome
	Seq     uint64
	Due     int64
	// Version is the event's version when this entry made it (Created, Replaced, Renewed);
	// 0 otherwise.
	Version uint64
}

// ScheduleBatchResult is the response to a ScheduleBatch entry.
type ScheduleBatchResult struct {
	Results []ScheduleResult
}

// CancelOutcome says what a Cancel did with one id.
type CancelOutcome uint8

const (
	Cancelled           CancelOutcome = 1 // was pending, now cancelled
	AlreadyCancelled    CancelOutcome = 2
	NotFound            CancelOutcome = 3 // no event with this id; Seq is 0
	AlreadyFired        CancelOutcome = 4
	AlreadyDeadLettered CancelOutcome = 5
)

func (o CancelOutcome) String() string {
	switch o {
	case Cancelled:
		return "Cancelled"
	case AlreadyCancelled:
		return "AlreadyCancelled"
	case NotFound:
		return "NotFound"
	case AlreadyFired:
		return "AlreadyFired"
	case AlreadyDeadLettered:
		return "AlreadyDeadLettered"
	}
	return fmt.Sprintf("CancelOutcome(%d)", uint8(o))
}

// CancelResult is the result for one id of a Cancel, at the same position.
type CancelResult struct {
	Outcome CancelOutcome
	Seq     uint64
}

// CancelBatchResult is the response to a Cancel entry.
type CancelBatchResult struct {
	Results []CancelResult
}

// MarkOutcome says what a MarkFired or MarkDeadLettered did with one entry. Only Marked
// changes the event; the others leave it exactly as it was.
type MarkOutcome uint8

const (
	// Marked: the event was pending and now is Fired (or DeadLettered).
	Marked MarkOutcome = 1
	// WasFired: an earlier leader fired it already. For MarkFired this is a duplicate
	// delivery, counted in Stats.Refired.
	WasFired MarkOutcome = 2
	// WasCancelled: it was cancelled. For MarkFired the record was produced although
	// cancelled, counted in Stats.FiredAfterCancel.
	WasCancelled MarkOutcome = 3
	// WasDeadLettered: an earlier leader dead-lettered it.
	WasDeadLettered MarkOutcome = 4
	// UnknownSeq: no event has this seq.
	UnknownSeq MarkOutcome = 5
	// WasExpired: it settled, and Expire has removed it since.
	WasExpired MarkOutcome = 6
)

func (o MarkOutcome) String() string {
	switch o {
	case Marked:
		return "Marked"
	case WasFired:
		return "WasFired"
	case WasCancelled:
		return "WasCancelled"
	case WasDeadLettered:
		return "WasDeadLettered"
	case UnknownSeq:
		return "UnknownSeq"
	case WasExpired:
		return "WasExpired"
	}
	return fmt.Sprintf("MarkOutcome(%d)", uint8(o))
}

// MarkBatchResult is the response to a MarkFired or MarkDeadLettered entry: one outcome per
// entry, at the same position.
type MarkBatchResult struct {
	Outcomes []MarkOutcome
}

// Stats are the shard's counters, as of AppliedIndex.
type Stats struct {
	Pending          uint64 // events in state Scheduled
	Fired            uint64
	Cancelled        uint64
	DeadLettered     uint64
	Refired          uint64 // MarkFired entries for events already fired (duplicate deliveries)
	FiredAfterCancel uint64 // MarkFired entries for cancelled events
	Expired          uint64 // settled events removed by Expire
	Replaced         uint64 // versions of pending events an Update or a REPLACE superseded
	Renewed          uint64 // settled events a REPLACE removed to schedule their id anew
	Retained         uint64 // settled events still stored: Fired + Cancelled + DeadLettered - Expired - Renewed
	AppliedIndex     uint64
	AppliedTerm      uint64
	NextSeq          uint64 // the seq the next created event will get
}

// FSM is the state machine of one shard. It implements raft.FSM and raft.BatchingFSM.
//
// Responses (ApplyFuture.Response) per entry:
//   - ScheduleBatch: *ScheduleBatchResult
//   - Cancel: *CancelBatchResult
//   - MarkFired, MarkDeadLettered: *MarkBatchResult
//   - Expire: *ExpireResult
//   - Update: *UpdateResult
//   - Recurring: *RecurringResult
//   - any entry at or below the applied index: ErrReplayed
//   - non-command entries (LogConfiguration, ...): nil; they still advance the applied index.
type FSM struct {
	st    *Store
	db    *pebble.DB
	shard uint32
	obs   Observer

	spanStart, spanEnd []byte // this shard's keys; see shardSpan
	metaKey            []byte
	restoringKey       []byte

	// ap is scratch reused by every apply; only the apply goroutine touches it.
	ap applier
	// pending mirrors the due index; see pendingMirror.
	pending pendingMirror
	// pendingMu is held by whatever changes pending: apply, for a whole batch, and
	// LoadPending, Restore and Close, which run on the apply goroutine too, so that a reader
	// may take in a finished build (tryTakePending) when apply is not running: an idle
	// shard may not apply for a long while, and until the build is taken in a forecast
	// walks the due index.
	pendingMu sync.Mutex
	// dues counts the pending events by due minute once the pending set is loaded
	// (duesLoaded), as of the last committed batch; guarded by mu, like meta.
	dues       dueCounts
	duesLoaded bool
	// occ says which pending events are recurring schedules' occurrences.
	occ occurrences

	// mu guards meta and restoring for readers. Only the apply goroutine writes them, and
	// only while holding mu, so the apply goroutine may read them without mu.
	mu sync.RWMutex
	// meta is the state as of the last committed batch (and as stored under shard|'m').
	meta meta
	// restoring is true while a restore marker exists: a Restore is running or failed.
	restoring bool
	// reclaimed counts the bytes of keys and values Expire removed (ReclaimedBytes); only
	// the apply goroutine writes it, under mu.
	reclaimed uint64

	// stopping is closed by Stopping: a snapshot persist then stops waiting for Pebble to
	// flush by itself.
	stopping     chan struct{}
	stoppingOnce sync.Once
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.BatchingFSM = (*FSM)(nil)
)

// NewFSM opens the state machine of shard in st, loading its applied index and counters.
// obs may be nil. If a previous restore did not finish, NeedsRestore reports true and the FSM
// refuses to apply until a Restore succeeds.
func NewFSM(st *Store, shard uint32, obs Observer) (*FSM, error) {
	if obs == nil {
		obs = nopObserver{}
	}
	if err := st.claim(shard); err != nil {
		return nil, err
	}
	f := &FSM{st: st, db: st.db, shard: shard, obs: obs, stopping: make(chan struct{})}
	f.spanStart, f.spanEnd = shardSpan(shard)
	f.metaKey, f.restoringKey = appendShardTag(nil, shard, tagMeta), appendShardTag(nil, shard, tagRestoring)
	f.ap.init(f)
	if err := f.load(); err != nil {
		st.release(shard)
		return nil, err
	}
	if err := f.upgradeLayout(); err != nil {
		st.release(shard)
		return nil, err
	}
	if err := f.loadOccurrences(); err != nil {
		st.release(shard)
		return nil, err
	}
	if !f.restoring {
		f.newIDFilter(int(f.meta.pending + f.meta.retained()))
	}
	return f, nil
}

// load reads meta and the restoring marker from Pebble into memory.
// Called on the apply goroutine (or before it exists).
func (f *FSM) load() error {
	m := freshMeta()
	v, closer, err := f.db.Get(f.metaKey)
	switch {
	case err == nil:
		m, err = decodeMeta(v)
		_ = closer.Close() // releases v; Pebble's Get closers return no error
		if err != nil {
			return fmt.Errorf("raftfsm: shard %d: %w", f.shard, err)
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("raftfsm: shard %d: read meta: %w", f.shard, err)
	}
	restoring := true
	_, closer, err = f.db.Get(f.restoringKey)
	switch {
	case err == nil:
		_ = closer.Close() // releases the value; Pebble's Get closers return no error
	case errors.Is(err, pebble.ErrNotFound):
		restoring = false
	default:
		return fmt.Errorf("raftfsm: shard %d: read restore marker: %w", f.shard, err)
	}
	f.mu.Lock()
	f.meta, f.restoring = m, restoring
	f.mu.Unlock()
	return nil
}

// Close stops the FSM's background work and releases the shard's claim on the Store. The FSM
// must not be used afterwards, and raft must have stopped applying to it.
func (f *FSM) Close() {
	f.Stopping()
	f.stopPending()
	f.stopIDFilter()
	f.st.release(f.shard)
}

// Stopping tells the FSM that its owner is about to shut raft down: a snapshot being persisted
// stops waiting for Pebble to flush by itself and flushes at once, so that the shutdown, which
// waits for the persist, is not held up. Close implies it; calling it again does nothing.
func (f *FSM) Stopping() {
	f.stoppingOnce.Do(func() { close(f.stopping) })
}

// Shard returns the shard id.
func (f *FSM) Shard() uint32 { return f.shard }

// AppliedIndex returns the index of the last log entry reflected in Pebble.
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.meta.appliedIndex
}

// NeedsRestore reports whether a restore of this shard began and did not finish (in this
// process or before a restart). The shard's Pebble state is then partial: the owner must have
// raft restore its latest snapshot (start it without NoSnapshotRestoreOnStart) before applying.
func (f *FSM) NeedsRestore() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.restoring
}

// Apply applies one log entry. raft uses ApplyBatch; Apply exists for raft.FSM and behaves
// exactly like a batch of one.
func (f *FSM) Apply(l *raft.Log) interface{} {
	var out [1]interface{}
	f.apply([]*raft.Log{l}, out[:])
	return out[0]
}

// ApplyBatch applies consecutive log entries in one Pebble batch, committed once, with the
// applied index of the last entry written in the same batch.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	f.apply(logs, out)
	return out
}

func (f *FSM) apply(logs []*raft.Log, out []interface{}) {
	if f.restoring {
		panic(fmt.Sprintf("raftfsm: shard %d: apply with an unfinished restore; the state is partial", f.shard))
	}
	f.pendingMu.Lock() // one uncontended lock a batch; see pendingMu
	defer f.pendingMu.Unlock()
	if !f.pending.loaded {
		f.pollPending()
		f.scanIDFilter() // for an owner that did not call LoadPending
	}
	f.takeRebuiltIDFilter()
	a := &f.ap
	a.begin(f.meta)
	defer a.end()
	changed := false
	for i, l := range logs {
		if l.Index <= a.m.appliedIndex {
			out[i] = ErrReplayed
			continue
		}
		if l.Type == raft.LogCommand {
			cmd, err := DecodeCommand(l.Data)
			if err != nil {
				panic(fmt.Sprintf("raftfsm: shard %d: log entry %d (term %d) cannot be applied: %v", f.shard, l.Index, l.Term, err))
			}
			out[i] = a.command(cmd)
		}
		a.m.appliedIndex, a.m.appliedTerm = l.Index, l.Term
		changed = true
	}
	if !changed {
		return
	}
	a.val = a.m.append(a.val[:0])
	a.set(f.metaKey, a.val)
	a.write()
	if err := a.batch.Commit(pebble.NoSync); err != nil {
		panic(fmt.Sprintf("raftfsm: shard %d: commit entries through %d: %v", f.shard, a.m.appliedIndex, err))
	}
	f.publishSchedules(a.scheds)
	f.mu.Lock()
	f.meta = a.m
	f.reclaimed += a.reclaimed
	f.takeDueDeltas()
	f.mu.Unlock()
	if a.idfNext != nil {
		f.scan(a.idfNext)
	}
	bo, batched := f.obs.(BatchObserver)
	if batched && len(a.notes) > 0 {
		bo.BeginNotes()
		defer bo.EndNotes()
	}
	for _, n := range a.notes {
		if n.scheduled {
			f.obs.Scheduled(n.seq, n.due, n.policy)
		} else {
			f.obs.Settled(n.seq)
		}
	}
}

// applier applies commands into one Pebble batch. Reads must see the batch's own writes (a
// later event or entry in the same batch may name an id created earlier in it), so the
// applier keeps what it wrote in small overlays instead of paying for an indexed batch: ids
// created or expired in this batch (an expired one maps to the zero idRef), the latest
// status of every event it read or wrote (an expired one's is the zero status), and the
// settled-index entries it wrote. What raft hands to one ApplyBatch differs between
// replicas, so an entry must see exactly what it would see applied alone.
type applier struct {
	f     *FSM
	batch *pebble.Batch
	it    *pebble.Iterator // over committed state, opened on first read; see get
	m     meta             // the working copy; becomes f.meta on commit

	ids      map[string]idRef
	statuses map[uint64]status
	// scheds holds the recurring schedules this batch read or wrote, by id.
	scheds map[string]*scheduleEntry
	// bodies holds bodies preload read, by seq: an event's body never changes, and a
	// superseded or renewed seq is dropped from it.
	bodies  map[uint64][]byte
	idf     *idFilter // nil while a restore runs; see idFilter
	idfNext *idFilter // the filter being rebuilt, if one is (rebuildIDFilter)
	notes   []note
	// settledNow are the settled-index entries written in this batch; expired ones are
	// marked gone. xFrom is where Expire resumes in the committed settled index: entries
	// before it were expired earlier in this batch.
	settledNow []settledEntry
	xFrom      []byte
	reclaimed  uint64 // bytes removed by Expire in this batch

	key, val []byte // scratch; set copies

	// The apply's writes, in the order made: key buf[k0:k1], value buf[k1:v1].
	ops []op
	buf []byte
	// scratch for write's grouping, then the ops in key order
	sorted []op
}

// An applier keeps its write queue for the next apply while it is at most maxKeptScratch
// bytes and, past shrinkScratch, the apply that ends used a quarter of it. A shard taking
// large batches reuses it: growing it again from nothing each apply was a tenth of the CPU
// of topic ingest (2000-event runs, 2-3 MB an apply: growslice, clearing, GC). One apply of
// a large backlog (tens of MB), or a shard gone quiet, gives it back, so that every shard's
// FSM does not keep the most it ever queued.
const (
	maxKeptScratch = 8 << 20
	shrinkScratch  = 1 << 20
)

type op struct {
	k0, k1, v1 int
	del        bool
	// hi and lo are the 16 key bytes after the shard and tag, big-endian, zero-padded: the
	// sort compares them first, without reading buf (see compareOps).
	hi, lo uint64
}

// newOp queues k (at buf[k0:k1]) with its sort prefix.
func newOp(k []byte, k0, k1, v1 int, del bool) op {
	o := op{k0: k0, k1: k1, v1: v1, del: del}
	var p [16]byte
	copy(p[:], k[shardPrefixLen+1:])
	o.hi, o.lo = binary.BigEndian.Uint64(p[:8]), binary.BigEndian.Uint64(p[8:])
	return o
}

// note is an Observer call held back until the batch commits.
type note struct {
	scheduled bool // Scheduled(seq, due, policy) if true, Settled(seq) if false
	seq       uint64
	due       int64
	policy    Policy
}

func (a *applier) init(f *FSM) {
	a.f = f
	a.ids = make(map[string]idRef)
	a.statuses = make(map[uint64]status)
	a.bodies = make(map[uint64][]byte)
	a.scheds = make(map[string]*scheduleEntry)
}

func (a *applier) begin(m meta) {
	a.m = m
}

func (a *applier) end() {
	if a.it != nil {
		_ = a.it.Close()
		a.it = nil
	}
	if a.batch != nil {
		_ = a.batch.Close()
		a.batch = nil
	}
	used := len(a.buf)
	a.ops, a.buf, a.sorted = a.ops[:0], a.buf[:0], a.sorted[:0]
	if c := cap(a.buf); c > maxKeptScratch || c > shrinkScratch && used < c/4 {
		a.ops, a.buf, a.sorted = nil, nil, nil
	}
	clear(a.ids)
	clear(a.statuses)
	clear(a.bodies)
	clear(a.scheds)
	a.notes = a.notes[:0]
	a.settledNow, a.xFrom, a.reclaimed = a.settledNow[:0], a.xFrom[:0], 0
}

func (a *applier) fatal(format string, args ...any) {
	panic(fmt.Sprintf("raftfsm: shard %d: ", a.f.shard) + fmt.Sprintf(format, args...))
}

// set and del queue a write; write hands the queue to a Pebble batch in key order.
func (a *applier) set(k, v []byte) {
	k0 := len(a.buf)
	a.buf = append(append(a.buf, k...), v...)
	a.ops = append(a.ops, newOp(k, k0, k0+len(k), len(a.buf), false))
}

func (a *applier) del(k []byte) {
	k0 := len(a.buf)
	a.buf = append(a.buf, k...)
	a.ops = append(a.ops, newOp(k, k0, len(a.buf), len(a.buf), true))
}

// write builds the Pebble batch from the queued writes, sorted by key. An apply writes keys
// scattered over the shard (an event's id, body and due-index keys; statuses by seq and
// due-index deletions by due), and committing them in that order made every memtable insert
// search its skiplist from the top: 36% of a draining cluster's CPU. In key order each insert
// starts from where the last one ended. Writes to one key keep their order (a due-index key
// created and deleted in the same apply): ties are broken by position in buf, which is the
// order they were made in. (slices.SortStableFunc, which merges in place, was 11% of a
// draining cluster's CPU.)
//
// Every key starts with the shard and its region's tag, so the writes are first grouped by
// tag, in the order made (a counting sort), and each group is sorted alone (sortGroup).
// Bodies and the due index are usually made in key order already; ids, and a drain's
// statuses and settled-index keys, are really sorted. One sort of everything interleaved was
// 8% of an ingesting cluster's CPU.
func (a *applier) write() {
	var start [257]int
	for _, o := range a.ops {
		start[a.buf[o.k0+shardPrefixLen]+1]++
	}
	for t := 1; t < len(start); t++ {
		start[t] += start[t-1]
	}
	next := start
	a.sorted = slices.Grow(a.sorted[:0], len(a.ops))[:len(a.ops)]
	for _, o := range a.ops {
		t := a.buf[o.k0+shardPrefixLen]
		a.sorted[next[t]] = o
		next[t]++
	}
	a.ops, a.sorted = a.sorted, a.ops // a.sorted, the writes as made, is now scratch space
	for t := 0; t < 256; t++ {
		if g := a.ops[start[t]:start[t+1]]; len(g) > 1 {
			a.sortGroup(g, a.sorted[start[t]:start[t+1]])
		}
	}
	a.batch = a.f.db.NewBatchWithSize(len(a.buf) + 16*len(a.ops))
	if len(a.xFrom) > 0 {
		// First in the batch, so it deletes only committed keys: the settled-index head
		// Expire consumed (see remove), not entries this batch writes.
		if err := a.batch.DeleteRange(appendShardTag(nil, a.f.shard, tagSettled), a.xFrom, nil); err != nil {
			a.fatal("batch write: %v", err)
		}
	}
	for _, o := range a.ops {
		var err error
		if o.del {
			err = a.batch.Delete(a.buf[o.k0:o.k1], nil)
		} else {
			err = a.batch.Set(a.buf[o.k0:o.k1], a.buf[o.k1:o.v1], nil)
		}
		if err != nil {
			a.fatal("batch write: %v", err)
		}
	}
}

// radixMin is the least number of writes a radix sort is used for: below it its passes over
// the group cost more than pdqsort's compares.
const radixMin = 256

// sortGroup sorts one tag group of queued writes by key, ties in the order made, using
// scratch (as long as g) as it likes. A group whose keys are all one length of at most 16
// bytes after the tag (statuses, bodies, the due and settled indexes: every group but ids) is
// ordered by the op's prefix alone, so it is radix sorted on the bytes that differ within it,
// a handful for the seqs and times of one apply: a drain's statuses and settled-index keys,
// in fire order, made pdqsort 9% of a draining cluster's CPU.
func (a *applier) sortGroup(g, scratch []op) {
	n := g[0].k1 - g[0].k0
	fixed := len(g) >= radixMin && n <= shardPrefixLen+1+16
	sorted := true
	for i := 1; i < len(g) && (fixed || sorted); i++ {
		fixed = fixed && g[i].k1-g[i].k0 == n
		sorted = sorted && a.compareOps(g[i-1], g[i]) <= 0
	}
	switch {
	case sorted: // bodies and the due index usually are
	case fixed:
		radixSortOps(g, scratch)
	default:
		slices.SortFunc(g, a.compareOps)
	}
}

// radixSortOps sorts g by (hi, lo), stably, with an LSD radix sort that skips every byte
// position where all of g agree. scratch is as long as g.
func radixSortOps(g, scratch []op) {
	var diffHi, diffLo uint64
	for _, o := range g[1:] {
		diffHi |= o.hi ^ g[0].hi
		diffLo |= o.lo ^ g[0].lo
	}
	src, dst := g, scratch
	for _, half := range [2]struct {
		diff uint64
		hi   bool
	}{{diffLo, false}, {diffHi, true}} {
		for shift := uint(0); shift < 64; shift += 8 {
			if byte(half.diff>>shift) == 0 {
				continue
			}
			var count [256]int
			for i := range src {
				count[radixByte(&src[i], half.hi, shift)]++
			}
			at := 0
			for b, c := range count {
				count[b], at = at, at+c
			}
			for i := range src {
				b := radixByte(&src[i], half.hi, shift)
				dst[count[b]] = src[i]
				count[b]++
			}
			src, dst = dst, src
		}
	}
	if &src[0] != &g[0] {
		copy(g, src)
	}
}

func radixByte(o *op, hi bool, shift uint) byte {
	if hi {
		return byte(o.hi >> shift)
	}
	return byte(o.lo >> shift)
}

// compareOps orders two queued writes of one tag group by key, then by the order they were
// made. Every key of a group starts with the same shard and tag, and most continue with one
// or two big-endian numbers (a seq; a due time or settle time and a seq), so the 16 bytes
// after the tag, held in the op, decide almost every compare without reading buf: a drain
// sorts hundreds of thousands of statuses and settled-index keys, which arrive in fire order
// rather than key order, and reading both keys from buf for each compare was 8% of a
// draining cluster's CPU. Zero padding makes "a" and "a\x00" equal there; buf decides those.
func (a *applier) compareOps(x, y op) int {
	if c := cmp.Compare(x.hi, y.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(x.lo, y.lo); c != 0 {
		return c
	}
	kx, ky := a.buf[x.k0+shardPrefixLen+1:x.k1], a.buf[y.k0+shardPrefixLen+1:y.k1]
	return cmp.Or(bytes.Compare(kx, ky), cmp.Compare(x.k0, y.k0))
}

// get reads a committed value; v is valid until the next get. All reads of one apply go
// through one iterator: it sees the committed state, which nothing else changes while the
// apply goroutine builds its batch (only this goroutine writes the shard's keys), and unlike a
// Get per key it opens each sstable once per apply rather than once per read. SeekPrefixGE
// (the whole key is the prefix under the default comparer) consults the bloom filters.
func (a *applier) get(k []byte) (v []byte, found bool) {
	if !a.iter().SeekPrefixGE(k) || !bytes.Equal(a.it.Key(), k) {
		if err := a.it.Error(); err != nil {
			a.fatal("read %x: %v", k, err)
		}
		return nil, false
	}
	v, err := a.it.ValueAndErr()
	if err != nil {
		a.fatal("read %x: %v", k, err)
	}
	return v, true
}

func (a *applier) lookupID(id string) (idRef, bool) {
	// The filter also holds the ids this apply created, so "certainly new" skips the
	// overlay as well as Pebble.
	if a.idf != nil && a.idf.certainlyNew(id) {
		return idRef{}, false
	}
	if ref, ok := a.ids[id]; ok {
		return ref, ref.seq != 0 // zero: expired earlier in this batch
	}
	a.key = appendIDKey(a.key[:0], a.f.shard, id)
	v, ok := a.get(a.key)
	if !ok {
		return idRef{}, false
	}
	ref, err := decodeIDRef(v)
	if err != nil {
		a.fatal("id %q: %v", id, err)
	}
	return ref, true
}

// preload reads, in key order, the id entries of ids that the overlay does not hold yet and
// the bodies they name, into the overlay (ids; idRef{} for an id with no entry, as lookupID
// then reports) and the body cache, so that the Replaces and Updates of a command cost one
// forward walk over neighbouring keys instead of two seeks per event from the top of every
// level: a seek rebuilds the merging iterator's heap, and 60% of the CPU of batched upserts
// went to them. It reads exactly what lookupID and body would read, so nothing else changes.
func (a *applier) preload(ids []string) {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	walk := forwardIter{it: a.iter()}
	var refs []Ref
	for i, id := range sorted {
		if i > 0 && id == sorted[i-1] {
			continue
		}
		if _, ok := a.ids[id]; ok || a.idf != nil && a.idf.certainlyNew(id) {
			continue
		}
		a.key = appendIDKey(a.key[:0], a.f.shard, id)
		if !walk.seekGE(a.key) || !bytes.Equal(a.it.Key(), a.key) {
			if err := a.it.Error(); err != nil {
				a.fatal("read %x: %v", a.key, err)
			}
			a.ids[id] = idRef{}
			continue
		}
		ref, err := decodeIDRef(a.it.Value())
		if err != nil {
			a.fatal("id %q: %v", id, err)
		}
		a.ids[id] = ref
		refs = append(refs, Ref{Seq: ref.seq, Due: ref.due})
	}
	slices.SortFunc(refs, func(x, y Ref) int { return cmp.Or(cmp.Compare(x.Due, y.Due), cmp.Compare(x.Seq, y.Seq)) })
	walk = forwardIter{it: a.it}
	for _, r := range refs {
		a.key = appendBodyKey(a.key[:0], a.f.shard, r.Due, r.Seq)
		if walk.seekGE(a.key) && bytes.Equal(a.it.Key(), a.key) {
			a.bodies[r.Seq] = bytes.Clone(a.it.Value())
		} else if err := a.it.Error(); err != nil {
			a.fatal("read %x: %v", a.key, err)
		}
	}
}

// iter returns the apply's iterator over the committed state, opening it on
// first use.
func (a *applier) iter() *pebble.Iterator {
	if a.it == nil {
		it, err := a.f.db.NewIter(&pebble.IterOptions{LowerBound: a.f.spanStart, UpperBound: a.f.spanEnd})
		if err != nil {
			a.fatal("open iterator: %v", err)
		}
		a.it = it
	}
	return a.it
}

// loadStatuses reads the stored statuses of those seqs that are not pending into the overlay,
// in ascending key order, so that each seek continues from the last instead of starting from
// the top of every level (a MarkFired names up to thousands of events). Pending and unknown
// seqs are skipped: a pending event has no stored status. It sorts seqs in place.
func (a *applier) loadStatuses(seqs []uint64) {
	slices.Sort(seqs)
	var key []byte
	for i, seq := range seqs {
		if pending, _ := a.f.pending.has(seq); (i > 0 && seq == seqs[i-1]) || !a.known(seq) || pending {
			continue
		}
		if _, ok := a.statuses[seq]; ok {
			continue
		}
		key = appendStatusKey(key[:0], a.f.shard, seq)
		if !a.iter().SeekGE(key) || !bytes.Equal(a.it.Key(), key) {
			if err := a.it.Error(); err != nil {
				a.fatal("read %x: %v", key, err)
			}
			continue
		}
		st, err := decodeStatus(a.it.Value())
		if err != nil {
			a.fatal("event %d: %v", seq, err)
		}
		a.statuses[seq] = st
	}
}

// status returns the current status of seq, which must have been assigned. A pending event's
// is {Scheduled, due}, with the due its caller knows (0 if it does not: dueOf finds it); a
// settled one's is stored; an expired one's is the zero status. Until the pending set is
// loaded, a pending event is told from an expired one, which has no status either, by its
// due-index key.
func (a *applier) status(seq uint64, due int64) status {
	pending, known := a.f.pending.has(seq)
	if pending {
		return status{state: StateScheduled, due: due}
	}
	if s, ok := a.statuses[seq]; ok {
		return s
	}
	a.key = appendStatusKey(a.key[:0], a.f.shard, seq)
	if v, ok := a.get(a.key); ok {
		s, err := decodeStatus(v)
		if err != nil {
			a.fatal("event %d: %v", seq, err)
		}
		a.statuses[seq] = s
		return s
	}
	if !known {
		if due == 0 {
			var ok bool
			if due, ok = a.findDue(seq); ok {
				return status{state: StateScheduled, due: due}
			}
		} else if _, ok := a.get(appendDueKey(a.key[:0], a.f.shard, due, seq)); ok {
			return status{state: StateScheduled, due: due}
		}
	}
	return status{} // expired
}

// dueOf finds the due time of pending seq (see findDue).
func (a *applier) dueOf(seq uint64) int64 {
	due, ok := a.findDue(seq)
	if !ok {
		a.fatal("pending event %d has no due-index key", seq)
	}
	return due
}

// findDue finds the due time of seq if it is pending, by walking the due index: O(pending),
// for entries that name an event by seq without its due time, which only chimed before key
// layout 2 wrote (TypeMarkFired, TypeMarkDeadLettered).
func (a *applier) findDue(seq uint64) (int64, bool) {
	if s, ok := a.statuses[seq]; ok {
		return s.due, s.state == StateScheduled
	}
	for _, n := range a.notes { // scheduled earlier in this batch, so not committed yet
		if n.scheduled && n.seq == seq {
			return n.due, true
		}
	}
	it := a.iter()
	prefix := appendShardTag(nil, a.f.shard, tagDue)
	for valid := it.SeekGE(prefix); valid && bytes.HasPrefix(it.Key(), prefix); valid = it.Next() {
		due, s, err := parseDueKey(it.Key())
		if err != nil {
			a.fatal("%v", err)
		}
		if s == seq {
			return due, true
		}
	}
	if err := it.Error(); err != nil {
		a.fatal("read the due index: %v", err)
	}
	return 0, false
}

// putStatus stores the final status of an event that leaves Scheduled, and its entry in the
// settled-time index.
func (a *applier) putStatus(seq uint64, s status) {
	a.statuses[seq] = s
	a.key = appendStatusKey(a.key[:0], a.f.shard, seq)
	a.val = s.append(a.val[:0])
	a.set(a.key, a.val)
	e := settledEntry{at: s.settledAt(), seq: seq, due: s.due}
	a.key = appendSettledKey(a.key[:0], a.f.shard, e.at, seq)
	a.val = binary.BigEndian.AppendUint64(a.val[:0], uint64(e.due))
	a.set(a.key, a.val)
	a.settledNow = append(a.settledNow, e)
}

// settle takes a pending event out of the due index; the caller stores its final status.
func (a *applier) settle(seq uint64, due int64) {
	a.key = appendDueKey(a.key[:0], a.f.shard, due, seq)
	a.del(a.key)
	a.f.pending.remove(seq, due)
	a.m.pending--
	a.notes = append(a.notes, note{seq: seq})
}

// known reports whether seq was ever assigned; seqs are dense from 1.
func (a *applier) known(seq uint64) bool { return seq != 0 && seq < a.m.nextSeq }

func (a *applier) command(c Command) interface{} {
	switch c := c.(type) {
	case *ScheduleBatch:
		return a.schedule(c)
	case *Cancel:
		return a.cancel(c)
	case *MarkFired:
		return a.markFired(c)
	case *MarkDeadLettered:
		return a.markDeadLettered(c)
	case *Expire:
		return a.expire(c)
	case *Update:
		return a.update(c)
	case *Recurring:
		return a.recurring(c)
	}
	a.fatal("no apply for %T", c)
	return nil
}

func (a *applier) schedule(c *ScheduleBatch) *ScheduleBatchResult {
	res := make([]ScheduleResult, len(c.Events))
	var replaced []string
	for i := range c.Events {
		if c.Events[i].Replace {
			replaced = append(replaced, c.Events[i].ID)
		}
	}
	if len(replaced) > 1 {
		a.preload(replaced)
	}
	for i := range c.Events {
		e := &c.Events[i]
		ref, ok := a.lookupID(e.ID)
		if e.Replace && e.CheckPending {
			if seq := a.pendingSeq(ref, ok); seq != e.Pending {
				res[i] = ScheduleResult{Outcome: Moved, Seq: ref.seq, Due: ref.due}
				continue
			}
		}
		if ok {
			if e.Replace {
				res[i] = a.replace(e, ref, c.ProposedAt)
				continue
			}
			outcome := Existing
			if ref.hash != e.ContentHash {
				outcome = Conflict
			}
			res[i] = ScheduleResult{Outcome: outcome, Seq: ref.seq, Due: ref.due}
			continue
		}
		seq := a.createNew(e, c.ProposedAt)
		res[i] = ScheduleResult{Outcome: Created, Seq: seq, Due: e.Due, Version: 1}
	}
	return &ScheduleBatchResult{Results: res}
}

// createNew creates e, whose id is bound to nothing, as the first version of its id.
func (a *applier) createNew(e *NewEvent, createdAt int64) uint64 {
	stored := int(a.m.pending + a.m.retained())
	if a.idfNext != nil {
		a.idfNext.add(e.ID, stored)
	}
	if a.idf != nil && a.idf.add(e.ID, stored) {
		a.f.rebuildIDFilter(stored)
	}
	return a.create(e, createdAt, 1)
}

// create stores e as a pending event of a new seq at version, and binds its id to it.
func (a *applier) create(e *NewEvent, createdAt int64, version uint64) (seq uint64) {
	seq = a.m.nextSeq
	a.m.nextSeq++
	ref := idRef{seq: seq, hash: e.ContentHash, due: e.Due}
	a.ids[e.ID] = ref
	a.key = appendIDKey(a.key[:0], a.f.shard, e.ID)
	a.val = ref.append(a.val[:0])
	a.set(a.key, a.val)
	a.key = appendBodyKey(a.key[:0], a.f.shard, e.Due, seq)
	a.val = appendBody(a.val[:0], e, createdAt, version)
	a.set(a.key, a.val)
	a.key = appendDueKey(a.key[:0], a.f.shard, e.Due, seq)
	a.val = appendDueValue(a.val[:0], e.Policy)
	a.set(a.key, a.val)
	a.f.pending.add(seq, e.Due)
	if !a.f.pending.loaded {
		// Scheduled by this batch, so not in the committed due index that status
		// reads until the pending set is loaded.
		a.statuses[seq] = status{state: StateScheduled, due: e.Due}
	}
	a.m.pending++
	a.notes = append(a.notes, note{scheduled: true, seq: seq, due: e.Due, policy: e.Policy})
	return seq
}

// pendingSeq returns the seq of the id's event if found and pending, 0 otherwise.
func (a *applier) pendingSeq(ref idRef, found bool) uint64 {
	if found && a.status(ref.seq, ref.due).state == StateScheduled {
		return ref.seq
	}
	return 0
}

// replace makes e the next version of the event its id is bound to (ref): a pending one is
// superseded, a settled one removed (renewed). The new version is created at now.
func (a *applier) replace(e *NewEvent, ref idRef, now int64) ScheduleResult {
	s := a.status(ref.seq, ref.due)
	old := a.body(ref.seq, ref.due)
	outcome := Replaced
	switch s.state {
	case StateScheduled:
		a.supersede(ref.seq, ref.due)
	case StateFired, StateCancelled, StateDeadLettered:
		a.renew(ref.seq, s)
		outcome = Renewed
	default: // expired: its id is removed with it, so lookupID does not find it
		a.fatal("id %q names event %d, which has expired", e.ID, ref.seq)
	}
	seq := a.create(e, now, old.version+1)
	if outcome == Replaced {
		a.rebound(ref.seq, seq, e.Due)
	}
	return ScheduleResult{Outcome: outcome, Seq: seq, Due: e.Due, Version: old.version + 1}
}

// supersede removes pending event seq, due at due, because its next version takes its
// place: its body and due-index key go, and it is settled for the observer. It keeps no
// status: its seq names nothing from now on, as an expired event's does.
func (a *applier) supersede(seq uint64, due int64) {
	a.key = appendBodyKey(a.key[:0], a.f.shard, due, seq)
	a.del(a.key)
	delete(a.bodies, seq)
	a.settle(seq, due)
	a.statuses[seq] = status{}
	a.m.replaced++
}

// renew removes settled event seq (status s) so that its id can be scheduled anew, as
// Expire would remove it, and takes it out of what this batch settled, so that an Expire
// later in the batch does not remove it twice.
func (a *applier) renew(seq uint64, s status) {
	for i := range a.settledNow {
		if a.settledNow[i].seq == seq {
			a.settledNow[i].gone = true
		}
	}
	a.remove(settledEntry{at: s.settledAt(), due: s.due, seq: seq}, false)
	delete(a.bodies, seq)
	a.m.renewed++
}

// body reads and decodes the body of event seq, due at due: committed, or written earlier
// in this batch. Its byte slices alias what they were read from, so they are valid until
// the next read.
func (a *applier) body(seq uint64, due int64) body {
	key := appendBodyKey(nil, a.f.shard, due, seq)
	v, ok := a.bodies[seq]
	if !ok {
		v, ok = a.get(key)
	}
	if !ok {
		for i := len(a.ops) - 1; i >= 0; i-- { // created in this batch: rare, so a scan
			if o := a.ops[i]; !o.del && bytes.Equal(a.buf[o.k0:o.k1], key) {
				v, ok = a.buf[o.k1:o.v1], true
				break
			}
		}
	}
	if !ok {
		a.fatal("event %d (due %d) has no body", seq, due)
	}
	b, err := decodeBody(v)
	if err != nil {
		a.fatal("event %d: %v: body: %v", seq, ErrCorrupt, err)
	}
	return b
}

// update applies each change to the pending event its id names, as its next version: the
// fields the change sets, the rest of the event's own, the same content hash (a re-send of
// the Schedule that created it is still recognised) and the same creation time.
func (a *applier) update(c *Update) *UpdateResult {
	res := make([]ChangeResult, len(c.Changes))
	if len(c.Changes) > 1 {
		ids := make([]string, len(c.Changes))
		for i := range c.Changes {
			ids[i] = c.Changes[i].ID
		}
		a.preload(ids)
	}
	for i := range c.Changes {
		ch := &c.Changes[i]
		ref, ok := a.lookupID(ch.ID)
		if ch.Fields&ChangeCheckPending != 0 && a.pendingSeq(ref, ok) != ch.Pending {
			res[i] = ChangeResult{Outcome: UpdateMoved, Seq: ref.seq, Due: ref.due}
			continue
		}
		if !ok {
			res[i] = ChangeResult{Outcome: UpdateNotFound}
			continue
		}
		s := a.status(ref.seq, ref.due)
		old := a.body(ref.seq, ref.due)
		r := ChangeResult{State: s.state, Seq: ref.seq, Due: ref.due, Version: old.version}
		switch {
		case s.state == 0:
			a.fatal("id %q names event %d, which has expired", ch.ID, ref.seq)
		case s.state != StateScheduled:
			r.Outcome = UpdateNotPending
		case ch.IfVersion != 0 && ch.IfVersion != old.version:
			r.Outcome = VersionMismatch
		default:
			e := old.NewEvent
			e.Due = ref.due
			if ch.Fields&ChangeDue != 0 {
				e.Due = ch.Due
			}
			if ch.Fields&ChangeKey != 0 {
				e.Key = ch.Key
			}
			if ch.Fields&ChangePayload != 0 {
				e.Payload = ch.Payload
			}
			if ch.Fields&ChangeHeaders != 0 {
				e.Headers = ch.Headers
			}
			a.supersede(ref.seq, ref.due)
			r.Seq = a.create(&e, old.createdAt, old.version+1)
			a.rebound(ref.seq, r.Seq, e.Due)
			r.Outcome, r.Due, r.Version = Updated, e.Due, old.version+1
		}
		res[i] = r
	}
	return &UpdateResult{Results: res}
}

func (a *applier) cancel(c *Cancel) *CancelBatchResult {
	res := make([]CancelResult, len(c.IDs))
	for i, id := range c.IDs {
		ref, ok := a.lookupID(id)
		if !ok {
			res[i] = CancelResult{Outcome: NotFound}
			continue
		}
		res[i].Seq = ref.seq
		s := a.status(ref.seq, ref.due)
		switch s.state {
		case StateScheduled:
			a.settle(ref.seq, s.due)
			s.state, s.cancelledAt = StateCancelled, c.ProposedAt
			a.putStatus(ref.seq, s)
			a.m.cancelled++
			res[i].Outcome = Cancelled
			a.occurred(ref.seq, c.ProposedAt)
		case StateCancelled:
			res[i].Outcome = AlreadyCancelled
		case StateFired:
			res[i].Outcome = AlreadyFired
		case StateDeadLettered:
			res[i].Outcome = AlreadyDeadLettered
		default: // expired: its id is removed with it, so lookupID does not find it
			a.fatal("id %q names event %d, which has expired", id, ref.seq)
		}
	}
	return &CancelBatchResult{Results: res}
}

// notPending maps the state of an event that is no longer pending to its MarkOutcome.
func notPending(s State) MarkOutcome {
	switch s {
	case StateFired:
		return WasFired
	case StateCancelled:
		return WasCancelled
	case StateDeadLettered:
		return WasDeadLettered
	default:
		return WasExpired
	}
}

func (a *applier) markFired(c *MarkFired) *MarkBatchResult {
	res := make([]MarkOutcome, len(c.Entries))
	seqs := make([]uint64, len(c.Entries))
	for i, e := range c.Entries {
		seqs[i] = e.Seq
	}
	a.loadStatuses(seqs)
	for i, e := range c.Entries {
		if !a.known(e.Seq) {
			res[i] = UnknownSeq
			continue
		}
		s := a.status(e.Seq, e.Due)
		if s.state != StateScheduled {
			res[i] = notPending(s.state)
			switch s.state {
			case StateFired:
				a.m.refired++
			case StateCancelled:
				a.m.firedAfterCancel++
			}
			continue
		}
		// Pending: nothing of it needs reading, as its status is {Scheduled, due}.
		if !c.DueKnown {
			s.due = a.dueOf(e.Seq)
		}
		a.settle(e.Seq, s.due)
		s.state, s.firedAt, s.attempts = StateFired, e.FiredAt, e.Attempts
		a.putStatus(e.Seq, s)
		a.m.fired++
		res[i] = Marked
		a.occurred(e.Seq, c.ProposedAt)
	}
	return &MarkBatchResult{Outcomes: res}
}

func (a *applier) markDeadLettered(c *MarkDeadLettered) *MarkBatchResult {
	res := make([]MarkOutcome, len(c.Entries))
	seqs := make([]uint64, len(c.Entries))
	for i, e := range c.Entries {
		seqs[i] = e.Seq
	}
	a.loadStatuses(seqs)
	for i, e := range c.Entries {
		if !a.known(e.Seq) {
			res[i] = UnknownSeq
			continue
		}
		s := a.status(e.Seq, e.Due)
		if s.state != StateScheduled {
			res[i] = notPending(s.state)
			continue
		}
		if !c.DueKnown {
			s.due = a.dueOf(e.Seq)
		}
		a.settle(e.Seq, s.due)
		s.state, s.deadLetteredAt, s.attempts = StateDeadLettered, e.At, e.Attempts
		s.lastError, s.deadLetterTopic = e.Error, e.Topic
		a.putStatus(e.Seq, s)
		a.m.deadLettered++
		res[i] = Marked
		a.occurred(e.Seq, c.ProposedAt)
	}
	return &MarkBatchResult{Outcomes: res}
}
