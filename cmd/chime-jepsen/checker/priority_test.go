package checker

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// burstRun is a run with one burst "B1": 20 events "b1-00".."b1-19" on topic "jepsen-burst",
// all due at D (t0+10 s), acked at D−1 s; b1-i has priority i%10, except b1-05, whose
// priority is unset (5). Each is produced once, at attempt 1, in priority order (highest
// first, then by id), 100 ms apart from D+5 ms: b1-09 at D+5 ms, b1-19 at D+105 ms, b1-08
// at D+205 ms, b1-18 at D+305 ms, ..., b1-10 at D+1.905 s.
type burstRun struct {
	ops  []Op
	recs []Record
	cfg  Config
}

var burstD = at(10 * time.Second)

func newBurstRun() *burstRun {
	g := &burstRun{}
	g.addBurst("B1", "b1", burstD, 20)
	return g
}

// addBurst adds burst tag of n events "<prefix>-NN" due at d, produced as newBurstRun says.
func (g *burstRun) addBurst(tag, prefix string, d int64, n int) {
	rank := 0
	for p := 9; p >= 0; p-- {
		for i := range n {
			if i%10 != p {
				continue
			}
			id := fmt.Sprintf("%s-%02d", prefix, i)
			op := Op{Index: len(g.ops), F: FSchedule, ID: id, Topic: "jepsen-burst", Payload: "p-" + id, DeliverAtNs: d,
				Burst: tag, InvokeNs: d - int64(time.Second) - 3e6, CompleteNs: d - int64(time.Second), Type: TypeOK, AckDueNs: d}
			if i != 5 {
				prio := uint32(p)
				op.Priority = &prio
			}
			g.ops = append(g.ops, op)
			appended := d + 5e6 + int64(rank)*1e8
			g.recs = append(g.recs, Record{ID: id, Topic: "jepsen-burst", Payload: "p-" + id, DueMs: d / 1e6, Attempt: 1,
				AppendMs: appended / 1e6, Offset: int64(len(g.recs))})
			rank++
		}
	}
}

func (g *burstRun) op(id string) *Op {
	for i := range g.ops {
		if g.ops[i].ID == id && g.ops[i].F == FSchedule {
			return &g.ops[i]
		}
	}
	panic("no op " + id)
}

func (g *burstRun) rec(id string) *Record {
	for i := range g.recs {
		if g.recs[i].ID == id {
			return &g.recs[i]
		}
	}
	panic("no record " + id)
}

// appendAt moves the record of id to D + d.
func (g *burstRun) appendAt(id string, d time.Duration) {
	g.rec(id).AppendMs = (burstD + int64(d)) / 1e6
}

func (g *burstRun) fault(kind string, start, heal int64) {
	g.ops = append(g.ops, Op{Index: len(g.ops), F: FNemesis, Kind: kind, InvokeNs: start, CompleteNs: heal, Type: TypeInfo})
}

func (g *burstRun) check() Results { return Check(g.ops, g.recs, cleanCluster(1), g.cfg) }

// assertBursts: checked bursts were judged, skipped ones not, and each has its entry.
func assertBursts(t *testing.T, res Results, checked, skipped int) {
	t.Helper()
	if res.BurstsChecked != checked || res.BurstsSkipped != skipped || len(res.Bursts) != checked+skipped {
		t.Fatalf("bursts checked %d skipped %d (%+v), want %d and %d", res.BurstsChecked, res.BurstsSkipped, res.Bursts, checked, skipped)
	}
}

