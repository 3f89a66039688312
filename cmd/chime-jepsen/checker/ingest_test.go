package checker

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// ingestScenarios are the ingest keys every generated run has (addIngest), in rotation.
var ingestScenarios = []string{
	"ingest_plain",          // schedule acked (a delay), fires
	"ingest_deliver_at",     // schedule acked (a deliver-at in Unix ms), fires
	"ingest_tombstoned",     // schedule acked, due 30-40 s later; tombstone acked 1-3 s after: never fires
	"ingest_tombstone_race", // schedule acked, tombstone acked within ±50 ms of due: fires or not
	"ingest_replaced",       // schedule acked, a second one 1-2 s later, before the first was due: only the second fires
	"ingest_refired",        // schedule acked and fired, then a second one: both fire
	"ingest_cut",            // due inside a fault window; tombstone acked in it, applied after the heal: fired after the tombstone's ack
	"ingest_unknown",        // a schedule whose ack was lost (info): fires or not
	"ingest_deadletter",     // schedule acked, fired to the dead-letter topic
}

const ingestTopic = "chime.schedule"

// addIngest adds n ingest keys to g, in the rotation of ingestScenarios, as a correct Chime
// would have handled them: each record applied 20 ms after its ack (inside a fault window, 20
// ms after the heal), so that a partition's records are applied in offset order, and fired
// 0-30 ms after its due (inside a fault window, up to 2 s after the heal). Offsets follow
// the acks, per partition.
func (g *run) addIngest(r *rand.Rand, n int) {
	first := len(g.ops)
	defer func() {
		var acked []*Op
		for i := first; i < len(g.ops); i++ {
			if g.ops[i].Type == TypeOK {
				acked = append(acked, &g.ops[i])
			}
		}
		slices.SortStableFunc(acked, func(x, y *Op) int { return cmp.Compare(x.CompleteNs, y.CompleteNs) })
		offsets := map[int32]int64{}
		for _, op := range acked {
			op.Offset = offsets[op.Partition]
			offsets[op.Partition]++
		}
	}()
	lat := func() int64 { return int64(time.Millisecond) + r.Int64N(int64(4*time.Millisecond)) }
	healOf := func(t int64) (int64, bool) {
		for _, w := range genWindows {
			if t >= at(w.start) && t <= at(w.end) {
				return at(w.end), true
			}
		}
		return 0, false
	}
	applied := func(ack int64) int64 {
		if heal, ok := healOf(ack); ok {
			return heal + int64(20*time.Millisecond)
		}
		return ack + int64(20*time.Millisecond)
	}
	fired := func(due int64) int64 {
		if heal, ok := healOf(due); ok {
			return heal + r.Int64N(int64(2*time.Second))
		}
		return due + r.Int64N(int64(30*time.Millisecond))
	}
	for i := range n {
		sc := ingestScenarios[i%len(ingestScenarios)]
		key := fmt.Sprintf("k-%d", i)
		id := ingestTopic + "/" + key
		g.ids[sc] = append(g.ids[sc], id)
		hsh := fnv.New32a()
		hsh.Write([]byte(key))
		part := int32(hsh.Sum32() % 4)
		topic := []string{"reminders", "payments"}[r.IntN(2)]
		seq := 0
		// produce adds one ingest op invoked at inv: a schedule (delay or deliverAt) or a
		// tombstone (both zero and tomb), acked unless typ says otherwise; it returns the op.
		produce := func(inv int64, delay time.Duration, deliverAt int64, tomb bool, typ string) Op {
			op := Op{F: FIngest, Action: IngestSchedule, ID: id, Topic: topic, InvokeNs: inv, CompleteNs: inv + lat(), Type: typ,
				Process: 500, Node: "kafka"}
			if tomb {
				op.Action, op.Topic = IngestTombstone, ""
			} else {
				seq++
				op.Payload = fmt.Sprintf("p-%s-%d", key, seq)
				op.DelayNs, op.DeliverAtNs = int64(delay), deliverAt
			}
			if typ == TypeOK {
				op.Partition = part // the offset is set at the end, by ack
			} else {
				op.Error = "context deadline exceeded"
			}
			g.ops = append(g.ops, op)
			return op
		}
		fire := func(op Op, appendNs int64, onTopic string) {
			g.recs = append(g.recs, Record{ID: id, Topic: onTopic, Partition: int32(r.IntN(4)), Offset: int64(len(g.recs)),
				Payload: op.Payload, Attempt: 1, Version: 1, AppendMs: appendNs / 1e6, ReceivedNs: appendNs + 5e6})
		}
		inv := at(time.Duration(r.Int64N(int64(80 * time.Second))))
		delay := 500*time.Millisecond + time.Duration(r.Int64N(int64(5*time.Second)))
		switch sc {
		case "ingest_plain":
			op := produce(inv, delay, 0, false, TypeOK)
			fire(op, fired(applied(op.CompleteNs)+int64(delay)), topic)
		case "ingest_deliver_at":
			d := (inv + int64(delay)) / 1e6 * 1e6
			op := produce(inv, 0, d, false, TypeOK)
			fire(op, fired(max(d, applied(op.CompleteNs))), topic)
		case "ingest_deadletter":
			op := produce(inv, delay, 0, false, TypeOK)
			fire(op, fired(applied(op.CompleteNs)+int64(delay))+int64(300*time.Millisecond), DefaultDeadLetterTopic)
		case "ingest_tombstoned":
			inv = at(time.Duration(r.Int64N(int64(40 * time.Second))))
			op := produce(inv, 30*time.Second+time.Duration(r.Int64N(int64(10*time.Second))), 0, false, TypeOK)
			produce(op.CompleteNs+int64(time.Second)+r.Int64N(int64(2*time.Second)), 0, 0, true, TypeOK)
		case "ingest_tombstone_race":
			op := produce(inv, delay, 0, false, TypeOK)
			due := applied(op.CompleteNs) + int64(delay)
			t := produce(due-int64(50*time.Millisecond)+r.Int64N(int64(100*time.Millisecond)), 0, 0, true, TypeOK)
			if tApplied := applied(t.CompleteNs); tApplied > due {
				fire(op, min(fired(due), tApplied), topic) // fired before the tombstone was applied
			}
		case "ingest_replaced":
			op := produce(inv, 5*time.Second+delay, 0, false, TypeOK)
			second := produce(op.CompleteNs+int64(time.Second)+r.Int64N(int64(time.Second)), delay, 0, false, TypeOK)
			fire(second, fired(applied(second.CompleteNs)+int64(delay)), topic)
		case "ingest_refired":
			op := produce(inv, delay, 0, false, TypeOK)
			f := fired(applied(op.CompleteNs) + int64(delay))
			fire(op, f, topic)
			second := produce(f+int64(time.Second), delay, 0, false, TypeOK)
			fire(second, fired(applied(second.CompleteNs)+int64(delay)), topic)
		case "ingest_cut":
			// The kafka window [70 s, 72 s]: the consumer of the key's partition is cut off, so
			// the tombstone acked inside it is applied only after the heal; the event, due
			// inside it, fires on time from another node, after the tombstone's ack.
			op := produce(at(69*time.Second), 1500*time.Millisecond, 0, false, TypeOK)
			due := op.CompleteNs + int64(10*time.Millisecond) + int64(1500*time.Millisecond)
			produce(at(70*time.Second)+r.Int64N(int64(500*time.Millisecond)), 0, 0, true, TypeOK)
			fire(op, due+r.Int64N(int64(300*time.Millisecond)), topic)
		case "ingest_unknown":
			op := produce(inv, delay, 0, false, TypeInfo)
			if r.IntN(2) == 0 {
				fire(op, fired(applied(op.CompleteNs)+int64(delay)), topic)
			}
		}
	}
}

