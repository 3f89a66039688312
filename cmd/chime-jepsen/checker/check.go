package checker

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/chimehq/chime/cmd/internal/latency"
)

// Check runs every check of doc.go over one run: the history ops, every record read back
// from Kafka, and the final cluster state. It is pure: same input, same Results.
func Check(ops []Op, recs []Record, final Cluster, cfg Config) Results {
	a := analyze(ops, recs, cfg)
	res := Results{
		DuplicatesByFault:   map[string]int{"none": 0},
		DuplicatesByStep:    map[string]int{},
		ConvergenceProblems: []string{},
		Recovery:            []Recovery{},
		Ops:                 map[string]map[string]int{},
		Examples:            map[string][]Example{},
		Records:             len(recs),
		Config: ConfigUsed{
			EarlyToleranceNs:    int64(a.cfg.EarlyTolerance),
			CancelToleranceNs:   int64(a.cfg.CancelTolerance),
			DuplicateGraceNs:    int64(a.cfg.DuplicateGrace),
			FinalHealNs:         a.cfg.FinalHealNs,
			DeadLetterTopic:     a.cfg.DeadLetterTopic,
			RetentionNs:         int64(a.cfg.Retention),
			PriorityToleranceNs: int64(a.cfg.PriorityTolerance),
			IngestBoundNs:       int64(a.cfg.IngestBound),
			IngestRejectedTopic: a.cfg.IngestRejectedTopic,
		},
	}
	note := func(check, id, format string, args ...any) {
		if len(res.Examples[check]) < MaxExamples {
			res.Examples[check] = append(res.Examples[check], Example{ID: id, Why: fmt.Sprintf(format, args...)})
		}
	}

	for i := range ops {
		op := &ops[i]
		if res.Ops[op.F] == nil {
			res.Ops[op.F] = map[string]int{}
		}
		res.Ops[op.F][op.Type]++
		if op.F == FInvalid && op.Type == TypeOK {
			res.InvalidAccepted++
			note("invalid_accepted", op.ID, "invalid op %d (%s) returned ok", op.Index, a.rel(op.InvokeNs))
		}
		if op.F == FCancelMatching {
			// 10. bulk cancels whose totals contradict themselves
			if why := bulkTotalsWrong(op); why != "" {
				res.BulkCancelViolations++
				note("bulk_cancel_violations", op.Prefix, "cancel_matching op %d (prefix %q, %s) %s", op.Index, op.Prefix, a.rel(op.InvokeNs), why)
			}
			if op.Type == TypeOK && !op.DryRun {
				b := &res.BulkCancels
				b.Ops++
				b.Matched += op.Matched
				b.Cancelled += op.Cancelled
				b.SkippedFired += op.SkippedFired
				b.SkippedHeld += op.SkippedHeld
			}
		}
	}
	for _, w := range a.windows {
		res.DuplicatesByFault[w.kind] += 0
	}
	for i := range recs {
		if a.isDeadLetter(&recs[i]) {
			res.DeadLetterRecords++
		}
	}

	var late struct{ healthy, faulty, afterHeal []float64 }
	for _, id := range a.order {
		h := a.ids[id]
		if len(h.oks) > 0 {
			res.AckedIDs++
		}
		if len(h.records) > 0 {
			res.DeliveredIDs++
		}

		// 1. lost
		if len(h.oks) > 0 && len(h.records) == 0 && !cancelMayHaveHappened(h) && !updateMadeItLater(h) {
			res.Lost++
			due := "unknown"
			if h.ackDueNs != 0 {
				due = a.rel(h.ackDueNs)
			}
			note("lost", id, "schedule acked at %s (due %s, %s), no cancel ok or info, and no record",
				a.rel(h.oks[0].CompleteNs), due, contentOf(h.oks[0]))
		}

		// 2. early, early under skew
		for _, r := range h.records {
			due, at := a.dueNs(h, r), r.AppendMs*1e6
			if at >= due-int64(a.cfg.EarlyTolerance) {
				continue
			}
			early := time.Duration(due - at)
			if w, ok := a.skewExplains(due, at); ok {
				res.EarlyUnderSkew++
				note("early_under_skew", id, "record %s appended %s before due %s, inside skew window %s–%s (skew %s)",
					recName(r), early, a.rel(due), a.rel(w.start), a.rel(w.heal), time.Duration(w.skew))
				continue
			}
			res.Early++
			note("early", id, "record %s appended at %s, %s before due %s (tolerance %s)",
				recName(r), a.rel(at), early, a.rel(due), a.cfg.EarlyTolerance)
		}

		// 3. cancel violations: judged against the earliest ok cancel; 10. when that is a
		// bulk cancel's, they are bulk cancel violations
		var cancel *Op
		for _, op := range h.cancels {
			if op.Type == TypeOK && (cancel == nil || op.CompleteNs < cancel.CompleteNs) {
				cancel = op
			}
		}
		if cancel != nil {
			bulk := a.bulkOf[cancel]
			for _, r := range h.records {
				at := r.AppendMs * 1e6
				if at <= cancel.CompleteNs+int64(a.cfg.CancelTolerance) {
					continue
				}
				if bulk != nil {
					res.BulkCancelViolations++
					note("bulk_cancel_violations", id, "record %s appended at %s, %s after cancel_matching op %d (prefix %q), which cancelled it, was acked at %s",
						recName(r), a.rel(at), time.Duration(at-cancel.CompleteNs), bulk.Index, bulk.Prefix, a.rel(cancel.CompleteNs))
					continue
				}
				res.CancelViolations++
				note("cancel_violations", id, "record %s appended at %s, %s after the cancel was acked at %s",
					recName(r), a.rel(at), time.Duration(at-cancel.CompleteNs), a.rel(cancel.CompleteNs))
			}
		}

		// 4. phantom
		var genuine []*Record // records that are not phantoms
		for _, r := range h.records {
			if why := a.phantom(h, r); why != "" {
				res.Phantom++
				note("phantom", id, "%s", why)
			} else {
				genuine = append(genuine, r)
			}
		}

		// 5. idempotency
		if problems := a.idempotencyProblems(h, genuine); len(problems) > 0 {
			res.IdempotencyViolations++
			note("idempotency_violations", id, "%s", strings.Join(problems, "; "))
		}

		// 9. updates: no record of a replaced version after the update's ack, the latest
		// acked version fires, a version's record carries that version's content; and
		// no get or list shows a state older than a change acked before it began.
		for _, why := range a.updateProblems(h) {
			res.UpdateViolations++
			note("update_violations", id, "%s", why)
		}
		for _, why := range a.staleReads(h) {
			res.StaleReads++
			note("stale_reads", id, "%s", why)
		}

		// 6. retention
		if bad, why := a.expiredEarly(h); len(bad) > 0 {
			res.ExpiredEarly += len(bad)
			for _, w := range why {
				note("expired_early", id, "%s", w)
			}
		}
		if why := a.resurrection(h); why != "" {
			res.Resurrected++
			note("resurrected", id, "%s", why)
		}

		// 7. backups: what each one holds of this id
		for _, f := range a.backupFindings(h) {
			switch f.check {
			case "backup_lost":
				res.BackupLost++
			case "backup_phantom":
				res.BackupPhantom++
			case "backup_wrong_state":
				res.BackupWrongState++
			}
			note(f.check, id, "%s", f.why)
		}

		// duplicates: copies of a version after its first (an update or an upsert makes a
		// new version, whose record is no copy)
		firstOf := map[uint64]*Record{}
		for _, r := range h.records {
			v := max(r.Version, 1)
			first, seen := firstOf[v]
			if !seen {
				firstOf[v] = r
				continue
			}
			at := r.AppendMs * 1e6
			kind, step := a.attribute(at), duplicateStep(first, r)
			res.Duplicates++
			res.DuplicatesByFault[kind]++
			res.DuplicatesByStep[step]++
			note("duplicates", id, "copy %s (attempt %d) appended at %s after the first (attempt %d) at %s: %s, attributed to %s",
				recName(r), r.Attempt, a.rel(at), first.Attempt, a.rel(first.AppendMs*1e6), step, kind)
		}

		// lateness, of the first copy of every event the history knows
		if len(h.records) > 0 && h.accepted() && h.burst == "" {
			r := h.records[0]
			due := a.dueNs(h, r)
			l := float64(a.latenessNs(h, r)) / 1e6
			switch a.period(due) {
			case "faulty":
				late.faulty = append(late.faulty, l)
			case "after_heal":
				late.afterHeal = append(late.afterHeal, l)
			default:
				late.healthy = append(late.healthy, l)
			}
		}
	}
	res.LatenessMs = Lateness{
		Healthy:   quantiles(late.healthy),
		Faulty:    quantiles(late.faulty),
		AfterHeal: quantiles(late.afterHeal),
	}
	res.Recovery = a.recovery()

	// 7. backups that contradict their own directory
	for _, b := range a.backups {
		if why := backupInvalid(b); why != "" {
			res.BackupInvalid++
			note("backup_invalid", b.Dir, "backup %s (%s–%s) %s", b.Dir, a.rel(b.InvokeNs), a.rel(b.CompleteNs), why)
		}
	}

	// 11. recurring schedules
	findings, occurrences := a.recurring(ops)
	res.Occurrences = occurrences
	for _, f := range findings {
		switch f.check {
		case "recurring_missing":
			res.RecurringMissing++
		case "recurring_early":
			res.RecurringEarly++
		case "recurring_phantom":
			res.RecurringPhantom++
		case "recurring_after_stop":
			res.RecurringAfterStop++
		case "recurring_trigger_lost":
			res.RecurringTriggerLost++
		case "recurring_trigger_early":
			res.RecurringTriggerEarly++
		case "recurring_backfill_lost":
			res.RecurringBackfillLost++
		case "recurring_backfill_outside":
			res.RecurringBackfillOutside++
		case "early_under_skew":
			res.EarlyUnderSkew++
		}
		note(f.check, f.id, "%s", f.why)
	}

	// 12. priority under a backlog
	res.Bursts = []BurstResult{}
	for _, b := range a.priority(ops) {
		res.Bursts = append(res.Bursts, b.BurstResult)
		if b.Skipped != "" {
			res.BurstsSkipped++
			continue
		}
		res.BurstsChecked++
		res.PriorityViolations += b.Violations
		for _, f := range b.findings {
			note("priority_violations", f.id, "%s", f.why)
		}
	}

	// 13. tenants
	for _, f := range tenantViolations(ops, recs) {
		res.TenantViolations++
		note(f.check, f.id, "%s", f.why)
	}

	// 15. ingest
	ing := a.ingestCheck()
	for _, f := range ing.findings {
		switch f.check {
		case "ingest_lost":
			res.IngestLost++
		case "ingest_after_tombstone":
			res.IngestAfterTombstone++
		case "ingest_after_replace":
			res.IngestAfterReplace++
		case "ingest_rejected":
			res.IngestRejected++
		case "early":
			res.Early++
		case "early_under_skew":
			res.EarlyUnderSkew++
		case "phantom":
			res.Phantom++
		case "backup_phantom":
			res.BackupPhantom++
		}
		note(f.check, f.id, "%s", f.why)
	}
	for i, d := range ing.duplicates {
		res.Duplicates++
		res.DuplicatesByFault[ing.kinds[i]]++
		res.DuplicatesByStep[ing.steps[i]]++
		note("duplicates", d.id, "%s", d.why)
	}
	for _, h := range a.ingest {
		if len(h.acked)+len(h.unknown) > 0 {
			res.Ingest.IDs++
		}
		if len(h.records) > 0 {
			res.Ingest.Fired++
		}
		for _, op := range h.acked {
			if op.Action == IngestTombstone {
				res.Ingest.Tombstones++
			} else {
				res.Ingest.Schedules++
			}
		}
		res.Ingest.Unknown += len(h.unknown)
	}

	// 8. convergence
	res.ConvergenceProblems = ConvergenceProblems(final)
	res.Converged = len(res.ConvergenceProblems) == 0

	// 14. crashes: a node's process ends only when the nemesis ends it; or, of the old
	// build in an upgrade run, when it refuses what the current build wrote
	// (format_refusals); or when a disk fault on it made it stop as it must (disk_exits)
	for _, c := range final.Crashes {
		if RefusedFormat(c) {
			res.FormatRefusals++
			note("format_refusals", c.Node, "%s (old build) refused a format at %s (%s): %s", c.Node, a.rel(c.AtNs), c.Exit, c.Line)
			continue
		}
		if w, ok := a.diskExplains(c); ok {
			res.DiskExits++
			note("disk_exits", c.Node, "%s stopped at %s (%s) in a %s window on it (%s–%s): %s",
				c.Node, a.rel(c.AtNs), c.Exit, w.kind, a.rel(w.start), a.rel(w.heal), c.Line)
			continue
		}
		res.Crashes++
		note("crashes", c.Node, "%s ended by itself at %s (%s): %s", c.Node, a.rel(c.AtNs), c.Exit, c.Line)
	}

	// 15. events a leader's firing lost and its sweep put back (measured)
	for _, o := range final.Orphans {
		res.FiringOrphans++
		note("firing_orphans", o.Node, "%s", o.Line)
	}

	res.Valid = res.Lost == 0 && res.Early == 0 && res.CancelViolations == 0 && res.Phantom == 0 &&
		res.IdempotencyViolations == 0 && res.ExpiredEarly == 0 && res.Resurrected == 0 &&
		res.BackupLost == 0 && res.BackupPhantom == 0 && res.BackupWrongState == 0 && res.BackupInvalid == 0 &&
		res.UpdateViolations == 0 && res.StaleReads == 0 && res.BulkCancelViolations == 0 &&
		res.RecurringMissing == 0 && res.RecurringEarly == 0 && res.RecurringPhantom == 0 && res.RecurringAfterStop == 0 &&
		res.RecurringTriggerLost == 0 && res.RecurringTriggerEarly == 0 && res.RecurringBackfillLost == 0 && res.RecurringBackfillOutside == 0 &&
		res.PriorityViolations == 0 && res.TenantViolations == 0 &&
		res.IngestLost == 0 && res.IngestAfterTombstone == 0 && res.IngestAfterReplace == 0 && res.IngestRejected == 0 &&
		res.Converged && res.Crashes == 0
	return res
}

