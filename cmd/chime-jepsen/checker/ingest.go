package checker

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Check 15: schedules made by producing a record to an ingest topic. See doc.go.

// FIngest is one record the driver produced to an ingest topic: Op.Action says which
// (IngestSchedule or IngestTombstone), Op.ID is the event id Chime gives it
// ("<ingest topic>/<key>"), Op.Topic, Op.Payload, Op.DelayNs or Op.DeliverAtNs what the
// record's headers and value said, and for an ok one (the broker acknowledged it, acks=all)
// Op.Partition and Op.Offset where it landed.
const FIngest = "ingest"

// Op.Action values of an ingest op.
const (
	IngestSchedule  = "schedule"
	IngestTombstone = "tombstone"
)

// Defaults of the ingest check (Config.IngestBound, Config.IngestRejectedTopic).
const (
	// DefaultIngestBound: how long after the broker acknowledged a record Chime may still be
	// applying it in a run clear of faults. A consumer that died or went silent holds its
	// partitions for the group's session timeout (10 s) before another node reads them from
	// the last committed offset; a rebalance and the retries of a call that met no leader
	// take a few seconds more.
	DefaultIngestBound         = 15 * time.Second
	DefaultIngestRejectedTopic = "chime.ingest.rejected"
)

// ingestHistory is everything the run knows about one ingest id.
type ingestHistory struct {
	id string
	// acked: the ok ops, in the order Chime applies them (partition, then offset); unknown:
	// the info ones, in history order. A failed op produced nothing.
	acked, unknown []*Op
	// records: the fired records of the id (any topic, the dead-letter one included), by
	// append; rejected: its copies on the rejected topic.
	records, rejected []*Record
}

// producedBy returns the schedule op (ok or info) whose payload record r carries, or nil.
// The driver gives every record it produces a payload of its own.
func (h *ingestHistory) producedBy(r *Record) *Op {
	for _, ops := range [][]*Op{h.acked, h.unknown} {
		for _, op := range ops {
			if op.Action == IngestSchedule && op.Payload == r.Payload {
				return op
			}
		}
	}
	return nil
}

// ingestResult is what check 15 found: findings keyed by the check they count in, and the
// extra copies of each produced record (duplicates, measured).
type ingestResult struct {
	findings   []idFinding
	duplicates []idFinding // check "duplicates", why names the fault it is attributed to
	kinds      []string    // the fault each duplicate is attributed to, parallel to duplicates
	steps      []string    // the fire path's step that made each duplicate (duplicateStep)
}

// ingestDeadline is the latest a record acknowledged at ack can still be being applied:
// ack + IngestBound, and while a fault window starts by then, its heal + IngestBound (a
// consumer killed, paused, partitioned from the shard leaders or cut off from the broker
// applies nothing until the fault heals or the group moves its partitions).
func (a *analysis) ingestDeadline(ack int64) int64 {
	b := int64(a.cfg.IngestBound)
	d := ack + b
	for moved := true; moved; {
		moved = false
		for _, w := range a.windows {
			if w.start <= d && w.heal+b > d {
				d, moved = w.heal+b, true
			}
		}
	}
	return d
}