// ingestRun is a generated run (genClean) that has every ingest scenario.
func ingestRun(t *testing.T) *run {
	t.Helper()
	g := genClean(7, 650)
	for _, sc := range ingestScenarios {
		if len(g.ids[sc]) == 0 {
			t.Fatalf("no ingest id for %s", sc)
		}
	}
	return g
}

// ingestOp returns the index in g.ops of the k-th ingest op of id.
func (g *run) ingestOp(id string, k int) int {
	return g.opsOf(id, FIngest)[k]
}

func TestIngestCleanRunsPass(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		g := genClean(seed, 800)
		res := g.check()
		assertClean(t, res)
		if res.Duplicates != 0 {
			t.Errorf("seed %d: duplicates %d, want 0: %v", seed, res.Duplicates, res.Examples["duplicates"])
		}
		in := res.Ingest
		if in.IDs == 0 || in.Schedules == 0 || in.Tombstones == 0 || in.Unknown == 0 || in.Fired == 0 {
			t.Errorf("seed %d: ingest totals %+v: every kind should be there", seed, in)
		}
		// The cut scenario fired after its tombstone's ack: the rule looked at it, and the
		// fault window excused it.
		var after bool
		for _, id := range g.ids["ingest_cut"] {
			tomb := g.ops[g.ingestOp(id, 1)]
			for _, i := range g.recsOf(id) {
				after = after || g.recs[i].AppendMs*1e6 > tomb.CompleteNs
			}
		}
		if !after {
			t.Errorf("seed %d: no ingest_cut record fired after its tombstone's ack", seed)
		}
	}
}