// DiskFaultKinds are the nemeses that take a node's disk away (its filesystem full, or
// frozen); inside their windows a node may stop by itself (check 14).
var DiskFaultKinds = []string{"disk-full", "disk-stall"}

// DiskExitLine is what chimed logs, last, when it stops because its data directory cannot
// be written (node.Node's diskFailed): the only reason a disk fault excuses an exit.
const DiskExitLine = "the data directory cannot be written"

// DiskExitGrace is how long after a disk fault's heal an exit the fault caused may still
// come: a process whose disk was frozen ends only once the filesystem thaws (its threads wait
// in the kernel until then), and its last error may come a moment after.
const DiskExitGrace = 10 * time.Second

// diskExplains returns the disk fault window on c's node that explains its exit: c's line
// says the data directory could not be written, and c came between the window's start and
// DiskExitGrace after its heal. Any other exit, in a disk window or not, is a crash.
func (a *analysis) diskExplains(c Crash) (window, bool) {
	if !strings.Contains(c.Line, DiskExitLine) {
		return window{}, false
	}
	for _, w := range a.windows {
		if slices.Contains(DiskFaultKinds, w.kind) && slices.Contains(w.targets, c.Node) &&
			c.AtNs >= w.start && c.AtNs <= w.heal+int64(DiskExitGrace) {
			return w, true
		}
	}
	return window{}, false
}

