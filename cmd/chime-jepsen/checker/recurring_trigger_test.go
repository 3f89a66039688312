package checker

import (
	"testing"
)

// trigger adds an ok trigger of r1 at s, invoked then and acked 10 ms later, and the record
// of its occurrence, appended 20 ms after s (none when appended is 0).
func (g *recurringRun) trigger(s float64, appended float64) {
	g.ops = append(g.ops, Op{F: FRecurring, Action: ActionTrigger, ID: "r1", AtNs: rt(s), InvokeNs: rt(s), CompleteNs: rt(s + 0.01), Type: TypeOK})
	if appended != 0 {
		g.recs = append(g.recs, g.occurrence("r1", rt(s), rt(appended)))
	}
}

// newBackfillRun is newRecurringRun with r1's rule starting at -60 s, before its creation at
// 1 s, so that the instants before it are a backfill's alone (its own sequence starts at 2
// s); and an ok backfill of [-40 s, -30 s) invoked at 5 s that made its five instants,
// produced at 5.1 s.
func newBackfillRun() *recurringRun {
	g := newRecurringRun()
	g.ops[0].StartNs = rt(-60)
	for s := 2.0; s < 10; s += 2 {
		g.recs = append(g.recs, g.occurrence("r1", rt(s), rt(s)+5e6))
	}
	var created []int64
	for s := -40.0; s < -30; s += 2 {
		created = append(created, rt(s))
		g.recs = append(g.recs, g.occurrence("r1", rt(s), rt(5.1)))
	}
	g.ops = append(g.ops, Op{F: FRecurring, Action: ActionBackfill, ID: "r1", FromNs: rt(-40), ToNs: rt(-30), CreatedNs: created,
		InvokeNs: rt(5), CompleteNs: rt(5.05), Type: TypeOK})
	return g
}

func TestRecurringTriggerAndBackfillCleanRuns(t *testing.T) {
	// A trigger off the rule's instants: its occurrence is the schedule's, not a phantom.
	g := newRecurringRun()
	g.trigger(17.3, 17.32)
	res := g.check()
	assertClean(t, res)
	if res.Occurrences != 12 {
		t.Fatalf("occurrences = %d, want 11 and the triggered one", res.Occurrences)
	}
	// Triggered while paused: an operator's act, not an occurrence after the pause.
	g = newRecurringRun()
	g.op(ActionPause, 15, 15.1, TypeOK)
	g.op(ActionResume, 21, 21.1, TypeOK)
	for i, r := range g.recs {
		if r.OccurrenceMs*1e6 > rt(15) && r.OccurrenceMs*1e6 <= rt(21) {
			g.recs[i].AppendMs = (rt(21.2) + int64(i)*1e6) / 1e6
		}
	}
	g.trigger(17.3, 17.32)
	assertClean(t, g.check())
	// An ok trigger that found its occurrence existing, and an unknown one, demand nothing.
	g = newRecurringRun()
	g.trigger(17.3, 0)
	g.ops[len(g.ops)-1].Existing = true
	g.trigger(19.3, 0)
	g.ops[len(g.ops)-1].Type = TypeInfo
	assertClean(t, g.check())

	// A backfill of the rule's past, and its occurrences.
	g = newBackfillRun()
	res = g.check()
	assertClean(t, res)
	if res.Occurrences != 20 {
		t.Fatalf("occurrences = %d, want 15 and the five backfilled", res.Occurrences)
	}
	// What a pause held back, backfilled during the pause: not after the stop.
	g = newRecurringRun()
	g.op(ActionPause, 15, 15.1, TypeOK)
	g.ops = append(g.ops, Op{F: FRecurring, Action: ActionBackfill, ID: "r1", FromNs: rt(14), ToNs: rt(20), CreatedNs: []int64{rt(16), rt(18)},
		InvokeNs: rt(19.5), CompleteNs: rt(19.6), Type: TypeOK})
	g.op(ActionResume, 21, 21.1, TypeOK)
	for i, r := range g.recs {
		switch ns := r.OccurrenceMs * 1e6; {
		case ns == rt(16) || ns == rt(18):
			g.recs[i].AppendMs = rt(19.55) / 1e6
		case ns == rt(20):
			g.recs[i].AppendMs = rt(21.2) / 1e6
		}
	}
	assertClean(t, g.check())
}

func TestPlantRecurringTriggerLost(t *testing.T) {
	g := newRecurringRun()
	g.trigger(17.3, 0)
	assertOnly(t, g.check(), "recurring_trigger_lost", "r1")
}

func TestPlantRecurringTriggerEarly(t *testing.T) {
	g := newRecurringRun()
	g.trigger(17.3, 17.2) // produced before the trigger was invoked
	assertOnly(t, g.check(), "recurring_trigger_early", "r1")
}

func TestPlantRecurringBackfillLost(t *testing.T) {
	g := newBackfillRun()
	g.drop(-36)
	assertOnly(t, g.check(), "recurring_backfill_lost", "r1")
}

func TestPlantRecurringBackfillOutside(t *testing.T) {
	// An instant of the rule before the schedule existed, outside the backfill's range.
	g := newBackfillRun()
	g.recs = append(g.recs, g.occurrence("r1", rt(-50), rt(5.1)))
	assertOnly(t, g.check(), "recurring_backfill_outside", "r1")
	// Inside its range, but produced before the backfill was invoked.
	g = newBackfillRun()
	g.ops[len(g.ops)-1].CreatedNs = g.ops[len(g.ops)-1].CreatedNs[1:]
	g.drop(-40)
	g.recs = append(g.recs, g.occurrence("r1", rt(-40), rt(3)))
	assertOnly(t, g.check(), "recurring_backfill_outside", "r1")
}