func TestPlantIngestLost(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_plain", nil)
	g.dropRecords(id)
	assertOnly(t, g.check(), "ingest_lost", id)

	// A replaced record is not owed; the record that replaced it is.
	g = ingestRun(t)
	id = g.pick("ingest_replaced", nil)
	g.dropRecords(id)
	assertOnly(t, g.check(), "ingest_lost", id)
}

func TestPlantIngestEarly(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_plain", nil)
	op := g.ops[g.ingestOp(id, 0)]
	// Fired 5 ms before its delay had passed since the producer began to produce it.
	g.recs[g.recsOf(id)[0]].AppendMs = (op.InvokeNs+op.DelayNs)/1e6 - 5
	res := g.check()
	assertOnly(t, res, "early", id)

	g = ingestRun(t)
	id = g.pick("ingest_deliver_at", nil)
	op = g.ops[g.ingestOp(id, 0)]
	g.recs[g.recsOf(id)[0]].AppendMs = op.DeliverAtNs/1e6 - 3
	assertOnly(t, g.check(), "early", id)
}

// TestIngestEarlyUnderSkew: a chime-delay record applied while a leader's clock was behind
// gets a due that much early, which it keeps after the heal, so a clock moved back by at
// least the earliness in [invocation, append] explains it; a clock moved ahead, a smaller
// move, or a chime-deliver-at (an absolute due, not counted on the leader's clock) does not.
// A clock behind when the delay was counted and one ahead when the record was produced
// explain together as much as both moves.
func TestIngestEarlyUnderSkew(t *testing.T) {
	cases := []struct {
		name      string
		scenario  string
		skew      time.Duration
		fireSkew  time.Duration // a second skew window around the append, if not 0
		early     time.Duration
		underSkew bool
	}{
		{"clock behind by more", "ingest_plain", -3 * time.Second, 0, 2500 * time.Millisecond, true},
		{"clock behind by less", "ingest_plain", -2 * time.Second, 0, 2500 * time.Millisecond, false},
		{"clock ahead", "ingest_plain", 3 * time.Second, 0, 2500 * time.Millisecond, false},
		{"deliver-at", "ingest_deliver_at", -3 * time.Second, 0, 2500 * time.Millisecond, false},
		{"behind, then ahead as it fired, by more together", "ingest_plain", -3 * time.Second, 3 * time.Second, 5500 * time.Millisecond, true},
		{"behind, then ahead as it fired, by less together", "ingest_plain", -3 * time.Second, 2 * time.Second, 5500 * time.Millisecond, false},
		{"ahead, then ahead as it fired", "ingest_plain", time.Second, 3 * time.Second, 5500 * time.Millisecond, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := ingestRun(t)
			id := g.pick(tc.scenario, nil)
			op := &g.ops[g.ingestOp(id, 0)]
			due := op.DeliverAtNs
			if due == 0 {
				op.DelayNs = int64(10 * time.Second)
				due = op.InvokeNs + op.DelayNs
			}
			// The one skew window of the run spans the produce and heals well before
			// the record is appended.
			at := due - int64(tc.early)
			for i := range g.ops {
				if g.ops[i].Kind != KindSkew {
					continue
				}
				g.ops[i].InvokeNs, g.ops[i].CompleteNs = op.InvokeNs-int64(time.Second), op.InvokeNs+int64(100*time.Millisecond)
				g.ops[i].SkewNs = int64(tc.skew)
				if tc.fireSkew != 0 {
					fired := g.ops[i]
					fired.InvokeNs, fired.CompleteNs, fired.SkewNs = at-int64(time.Second), at+int64(time.Second), int64(tc.fireSkew)
					g.ops = append(g.ops, fired)
				}
				break
			}
			g.recs[g.recsOf(id)[0]].AppendMs = at / 1e6
			res := g.check()
			if !tc.underSkew {
				assertOnly(t, res, "early", id)
				return
			}
			assertClean(t, res)
			if ex := res.Examples["early_under_skew"]; len(ex) != 1 || ex[0].ID != id {
				t.Fatalf("early_under_skew examples %v, want one naming %s", ex, id)
			}
		})
	}
}

