package checker

import (
	"fmt"
	"testing"
	"time"
)

// recurringRun is a run with one schedule "r1": every 2 s of the minute from t=10 s to t=30 s
// (catch-up all), created at t=1 s, every occurrence produced 5 ms late; and the ops added to
// it.
type recurringRun struct {
	ops  []Op
	recs []Record
}

// rbase is a whole minute, Unix time 1,699,999,980 s.
const rbase = int64(1_699_999_980) * 1e9

func rt(s float64) int64 { return rbase + int64(s*1e9) }

func newRecurringRun() *recurringRun {
	g := &recurringRun{}
	g.ops = append(g.ops, Op{F: FRecurring, Action: ActionCreate, ID: "r1", Cron: "*/2 * * * * *", TimeZone: "Europe/Paris",
		StartNs: rt(10), EndNs: rt(30), CatchUp: "all", Topic: "t", Payload: "p", InvokeNs: rt(1), CompleteNs: rt(1.01), Type: TypeOK})
	for s := 10.0; s <= 30; s += 2 {
		g.recs = append(g.recs, g.occurrence("r1", rt(s), rt(s)+5e6))
	}
	return g
}

func (g *recurringRun) occurrence(id string, nominal, appended int64) Record {
	ms := nominal / 1e6
	return Record{ID: fmt.Sprintf("%s@%d", id, ms), Topic: "t", Payload: "p", RecurringID: id, OccurrenceMs: ms,
		DueMs: ms, AppendMs: appended / 1e6, Offset: int64(len(g.recs))}
}

func (g *recurringRun) op(action string, invoke, complete float64, typ string) {
	g.ops = append(g.ops, Op{F: FRecurring, Action: action, ID: "r1", InvokeNs: rt(invoke), CompleteNs: rt(complete), Type: typ})
}

// drop removes the record of the occurrence at s.
func (g *recurringRun) drop(s float64) {
	for i, r := range g.recs {
		if r.OccurrenceMs == rt(s)/1e6 {
			g.recs = append(g.recs[:i], g.recs[i+1:]...)
			return
		}
	}
}

func (g *recurringRun) check() Results { return Check(g.ops, g.recs, cleanCluster(1), Config{}) }

func TestRecurringCleanRuns(t *testing.T) {
	g := newRecurringRun()
	res := g.check()
	assertClean(t, res)
	if res.Occurrences != 11 {
		t.Fatalf("occurrences = %d, want 11", res.Occurrences)
	}
	// A pause and a resume: what the pause held back is caught up after the resume, late.
	g = newRecurringRun()
	g.op(ActionPause, 15, 15.1, TypeOK)
	g.op(ActionResume, 21, 21.1, TypeOK)
	for i, r := range g.recs {
		if r.OccurrenceMs*1e6 > rt(15) && r.OccurrenceMs*1e6 <= rt(21) {
			g.recs[i].AppendMs = (rt(21.2) + int64(i)*1e6) / 1e6
		}
	}
	assertClean(t, g.check())
	// Deleted at 25 s: nothing after, and nothing missing is demanded.
	g = newRecurringRun()
	g.op(ActionDelete, 25, 25.1, TypeOK)
	g.drop(26)
	g.drop(28)
	g.drop(30)
	assertClean(t, g.check())
	// Paused at the end (the resume failed): what follows the pause is not demanded.
	g = newRecurringRun()
	g.op(ActionPause, 25, 25.1, TypeOK)
	g.op(ActionResume, 27, 27.1, TypeFail)
	g.drop(26)
	g.drop(28)
	g.drop(30)
	assertClean(t, g.check())
	// A backup holding an occurrence: the occurrence is its schedule's, not a phantom event.
	g = newRecurringRun()
	g.ops = append(g.ops, Op{F: FBackup, Type: TypeOK, Dir: "b", InvokeNs: rt(13), CompleteNs: rt(13.1),
		BackupShards: []BackupShard{{Shard: 0, Events: 1}}, BackupEvents: map[string]string{fmt.Sprintf("r1@%d", rt(12)/1e6): StateFired}})
	assertClean(t, g.check())
	// A duplicate of an occurrence first produced before a pause is no occurrence after it.
	g = newRecurringRun()
	g.op(ActionPause, 24.010, 24.020, TypeOK)
	g.op(ActionResume, 24.5, 24.6, TypeOK)
	g.recs = append(g.recs, g.occurrence("r1", rt(24), rt(24.3)))
	assertClean(t, g.check())
}

