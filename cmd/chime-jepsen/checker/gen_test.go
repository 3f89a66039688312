package checker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// t0 is the synthetic run's start on the driver clock.
const t0 = int64(1_700_000_000) * int64(time.Second)

func at(d time.Duration) int64 { return t0 + int64(d) }

// run is a synthetic history: ops, records, the final state, and which id plays which
// scenario, so tests can plant one violation into an otherwise clean run.
type run struct {
	ops   []Op
	recs  []Record
	final Cluster
	cfg   Config
	// scenario name → ids, in creation order
	ids map[string][]string
	// content per id of the stored event
	due map[string]int64
}

// Nemesis windows of every generated run (none overlap; FinalHealNs is the kafka heal).
var genWindows = []struct {
	kind       string
	targets    []string
	start, end time.Duration
	skew       time.Duration
}{
	{"kill", []string{"n1"}, 10 * time.Second, 14 * time.Second, 0},
	{"partition", []string{"n2", "n3"}, 25 * time.Second, 35 * time.Second, 0},
	{"skew", []string{"n4"}, 48 * time.Second, 53 * time.Second, 3 * time.Second},
	{"pause", []string{"n5"}, 60 * time.Second, 63 * time.Second, 0},
	{"kafka", nil, 70 * time.Second, 72 * time.Second, 0},
}

// scenarios every generated run contains at least once, in rotation.
var scenarios = []string{
	"acked",          // schedule ok, one record
	"acked_resend",   // ok creator, identical re-send ok existing=true, one record
	"acked_conflict", // ok creator, conflicting re-send fails ALREADY_EXISTS, one record
	"info_delivered", // schedule info, one record
	"info_lost",      // schedule info, no record
	"failed",         // schedule fail UNAVAILABLE, no record
	"cancel_before",  // schedule ok, cancel ok before due, no record
	"cancel_race",    // schedule ok, record appended, cancel ok acked after the append
	"cancel_after",   // schedule ok, record, cancel fails FAILED_PRECONDITION
	"cancel_info",    // schedule ok, cancel info, record or not
	"info_then_ok",   // schedule info (timed out), re-send ok existing=true, one record
	"info_conflict",  // two info schedules with different content, record of the first
	"deadletter",     // schedule ok, record on the dead-letter topic
	"updated",        // schedule ok, one or two updates ok, one record of the last version
	"update_refused", // schedule ok, record, update fails FAILED_PRECONDITION
	"update_info",    // schedule ok, update info, a record of either version
}