// TestIngestEarlyBoundary: a record appended in the millisecond its delay ends, counted from
// the producer's invocation (not its ack, which a consumer may overtake), is not early.
func TestIngestEarlyBoundary(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_plain", nil)
	op := g.ops[g.ingestOp(id, 0)]
	g.recs[g.recsOf(id)[0]].AppendMs = (op.InvokeNs + op.DelayNs) / 1e6
	assertClean(t, g.check())
}

// deadline is ingestDeadline of the run g, from ack.
func (g *run) deadline(ack int64) int64 {
	return analyze(g.ops, g.recs, g.cfg).ingestDeadline(ack)
}

// superseded is ingestSuperseded of the run g for the first copy of ingest op i.
func (g *run) superseded(i int) int64 {
	a := analyze(g.ops, g.recs, g.cfg)
	a.indexIngest()
	op := &g.ops[i]
	_, d, _ := a.ingestSuperseded(a.ingest[op.ID], op, true)
	return d
}

// alone moves every other key with a record after id's tombstone in its partition to a
// partition of their own (9), so that nothing in the partition tells when the tombstone was
// applied.
func (g *run) alone(id string) {
	tomb := g.ops[g.ingestOp(id, 1)]
	keys := map[string]bool{}
	for _, op := range g.ops {
		if op.F == FIngest && op.ID != id && op.Type == TypeOK && op.Partition == tomb.Partition && op.Offset > tomb.Offset {
			keys[op.ID] = true
		}
	}
	for i := range g.ops {
		if g.ops[i].F == FIngest && keys[g.ops[i].ID] {
			g.ops[i].Partition = 9
		}
	}
}

// TestPlantIngestAfterTombstone: with nothing after the tombstone in its partition, a record
// of the event it cancelled may come up to the tombstone's acknowledgement deadline (the ack
// plus IngestBound, extended through fault windows), and not after.
func TestPlantIngestAfterTombstone(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_tombstoned", func(id string) bool {
		return g.deadline(g.ops[g.ingestOp(id, 1)].CompleteNs) > ingestEarliestDue(&g.ops[g.ingestOp(id, 0)])+int64(time.Second)
	})
	g.alone(id)
	sched := g.ops[g.ingestOp(id, 0)]
	d := g.superseded(g.ingestOp(id, 0))
	if want := g.deadline(g.ops[g.ingestOp(id, 1)].CompleteNs); d != want {
		t.Fatalf("deadline %s, want the acknowledgement's %s", time.Duration(d-t0), time.Duration(want-t0))
	}
	// By the deadline: the tombstone may not have been applied yet.
	g.recs = append(g.recs, Record{ID: id, Topic: sched.Topic, Payload: sched.Payload, Offset: 99998, Attempt: 1, Version: 1,
		AppendMs: d / 1e6})
	assertClean(t, g.check())
	// Past it: the tombstone had to be applied, and nothing before it fires after that.
	g.recs[len(g.recs)-1].AppendMs = d/1e6 + 1
	res := g.check()
	assertOnly(t, res, "ingest_after_tombstone", id)
	if why := res.Examples["ingest_after_tombstone"][0].Why; !strings.Contains(why, "tombstone") {
		t.Errorf("example %q does not name the tombstone", why)
	}
}