// cancelMayHaveHappened: some cancel of the id was acked (ok) or may have taken effect
// (info). A failed cancel definitely did not.
func cancelMayHaveHappened(h *idHistory) bool {
	for _, op := range h.cancels {
		if op.Type == TypeOK || op.Type == TypeInfo {
			return true
		}
	}
	return false
}

// updateMadeItLater: an ok update of the id moved it, so the lack of records is judged by
// the update check (which asks for its latest version), not as a loss of the schedule.
func updateMadeItLater(h *idHistory) bool {
	return slices.ContainsFunc(h.updates, func(u *Op) bool { return u.Type == TypeOK })
}

// updateProblems lists what breaks the promise of Update for one id: after an ok update to
// version v completed at C, no record of a version below v is appended after C (a record
// without a chime-version header is version 1); unless a cancel may have happened, some
// record of version v or later exists, for the latest ok v; and a record of a version an ok
// update made carries that update's payload.
func (a *analysis) updateProblems(h *idHistory) []string {
	var problems []string
	var latest *Op
	for _, u := range h.updates {
		if u.Type != TypeOK {
			continue
		}
		if latest == nil || u.Version > latest.Version {
			latest = u
		}
		for _, r := range h.records {
			if v := max(r.Version, 1); v < u.Version && r.AppendMs*1e6 > u.CompleteNs {
				problems = append(problems, fmt.Sprintf("record %s of version %d appended at %s, after the update to version %d was acked at %s",
					recName(r), v, a.rel(r.AppendMs*1e6), u.Version, a.rel(u.CompleteNs)))
			}
		}
		for _, r := range h.records {
			if r.Version == u.Version && r.Payload != u.Payload {
				problems = append(problems, fmt.Sprintf("record %s of version %d carries payload %s, the update that made it set %s",
					recName(r), r.Version, shortQuote(r.Payload), shortQuote(u.Payload)))
			}
		}
	}
	if latest != nil && !cancelMayHaveHappened(h) &&
		!slices.ContainsFunc(h.records, func(r *Record) bool { return r.Version >= latest.Version }) {
		problems = append(problems, fmt.Sprintf("the update to version %d (due %s) was acked at %s, and no record of it or a later version came",
			latest.Version, a.rel(latest.AckDueNs), a.rel(latest.CompleteNs)))
	}
	return problems
}