// genClean builds a clean run of n events from seed: Check must find nothing in it.
func genClean(seed uint64, n int) *run {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	g := &run{ids: map[string][]string{}, due: map[string]int64{}}
	idx := 0
	add := func(op Op) *Op {
		op.Index = idx
		idx++
		if op.Process == 0 {
			op.Process = r.IntN(8)
		}
		if op.Node == "" && op.F != FNemesis {
			op.Node = fmt.Sprintf("n%d", 1+r.IntN(5))
		}
		g.ops = append(g.ops, op)
		return &g.ops[len(g.ops)-1]
	}
	var faultEnd int64
	for _, w := range genWindows {
		add(Op{F: FNemesis, Type: TypeInfo, Kind: w.kind, Targets: w.targets,
			InvokeNs: at(w.start), CompleteNs: at(w.end), SkewNs: int64(w.skew)})
		faultEnd = max(faultEnd, at(w.end))
	}
	inFault := func(t int64) (int64, bool) {
		for _, w := range genWindows {
			if t >= at(w.start) && t <= at(w.end) {
				return at(w.end), true
			}
		}
		return 0, false
	}
	// appendAt: when a record of an event due at due reaches Kafka. Healthy: 0–30 ms late,
	// sometimes up to 0.9 ms "early" (inside the tolerance). Due inside a fault: up to 2 s
	// after the heal.
	appendAt := func(due int64) int64 {
		if heal, ok := inFault(due); ok {
			return heal + r.Int64N(int64(2*time.Second))
		}
		if r.IntN(10) == 0 {
			return due - r.Int64N(int64(900*time.Microsecond))
		}
		return due + r.Int64N(int64(30*time.Millisecond))
	}
	offsets := map[string]int64{}
	record := func(id, topic, payload string, due, appendNs int64) {
		offsets[topic]++
		ms := appendNs / 1e6 // LogAppendTime is truncated to the millisecond
		g.recs = append(g.recs, Record{ID: id, Topic: topic, Partition: int32(r.IntN(4)), Offset: offsets[topic],
			Payload: payload, DueMs: due / 1e6, FiredMs: ms - 1, Attempt: 1, AppendMs: ms, ReceivedNs: appendNs + 5e6})
	}
	topics := []string{"reminders", "payments", "timeouts"}
	lat := func() int64 { return int64(time.Millisecond) + r.Int64N(int64(20*time.Millisecond)) }

	for i := range n {
		sc := scenarios[i%len(scenarios)]
		id := fmt.Sprintf("e%05d", i)
		g.ids[sc] = append(g.ids[sc], id)
		topic := topics[r.IntN(len(topics))]
		payload := fmt.Sprintf("p-%d-%d", i, r.IntN(1000))
		invoke := at(time.Duration(r.Int64N(int64(80 * time.Second))))
		complete := invoke + lat()
		sched := Op{F: FSchedule, ID: id, Topic: topic, Payload: payload, InvokeNs: invoke, CompleteNs: complete}
		var due int64
		if r.IntN(2) == 0 {
			sched.DelayNs = int64(500*time.Millisecond) + r.Int64N(int64(5*time.Second))
			due = invoke + r.Int64N(complete-invoke+1) + sched.DelayNs // accepted somewhere in the call
		} else {
			sched.DeliverAtNs = invoke + int64(200*time.Millisecond) + r.Int64N(int64(5*time.Second))
			due = sched.DeliverAtNs
		}
		g.due[id] = due
		ok := func(op Op, existing bool) Op {
			op.Type, op.AckDueNs, op.Existing = TypeOK, due, existing
			return op
		}
		resendAt := func(op Op, after int64) Op {
			op.InvokeNs = after + lat()
			op.CompleteNs = op.InvokeNs + lat()
			return op
		}
		deliver := func() int64 {
			t := appendAt(due)
			record(id, topic, payload, due, t)
			return t
		}
		switch sc {
		case "acked":
			add(ok(sched, false))
			deliver()
		case "acked_resend":
			add(ok(sched, false))
			add(ok(resendAt(sched, complete), true))
			deliver()
		case "acked_conflict":
			add(ok(sched, false))
			c := resendAt(sched, complete)
			c.Payload += "-other"
			c.Type, c.Code, c.Error = TypeFail, "AlreadyExists", "id exists with different content"
			add(c)
			deliver()
		case "info_delivered":
			sched.Type, sched.Code, sched.Error = TypeInfo, "DEADLINE_EXCEEDED", "timeout"
			add(sched)
			deliver()
		case "info_lost":
			sched.Type, sched.Code, sched.Error = TypeInfo, "Unavailable", "connection lost"
			add(sched)
		case "failed":
			sched.Type, sched.Code, sched.Error = TypeFail, "Unavailable", "no leader"
			add(sched)
		case "cancel_before":
			add(ok(sched, false))
			cinv := complete + r.Int64N(max(1, due-complete-int64(50*time.Millisecond)))
			add(Op{F: FCancel, ID: id, Type: TypeOK, State: "cancelled", InvokeNs: cinv, CompleteNs: min(cinv+lat(), due-1)})
		case "cancel_race":
			add(ok(sched, false))
			t := deliver()
			// The cancel was applied before MarkFired but acked after the record landed: allowed.
			add(Op{F: FCancel, ID: id, Type: TypeOK, State: "cancelled", InvokeNs: t - lat(), CompleteNs: (t/1e6)*1e6 + r.Int64N(int64(time.Millisecond))})
		case "cancel_after":
			add(ok(sched, false))
			t := deliver()
			add(Op{F: FCancel, ID: id, Type: TypeFail, Code: "FailedPrecondition", Error: "already fired", InvokeNs: t + lat(), CompleteNs: t + 2*lat()})
		case "cancel_info":
			add(ok(sched, false))
			add(Op{F: FCancel, ID: id, Type: TypeInfo, Code: "DEADLINE_EXCEEDED", InvokeNs: due - lat(), CompleteNs: due + lat()})
			if r.IntN(2) == 0 {
				deliver()
			}
		case "info_then_ok":
			sched.Type, sched.Code = TypeInfo, "DEADLINE_EXCEEDED"
			add(sched)
			add(ok(resendAt(sched, complete), true))
			deliver()
		case "info_conflict":
			sched.Type, sched.Code = TypeInfo, "DEADLINE_EXCEEDED"
			add(sched)
			c := resendAt(sched, complete)
			c.Payload += "-other"
			add(c) // also unknown: either could be the stored one
			deliver()
		case "deadletter":
			add(ok(sched, false))
			t := appendAt(due) + int64(300*time.Millisecond) // after the retries
			record(id, DefaultDeadLetterTopic, payload, due, t)
		case "updated":
			add(ok(sched, false))
			last, version, p := complete, uint64(1), payload
			for k := range 1 + r.IntN(2) {
				u := Op{F: FUpdate, ID: id, Payload: fmt.Sprintf("%s-u%d", payload, k), Type: TypeOK, InvokeNs: last + lat()}
				u.CompleteNs = u.InvokeNs + lat()
				u.DelayNs = int64(500*time.Millisecond) + r.Int64N(int64(5*time.Second))
				version++
				u.AckDueNs, u.Version = u.CompleteNs+u.DelayNs, version
				if r.IntN(2) == 0 {
					u.ExpectedVersion = version - 1
				}
				add(u)
				last, due, p = u.CompleteNs, u.AckDueNs, u.Payload
			}
			g.due[id] = due
			record(id, topic, p, due, appendAt(due))
			g.recs[len(g.recs)-1].Version = version
			if r.IntN(2) == 0 { // a re-send of the original schedule reports the due time as it now is
				re := resendAt(sched, last)
				re.Type, re.AckDueNs, re.Existing = TypeOK, due, true
				add(re)
			}
			if r.IntN(2) == 0 {
				gi := last + lat()
				add(Op{F: FGet, ID: id, Type: TypeOK, State: StateScheduled, Version: version, InvokeNs: gi, CompleteNs: gi + lat()})
			}
		case "update_refused":
			add(ok(sched, false))
			t := deliver()
			add(Op{F: FUpdate, ID: id, Payload: payload + "-late", DelayNs: int64(time.Second), Type: TypeFail, Code: "FailedPrecondition",
				Error: "already fired", InvokeNs: t + lat(), CompleteNs: t + 2*lat()})
		case "update_info":
			add(ok(sched, false))
			u := Op{F: FUpdate, ID: id, Payload: payload + "-u", Type: TypeInfo, Code: "Unknown", InvokeNs: complete + lat()}
			u.CompleteNs = u.InvokeNs + lat()
			u.DelayNs = int64(500*time.Millisecond) + r.Int64N(int64(5*time.Second))
			add(u)
			if r.IntN(2) == 0 {
				deliver()
			} else {
				due = u.CompleteNs + u.DelayNs
				g.due[id] = due
				record(id, topic, u.Payload, due, appendAt(due))
				g.recs[len(g.recs)-1].Version = 2
			}
		}
		if r.IntN(4) == 0 {
			st := []string{"scheduled", "fired", "cancelled"}[r.IntN(3)]
			gi := invoke + r.Int64N(int64(3*time.Second))
			add(Op{F: FGet, ID: id, Type: TypeOK, State: st, InvokeNs: gi, CompleteNs: gi + lat()})
		}
		if r.IntN(8) == 0 {
			ii := invoke + lat()
			add(Op{F: FInvalid, ID: "bad-" + id, Topic: "", Payload: payload, Type: TypeFail, Code: "INVALID_ARGUMENT",
				Error: "event.topic: required", InvokeNs: ii, CompleteNs: ii + lat()})
		}
	}
	g.addBackups(rand.New(rand.NewPCG(seed, 0xbac)))
	// History order is invocation order.
	slices.SortStableFunc(g.ops, func(a, b Op) int { return int(min(max(a.InvokeNs-b.InvokeNs, -1), 1)) })
	for i := range g.ops {
		g.ops[i].Index = i
	}
	g.final = cleanCluster(4)
	g.cfg = Config{FinalHealNs: faultEnd}
	return g
}