// TestPlantIngestAfterTombstoneShownByOrder: a record of the partition after the tombstone
// fired, so the tombstone was applied by then, long before its acknowledgement's deadline; a
// record of the cancelled event appended after that is a violation.
func TestPlantIngestAfterTombstoneShownByOrder(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_tombstoned", func(id string) bool {
		return g.superseded(g.ingestOp(id, 0)) < g.deadline(g.ops[g.ingestOp(id, 1)].CompleteNs)
	})
	// Its delay made short, so that a record after the tombstone is not early as well.
	g.ops[g.ingestOp(id, 0)].DelayNs = int64(100 * time.Millisecond)
	sched := g.ops[g.ingestOp(id, 0)]
	d := g.superseded(g.ingestOp(id, 0))
	g.recs = append(g.recs, Record{ID: id, Topic: sched.Topic, Payload: sched.Payload, Offset: 99998, Attempt: 1, Version: 1,
		AppendMs: d/1e6 + 1})
	res := g.check()
	assertOnly(t, res, "ingest_after_tombstone", id)
	if why := res.Examples["ingest_after_tombstone"][0].Why; !strings.Contains(why, "after it in the partition") {
		t.Errorf("example %q does not say the partition's order showed it", why)
	}
}

func TestPlantIngestAfterReplace(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_replaced", nil)
	first := g.ops[g.ingestOp(id, 0)]
	g.recs = append(g.recs, Record{ID: id, Topic: first.Topic, Payload: first.Payload, Offset: 99998, Attempt: 1, Version: 1,
		AppendMs: max(g.superseded(g.ingestOp(id, 0)), ingestEarliestDue(&first))/1e6 + 1})
	assertOnly(t, g.check(), "ingest_after_replace", id)
}

func TestPlantIngestRejected(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_plain", nil)
	op := g.ops[g.ingestOp(id, 0)]
	g.recs = append(g.recs, Record{ID: id, Topic: DefaultIngestRejectedTopic, Payload: op.Payload, Offset: 1,
		AppendMs: op.CompleteNs/1e6 + 20, Error: `chime-topic: "reminders" not permitted`})
	res := g.check()
	assertOnly(t, res, "ingest_rejected", id)
	if why := res.Examples["ingest_rejected"][0].Why; !strings.Contains(why, "not permitted") {
		t.Errorf("example %q does not carry chime-error", why)
	}
}

func TestPlantIngestPhantom(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_plain", nil)
	g.recs[g.recsOf(id)[0]].Topic = "payments-other"
	assertOnly(t, g.check(), "phantom", id)
}

// TestIngestDuplicatesMeasured: a second copy of one ingest record is a duplicate, attributed
// to its fault, and no violation.
func TestIngestDuplicatesMeasured(t *testing.T) {
	g := ingestRun(t)
	id := g.pick("ingest_plain", nil)
	c := g.recs[g.recsOf(id)[0]]
	c.Offset, c.AppendMs = 99997, c.AppendMs+1000
	g.recs = append(g.recs, c)
	res := g.check()
	assertClean(t, res)
	if res.Duplicates != 1 || len(res.Examples["duplicates"]) != 1 || res.Examples["duplicates"][0].ID != id {
		t.Errorf("duplicates %d (%v), want 1 of %s", res.Duplicates, res.Examples["duplicates"], id)
	}
}