// staleReads lists the reads of the id that show a state older than a change acknowledged
// before they began, or that a list's filter excludes, and the lists that left out an event
// they had to show (doc.go, check 9).
func (a *analysis) staleReads(h *idHistory) []string {
	var problems []string
	for _, rd := range h.reads {
		if why := a.staleRead(h, rd); why != "" {
			problems = append(problems, why)
		}
	}
	for _, l := range h.lists {
		if why := a.listMissing(h, l); why != "" {
			problems = append(problems, why)
		}
	}
	return problems
}

// readName names the op of a read: a get, or a list with its prefix.
func (a *analysis) readName(op *Op) string {
	if op.F == FList {
		return fmt.Sprintf("list op %d (prefix %q) at %s", op.Index, op.Prefix, a.rel(op.InvokeNs))
	}
	return fmt.Sprintf("get op %d at %s", op.Index, a.rel(op.InvokeNs))
}

// staleRead says why one read of the id is wrong, or "": (a) it shows a version (0 is a run
// from before versions) below that of an ok update that completed before its op was
// invoked; (b) it shows the event scheduled although an ok cancel of it (a bulk cancel's
// that certainly cancelled it included) completed before its op was invoked, and no upsert
// (which renews a settled event) was invoked before the read completed; (c) it is an entry
// of a list whose filter names states, in a state the filter does not name.
func (a *analysis) staleRead(h *idHistory, rd read) string {
	op := rd.op
	if op.F == FList && len(op.States) > 0 && !slices.Contains(op.States, rd.state) {
		return fmt.Sprintf("%s, filtered by states %v, listed it %s", a.readName(op), op.States, rd.state)
	}
	if rd.version != 0 {
		for _, u := range h.updates {
			if u.Type == TypeOK && u.CompleteNs < op.InvokeNs && u.Version > rd.version {
				return fmt.Sprintf("%s showed version %d; the update to version %d was acked at %s",
					a.readName(op), rd.version, u.Version, a.rel(u.CompleteNs))
			}
		}
	}
	if rd.state == StateScheduled && !upsertedBefore(h, op.CompleteNs) {
		for _, c := range h.cancels {
			if c.Type != TypeOK || c.CompleteNs >= op.InvokeNs {
				continue
			}
			what := "the cancel"
			if b := a.bulkOf[c]; b != nil {
				what = fmt.Sprintf("cancel_matching op %d (prefix %q), which cancelled it,", b.Index, b.Prefix)
			}
			return fmt.Sprintf("%s showed it scheduled; %s was acked at %s", a.readName(op), what, a.rel(c.CompleteNs))
		}
	}
	return ""
}

