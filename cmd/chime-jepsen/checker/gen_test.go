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
	// bulkCancels: per id, the cancels the bulk cancels of it stand for (ok where the bulk
	// cancel certainly cancelled it, info where it may have), for addBackups.
	bulkCancels map[string][]Op
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
	"listed",         // schedule ok, one record, lists of its id before, while pending, after firing
	// bulk: a group of 2-5 ids "bNNNNN-j" scheduled ok, then a cancel_matching of their
	// prefix: ok and exact, ok with one held, ok after one fired, ok with one skipped as
	// fired, info part-way, or a dry run (and a failed one); lists of the prefix before and
	// after it.
	"bulk",
}

// genClean builds a clean run of n events from seed: Check must find nothing in it.
func genClean(seed uint64, n int) *run {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	g := &run{ids: map[string][]string{}, due: map[string]int64{}, bulkCancels: map[string][]Op{}}
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
		if sc == "bulk" {
			id = fmt.Sprintf("b%05d-0", i) // the first of its group
		}
		firstOp := len(g.ops)
		// cancelledAt: from when the event is certainly cancelled (0: never), so that no
		// read after it shows it scheduled.
		var cancelledAt int64
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
			c := add(Op{F: FCancel, ID: id, Type: TypeOK, State: "cancelled", InvokeNs: cinv, CompleteNs: min(cinv+lat(), due-1)})
			if r.IntN(2) == 0 { // a list after the cancel shows it cancelled
				li := c.CompleteNs + lat()
				add(Op{F: FList, Prefix: id, Type: TypeOK, Pages: 1, InvokeNs: li, CompleteNs: li + lat(),
					Listed: []Listed{{ID: id, State: StateCancelled, Version: 1, DueNs: due}}})
			}
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
			c := add(Op{F: FCancel, ID: id, Type: TypeInfo, Code: "DEADLINE_EXCEEDED", InvokeNs: due - lat(), CompleteNs: due + lat()})
			li := c.CompleteNs + lat()
			if r.IntN(2) == 0 {
				deliver()
			}
			if r.IntN(2) == 0 { // a list that does not show it: the cancel may have removed it... or not
				add(Op{F: FList, Prefix: id, Type: TypeOK, Pages: 1, InvokeNs: li, CompleteNs: li + lat()})
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
			if r.IntN(2) == 0 {
				li := last + lat()
				add(Op{F: FList, Prefix: id, Type: TypeOK, Pages: 1, InvokeNs: li, CompleteNs: li + lat(),
					Listed: []Listed{{ID: id, State: StateScheduled, Version: version, DueNs: due}}})
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
		case "listed":
			add(ok(sched, false))
			t := deliver()
			list := func(li int64, states []string, entries ...Listed) {
				add(Op{F: FList, Prefix: id, States: states, Type: TypeOK, Pages: 1, InvokeNs: li, CompleteNs: li + lat(), Listed: entries})
			}
			if r.IntN(2) == 0 { // invoked before the schedule completed: it need not show it
				list(complete-lat(), nil)
			}
			if li := complete + lat(); due-li > int64(100*time.Millisecond) { // pending
				var states []string
				if r.IntN(3) == 0 {
					states = []string{StateScheduled}
				}
				list(li, states, Listed{ID: id, State: StateScheduled, Version: 1, DueNs: due})
			}
			switch li := t + lat(); r.IntN(4) { // fired
			case 0:
				list(li, []string{StateScheduled}) // filtered out
			case 1: // stopped after its pages, before the one that had it
				add(Op{F: FList, Prefix: id, Type: TypeOK, Pages: 10, More: true, InvokeNs: li, CompleteNs: li + lat()})
			case 2: // failed: it shows nothing
				add(Op{F: FList, Prefix: id, Type: TypeInfo, Code: "Unavailable", Error: "no leader", InvokeNs: li, CompleteNs: li + lat()})
			default:
				list(li, nil, Listed{ID: id, State: StateFired, Version: 1, DueNs: due})
			}
		case "bulk":
			cancelledAt = g.genBulk(r, id[:len(id)-1], invoke, topic, lat, add, record, appendAt)
		}
		if r.IntN(4) == 0 {
			states := []string{"scheduled", "fired", "cancelled"}
			gi := invoke + r.Int64N(int64(3*time.Second))
			for _, op := range g.ops[firstOp:] {
				if op.F == FCancel && op.ID == id && op.Type == TypeOK && (cancelledAt == 0 || op.CompleteNs < cancelledAt) {
					cancelledAt = op.CompleteNs
				}
			}
			if cancelledAt != 0 && gi > cancelledAt {
				states = states[1:] // not scheduled after it was certainly cancelled
			}
			add(Op{F: FGet, ID: id, Type: TypeOK, State: states[r.IntN(len(states))], InvokeNs: gi, CompleteNs: gi + lat()})
		}
		if r.IntN(8) == 0 {
			ii := invoke + lat()
			add(Op{F: FInvalid, ID: "bad-" + id, Topic: "", Payload: payload, Type: TypeFail, Code: "INVALID_ARGUMENT",
				Error: "event.topic: required", InvokeNs: ii, CompleteNs: ii + lat()})
		}
	}
	// Two bursts (check 12) of 30 events "qK-NN" on one topic, due at once and acked in one
	// batch a second before: q1 at 40 s, clear of every fault, produced in priority order
	// (unset is 5) over 2 s, each up to 200 ms off its turn; q2 at 12 s, inside the kill,
	// produced after the heal in no order at all, which a fault excuses (it is skipped).
	for k, due := range []int64{at(40 * time.Second), at(12 * time.Second)} {
		tag, heal := fmt.Sprintf("burst%d", k+1), int64(0)
		if h, ok := inFault(due); ok {
			heal = h
		}
		type ev struct {
			id   string
			prio int
		}
		var evs []ev
		invoke := due - int64(time.Second)
		for i := range 30 {
			id := fmt.Sprintf("q%d-%02d", k+1, i)
			op := Op{F: FSchedule, ID: id, Topic: "bursts", Payload: "p-" + id, DeliverAtNs: due, Burst: tag,
				InvokeNs: invoke, CompleteNs: invoke + lat(), Type: TypeOK, AckDueNs: due}
			prio := DefaultPriority
			if r.IntN(5) != 0 {
				p := uint32(r.IntN(10))
				op.Priority, prio = &p, int(p)
			}
			add(op)
			g.ids["burst"] = append(g.ids["burst"], id)
			g.due[id] = due
			evs = append(evs, ev{id, prio})
		}
		if heal == 0 {
			slices.SortStableFunc(evs, func(x, y ev) int { return y.prio - x.prio })
		}
		for rank, e := range evs {
			appended := due + 5e6 + int64(rank)*int64(2*time.Second)/30 + r.Int64N(int64(400*time.Millisecond)) - int64(200*time.Millisecond)
			if heal != 0 {
				appended = heal + r.Int64N(int64(2*time.Second))
			}
			record(e.id, "bursts", "p-"+e.id, due, max(appended, due))
		}
	}
	g.addIngest(rand.New(rand.NewPCG(seed, 0x1e57)), max(n/8, len(ingestScenarios)))
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

// genBulk adds a "bulk" group to g: 2-5 events "<prefix>j" scheduled ok from invoke on,
// each due 1.5-5.5 s after it, a cancel_matching of prefix invoked 0.4 s after invoke (once
// every schedule was acked) in one of six variations, and lists of the prefix before and
// after it. It returns from when the group's first event is certainly cancelled (0: never).
func (g *run) genBulk(r *rand.Rand, prefix string, invoke int64, topic string, lat func() int64,
	add func(Op) *Op, record func(id, topic, payload string, due, appendNs int64), appendAt func(int64) int64) int64 {
	k := 2 + r.IntN(4)
	type member struct {
		id, payload string
		due         int64
		fired       int64 // when its record was appended (0: none)
		cancelled   bool  // the bulk cancel cancelled it
	}
	ms := make([]member, k)
	bulkInv := invoke + int64(400*time.Millisecond) + lat()
	bulkDone := bulkInv + int64(50*time.Millisecond) + r.Int64N(int64(300*time.Millisecond))
	b := Op{F: FCancelMatching, Prefix: prefix, Type: TypeOK, InvokeNs: bulkInv, CompleteNs: bulkDone, Matched: uint64(k)}
	variation := r.IntN(6)
	for j := range ms {
		m := &ms[j]
		m.id = fmt.Sprintf("%s%d", prefix, j)
		m.payload = "p-" + m.id
		m.due = invoke + int64(1500*time.Millisecond) + r.Int64N(int64(4*time.Second))
		if j > 0 {
			g.ids["bulk"] = append(g.ids["bulk"], m.id)
		}
		si := invoke + int64(j)*int64(50*time.Millisecond)
		s := Op{F: FSchedule, ID: m.id, Topic: topic, Payload: m.payload, Type: TypeOK, InvokeNs: si, CompleteNs: si + lat()}
		switch {
		case j == 0 && variation == 2: // fired before the bulk cancel began: not matched
			m.due = invoke + int64(100*time.Millisecond)
			m.fired = m.due + r.Int64N(int64(10*time.Millisecond))
		case j == 0 && variation == 5: // fired while it ran: skipped as fired
			m.due = bulkInv + int64(20*time.Millisecond)
			m.fired = m.due + r.Int64N(int64(10*time.Millisecond))
		}
		s.DeliverAtNs, s.AckDueNs = m.due, m.due
		add(s)
		g.due[m.id] = m.due
	}
	switch variation {
	case 0: // ok: every one cancelled
		b.Cancelled = uint64(k)
	case 1: // ok: the first held (a fire batch had it), and it fires after all
		b.Cancelled, b.SkippedHeld = uint64(k-1), 1
		ms[0].fired = appendAt(ms[0].due)
	case 2: // ok: the first had fired already and is not matched
		b.Matched, b.Cancelled = uint64(k-1), uint64(k-1)
	case 3: // info: it stopped part-way, having cancelled the first c
		c := r.IntN(k + 1)
		b.Type, b.Code, b.Error = TypeInfo, "DeadlineExceeded", "context deadline exceeded"
		b.Matched, b.Cancelled = uint64(c), uint64(c)
		for j := c; j < k; j++ {
			ms[j].fired = appendAt(ms[j].due)
		}
	case 4: // a dry run, and a refused one: every event fires
		b.DryRun = true
		for j := range ms {
			ms[j].fired = appendAt(ms[j].due)
		}
		fi := bulkInv - lat()
		add(Op{F: FCancelMatching, Prefix: prefix, Type: TypeFail, Code: "InvalidArgument", Error: "filter: empty", InvokeNs: fi, CompleteNs: fi + 1e5})
	case 5: // ok: the first fired while it ran
		b.Cancelled, b.SkippedFired = uint64(k-1), 1
	}
	add(b)
	var firstCancelled int64
	for j := range ms {
		m := &ms[j]
		if m.fired != 0 {
			record(m.id, topic, m.payload, m.due, m.fired)
			continue
		}
		if b.DryRun {
			continue
		}
		m.cancelled = true
		if j == 0 {
			firstCancelled = bulkDone
		}
	}
	// What the bulk cancel stands for, per id: ok where it certainly cancelled the event (it
	// was ok, skipped nothing, and the event had no record by its end), else info.
	if !b.DryRun {
		certain := b.Type == TypeOK && b.SkippedHeld == 0 && b.SkippedFired == 0
		for _, m := range ms {
			c := Op{F: FCancel, ID: m.id, Type: TypeInfo, InvokeNs: bulkInv, CompleteNs: bulkDone}
			if certain && (m.fired == 0 || m.fired > bulkDone) {
				c.Type = TypeOK
			}
			g.bulkCancels[m.id] = append(g.bulkCancels[m.id], c)
		}
	}
	// Lists of the prefix: before the bulk cancel (every event acked) and after it.
	list := func(li int64, after bool) {
		l := Op{F: FList, Prefix: prefix, Type: TypeOK, Pages: 1, InvokeNs: li, CompleteNs: li + lat()}
		if r.IntN(3) == 0 {
			l.States = []string{StateScheduled}
		}
		for _, m := range ms {
			st := StateScheduled
			switch {
			case m.fired != 0 && m.fired < li:
				st = StateFired
			case after && m.cancelled:
				st = StateCancelled
			}
			if l.States == nil || st == StateScheduled {
				l.Listed = append(l.Listed, Listed{ID: m.id, State: st, Version: 1, DueNs: m.due})
			}
		}
		add(l)
	}
	if r.IntN(2) == 0 {
		list(invoke+int64(250*time.Millisecond)+r.Int64N(int64(100*time.Millisecond)), false)
	}
	if r.IntN(2) == 0 {
		list(bulkDone+lat(), true)
	}
	return firstCancelled
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
	for _, sc := range append(slices.Clone(scenarios), "burst") {
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
		if h := byID[rec.ID]; h != nil { // ingest keys (addIngest) are no backup's here
			h.recs = append(h.recs, rec)
		}
	}
	for id, cs := range g.bulkCancels {
		byID[id].cancels = append(byID[id].cancels, cs...)
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
			if !acked && (!underWay || r.IntN(2) != 0) {
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