func TestPlantRecurringMissing(t *testing.T) {
	g := newRecurringRun()
	g.drop(20)
	assertOnly(t, g.check(), "recurring_missing", "r1")
}

func TestPlantRecurringEarly(t *testing.T) {
	g := newRecurringRun()
	g.recs[3].AppendMs = (rt(16) - 3e6) / 1e6
	assertOnly(t, g.check(), "recurring_early", "r1")
}

func TestPlantRecurringPhantom(t *testing.T) {
	for name, edit := range map[string]func(g *recurringRun){
		"an occurrence the rule does not generate": func(g *recurringRun) { g.recs = append(g.recs, g.occurrence("r1", rt(21), rt(21.01))) },
		"after the end": func(g *recurringRun) { g.recs = append(g.recs, g.occurrence("r1", rt(32), rt(32.01))) },
		"another payload": func(g *recurringRun) {
			r := g.recs[2]
			r.Payload = "q"
			g.recs = append(g.recs, r)
		},
		"an id not of its occurrence": func(g *recurringRun) {
			r := g.recs[2]
			r.ID = "r1@5"
			g.recs = append(g.recs, r)
		},
		"a schedule never created": func(g *recurringRun) {
			g.recs = append(g.recs, g.occurrence("r2", rt(12), rt(12.01)))
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := newRecurringRun()
			edit(g)
			id := "r1"
			if name == "a schedule never created" {
				id = "r2"
			}
			assertOnly(t, g.check(), "recurring_phantom", id)
		})
	}
}

func TestPlantRecurringAfterStop(t *testing.T) {
	// An occurrence first appended after an acked Delete.
	g := newRecurringRun()
	g.op(ActionDelete, 25, 25.1, TypeOK)
	g.drop(28)
	g.drop(30)
	assertOnly(t, g.check(), "recurring_after_stop", "r1") // the one of 26 s, appended at 26.005
	// An occurrence first appended after an acked Pause and before the Resume.
	g = newRecurringRun()
	g.op(ActionPause, 19, 19.1, TypeOK)
	g.op(ActionResume, 23, 23.1, TypeOK)
	for i, r := range g.recs {
		if r.OccurrenceMs*1e6 == rt(22) {
			g.recs[i].AppendMs = (rt(22) + 5e6) / 1e6 // before the resume: a broken pause
		} else if r.OccurrenceMs*1e6 == rt(20) {
			g.recs[i].AppendMs = rt(23.2) / 1e6 // caught up after the resume: fine
		}
	}
	assertOnly(t, g.check(), "recurring_after_stop", "r1")
}

func TestRecurringRuleArithmetic(t *testing.T) {
	every := ruleOf(&Op{EveryNs: int64(1500 * time.Millisecond), StartNs: rt(10), EndNs: rt(20)})
	if !every.generates(rt(11.5)) || every.generates(rt(11)) || every.generates(rt(8.5)) || every.generates(rt(21.5)) || every.next(rt(11.5)) != rt(13) {
		t.Fatal("every rule arithmetic")
	}
	cron := ruleOf(&Op{Cron: "*/3 * * * * *"})
	if !cron.supported || cron.next(rt(0)) != rt(3) || cron.next(rt(4)) != rt(6) || !cron.generates(rt(9)) || cron.generates(rt(10)) {
		t.Fatalf("cron rule arithmetic: %+v", cron)
	}
	if ruleOf(&Op{Cron: "0 2 * * *"}).supported || ruleOf(&Op{Cron: "*/7 * * * * *"}).supported {
		t.Fatal("a rule the checker cannot compute is supported")
	}
}