// listMissing says why ok list l, whose prefix matches the id, had to show the event and
// did not, or "". Only a list with no states filter that read to its end (not More) says
// what it left out. It had to show the event when an ok schedule of it completed before l
// was invoked; no cancel of it that may have happened (ok or info, a bulk cancel's included)
// and no upsert (ok or info) was invoked before l completed; the retention cannot have
// removed it by l's completion (notExpiredBy); and, for a list of several pages, no update
// of it may have taken effect while l ran (an update moves the event in the due order,
// possibly behind a page already read).
func (a *analysis) listMissing(h *idHistory, l *Op) string {
	if len(l.States) > 0 || l.More || slices.ContainsFunc(l.Listed, func(e Listed) bool { return e.ID == h.id }) {
		return ""
	}
	ack := firstAck(h, l.InvokeNs)
	cancelled := slices.ContainsFunc(h.cancels, func(c *Op) bool {
		return (c.Type == TypeOK || c.Type == TypeInfo) && c.InvokeNs < l.CompleteNs
	})
	if ack == nil || cancelled || upsertedBefore(h, l.CompleteNs) || (l.Pages > 1 && updateMayOverlap(h, l.InvokeNs, l.CompleteNs)) {
		return ""
	}
	why := a.notExpiredBy(h, l.CompleteNs)
	if why == "" {
		return ""
	}
	return fmt.Sprintf("%s did not list it: its schedule was acked at %s, no cancel of it may have happened, and %s",
		a.readName(l), a.rel(ack.CompleteNs), why)
}