func TestPriorityCleanBurstPasses(t *testing.T) {
	g := newBurstRun()
	res := g.check()
	assertClean(t, res)
	assertBursts(t, res, 1, 0)
	want := BurstResult{Burst: "B1", DueNs: burstD, Events: 20, Judged: 20, LastAppendNs: burstD + 1905e6, DrainMs: 1905}
	if res.Bursts[0] != want {
		t.Errorf("burst = %+v\nwant    %+v", res.Bursts[0], want)
	}
	// The rate limit delays a burst by design: its drain is measured here, not as lateness.
	if res.LatenessMs.Healthy.Count != 0 || len(res.Recovery) != 0 {
		t.Errorf("lateness %+v: a burst's events are not in it", res.LatenessMs)
	}

	// Neighbours overlapping by up to the tolerance pass: b1-08 (priority 8) appended 400 ms
	// before b1-09 (9), the unset b1-05 (5) with b1-06 (6).
	g.appendAt("b1-09", 605*time.Millisecond)
	g.appendAt("b1-08", 205*time.Millisecond)
	g.appendAt("b1-05", 805*time.Millisecond) // ranks: b1-06 at 705 ms, b1-16 at 805
	g.appendAt("b1-06", 1205*time.Millisecond)
	assertClean(t, g.check())

	// Two bursts (two shards) at once are judged apart: B2's low priorities may come before
	// B1's high ones.
	g = newBurstRun()
	g.addBurst("B2", "b2", burstD, 20)
	for i := range g.recs[20:] { // B2's, highest first: reversed, lowest first
		g.recs[20+i].AppendMs = (burstD + 5e6 + int64(19-i)*1e8) / 1e6
	}
	g.cfg.PriorityTolerance = time.Nanosecond
	res = g.check()
	if res.PriorityViolations == 0 || res.Bursts[0].Violations != 0 || res.Bursts[1].Burst != "B2" {
		t.Fatalf("B2 reversed: priority_violations %d, bursts %+v; want B2's only", res.PriorityViolations, res.Bursts)
	}
	for _, ex := range res.Examples["priority_violations"] {
		if !strings.HasPrefix(ex.ID, "b2-") || !strings.Contains(ex.Why, "burst B2") {
			t.Errorf("example %v is not B2's", ex)
		}
	}
}

// A lower-priority event produced clearly before an already-due higher-priority one: b1-09
// (priority 9) appended at D+1.205 s, after b1-08 (D+205 ms, 8), b1-18 (305, 8), b1-07 (405,
// 7), b1-17 (505, 7) and b1-06 (605, 6) by more than 500 ms: five pairs.
func TestPlantPriorityInversion(t *testing.T) {
	g := newBurstRun()
	g.appendAt("b1-09", 1205*time.Millisecond)
	res := g.check()
	if res.Valid || res.PriorityViolations != 5 || res.Bursts[0].Violations != 5 {
		t.Fatalf("valid %v, priority_violations %d, bursts %+v; want invalid with 5", res.Valid, res.PriorityViolations, res.Bursts)
	}
	for k, n := range violations(res) {
		if k != "priority_violations" && n != 0 {
			t.Errorf("%s = %d, want 0", k, n)
		}
	}
	ex := res.Examples["priority_violations"]
	var ids []string
	for _, e := range ex {
		ids = append(ids, e.ID)
	}
	if fmt.Sprint(ids) != "[b1-08 b1-18 b1-07 b1-17 b1-06]" {
		t.Fatalf("examples name %v, want the five lower-priority events in append order", ids)
	}
	// (t=0 is the first invocation, D−1.003 s.)
	if want := "burst B1 (due t=1.003s): priority 8, appended at t=1.208s, 1s before b1-09 of priority 9 (appended at t=2.208s); tolerance 500ms"; ex[0].Why != want {
		t.Errorf("example %q lacks %q", ex[0].Why, want)
	}
	t.Logf("%s: %s", ex[0].ID, ex[0].Why)

	// An unset priority is 5: b1-05 produced first, at D, is below b1-17 (7, at D+505 ms),
	// b1-06 and b1-16 (6, at D+605 and 705 ms).
	g = newBurstRun()
	g.appendAt("b1-05", 0)
	res = g.check()
	if ex := res.Examples["priority_violations"]; res.PriorityViolations != 3 || len(ex) != 1 ||
		!strings.Contains(ex[0].Why, "priority 5, appended at t=1.003s, 705ms before b1-16 of priority 6 (appended at t=1.708s), and 2 more") {
		t.Errorf("unset priority produced first: priority_violations %d, examples %v; want 3 pairs, one example", res.PriorityViolations, ex)
	}
	// One L, one H (the edge of the tolerance is TestPriorityTolerance's).
	g = newBurstRun()
	g.appendAt("b1-09", 706*time.Millisecond)
	assertOnly(t, g.check(), "priority_violations", "b1-08")
}