// ingestCheck runs check 15 over every ingest id.
func (a *analysis) ingestCheck() ingestResult {
	var res ingestResult
	a.indexIngest()
	add := func(check, id, format string, args ...any) {
		res.findings = append(res.findings, idFinding{id: id, finding: finding{check: check, why: fmt.Sprintf(format, args...)}})
	}
	ids := make([]string, 0, len(a.ingest))
	for id := range a.ingest {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		h := a.ingest[id]

		// (d) rejected: the workload produces only valid records
		for _, r := range h.rejected {
			add("ingest_rejected", id, "record %s of key %q was rejected: %s", recName(r), id, r.Error)
		}

		// (a) lost: the last acknowledged record schedules, so some record of it fires (or
		// of an unacknowledged schedule that may have landed after it), unless an
		// unacknowledged tombstone may have cancelled it
		if n := len(h.acked); n > 0 && h.acked[n-1].Action == IngestSchedule {
			last := h.acked[n-1]
			want := []string{last.Payload}
			excused := false
			for _, op := range h.unknown {
				if op.Action == IngestTombstone {
					excused = true
				}
				want = append(want, op.Payload)
			}
			if !excused && !slices.ContainsFunc(h.records, func(r *Record) bool { return slices.Contains(want, r.Payload) }) {
				add("ingest_lost", id, "its last record (%s, %s) was acknowledged at %s and nothing after it may have cancelled or replaced it, and no record of it fired",
					ingestName(last), ingestDue(last), a.rel(last.CompleteNs))
			}
		}

		copies := map[string]int{}
		firstOf := map[string]*Record{}
		for _, r := range h.records {
			op := h.producedBy(r)
			// phantom: no record the driver produced carries its payload, or it went to
			// another topic (a dead-letter copy is matched on payload only)
			if op == nil || (op.Topic != r.Topic && !a.isDeadLetter(r)) {
				add("phantom", id, "record %s has topic=%q payload=%s, which no ingest record of this key carried",
					recName(r), r.Topic, shortQuote(r.Payload))
				continue
			}
			at := r.AppendMs * 1e6
			if copies[r.Payload]++; copies[r.Payload] > 1 {
				kind, step := a.attribute(at), duplicateStep(firstOf[r.Payload], r)
				res.duplicates = append(res.duplicates, idFinding{id: id, finding: finding{check: "duplicates",
					why: fmt.Sprintf("copy %s of %s appended at %s: %s, attributed to %s", recName(r), ingestName(op), a.rel(at), step, kind)}})
				res.kinds = append(res.kinds, kind)
				res.steps = append(res.steps, step)
			} else {
				firstOf[r.Payload] = r
			}

			// (b) early: never before the earliest due the record can have had
			if due := ingestEarliestDue(op); at < due-int64(a.cfg.EarlyTolerance) {
				if w, ok := a.ingestSkewExplains(op, due, at); ok {
					add("early_under_skew", id, "record %s of %s appended %s before its earliest due %s, explained by skew window %s–%s (skew %s)",
						recName(r), ingestName(op), time.Duration(due-at), a.rel(due), a.rel(w.start), a.rel(w.heal), time.Duration(w.skew))
				} else {
					add("early", id, "record %s of %s appended at %s, %s before its earliest due %s (tolerance %s)",
						recName(r), ingestName(op), a.rel(at), time.Duration(due-at), a.rel(due), a.cfg.EarlyTolerance)
				}
			}

			// (c) after a later record of the key: the first copy against the earlier of the
			// two deadlines of the record that superseded it, a later copy (a stale produce
			// attempt landing late) against the acknowledgement's deadline only
			if op.Type != TypeOK {
				continue // an unacknowledged record's place in the partition is unknown
			}
			next, d, by := a.ingestSuperseded(h, op, copies[r.Payload] == 1)
			if next == nil {
				continue
			}
			if at > d {
				check, what := "ingest_after_replace", "replaced it"
				if next.Action == IngestTombstone {
					check, what = "ingest_after_tombstone", "cancelled it"
				}
				add(check, id, "record %s of %s appended at %s; %s, acknowledged at %s, %s, and was applied by %s (%s)",
					recName(r), ingestName(op), a.rel(at), ingestName(next), a.rel(next.CompleteNs), what, a.rel(d), by)
			}
		}
	}

	// backups: an ingest id an ok backup holds must have been produced before it completed
	for _, b := range a.backups {
		if b.Type != TypeOK || backupInvalid(b) != "" {
			continue
		}
		for _, id := range sortedKeys(b.BackupEvents) {
			h := a.ingest[id]
			if h == nil {
				continue
			}
			if !slices.ContainsFunc(append(slices.Clone(h.acked), h.unknown...), func(op *Op) bool {
				return op.Action == IngestSchedule && op.InvokeNs < b.CompleteNs
			}) {
				add("backup_phantom", id, "backup %s (%s–%s) holds it (%s), but no ingest record scheduling it was produced before the backup completed",
					b.Dir, a.rel(b.InvokeNs), a.rel(b.CompleteNs), b.BackupEvents[id])
			}
		}
	}
	return res
}

