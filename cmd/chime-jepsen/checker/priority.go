package checker

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// Check 12: priority under a backlog. See doc.go.

// burstCheck is one burst as check 12 judged it: its result, and one finding per
// lower-priority event produced clearly before a higher-priority one of the burst.
type burstCheck struct {
	BurstResult
	findings []idFinding
}

// burstEvent is one event check 12 compares: its id, effective priority and append.
type burstEvent struct {
	id   string
	prio int
	at   int64
}

// priority runs check 12 over every burst (the schedule ops with an Op.Burst), by due time.
func (a *analysis) priority(ops []Op) []burstCheck {
	byTag := map[string][]*Op{}
	var tags []string
	for i := range ops {
		op := &ops[i]
		if op.F != FSchedule || op.Burst == "" || op.ID == "" {
			continue
		}
		if _, seen := byTag[op.Burst]; !seen {
			tags = append(tags, op.Burst)
		}
		byTag[op.Burst] = append(byTag[op.Burst], op)
	}
	out := make([]burstCheck, 0, len(tags))
	for _, tag := range tags {
		out = append(out, a.burst(tag, byTag[tag]))
	}
	slices.SortStableFunc(out, func(x, y burstCheck) int {
		return cmp.Or(cmp.Compare(x.DueNs, y.DueNs), cmp.Compare(x.Burst, y.Burst))
	})
	return out
}

// burst judges one burst, whose schedule ops are ops.
func (a *analysis) burst(tag string, ops []*Op) burstCheck {
	b := burstCheck{BurstResult: BurstResult{Burst: tag}}
	acked := map[string]*Op{} // id → its first ok schedule in the burst
	seen := map[string]bool{}
	var ids []string
	var asked int64
	for _, op := range ops {
		if !seen[op.ID] {
			seen[op.ID] = true
			ids = append(ids, op.ID)
		}
		asked = max(asked, op.DeliverAtNs)
		if op.Type != TypeOK {
			continue
		}
		due := op.AckDueNs
		if due == 0 {
			due = op.DeliverAtNs
		}
		b.DueNs = max(b.DueNs, due)
		if acked[op.ID] == nil {
			acked[op.ID] = op
		}
	}
	slices.Sort(ids)
	b.Events = len(ids)
	first := int64(math.MaxInt64)
	for _, id := range ids {
		for _, r := range a.ids[id].records {
			b.LastAppendNs = max(b.LastAppendNs, r.AppendMs*1e6)
			first = min(first, r.AppendMs*1e6)
		}
	}
	d := b.DueNs
	switch {
	case len(acked) == 0:
		b.DueNs = asked
		b.Skipped = "no event of it was acknowledged"
		return b
	case b.LastAppendNs == 0:
		b.Skipped = "no record of it was read back"
		return b
	}
	b.DrainMs = roundMicro(float64(b.LastAppendNs-d) / 1e6)
	// From D, or from the first append when a leader whose clock runs
	// ahead (skew) produced the burst before D.
	begin, end := min(d, first), b.LastAppendNs+int64(time.Second)
	for _, w := range a.windows {
		if w.start <= end && w.heal >= begin {
			b.Skipped = fmt.Sprintf("fault window %s (%s–%s) overlaps [due or first append %s, last append %s + 1s]",
				w.kind, a.rel(w.start), a.rel(w.heal), a.rel(begin), a.rel(b.LastAppendNs))
			return b
		}
	}

	// The events compared: acknowledged by D, without a window, never cancelled or updated
	// (ok or info), and produced exactly once, to their own topic, at the first attempt.
	var evs []burstEvent
	for _, id := range ids {
		op, h := acked[id], a.ids[id]
		if op == nil || op.CompleteNs > d || op.WindowNs != 0 || cancelMayHaveHappened(h) || h.updated() ||
			len(h.records) != 1 {
			continue
		}
		if r := h.records[0]; r.Attempt == 1 && r.Topic == op.Topic {
			evs = append(evs, burstEvent{id: id, prio: op.EffectivePriority(), at: r.AppendMs * 1e6})
		}
	}
	b.Judged = len(evs)
	slices.SortStableFunc(evs, func(x, y burstEvent) int { return cmp.Or(cmp.Compare(x.at, y.at), cmp.Compare(x.id, y.id)) })

	// A violation is a pair (L, H): H of higher priority, appended more than the tolerance
	// after L. Sorted by append, every H of an L comes after it. One finding per L names the
	// H appended last.
	tol := int64(a.cfg.PriorityTolerance)
	for i, l := range evs {
		n, worst := 0, -1
		for j := i + 1; j < len(evs); j++ {
			if h := evs[j]; h.prio > l.prio && h.at > l.at+tol {
				n++
				worst = j
			}
		}
		if n == 0 {
			continue
		}
		b.Violations += n
		h := evs[worst]
		more := ""
		if n > 1 {
			more = fmt.Sprintf(", and %d more of higher priority appended over the tolerance after it", n-1)
		}
		b.findings = append(b.findings, idFinding{l.id, finding{"priority_violations",
			fmt.Sprintf("burst %s (due %s): priority %d, appended at %s, %s before %s of priority %d (appended at %s)%s; tolerance %s",
				tag, a.rel(d), l.prio, a.rel(l.at), time.Duration(h.at-l.at), h.id, h.prio, a.rel(h.at), more,
				a.cfg.PriorityTolerance)}})
	}
	return b
}
