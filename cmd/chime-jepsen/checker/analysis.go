package checker

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// content is what the idempotency rules compare: the schedule request's fields that the
// server's content hash covers and that the history records (topic, payload, and the due
// time as the client gave it: delay or deliver_at, with which one was set).
type content struct {
	topic, payload       string
	delayNs, deliverAtNs int64
}

func contentOf(op *Op) content {
	return content{op.Topic, op.Payload, op.DelayNs, op.DeliverAtNs}
}

func (c content) String() string {
	due := fmt.Sprintf("delay=%s", time.Duration(c.delayNs))
	if c.deliverAtNs != 0 {
		due = fmt.Sprintf("deliver_at=%d", c.deliverAtNs)
	}
	return fmt.Sprintf("topic=%q payload=%s %s", c.topic, shortQuote(c.payload), due)
}

func shortQuote(s string) string {
	const max = 32
	if len(s) > max {
		return fmt.Sprintf("%q…(%d bytes)", s[:max], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// window is one nemesis fault: [start, heal] on the driver's clock.
type window struct {
	kind    string
	targets []string
	start   int64
	heal    int64
	skew    int64
}

func (w window) contains(t int64) bool { return t >= w.start && t <= w.heal }

// idHistory is everything the run knows about one id.
type idHistory struct {
	id        string
	schedules []*Op // history order
	// cancels: the cancel ops of the id and the cancels synthesized for it from bulk
	// cancels (analysis.bulkOf), in history order.
	cancels []*Op
	gets    []*Op // history order
	updates []*Op // history order
	// reads: what the ok gets of the id and its entries in ok lists showed, in history order.
	reads []read
	// lists: the ok list ops whose prefix matches the id (whether or not they showed it),
	// in history order.
	lists   []*Op
	records []*Record // by AppendMs, then partition, offset, topic: records[0] is the first copy
	// oks are the ok schedules: creators (existing=false) by invoke time, then existing=true
	// ones by completion time. oks[0], when there is one, defines the event's content.
	oks []*Op
	// ackDueNs is the first non-zero AckDueNs in oks; 0 when no ok schedule carried one.
	ackDueNs int64
	// burst is the Op.Burst of a schedule of the id ("" for none): the rate limit of its
	// topic delays it by design, so lateness and recovery leave it out (check 12 measures
	// its burst's drain instead).
	burst string
}

// read is one look at an event: an ok get, or one entry of an ok list (op is the list).
type read struct {
	op      *Op
	state   string
	version uint64
}

// createdNs is the earliest the event can have been created: the invocation of the ok
// schedule that created it (existing=false), else of the first ok or info schedule.
func (h *idHistory) createdNs() int64 {
	for _, op := range h.oks {
		if !op.Existing {
			return op.InvokeNs
		}
	}
	for _, op := range h.schedules {
		if op.Type == TypeOK || op.Type == TypeInfo {
			return op.InvokeNs
		}
	}
	return 0
}

// storedByNs is when the event was certainly stored: the earliest completion of an ok
// schedule of the id (an Existing answer too: the event was there by then), and false
// when no schedule of it was acknowledged. An unanswered schedule may be applied long
// after its call ended: a forwarded request held in a partitioned node's TCP buffers
// reaches it once the partition heals, with its relative gRPC deadline still to run.
func (h *idHistory) storedByNs() (int64, bool) {
	var by int64
	for _, op := range h.oks {
		if by == 0 || op.CompleteNs < by {
			by = op.CompleteNs
		}
	}
	return by, by != 0
}

// windowNs is the firing window of the version of the event record r is (0: none): for a
// version an upsert made, the upsert's; otherwise the window of the id's reference schedule
// (its first ok one, else its first ok or info one). An Update keeps the event's window,
// and the workload re-sends an id with the window it first had.
func (h *idHistory) windowNs(r *Record) int64 {
	if u := h.updateMaking(r.Version); r.Version > 1 && u != nil && u.Upsert {
		return u.WindowNs
	}
	if len(h.oks) > 0 {
		return h.oks[0].WindowNs
	}
	for _, op := range h.schedules {
		if op.Type == TypeOK || op.Type == TypeInfo {
			return op.WindowNs
		}
	}
	return 0
}

// latenessNs is how late record r came (doc.go, "What is measured"): its append less the
// later of its due time and the event's creation, and for an event with a window, less the
// window too, down to zero: a record anywhere in [due, due+window] came on time. A record
// before its due stays negative, window or not: the window never allows early.
func (a *analysis) latenessNs(h *idHistory, r *Record) int64 {
	return pastWindow(r.AppendMs*1e6-max(a.dueNs(h, r), h.createdNs()), h.windowNs(r))
}

// pastWindow is lateness l (ns, from the due time) counted from the end of a window of w ns
// instead: unchanged when negative (early) or w is 0, else max(0, l − w).
func pastWindow(l, w int64) int64 {
	if l <= 0 || w <= 0 {
		return l
	}
	return max(0, l-w)
}

// accepted reports whether any ok or info schedule carried this id: only such an op can
// have stored an event under it.
func (h *idHistory) accepted() bool {
	for _, op := range h.schedules {
		if op.Type == TypeOK || op.Type == TypeInfo {
			return true
		}
	}
	return false
}

// analysis is the indexed run that every check and the report read.
type analysis struct {
	cfg     Config
	windows []window // by start
	backups []*Op    // backup ops, in history order
	ids     map[string]*idHistory
	order   []string // ids, sorted
	// bulkOf maps each cancel synthesized from a cancel_matching op (in some
	// idHistory.cancels) to that op.
	bulkOf map[*Op]*Op
	// occurrences are the records of recurring schedules' occurrences (check 11).
	occurrences []*Record
	// ingest: the ids of ingest ops (check 15), with their ops and records; judged there and
	// by no check above.
	ingest map[string]*ingestHistory
	// ingestByPartition (acked ingest schedules by partition), ingestFirstFire (the first
	// copy's append of each, ns) and the run's largest clock skew (maxSkew; skewKnown false
	// when a skew window does not say its size) serve check 15 (c); indexIngest fills them.
	ingestByPartition map[int32][]*Op
	ingestTombstones  map[int32][]*Op // acked ingest tombstones by partition, by offset
	ingestFirstFire   map[*Op]int64
	maxSkew           int64
	skewKnown         bool
	startNs           int64 // earliest op invocation (or record append when there are no ops)
	endNs             int64 // latest time anything was seen
	nRecords          int
}

func analyze(ops []Op, recs []Record, cfg Config) *analysis {
	a := &analysis{cfg: cfg.withDefaults(ops), ids: make(map[string]*idHistory), nRecords: len(recs), bulkOf: map[*Op]*Op{},
		ingest: map[string]*ingestHistory{}}
	created := map[string]bool{} // recurring schedules some ok or info create made
	ingestOf := func(id string) *ingestHistory {
		h := a.ingest[id]
		if h == nil {
			h = &ingestHistory{id: id}
			a.ingest[id] = h
		}
		return h
	}
	for i := range ops {
		op := &ops[i]
		if op.F == FRecurring && op.Action == ActionCreate && op.Type != TypeFail {
			created[op.ID] = true
		}
		if op.F == FIngest && op.ID != "" {
			h := ingestOf(op.ID)
			switch op.Type {
			case TypeOK:
				h.acked = append(h.acked, op)
			case TypeInfo:
				h.unknown = append(h.unknown, op)
			}
		}
	}
	get := func(id string) *idHistory {
		h := a.ids[id]
		if h == nil {
			h = &idHistory{id: id}
			a.ids[id] = h
		}
		return h
	}
	// The run starts at the first invocation (or, with no ops, the first append) and ends at
	// the latest time anything was seen; zero times are "not recorded".
	lo, hi := int64(0), int64(0)
	see := func(t int64) {
		if t == 0 {
			return
		}
		if lo == 0 || t < lo {
			lo = t
		}
		hi = max(hi, t)
	}
	var lists, bulks []*Op
	for i := range ops {
		op := &ops[i]
		see(op.InvokeNs)
		hi = max(hi, op.CompleteNs)
		switch op.F {
		case FSchedule:
			if op.ID != "" {
				h := get(op.ID)
				h.schedules = append(h.schedules, op)
				if op.Burst != "" {
					h.burst = op.Burst
				}
			}
		case FCancel:
			if op.ID != "" {
				h := get(op.ID)
				h.cancels = append(h.cancels, op)
			}
		case FGet:
			if op.ID != "" {
				h := get(op.ID)
				h.gets = append(h.gets, op)
				if op.Type == TypeOK {
					h.reads = append(h.reads, read{op, op.State, op.Version})
				}
			}
		case FList:
			if op.Type == TypeOK {
				for _, e := range op.Listed {
					h := get(e.ID)
					h.reads = append(h.reads, read{op, e.State, e.Version})
				}
				lists = append(lists, op)
			}
		case FCancelMatching:
			bulks = append(bulks, op)
		case FUpdate:
			if op.ID != "" {
				h := get(op.ID)
				h.updates = append(h.updates, op)
			}
		case FBackup:
			a.backups = append(a.backups, op)
			for id := range op.BackupEvents {
				if scheduleOf(id, created) {
					continue // an occurrence: check 11 judges it by its records
				}
				if a.ingest[id] != nil {
					continue // produced to an ingest topic: check 15 judges it
				}
				get(id) // an id only a backup holds is checked too (a phantom)
			}
		}
	}
	for i := range recs {
		r := &recs[i]
		if len(ops) == 0 {
			see(r.AppendMs * 1e6)
		}
		hi = max(hi, r.AppendMs*1e6)
		if r.RecurringID != "" {
			// An occurrence is judged with its schedule (check 11), not as an event of its
			// own: no schedule op carries its id.
			a.occurrences = append(a.occurrences, r)
			continue
		}
		if r.Topic == a.cfg.IngestRejectedTopic {
			h := ingestOf(r.ID)
			h.rejected = append(h.rejected, r)
			continue
		}
		if h := a.ingest[r.ID]; h != nil {
			h.records = append(h.records, r)
			continue
		}
		h := get(r.ID)
		h.records = append(h.records, r)
	}
	a.startNs, a.endNs = lo, hi
	for i := range ops {
		op := &ops[i]
		if op.F != FNemesis {
			continue
		}
		w := window{kind: op.Kind, targets: op.Targets, start: op.InvokeNs, heal: op.CompleteNs, skew: op.SkewNs}
		if w.kind == "" {
			w.kind = "unknown"
		}
		if w.heal < w.start { // never healed: it lasted to the end of the run
			w.heal = a.endNs
		}
		a.windows = append(a.windows, w)
	}
	slices.SortStableFunc(a.windows, func(x, y window) int { return cmp.Compare(x.start, y.start) })

	for id, h := range a.ids {
		a.order = append(a.order, id)
		slices.SortStableFunc(h.records, func(x, y *Record) int {
			return cmp.Or(cmp.Compare(x.AppendMs, y.AppendMs), cmp.Compare(x.Partition, y.Partition),
				cmp.Compare(x.Offset, y.Offset), cmp.Compare(x.Topic, y.Topic))
		})
		var creators, existing []*Op
		for _, op := range h.schedules {
			if op.Type != TypeOK {
				continue
			}
			if op.Existing {
				existing = append(existing, op)
			} else {
				creators = append(creators, op)
			}
		}
		slices.SortStableFunc(creators, func(x, y *Op) int {
			return cmp.Or(cmp.Compare(x.InvokeNs, y.InvokeNs), cmp.Compare(x.Index, y.Index))
		})
		slices.SortStableFunc(existing, func(x, y *Op) int {
			return cmp.Or(cmp.Compare(x.CompleteNs, y.CompleteNs), cmp.Compare(x.Index, y.Index))
		})
		h.oks = append(creators, existing...)
		for _, op := range h.oks {
			if op.AckDueNs != 0 {
				h.ackDueNs = op.AckDueNs
				break
			}
		}
	}
	slices.Sort(a.order)
	for _, h := range a.ingest {
		h.sort()
	}

	for _, l := range lists {
		for _, id := range a.matching(l.Prefix) {
			h := a.ids[id]
			h.lists = append(h.lists, l)
		}
	}
	for _, b := range bulks {
		a.synthesizeCancels(b)
	}
	for _, h := range a.ids {
		slices.SortStableFunc(h.cancels, func(x, y *Op) int { return cmp.Compare(x.Index, y.Index) })
	}
	return a
}

// matching returns the ids (sorted) that start with prefix.
func (a *analysis) matching(prefix string) []string {
	i, _ := slices.BinarySearch(a.order, prefix)
	j := i
	for j < len(a.order) && strings.HasPrefix(a.order[j], prefix) {
		j++
	}
	return a.order[i:j]
}

// synthesizeCancels adds to every id bulk cancel b may have cancelled a cancel op standing
// for it (doc.go, "Lists and bulk cancels"): none for a dry run or a failed one; for an ok one, to the
// ids an ok or info schedule of which was invoked before it completed (it finished its work
// by then); for an info one, to every id it matches that a schedule may have stored (its
// steps may still commit after the client gave up). The cancel is ok when b certainly
// cancelled the event (bulkCertain), info otherwise.
func (a *analysis) synthesizeCancels(b *Op) {
	if b.DryRun || (b.Type != TypeOK && b.Type != TypeInfo) {
		return
	}
	for _, id := range a.matching(b.Prefix) {
		h := a.ids[id]
		if !h.accepted() || (b.Type == TypeOK && !invokedBefore(h, b.CompleteNs)) {
			continue
		}
		c := &Op{Index: b.Index, Process: b.Process, F: FCancel, Node: b.Node, ID: id,
			InvokeNs: b.InvokeNs, CompleteNs: b.CompleteNs, Type: TypeInfo}
		if bulkCertain(h, b) {
			c.Type = TypeOK
		}
		h.cancels = append(h.cancels, c)
		a.bulkOf[c] = b
	}
}

// bulkCertain reports whether bulk cancel b certainly cancelled the event of h, so that it
// promises what an ok Cancel does. b is ok, no dry run, and skipped nothing (every pending
// event it matched, it cancelled); the event was acked before b was invoked (so b's steps,
// linearizable, saw it); no record of it was appended by b's completion (so it had not
// fired, or been dead-lettered and removed, by b's steps: it was pending, and matched); it
// had no upsert that may have happened (an upsert renews a settled event); and no update of
// it may have taken effect while b ran (an update moves the event in the due order b's
// steps walk, possibly behind a step's position).
func bulkCertain(h *idHistory, b *Op) bool {
	switch {
	case b.Type != TypeOK || b.DryRun || b.SkippedHeld != 0 || b.SkippedFired != 0,
		!acked(h, b.InvokeNs),
		upserted(h),
		slices.ContainsFunc(h.records, func(r *Record) bool { return r.AppendMs*1e6 <= b.CompleteNs }),
		updateMayOverlap(h, b.InvokeNs, b.CompleteNs):
		return false
	}
	return true
}

// upserted reports whether an upsert of the id may have happened (ok or info).
func upserted(h *idHistory) bool { return upsertedBefore(h, math.MaxInt64) }

// upsertedBefore reports whether an upsert of the id that may have happened (ok or info) was
// invoked before t.
func upsertedBefore(h *idHistory, t int64) bool {
	return slices.ContainsFunc(h.updates, func(u *Op) bool { return u.Upsert && u.Type != TypeFail && u.InvokeNs < t })
}

// updateMayOverlap reports whether an update of the id (an upsert included) may have taken
// effect within [from, to]: an ok or info one invoked before to, unless it is ok and completed
// before from.
func updateMayOverlap(h *idHistory, from, to int64) bool {
	return slices.ContainsFunc(h.updates, func(u *Op) bool {
		return (u.Type == TypeOK || u.Type == TypeInfo) && u.InvokeNs < to && (u.Type != TypeOK || u.CompleteNs >= from)
	})
}

// dueNs is the due time a record is judged against. For a record of the first version: the
// acked due of its id when a schedule of it was acked with one. For a later version: the due
// time the ok update that made that version returned. Otherwise the record's own
// chime-due-unix-ms header.
func (a *analysis) dueNs(h *idHistory, r *Record) int64 {
	if r.Version > 1 {
		if u := h.updateMaking(r.Version); u != nil {
			return u.AckDueNs
		}
		return r.DueMs * 1e6
	}
	if h != nil && h.ackDueNs != 0 {
		return h.ackDueNs
	}
	return r.DueMs * 1e6
}

// updateMaking returns the ok update that made version v, or nil.
func (h *idHistory) updateMaking(v uint64) *Op {
	if h == nil {
		return nil
	}
	for _, u := range h.updates {
		if u.Type == TypeOK && u.Version == v {
			return u
		}
	}
	return nil
}

// updated reports whether an update of the id may have taken effect (ok or info).
func (h *idHistory) updated() bool {
	for _, u := range h.updates {
		if u.Type == TypeOK || u.Type == TypeInfo {
			return true
		}
	}
	return false
}

func (a *analysis) isDeadLetter(r *Record) bool { return r.Topic == a.cfg.DeadLetterTopic }

// phantom returns why r is a phantom, or "" when some schedule that could have been
// accepted carried its id and content.
//
// The candidates are the ok schedules of the id when there is one (an ok says the stored
// content is its own: it created it, or existing=true means identical), else its info
// schedules (any of them may have been stored). A failed schedule, ALREADY_EXISTS or not,
// never stored anything. A dead-letter copy is matched on payload only.
func (a *analysis) phantom(h *idHistory, r *Record) string {
	if h == nil || !h.accepted() {
		return "no ok or info schedule ever carried this id"
	}
	if r.Version > 1 {
		return a.phantomVersion(h, r)
	}
	var cands []*Op
	if len(h.oks) > 0 {
		cands = h.oks
	} else {
		for _, op := range h.schedules {
			if op.Type == TypeInfo {
				cands = append(cands, op)
			}
		}
	}
	for _, op := range cands {
		if op.Payload == r.Payload && (op.Topic == r.Topic || a.isDeadLetter(r)) {
			return ""
		}
	}
	which := "info"
	if len(h.oks) > 0 {
		which = "ok"
	}
	return fmt.Sprintf("record %s has topic=%q payload=%s, which no %s schedule of this id carried (e.g. %s)",
		recName(r), r.Topic, shortQuote(r.Payload), which, contentOf(cands[0]))
}

// phantomVersion is phantom for a record of a version after the first: an ok or info update
// of the id must have set its payload, and a schedule of the id that may have been stored its
// topic (an update keeps the topic).
func (a *analysis) phantomVersion(h *idHistory, r *Record) string {
	payload := slices.ContainsFunc(h.updates, func(u *Op) bool {
		return (u.Type == TypeOK || u.Type == TypeInfo) && u.Payload == r.Payload
	})
	topic := a.isDeadLetter(r) || slices.ContainsFunc(h.schedules, func(op *Op) bool {
		return (op.Type == TypeOK || op.Type == TypeInfo) && op.Topic == r.Topic
	})
	if payload && topic {
		return ""
	}
	return fmt.Sprintf("record %s of version %d has topic=%q payload=%s, which no ok or info update (payload) and schedule (topic) of this id carried",
		recName(r), r.Version, r.Topic, shortQuote(r.Payload))
}

// period names the part of the run an event due at due belongs to.
func (a *analysis) period(due int64) string {
	for _, w := range a.windows {
		if w.contains(due) {
			return "faulty"
		}
	}
	if a.cfg.FinalHealNs > 0 && due > a.cfg.FinalHealNs {
		return "after_heal"
	}
	return "healthy"
}

// skewExplains returns the skew window that can explain a record appended at appendNs being
// early for due: the due time or the append falls inside the window (a clock moved ahead
// fires while the skew is in place), and, when the window says by how much the clock moved,
// it moved ahead (SkewNs > 0, chimed's convention: now = real time + offset) and the record
// is early by no more than that plus EarlyTolerance. A clock moved back fires late, never
// early.
// skewLanding is how long after a skew window's heal a record its clock fired may be
// appended: a produce in flight (a fault run's landed 1 ms after the heal).
const skewLanding = time.Second

func (a *analysis) skewExplains(due, appendNs int64) (window, bool) {
	earliness := due - appendNs
	for _, w := range a.windows {
		// A record the skewed clock fired just before the heal is appended once its
		// produce lands, after the heal: the append may trail the window by skewLanding.
		landed := appendNs >= w.start && appendNs <= w.heal+int64(skewLanding)
		if w.kind != KindSkew || (!w.contains(due) && !landed) {
			continue
		}
		if w.skew < 0 || (w.skew > 0 && earliness > w.skew+int64(a.cfg.EarlyTolerance)) {
			continue
		}
		return w, true
	}
	return window{}, false
}

// attribute names the fault a duplicate appended at t belongs to: among the windows whose
// [start, heal+DuplicateGrace] contains t, the one that started last; "none" otherwise.
func (a *analysis) attribute(t int64) string {
	kind := "none"
	for _, w := range a.windows { // by start: the last match started last
		if t >= w.start && t <= w.heal+int64(a.cfg.DuplicateGrace) {
			kind = w.kind
		}
	}
	return kind
}

// rel formats a driver-clock time relative to the start of the run.
func (a *analysis) rel(t int64) string {
	return fmt.Sprintf("t=%.3fs", float64(t-a.startNs)/1e9)
}

// scheduleOf reports whether id is an occurrence's, <schedule>@<digits>, of a schedule in
// created.
func scheduleOf(id string, created map[string]bool) bool {
	at := strings.LastIndexByte(id, '@')
	if at < 0 || at == len(id)-1 {
		return false
	}
	for _, c := range id[at+1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return created[id[:at]]
}

func recName(r *Record) string {
	return fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
}