func TestPriorityTolerance(t *testing.T) {
	// b1-08 at D+205 ms; b1-09 moved to D+205 ms + tolerance: not clearly after it.
	g := newBurstRun()
	g.appendAt("b1-09", 705*time.Millisecond)
	assertClean(t, g.check())
	g.appendAt("b1-09", 706*time.Millisecond)
	assertOnly(t, g.check(), "priority_violations", "b1-08")
	// Another tolerance moves the edge. A negative one means zero: the run in priority
	// order still passes, and a higher priority appended 1 ms after a lower one fails.
	g.cfg.PriorityTolerance = 501 * time.Millisecond
	assertClean(t, g.check())
	g = newBurstRun()
	g.cfg.PriorityTolerance = -1
	assertClean(t, g.check())
	g.appendAt("b1-19", 206*time.Millisecond) // 1 ms after b1-08
	res := g.check()
	assertOnly(t, res, "priority_violations", "b1-08")
	if res.Config.PriorityToleranceNs != 0 {
		t.Errorf("priority_tolerance_ns = %d, want 0", res.Config.PriorityToleranceNs)
	}
	if res := newBurstRun().check(); res.Config.PriorityToleranceNs != int64(DefaultPriorityTolerance) {
		t.Errorf("default priority_tolerance_ns = %d", res.Config.PriorityToleranceNs)
	}
}

// A fault window overlapping [D, last append + 1 s] skips the burst: a leader change or a
// cut mid-burst reorders production legitimately. The burst's last append is D+1.905 s.
func TestPriorityBurstUnderFaultSkipped(t *testing.T) {
	last := burstD + 1905e6
	cases := []struct {
		name        string
		start, heal int64
		skipped     bool
	}{
		{"healed after D", burstD - 3e9, burstD, true},
		{"started within the drain", burstD + 1e9, burstD + 5e9, true},
		{"started within a second of the last append", last + 1e9, last + 5e9, true},
		{"started over a second after the last append", last + 1e9 + 1e6, last + 5e9, false},
		{"healed before D", burstD - 3e9, burstD - 1, false},
		{"never healed, started before D", burstD - 3e9, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newBurstRun()
			g.appendAt("b1-09", 1205*time.Millisecond) // an inversion, judged only when checked
			if tc.heal == 0 {
				last := burstD + 20e9 // a window never healed lasts to the end of the run
				g.recs = append(g.recs, Record{ID: "late", Topic: "x", AppendMs: last / 1e6})
				g.ops = append(g.ops, Op{F: FSchedule, ID: "late", Topic: "x", Payload: "", DeliverAtNs: last, Type: TypeOK, AckDueNs: last,
					InvokeNs: last - 2e9, CompleteNs: last - 2e9})
			}
			g.fault("kill", tc.start, tc.heal)
			res := g.check()
			if !tc.skipped {
				assertBursts(t, res, 1, 0)
				if res.PriorityViolations != 5 {
					t.Errorf("priority_violations %d, want 5", res.PriorityViolations)
				}
				return
			}
			assertClean(t, res)
			assertBursts(t, res, 0, 1)
			if b := res.Bursts[0]; !strings.Contains(b.Skipped, "fault window kill") || b.Violations != 0 || b.Judged != 0 {
				t.Errorf("burst %+v", b)
			}
		})
	}
}

// A burst a leader whose clock ran ahead produced before D, during a skew window that
// healed before D, is skipped: a fault run judged such a burst, its order broken when the
// clock went back mid-drain, as 3,972 violations.
func TestPrioritySkewedBurstBeforeDSkipped(t *testing.T) {
	g := newBurstRun()
	g.appendAt("b1-09", 1205*time.Millisecond) // an inversion, judged only when checked
	for i := range g.recs {
		g.recs[i].AppendMs -= 2500 // every record 2.5 s early: the last at D−595 ms
	}
	g.fault("skew", burstD-6e9, burstD-100e6)
	res := g.check()
	assertBursts(t, res, 0, 1)
	if b := res.Bursts[0]; !strings.Contains(b.Skipped, "fault window skew") || b.Violations != 0 || res.PriorityViolations != 0 {
		t.Errorf("burst %+v, priority_violations %d", b, res.PriorityViolations)
	}
}