// bulkTotalsWrong says why the totals a cancel_matching op received contradict each other,
// or "": a dry run cancels and skips nothing, and otherwise every matched event is counted
// once in cancelled, skipped_fired or skipped_held. Every progress message carries consistent
// running totals, so an info op's last one is judged too.
func bulkTotalsWrong(op *Op) string {
	if op.DryRun {
		if op.Cancelled != 0 || op.SkippedFired != 0 || op.SkippedHeld != 0 {
			return fmt.Sprintf("was a dry run, but reported cancelled=%d skipped_fired=%d skipped_held=%d",
				op.Cancelled, op.SkippedFired, op.SkippedHeld)
		}
		return ""
	}
	if (op.Type == TypeOK || op.Type == TypeInfo) && op.Matched != op.Cancelled+op.SkippedFired+op.SkippedHeld {
		return fmt.Sprintf("reported matched=%d, but cancelled+skipped_fired+skipped_held=%d+%d+%d",
			op.Matched, op.Cancelled, op.SkippedFired, op.SkippedHeld)
	}
	return ""
}

// idempotencyProblems lists what breaks design invariant 6 for one id. genuine are its
// records that are not phantoms.
func (a *analysis) idempotencyProblems(h *idHistory, genuine []*Record) []string {
	var problems []string

	// Two ok schedules that both claim to have created the id.
	var creators []string
	for _, op := range h.oks {
		if !op.Existing {
			creators = append(creators, fmt.Sprintf("op %d at %s", op.Index, a.rel(op.CompleteNs)))
		}
	}
	if len(creators) > 1 {
		problems = append(problems, fmt.Sprintf("%d ok schedules returned existing=false (%s)",
			len(creators), strings.Join(creators, ", ")))
	}

	// Every ok schedule carries the stored content: they must all agree, and identical
	// content must get the same due time (unless an update moved it in between: a re-send
	// then reports the event's due time as it is).
	updated := h.updated()
	dues := map[content][]int64{}
	var contents []content
	for _, op := range h.oks {
		c := contentOf(op)
		d, ok := dues[c]
		if !ok {
			contents = append(contents, c)
		}
		if op.AckDueNs != 0 && !slices.Contains(d, op.AckDueNs) && (!updated || len(d) == 0) {
			d = append(d, op.AckDueNs)
		}
		dues[c] = d
	}
	for _, c := range contents {
		if d := dues[c]; len(d) > 1 {
			problems = append(problems, fmt.Sprintf("ok schedules with identical content returned %d different due times (%s)",
				len(d), joinInts(d)))
		}
	}
	if len(contents) > 1 {
		problems = append(problems, fmt.Sprintf("ok schedules with different content: first accepted %s, also acked %s",
			contents[0], contents[1]))
	}

	// Records that each match a possible content but differ: two events under one id. (The
	// versions of an updated event differ by design: payloads are compared within one
	// version; the update check judges the versions.)
	var payloads, topics []string
	payloadOf := map[uint64]string{}
	for _, r := range genuine {
		if p, ok := payloadOf[max(r.Version, 1)]; !ok {
			payloadOf[max(r.Version, 1)] = r.Payload
		} else if p != r.Payload && !slices.Contains(payloads, r.Payload) {
			payloads = append(payloads, p, r.Payload)
		}
		if !a.isDeadLetter(r) && !slices.Contains(topics, r.Topic) {
			topics = append(topics, r.Topic)
		}
	}
	if len(payloads) > 1 {
		problems = append(problems, fmt.Sprintf("records of one version carry different payloads (%s, %s)",
			shortQuote(payloads[0]), shortQuote(payloads[1])))
	}
	if len(topics) > 1 {
		problems = append(problems, fmt.Sprintf("records were produced to %d different topics (%q, %q)",
			len(topics), topics[0], topics[1]))
	}
	return problems
}