// Backups of every generated run, each completed 1.5 s after it was invoked; the one at 50 s
// fails.
var genBackups = []struct {
	at time.Duration
	ok bool
}{{20 * time.Second, true}, {38 * time.Second, true}, {50 * time.Second, false}, {62 * time.Second, true}, {90 * time.Second, true}}

// addBackups adds genBackups to g, each ok one holding what a correct backup may hold: every
// event acked before it was invoked, and half of those whose ok schedule was under way, each
// in a state drawn from those the history allows (doc.go, check 7).
func (g *run) addBackups(r *rand.Rand) {
	type idOps struct {
		schedules, cancels []Op
		recs               []Record
	}
	byID := map[string]*idOps{}
	var ids []string
	for _, sc := range scenarios {
		for _, id := range g.ids[sc] {
			byID[id] = &idOps{}
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, op := range g.ops {
		if h := byID[op.ID]; h != nil && op.F == FSchedule {
			h.schedules = append(h.schedules, op)
		} else if h != nil && op.F == FCancel {
			h.cancels = append(h.cancels, op)
		}
	}
	for _, rec := range g.recs {
		byID[rec.ID].recs = append(byID[rec.ID].recs, rec)
	}
	for i, b := range genBackups {
		invoke, complete := at(b.at), at(b.at+1500*time.Millisecond)
		op := Op{F: FBackup, Process: 2000, Node: fmt.Sprintf("n%d", 1+i%5), Dir: fmt.Sprintf("backup-%03d", i+1),
			InvokeNs: invoke, CompleteNs: complete, Type: TypeOK}
		if !b.ok {
			op.Type, op.Error = TypeFail, fmt.Sprintf("backup: shard 2: Unavailable: no leader; %s has no manifest.json, so it is not a usable backup: delete it and run backup again", op.Dir)
			g.ops = append(g.ops, op)
			continue
		}
		op.BackupEvents = map[string]string{}
		op.BackupShards = []BackupShard{{0, 50, "n1", 0}, {1, 60, "n2", 0}, {2, 70, "n3", 0}, {3, 80, "n4", 0}}
		for _, id := range ids {
			h := byID[id]
			acked := slices.ContainsFunc(h.schedules, func(s Op) bool { return s.Type == TypeOK && s.CompleteNs < invoke })
			underWay := slices.ContainsFunc(h.schedules, func(s Op) bool { return s.Type == TypeOK && s.InvokeNs < complete })
			if !acked && !(underWay && r.IntN(2) == 0) {
				continue
			}
			var states []string
			if !slices.ContainsFunc(h.cancels, func(c Op) bool { return c.Type == TypeOK && c.CompleteNs < invoke }) {
				states = append(states, StateScheduled)
			}
			if slices.ContainsFunc(h.cancels, func(c Op) bool { return c.Type != TypeFail && c.InvokeNs < complete }) {
				states = append(states, StateCancelled)
			}
			for _, rec := range h.recs {
				if rec.AppendMs*1e6 > complete {
					continue
				}
				if rec.Topic == DefaultDeadLetterTopic {
					states = append(states, StateDeadLettered)
				} else {
					states = append(states, StateFired)
				}
			}
			op.BackupEvents[id] = states[r.IntN(len(states))]
			op.BackupShards[len(id)%4].Events++
		}
		g.ops = append(g.ops, op)
	}
}

// addAcked adds an acked schedule op and its record to g, and the event, as scheduled, to
// every ok backup invoked after the ack, which must hold it.
func (g *run) addAcked(op Op, rec Record) {
	op.Index = len(g.ops)
	g.ops = append(g.ops, op)
	g.recs = append(g.recs, rec)
	for i := range g.ops {
		if b := &g.ops[i]; b.F == FBackup && b.Type == TypeOK && b.InvokeNs > op.CompleteNs {
			b.BackupEvents[op.ID] = StateScheduled
		}
	}
}

// backup returns the backup op whose directory is dir.
func (g *run) backup(dir string) *Op {
	for i := range g.ops {
		if g.ops[i].F == FBackup && g.ops[i].Dir == dir {
			return &g.ops[i]
		}
	}
	panic("no backup " + dir)
}

func cleanCluster(shards int) Cluster {
	var c Cluster
	for s := range shards {
		nodes := []string{fmt.Sprintf("n%d", 1+s%5), fmt.Sprintf("n%d", 1+(s+1)%5), fmt.Sprintf("n%d", 1+(s+2)%5)}
		st := ShardState{ID: uint32(s), Leaders: []string{nodes[s%3]}}
		for _, n := range nodes {
			st.Replicas = append(st.Replicas, ReplicaState{Node: n, AppliedIndex: uint64(100 + s), Digest: fmt.Sprintf("d%x", 0xabc0+s)})
		}
		c.Shards = append(c.Shards, st)
	}
	return c
}

// pick returns the first id of scenario sc that satisfies keep.
func (g *run) pick(sc string, keep func(id string) bool) string {
	for _, id := range g.ids[sc] {
		if keep == nil || keep(id) {
			return id
		}
	}
	panic("no id for scenario " + sc)
}

// awayFromFaults: the id's due is at least 2 s away from every fault window.
func (g *run) awayFromFaults(id string) bool {
	d := g.due[id]
	for _, w := range genWindows {
		if d >= at(w.start-2*time.Second) && d <= at(w.end+2*time.Second) {
			return false
		}
	}
	return true
}

func (g *run) opsOf(id, f string) []int {
	var out []int
	for i, op := range g.ops {
		if op.ID == id && op.F == f {
			out = append(out, i)
		}
	}
	return out
}

func (g *run) recsOf(id string) []int {
	var out []int
	for i, r := range g.recs {
		if r.ID == id {
			out = append(out, i)
		}
	}
	return out
}

// dropRecords removes the records of id, and makes the backups that held it fired hold it
// scheduled: a history in which it never fired.
func (g *run) dropRecords(id string) {
	g.recs = slices.DeleteFunc(g.recs, func(r Record) bool { return r.ID == id })
	for _, b := range g.ops {
		if st, ok := b.BackupEvents[id]; ok && (st == StateFired || st == StateDeadLettered) {
			b.BackupEvents[id] = StateScheduled
		}
	}
}

func (g *run) check() Results { return Check(g.ops, g.recs, g.final, g.cfg) }
