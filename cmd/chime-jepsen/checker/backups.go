package checker

import (
	"fmt"
	"slices"
)

// finding is one violation of a check: the check's key and why.
type finding struct{ check, why string }

// backupInvalid says why backup op b contradicts its own directory, or "": an ok backup
// must read back (a manifest listing shards whose files match it and verify), and a failed
// one must not have left a manifest.json (a backup that fails leaves none, so that nothing
// mistakes it for a usable one).
func backupInvalid(b *Op) string {
	switch {
	case b.Type == TypeOK && b.BackupReadError != "":
		return fmt.Sprintf("completed, but its directory does not read back: %s", b.BackupReadError)
	case b.Type == TypeOK && len(b.BackupShards) == 0:
		return "completed, but its manifest lists no shards"
	case b.Type != TypeOK && b.LeftManifest:
		return fmt.Sprintf("failed (%s), but left a manifest.json", b.Error)
	}
	return ""
}

// backupFindings checks what each ok backup that reads back holds of the id of h
// (doc.go, check 7): backup_lost, backup_phantom, backup_wrong_state.
func (a *analysis) backupFindings(h *idHistory) []finding {
	var out []finding
	for _, b := range a.backups {
		if b.Type != TypeOK || backupInvalid(b) != "" {
			continue
		}
		name := fmt.Sprintf("backup %s (%s–%s)", b.Dir, a.rel(b.InvokeNs), a.rel(b.CompleteNs))
		state, held := b.BackupEvents[h.id]
		if !held {
			if ack := firstAck(h, b.InvokeNs); ack != nil {
				if why := a.notExpiredBy(h, b.CompleteNs); why != "" {
					out = append(out, finding{"backup_lost", fmt.Sprintf("%s does not hold it: its schedule was acked at %s, and %s",
						name, a.rel(ack.CompleteNs), why)})
				}
			}
			continue
		}
		if !invokedBefore(h, b.CompleteNs) {
			out = append(out, finding{"backup_phantom", fmt.Sprintf("%s holds it (%s), but no ok or info schedule of it was invoked before the backup completed",
				name, state)})
			continue
		}
		if why := a.stateRuledOut(h, state, b.InvokeNs, b.CompleteNs); why != "" {
			out = append(out, finding{"backup_wrong_state", fmt.Sprintf("%s holds it %s, but %s", name, state, why)})
		}
	}
	return out
}

// firstAck is the ok schedule of h that completed first before t, or nil.
func firstAck(h *idHistory, t int64) *Op {
	var first *Op
	for _, op := range h.oks {
		if op.CompleteNs < t && (first == nil || op.CompleteNs < first.CompleteNs) {
			first = op
		}
	}
	return first
}

// invokedBefore reports whether an ok or info schedule of h was invoked before t: only such
// an op can have stored the event by t.
func invokedBefore(h *idHistory, t int64) bool {
	return slices.ContainsFunc(h.schedules, func(op *Op) bool {
		return (op.Type == TypeOK || op.Type == TypeInfo) && op.InvokeNs < t
	})
}

// stateRuledOut says why a backup invoked at invoke and completed at complete cannot hold
// the event of h in state, or "". Each shard is copied at one moment in between, after a
// barrier: so it holds every settle acknowledged before invoke, and no settle that had not
// happened by complete.
//   - scheduled: not if a cancel of it was acked (ok) before invoke.
//   - cancelled: only if a cancel of it (ok or info) was invoked before complete.
//   - fired: only if a record of it reached its topic (not the dead-letter topic) by
//     complete: a leader marks an event fired once Kafka acknowledged it.
//   - dead_lettered: likewise, a record of it on the dead-letter topic.
//
// Record times are append times (the driver's clock, truncated to the millisecond: a real
// append before complete has AppendMs×1e6 <= complete).
func (a *analysis) stateRuledOut(h *idHistory, state string, invoke, complete int64) string {
	recordBy := func(deadLetter bool) bool {
		return slices.ContainsFunc(h.records, func(r *Record) bool {
			return a.isDeadLetter(r) == deadLetter && r.AppendMs*1e6 <= complete
		})
	}
	switch state {
	case StateScheduled:
		for _, op := range h.cancels {
			if op.Type == TypeOK && op.CompleteNs < invoke {
				return fmt.Sprintf("a cancel of it was acked at %s, before the backup was invoked", a.rel(op.CompleteNs))
			}
		}
	case StateCancelled:
		if !slices.ContainsFunc(h.cancels, func(op *Op) bool {
			return (op.Type == TypeOK || op.Type == TypeInfo) && op.InvokeNs < complete
		}) {
			return "no ok or info cancel of it was invoked before the backup completed"
		}
	case StateFired:
		if !recordBy(false) {
			return "no record of it reached its topic before the backup completed"
		}
	case StateDeadLettered:
		if !recordBy(true) {
			return "no record of it reached the dead-letter topic before the backup completed"
		}
	default:
		return "that is no event state"
	}
	return ""
}