// recovery measures, per fault, how long after its heal the last event due by then reached
// Kafka (first copies only: a later duplicate is not backlog).
func (a *analysis) recovery() []Recovery {
	out := make([]Recovery, 0, len(a.windows))
	for _, w := range a.windows {
		var last int64 = math.MinInt64
		for _, id := range a.order {
			h := a.ids[id]
			if len(h.records) == 0 || !h.accepted() || h.burst != "" {
				continue
			}
			r := h.records[0]
			// Backlog at the heal: events stored (acknowledged) and due by then, at the
			// end of their window when they have one.
			stored, ok := h.storedByNs()
			if ok && max(a.dueNs(h, r), stored)+h.windowNs(r) <= w.heal {
				last = max(last, r.AppendMs*1e6)
			}
		}
		ms := 0.0
		if last > w.heal {
			ms = roundMicro(float64(last-w.heal) / 1e6)
		}
		targets := w.targets
		if targets == nil {
			targets = []string{} // a fault on no node in particular (kafka) reads [] rather than null
		}
		out = append(out, Recovery{Kind: w.kind, Targets: targets, StartNs: w.start, HealNs: w.heal, RecoveryMs: ms})
	}
	return out
}

// ConvergenceProblems: every shard has exactly one leader, which is one of its replicas, and
// replicas agree on the applied index; replicas at the same applied index agree on the digest.
// With final.Replication set, every shard's configuration is also its replication factor of
// voters, all live members, none a removed node, and no non-voter left mid-change.
func ConvergenceProblems(final Cluster) []string {
	problems := []string{}
	if len(final.Shards) == 0 {
		return append(problems, "the final state lists no shards")
	}
	shards := slices.Clone(final.Shards)
	slices.SortStableFunc(shards, func(x, y ShardState) int { return cmp.Compare(x.ID, y.ID) })
	for _, s := range shards {
		var leaders []string
		for _, l := range s.Leaders {
			if !slices.Contains(leaders, l) {
				leaders = append(leaders, l)
			}
		}
		switch {
		case len(leaders) == 0:
			problems = append(problems, fmt.Sprintf("shard %d: no leader", s.ID))
		case len(leaders) > 1:
			problems = append(problems, fmt.Sprintf("shard %d: %d leaders (%s)", s.ID, len(leaders), strings.Join(leaders, ", ")))
		}
		if final.Replication > 0 {
			problems = append(problems, membershipProblems(s, final)...)
		}
		if len(s.Replicas) == 0 {
			problems = append(problems, fmt.Sprintf("shard %d: no replicas", s.ID))
			continue
		}
		for _, l := range leaders {
			if !slices.ContainsFunc(s.Replicas, func(r ReplicaState) bool { return r.Node == l }) {
				problems = append(problems, fmt.Sprintf("shard %d: leader %s is not one of its replicas", s.ID, l))
			}
		}
		var parts []string
		indexes := map[uint64]bool{}
		for _, r := range s.Replicas {
			indexes[r.AppliedIndex] = true
			parts = append(parts, fmt.Sprintf("%s=%d", r.Node, r.AppliedIndex))
		}
		if len(indexes) > 1 {
			problems = append(problems, fmt.Sprintf("shard %d: applied indexes differ (%s)", s.ID, strings.Join(parts, " ")))
		}
		byIndex := map[uint64][]ReplicaState{}
		for _, r := range s.Replicas {
			byIndex[r.AppliedIndex] = append(byIndex[r.AppliedIndex], r)
		}
		idx := make([]uint64, 0, len(byIndex))
		for i := range byIndex {
			idx = append(idx, i)
		}
		slices.Sort(idx)
		for _, i := range idx {
			group := byIndex[i]
			differ := false
			var parts []string
			for _, r := range group {
				differ = differ || r.Digest != group[0].Digest
				parts = append(parts, fmt.Sprintf("%s=%s", r.Node, r.Digest))
			}
			if differ {
				problems = append(problems, fmt.Sprintf("shard %d: digests differ at applied index %d (%s)",
					s.ID, i, strings.Join(parts, " ")))
			}
		}
	}
	return problems
}