// TestIngestBackups: an ingest event a backup holds is no generic phantom, but one held
// before any record scheduled it is.
func TestIngestBackups(t *testing.T) {
	g := ingestRun(t)
	b := g.backup("backup-005") // at 90 s: after every ingest op
	id := g.pick("ingest_plain", nil)
	b.BackupEvents[id] = StateFired
	assertClean(t, g.check())
	b = g.backup("backup-001") // at 20 s
	late := g.pick("ingest_plain", func(id string) bool { return g.ops[g.ingestOp(id, 0)].InvokeNs > at(25*time.Second) })
	b.BackupEvents[late] = StateScheduled
	assertOnly(t, g.check(), "backup_phantom", late)
}

// TestIngestDeadlineExtendsThroughFaults: a record acked before a fault window may be
// applied only after that window heals, and a fault starting before the extended deadline
// extends it again.
func TestIngestDeadlineExtendsThroughFaults(t *testing.T) {
	g := genClean(1, 20)
	b := int64(DefaultIngestBound)
	// From 1 s: 16 s reaches the kill [10, 14] → 29 s, the partition [25, 35] → 50 s, the
	// skew [48, 53] → 68 s, the pause [60, 63] → 78 s, the kafka cut [70, 72] → 87 s.
	if got, want := g.deadline(at(time.Second)), at(87*time.Second); got != want {
		t.Errorf("deadline from 1 s = %s, want 87 s", time.Duration(got-t0))
	}
	if got, want := g.deadline(at(80*time.Second)), at(80*time.Second)+b; got != want {
		t.Errorf("deadline from 80 s = %s, want 95 s", time.Duration(got-t0))
	}
}

// TestIngestOrderNeedsATombstone: schedules of distinct keys may go to Chime in one batch, so a
// record after a replacing schedule in the partition says nothing of when the replace was
// applied; a tombstone after it does (it waits for the batch before it, and is done before the
// records after it are sent).
func TestIngestOrderNeedsATombstone(t *testing.T) {
	sec := func(s float64) int64 { return at(time.Duration(s * float64(time.Second))) }
	op := func(i int, action, key, payload string, offset int64, ack float64, delay time.Duration) Op {
		o := Op{Index: i, F: FIngest, Action: action, ID: ingestTopic + "/" + key, Payload: payload, DelayNs: int64(delay),
			InvokeNs: sec(ack) - 1e6, CompleteNs: sec(ack), Type: TypeOK, Partition: 0, Offset: offset}
		if action == IngestSchedule {
			o.Topic = "t"
		}
		return o
	}
	rec := func(key, payload string, appendS float64) Record {
		return Record{ID: ingestTopic + "/" + key, Topic: "t", Payload: payload, Attempt: 1, AppendMs: sec(appendS) / 1e6}
	}
	ops := []Op{
		op(0, IngestSchedule, "a", "p-a-1", 0, 1, 3*time.Second), // replaced at 2 s; fires at 4.5 s
		op(1, IngestSchedule, "a", "p-a-2", 1, 2, 10*time.Second),
		op(2, IngestSchedule, "b", "p-b-1", 2, 2.001, 0), // fired at 2.05 s: accepted by then, maybe in a's batch
	}
	recs := []Record{rec("a", "p-a-1", 4.5), rec("a", "p-a-2", 12.1), rec("b", "p-b-1", 2.05)}
	final := cleanCluster(1)
	assertClean(t, Check(ops, recs, final, Config{}))

	// A tombstone of c after the replace, and d after it, fired at 3 s: the replace was applied
	// by then, and a's first record fired at 4.5 s.
	ops = append(ops, op(3, IngestSchedule, "c", "p-c-1", 3, 2.0015, 20*time.Second), op(4, IngestTombstone, "c", "", 4, 2.002, 0),
		op(5, IngestSchedule, "d", "p-d-1", 5, 2.003, 0))
	recs = append(recs, rec("d", "p-d-1", 3))
	res := Check(ops, recs, final, Config{})
	assertOnly(t, res, "ingest_after_replace", ingestTopic+"/a")
	if why := res.Examples["ingest_after_replace"][0].Why; !strings.Contains(why, "op 5, after it in the partition") {
		t.Errorf("example %q does not name d's record", why)
	}
}