// ingestSuperseded returns the acked record of the key right after acked schedule op in its
// partition (nil when none), and the latest a copy of op's record may be appended: for the
// first copy, the earlier of next's acknowledgement deadline (ingestDeadline) and what the
// partition's later records show (ingestOrderDeadline); for a later copy, a stale produce
// attempt that may land late, the acknowledgement deadline alone. by says which bound it is.
func (a *analysis) ingestSuperseded(h *ingestHistory, op *Op, firstCopy bool) (next *Op, deadline int64, by string) {
	if next = h.next(op); next == nil {
		return nil, 0, ""
	}
	deadline, by = a.ingestDeadline(next.CompleteNs), "its acknowledgement"
	if firstCopy {
		if o, k := a.ingestOrderDeadline(next); k != nil && o < deadline {
			deadline, by = o, fmt.Sprintf("ingest schedule op %d, after it in the partition, was accepted by then (it fired at %s)", k.Index, a.rel(a.ingestFirstFire[k]))
		}
	}
	return next, deadline, by
}

// next returns the acked record of the key right after acked record op in its partition (the
// one that superseded op's event when Chime applied it), or nil.
func (h *ingestHistory) next(op *Op) *Op {
	for _, o := range h.acked {
		if o.Partition == op.Partition && o.Offset > op.Offset {
			return o // acked is in partition order
		}
	}
	return nil
}

// ingestOrderDeadline bounds when acked record n was applied by what the records after it in
// its partition show. Chime applies a partition's records in offset order; schedules of
// distinct ids go together in one batch, but a tombstone waits for the batch before it and
// is done before the records after it are sent, and it is done only once no record of the
// version it cancels can still land (a cancel of an event being fired is retried until its
// produce is settled). So let T be n when n is a tombstone, else the first acked tombstone
// after n in the partition (of any key): n was applied before any acked schedule k after T
// was accepted, and k was accepted before its first fired copy was appended (F, truncated to
// the millisecond), by k's delay before it: accepted ≤ F + 1 ms − (delay − skew allowance),
// where the allowance is the largest clock skew of the run (a leader whose clock is behind
// accepts with an earlier due; with a skew of unknown size, the delay is not used). It
// returns the bound (plus EarlyTolerance) and the k that gives it, or nil when none fired.
func (a *analysis) ingestOrderDeadline(n *Op) (int64, *Op) {
	after := n.Offset
	if n.Action != IngestTombstone {
		found := false
		for _, t := range a.ingestTombstones[n.Partition] { // by offset
			if t.Offset > n.Offset {
				after, found = t.Offset, true
				break
			}
		}
		if !found {
			return 0, nil
		}
	}
	var best *Op
	var bound int64
	for _, k := range a.ingestByPartition[n.Partition] {
		if k.Offset <= after {
			continue
		}
		f, fired := a.ingestFirstFire[k]
		if !fired {
			continue
		}
		b := f + int64(time.Millisecond) + int64(a.cfg.EarlyTolerance)
		if k.DeliverAtNs == 0 && a.skewKnown {
			b -= max(0, k.DelayNs-a.maxSkew)
		}
		if best == nil || b < bound {
			best, bound = k, b
		}
	}
	return bound, best
}

// indexIngest fills ingestByPartition, ingestTombstones, ingestFirstFire, maxSkew and
// skewKnown.
func (a *analysis) indexIngest() {
	a.ingestByPartition = map[int32][]*Op{}
	a.ingestTombstones = map[int32][]*Op{}
	a.ingestFirstFire = map[*Op]int64{}
	a.skewKnown = true
	for _, w := range a.windows {
		if w.kind == KindSkew {
			a.skewKnown = a.skewKnown && w.skew != 0
			a.maxSkew = max(a.maxSkew, w.skew, -w.skew)
		}
	}
	for _, h := range a.ingest {
		for _, op := range h.acked {
			if op.Action != IngestSchedule {
				a.ingestTombstones[op.Partition] = append(a.ingestTombstones[op.Partition], op)
				continue
			}
			a.ingestByPartition[op.Partition] = append(a.ingestByPartition[op.Partition], op)
			for _, r := range h.records { // by append: the first match is the first copy
				if r.Payload == op.Payload && (r.Topic == op.Topic || a.isDeadLetter(r)) {
					a.ingestFirstFire[op] = r.AppendMs * 1e6
					break
				}
			}
		}
	}
	for _, ts := range a.ingestTombstones {
		slices.SortFunc(ts, func(x, y *Op) int { return cmp.Compare(x.Offset, y.Offset) })
	}
}