// duplicateStep names the step of the fire path that made copy, a later record of first's
// event and version (see Results.DuplicatesByStep).
func duplicateStep(first, copy *Record) string {
	if copy.Attempt > first.Attempt {
		return "retried"
	}
	return "refired"
}

// membershipProblems: the shard's configuration after membership changes is its replication
// factor of voters on live members, none of them removed, and no non-voter still catching up.
func membershipProblems(s ShardState, final Cluster) []string {
	var problems []string
	if len(s.Leaders) == 0 {
		return nil // no leader reported a configuration; "no leader" says so
	}
	if len(s.Voters) != final.Replication {
		problems = append(problems, fmt.Sprintf("shard %d: %d voters (%s), want the replication factor %d",
			s.ID, len(s.Voters), strings.Join(s.Voters, ", "), final.Replication))
	}
	if len(s.Nonvoters) > 0 {
		problems = append(problems, fmt.Sprintf("shard %d: non-voters left in the configuration (%s)", s.ID, strings.Join(s.Nonvoters, ", ")))
	}
	for _, v := range s.Voters {
		switch {
		case slices.Contains(final.Removed, v):
			problems = append(problems, fmt.Sprintf("shard %d: voter %s is a removed node", s.ID, v))
		case !slices.Contains(final.Live, v):
			problems = append(problems, fmt.Sprintf("shard %d: voter %s is not a live member", s.ID, v))
		}
	}
	return problems
}

// quantiles summarises v (left unchanged) with latency.Quantile.
func quantiles(v []float64) Quantiles {
	if len(v) == 0 {
		return Quantiles{}
	}
	s := slices.Clone(v)
	return Quantiles{Count: len(s), P50: roundMicro(latency.Quantile(s, 0.50)), P99: roundMicro(latency.Quantile(s, 0.99)), Max: roundMicro(latency.Quantile(s, 1))}
}

// roundMicro rounds milliseconds to the microsecond, so results.json stays readable.
func roundMicro(ms float64) float64 { return math.Round(ms*1000) / 1000 }

func joinInts(v []int64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
