package checker

import "fmt"

// settledNs is the earliest the event of h can have settled, on the driver's clock: its
// first record's append (an event is marked fired only after Kafka acknowledged it) or
// the invocation of its first cancel that may have happened, whichever is earlier; ok is
// false when neither exists, so that the event is still pending (or lost).
func (h *idHistory) settledNs() (at int64, ok bool) {
	if len(h.records) > 0 {
		at, ok = h.records[0].AppendMs*1e6, true
	}
	for _, op := range h.cancels {
		if (op.Type == TypeOK || op.Type == TypeInfo) && (!ok || op.InvokeNs < at) {
			at, ok = op.InvokeNs, true
		}
	}
	return at, ok
}

// notFound reports whether op is a get that found no event.
func notFound(op *Op) bool { return op.Type == TypeFail && op.Code == CodeNotFound }

// skewAllowance is how early the retention may remove an event whose life on the cluster
// spans [from, to] because of skew windows in it: the largest |SkewNs| of a skew window
// that overlaps it; unknown (ok false) when such a window's skew is not recorded. The
// leader's clock decides both when an event settled and when it expires, so a clock moved
// either way can remove it that much early.
func (a *analysis) skewAllowance(from, to int64) (allow int64, ok bool) {
	for _, w := range a.windows {
		if w.kind != KindSkew || w.heal < from || w.start > to {
			continue
		}
		if w.skew == 0 {
			return 0, false
		}
		allow = max(allow, w.skew, -w.skew)
	}
	return allow, true
}

// expiredEarly returns the gets of h that found no event although an acknowledged event
// was stored and cannot have expired yet (notExpiredBy). An event is acknowledged by an ok
// schedule that completed before the get was invoked.
func (a *analysis) expiredEarly(h *idHistory) (bad []*Op, why []string) {
	for _, g := range h.gets {
		if !notFound(g) || !acked(h, g.InvokeNs) {
			continue
		}
		if reason := a.notExpiredBy(h, g.CompleteNs); reason != "" {
			bad, why = append(bad, g), append(why, fmt.Sprintf("get at %s found nothing, but %s", a.rel(g.InvokeNs), reason))
		}
	}
	return bad, why
}

// notExpiredBy says why the event of h cannot have been removed by the retention by t, or
// "" when it may have been: it had not settled by t, or the retention is off, or it
// settled less than the retention before t, allowing for the skew windows in between
// (skewAllowance; a window whose skew is not recorded allows anything).
func (a *analysis) notExpiredBy(h *idHistory, t int64) string {
	settled, ok := h.settledNs()
	switch {
	case !ok || settled > t:
		return "the event was acked and has not settled"
	case a.cfg.Retention <= 0:
		return fmt.Sprintf("the event settled at %s and the retention is off", a.rel(settled))
	}
	allow, known := a.skewAllowance(settled, t)
	if known && t < settled+int64(a.cfg.Retention)-allow {
		return fmt.Sprintf("the event settled at %s, less than the retention (%v) before", a.rel(settled), a.cfg.Retention)
	}
	return ""
}

// acked reports whether an ok schedule of h completed before t.
func acked(h *idHistory, t int64) bool {
	for _, op := range h.oks {
		if op.CompleteNs < t {
			return true
		}
	}
	return false
}

// resurrection finds a get that found the event after an earlier get had found it removed
// (nothing settled comes back), unless a schedule may have created it anew: one that is
// info (it may take effect at any later time) or that completed ok after the get that
// found nothing was invoked.
func (a *analysis) resurrection(h *idHistory) string {
	for _, gone := range h.gets {
		if !notFound(gone) || !acked(h, gone.InvokeNs) {
			continue
		}
		for _, op := range h.schedules {
			if op.Type == TypeInfo || (op.Type == TypeOK && op.CompleteNs > gone.InvokeNs) {
				return ""
			}
		}
		for _, g := range h.gets {
			if g.Type == TypeOK && g.InvokeNs > gone.CompleteNs {
				return fmt.Sprintf("get at %s found nothing, and the get at %s found it %s", a.rel(gone.InvokeNs), a.rel(g.InvokeNs), g.State)
			}
		}
	}
	return ""
}