// ingestEarliestDue is the earliest due time record op can have had: its chime-deliver-at,
// or its invocation plus its chime-delay (Chime counts the delay from when it accepts the
// record, which is after the broker appended it, which is after the driver began producing
// it; not from the broker's acknowledgement, which a consumer may overtake).
func ingestEarliestDue(op *Op) int64 {
	if op.DeliverAtNs != 0 {
		return op.DeliverAtNs
	}
	return op.InvokeNs + op.DelayNs
}

// ingestSkewExplains returns the skew window that can explain record op appended at at being
// early against its earliest due: one that skewExplains names, or, for a chime-delay, a
// window in which a node's clock was behind (or by an unrecorded amount) that overlaps
// [op's invocation, at] and is at least as large as the earliness. The leader that applies a
// chime-delay counts it from its own clock's now, at some moment in that span, so a leader
// whose clock is s behind gives the event a due s early, and fires it s early once healed;
// a gRPC schedule is judged against the due its leader acknowledged, an ingest record has
// no such acknowledgement. Both can happen to one record: a clock behind when its delay was
// counted and a clock ahead when it fired (seed 20261221: 4.31 s behind, then 4.16 s ahead,
// 8.1 s early), so a window that moved a clock back also shifts the due skewExplains judges
// the firing against; the window returned then spans both, its skew their sum.
func (a *analysis) ingestSkewExplains(op *Op, due, at int64) (window, bool) {
	if w, ok := a.skewExplains(due, at); ok || op.DeliverAtNs != 0 {
		return w, ok
	}
	earliness := due - at
	for _, w := range a.windows {
		if w.kind != KindSkew || w.heal < op.InvokeNs || w.start > at || w.skew > 0 {
			continue
		}
		if w.skew == 0 || earliness <= -w.skew+int64(a.cfg.EarlyTolerance) {
			return w, true
		}
		if f, ok := a.skewExplains(due+w.skew, at); ok {
			return window{kind: KindSkew, start: min(w.start, f.start), heal: max(w.heal, f.heal), skew: f.skew - w.skew}, true
		}
	}
	return window{}, false
}

func ingestName(op *Op) string {
	what := "schedule"
	if op.Action == IngestTombstone {
		what = "tombstone"
	}
	if op.Type != TypeOK {
		return fmt.Sprintf("ingest %s op %d (%s)", what, op.Index, op.Type)
	}
	return fmt.Sprintf("ingest %s op %d (partition %d offset %d)", what, op.Index, op.Partition, op.Offset)
}

func ingestDue(op *Op) string {
	if op.DeliverAtNs != 0 {
		return fmt.Sprintf("deliver_at %d ms", op.DeliverAtNs/1e6)
	}
	return fmt.Sprintf("delay %s", time.Duration(op.DelayNs))
}

// sortIngest puts h.acked in partition order and h.records in append order.
func (h *ingestHistory) sort() {
	slices.SortStableFunc(h.acked, func(x, y *Op) int {
		return cmp.Or(cmp.Compare(x.Partition, y.Partition), cmp.Compare(x.Offset, y.Offset))
	})
	slices.SortStableFunc(h.records, func(x, y *Record) int {
		return cmp.Or(cmp.Compare(x.AppendMs, y.AppendMs), cmp.Compare(x.Partition, y.Partition),
			cmp.Compare(x.Offset, y.Offset), cmp.Compare(x.Topic, y.Topic))
	})
}