// Only an event acked by D, without a window, never cancelled or updated, and produced
// exactly once, to its topic, at attempt 1 is compared: the late H of the planted inversion
// excuses it in each of these ways.
func TestPriorityIgnoresRetriedAndDuplicated(t *testing.T) {
	cases := []struct {
		name   string
		change func(g *burstRun)
	}{
		{"retried (attempt 2)", func(g *burstRun) { g.rec("b1-09").Attempt = 2 }},
		{"no attempt header", func(g *burstRun) { g.rec("b1-09").Attempt = 0 }},
		{"duplicated", func(g *burstRun) {
			dup := *g.rec("b1-09")
			dup.Offset, dup.AppendMs = 999, dup.AppendMs+30
			g.recs = append(g.recs, dup)
		}},
		{"dead-lettered", func(g *burstRun) { g.rec("b1-09").Topic = DefaultDeadLetterTopic }},
		{"acked after D", func(g *burstRun) { g.op("b1-09").CompleteNs = burstD + 1 }},
		{"windowed", func(g *burstRun) { g.op("b1-09").WindowNs = int64(2 * time.Second) }},
		{"unknown outcome", func(g *burstRun) { g.op("b1-09").Type = TypeInfo }},
		{"cancelled, outcome unknown", func(g *burstRun) {
			g.ops = append(g.ops, Op{Index: len(g.ops), F: FCancel, ID: "b1-09", Type: TypeInfo, InvokeNs: burstD + 1e9, CompleteNs: burstD + 2e9})
		}},
		{"updated", func(g *burstRun) {
			g.ops = append(g.ops, Op{Index: len(g.ops), F: FUpdate, ID: "b1-09", Payload: "p-b1-09", Type: TypeInfo, DeliverAtNs: burstD,
				InvokeNs: burstD - 5e8, CompleteNs: burstD + 2e9})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newBurstRun()
			g.appendAt("b1-09", 1205*time.Millisecond)
			tc.change(g)
			res := g.check()
			if res.PriorityViolations != 0 || res.BurstsChecked != 1 || res.Bursts[0].Judged != 19 {
				t.Fatalf("priority_violations %d, bursts %+v; want b1-09 left out", res.PriorityViolations, res.Bursts)
			}
			if tc.name == "duplicated" && res.Duplicates != 1 {
				t.Errorf("duplicates %d", res.Duplicates)
			}
		})
	}
	// The same holds for L: b1-08 retried is not compared with b1-09.
	g := newBurstRun()
	g.appendAt("b1-09", 706*time.Millisecond)
	g.rec("b1-08").Attempt = 2
	if res := g.check(); res.PriorityViolations != 0 || !res.Valid {
		t.Errorf("retried L: priority_violations %d", res.PriorityViolations)
	}
}

// A burst with nothing acked, or nothing read back, is skipped, not checked.
func TestPriorityBurstWithNothingToJudge(t *testing.T) {
	g := newBurstRun()
	for i := range g.ops {
		g.ops[i].Type, g.ops[i].AckDueNs = TypeFail, 0
	}
	g.recs = nil
	res := g.check()
	assertClean(t, res)
	assertBursts(t, res, 0, 1)
	if b := res.Bursts[0]; b.Skipped != "no event of it was acknowledged" || b.DueNs != burstD {
		t.Errorf("burst %+v", b)
	}
	g = newBurstRun()
	for i := range g.ops {
		g.ops[i].Type = TypeInfo
	}
	g.recs = nil
	g.ops[0].Type = TypeOK
	res = g.check()
	assertOnly(t, res, "lost", g.ops[0].ID)
	assertBursts(t, res, 0, 1)
	if b := res.Bursts[0]; b.Skipped != "no record of it was read back" {
		t.Errorf("burst %+v", b)
	}
}
