package checker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Check 11: recurring schedules (design invariant 9). See doc.go.

// schedRule is a workload rule the checker computes by itself, without Chime's code: every
// k seconds of the minute ("*/k * * * * *", k dividing 60), or every EveryNs from StartNs.
// Zones change nothing for the first: every zone's offset is a whole number of minutes, so a
// second of the minute is the same second in every zone, and a transition skips or repeats
// whole minutes.
type schedRule struct {
	k              int64 // seconds, for a cron rule
	every          int64 // ns, for an interval
	start, end     int64 // ns; end 0: none
	supported      bool
	text, catchUp  string
	topic, payload string
}

func ruleOf(op *Op) schedRule {
	r := schedRule{start: op.StartNs, end: op.EndNs, text: op.Cron, catchUp: op.CatchUp, topic: op.Topic, payload: op.Payload}
	switch {
	case op.EveryNs > 0 && op.StartNs != 0:
		r.every, r.supported = op.EveryNs, true
		r.text = time.Duration(op.EveryNs).String()
	case strings.HasPrefix(op.Cron, "*/") && strings.HasSuffix(op.Cron, " * * * * *"):
		k, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(op.Cron, "*/"), " * * * * *"), 10, 64)
		r.k, r.supported = k, err == nil && k > 0 && 60%k == 0
	}
	return r
}

// generates reports whether the rule has an occurrence at ns.
func (r schedRule) generates(ns int64) bool {
	if ns < r.start || r.end != 0 && ns > r.end {
		return false
	}
	if r.every != 0 {
		return (ns-r.start)%r.every == 0
	}
	return ns%1e9 == 0 && (ns/1e9)%r.k == 0
}

// next is the rule's first occurrence strictly after ns (ignoring end).
func (r schedRule) next(ns int64) int64 {
	if ns < r.start {
		ns = r.start - 1
	}
	if r.every != 0 {
		return r.start + ((ns-r.start)/r.every+1)*r.every
	}
	step := r.k * 1e9
	return (ns/step + 1) * step
}

type schedHistory struct {
	id      string
	create  *Op   // the first ok or info create
	okOnce  *Op   // the first ok create
	changes []*Op // pause, resume and delete ops, in invocation order
	// triggers and backfills are the trigger and backfill ops, in invocation order.
	triggers, backfills []*Op
	records             []*Record
}

// backfillOnlyMargin: a schedule's own occurrences are the rule's instants after its
// creation applied, on the leader's clock, which the skew nemesis moves by at most 5 s from
// the driver's. An occurrence more than this before the create was invoked was made by a
// backfill (check 11 h).
const backfillOnlyMargin = 10 * time.Second

// idFinding is a finding about one schedule.
type idFinding struct {
	id string
	finding
}

// recurring runs check 11 over every schedule, and counts the distinct occurrences read back.
func (a *analysis) recurring(ops []Op) (findings []idFinding, occurrences int) {
	scheds := map[string]*schedHistory{}
	get := func(id string) *schedHistory {
		s := scheds[id]
		if s == nil {
			s = &schedHistory{id: id}
			scheds[id] = s
		}
		return s
	}
	for i := range ops {
		op := &ops[i]
		if op.F != FRecurring {
			continue
		}
		s := get(op.ID)
		switch {
		case op.Action == ActionTrigger:
			s.triggers = append(s.triggers, op)
		case op.Action == ActionBackfill:
			s.backfills = append(s.backfills, op)
		case op.Action != ActionCreate:
			s.changes = append(s.changes, op)
		case op.Type == TypeFail:
		default:
			if s.create == nil {
				s.create = op
			}
			if op.Type == TypeOK && s.okOnce == nil {
				s.okOnce = op
			}
		}
	}
	for _, r := range a.occurrences {
		s := get(r.RecurringID)
		s.records = append(s.records, r)
	}
	ids := make([]string, 0, len(scheds))
	for id := range scheds {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := scheds[id]
		for _, l := range [][]*Op{s.changes, s.triggers, s.backfills} {
			slices.SortFunc(l, func(x, y *Op) int { return int(x.InvokeNs - y.InvokeNs) })
		}
		fs, n := a.schedule(s)
		findings = append(findings, fs...)
		occurrences += n
	}
	return findings, occurrences
}

func (a *analysis) schedule(s *schedHistory) (findings []idFinding, occurrences int) {
	add := func(check, format string, args ...any) {
		findings = append(findings, idFinding{s.id, finding{check, fmt.Sprintf(format, args...)}})
	}
	var rule schedRule
	if s.create != nil {
		rule = ruleOf(s.create)
	}

	// The first trigger (ok or info) of each instant, to the millisecond: what explains a
	// record of it.
	triggered := map[int64]*Op{}
	for _, op := range s.triggers {
		if ms := op.AtNs / 1e6 * 1e6; op.Type != TypeFail && triggered[ms] == nil {
			triggered[ms] = op
		}
	}
	// backfilled reports whether a backfill (ok or info) invoked before at covers nominal.
	backfilled := func(nominal, at int64) bool {
		for _, op := range s.backfills {
			if op.Type != TypeFail && nominal >= op.FromNs && nominal < op.ToNs && at >= op.InvokeNs-int64(a.cfg.EarlyTolerance) {
				return true
			}
		}
		return false
	}

	// Each record: phantom, early. first holds each occurrence's first append, and
	// triggerFirst each triggered one's.
	first, triggerFirst := map[int64]int64{}, map[int64]int64{}
	for _, r := range s.records {
		at, nominal := r.AppendMs*1e6, r.OccurrenceMs*1e6
		trig := triggered[nominal]
		switch {
		case s.create == nil:
			add("recurring_phantom", "record %s of schedule %s, which no ok or info create made", recName(r), s.id)
			continue
		case r.ID != s.id+"@"+strconv.FormatInt(r.OccurrenceMs, 10):
			add("recurring_phantom", "record %s has id %q, not %s@%d", recName(r), r.ID, s.id, r.OccurrenceMs)
			continue
		case trig != nil && (!rule.supported || !rule.generates(nominal)):
			if r.Payload != rule.payload || r.Topic != rule.topic && r.Topic != a.cfg.DeadLetterTopic {
				add("recurring_phantom", "record %s carries %s/%q, the schedule's target is %s/%q", recName(r), r.Topic, r.Payload, rule.topic, rule.payload)
				continue
			}
			if at < trig.InvokeNs-int64(a.cfg.EarlyTolerance) {
				if w, ok := a.skewExplains(trig.InvokeNs, at); ok {
					add("early_under_skew", "triggered occurrence record %s appended %s before the trigger was invoked at %s, inside skew window %s–%s",
						recName(r), time.Duration(trig.InvokeNs-at), a.rel(trig.InvokeNs), a.rel(w.start), a.rel(w.heal))
				} else {
					add("recurring_trigger_early", "record %s of the occurrence triggered at %s appended at %s, %s before the trigger was invoked (tolerance %s)",
						recName(r), a.rel(nominal), a.rel(at), time.Duration(trig.InvokeNs-at), a.cfg.EarlyTolerance)
				}
			}
			if f, seen := triggerFirst[nominal]; !seen || at < f {
				triggerFirst[nominal] = at
			}
			continue
		case !rule.supported:
			add("recurring_phantom", "record %s of schedule %s, whose rule %q the checker cannot compute", recName(r), s.id, s.create.Cron)
			continue
		case !rule.generates(nominal):
			add("recurring_phantom", "record %s is occurrence %s, which rule %s (from %s to %s) does not generate",
				recName(r), a.rel(nominal), rule.text, a.rel(rule.start), a.rel(rule.end))
			continue
		case r.Payload != rule.payload || r.Topic != rule.topic && r.Topic != a.cfg.DeadLetterTopic:
			add("recurring_phantom", "record %s carries %s/%q, the schedule's target is %s/%q", recName(r), r.Topic, r.Payload, rule.topic, rule.payload)
			continue
		}
		if at < nominal-int64(a.cfg.EarlyTolerance) {
			if w, ok := a.skewExplains(nominal, at); ok {
				add("early_under_skew", "occurrence record %s appended %s before %s, inside skew window %s–%s",
					recName(r), time.Duration(nominal-at), a.rel(nominal), a.rel(w.start), a.rel(w.heal))
			} else {
				add("recurring_early", "record %s appended at %s, %s before its occurrence %s (tolerance %s)",
					recName(r), a.rel(at), time.Duration(nominal-at), a.rel(nominal), a.cfg.EarlyTolerance)
			}
		}
		if nominal < s.create.InvokeNs-int64(backfillOnlyMargin) && !backfilled(nominal, at) {
			add("recurring_backfill_outside", "record %s is occurrence %s, before the schedule was created at %s (so only a backfill makes it), in no backfill's range invoked before %s",
				recName(r), a.rel(nominal), a.rel(s.create.InvokeNs), a.rel(at))
		}
		if f, seen := first[nominal]; !seen || at < f {
			first[nominal] = at
		}
	}

	// Every acknowledged trigger and backfill reached Kafka.
	for _, op := range s.triggers {
		if op.Type != TypeOK || op.Existing {
			continue
		}
		if _, ok := triggerFirst[op.AtNs/1e6*1e6]; !ok {
			if _, ok := first[op.AtNs/1e6*1e6]; !ok {
				add("recurring_trigger_lost", "the occurrence triggered at %s (acked at %s) never reached Kafka", a.rel(op.AtNs/1e6*1e6), a.rel(op.CompleteNs))
			}
		}
	}
	for _, op := range s.backfills {
		if op.Type != TypeOK {
			continue
		}
		for _, nominal := range op.CreatedNs {
			if _, ok := first[nominal/1e6*1e6]; !ok {
				add("recurring_backfill_lost", "occurrence %s, which the backfill of [%s, %s) acked at %s created, never reached Kafka",
					a.rel(nominal), a.rel(op.FromNs), a.rel(op.ToNs), a.rel(op.CompleteNs))
			}
		}
	}

	// After an ok Delete, no occurrence; after an ok Pause, none until a Resume that may
	// have happened was invoked. A copy of an occurrence first produced before the ack is a
	// duplicate, not an occurrence after it.
	for i, op := range s.changes {
		if op.Type != TypeOK || op.Action != ActionDelete && op.Action != ActionPause {
			continue
		}
		from, until := op.CompleteNs+int64(a.cfg.CancelTolerance), int64(1<<63-1)
		if op.Action == ActionPause {
			for _, later := range s.changes[i+1:] {
				if later.Action == ActionResume && later.Type != TypeFail {
					until = later.InvokeNs
					break
				}
			}
		}
		for nominal, at := range first {
			if at > from && at < until && !backfilled(nominal, at) {
				add("recurring_after_stop", "occurrence %s first appended at %s, %s after the %s acked at %s",
					a.rel(nominal), a.rel(at), time.Duration(at-op.CompleteNs), op.Action, a.rel(op.CompleteNs))
			}
		}
	}

	// Every occurrence after the create's ack, up to the schedule's end, reached Kafka: for a
	// schedule that catches up every missed occurrence, was never (maybe) deleted, and is
	// not (maybe) paused at the end. A pause is followed by a Resume that catches up what it
	// missed, so it excuses nothing.
	occurrences = len(first) + len(triggerFirst)
	if s.okOnce == nil || !rule.supported || rule.end == 0 || rule.catchUp != "all" {
		return findings, occurrences
	}
	end := rule.end
	for i, op := range s.changes {
		if op.Type == TypeFail {
			continue
		}
		if op.Action == ActionDelete {
			return findings, occurrences
		}
		if op.Action != ActionPause {
			continue
		}
		resumed := false
		for _, later := range s.changes[i+1:] {
			resumed = resumed || later.Action == ActionResume && later.Type == TypeOK && later.InvokeNs > op.CompleteNs
		}
		if !resumed {
			end = min(end, op.InvokeNs)
			break
		}
	}
	for nominal := rule.next(s.okOnce.CompleteNs); nominal <= end; nominal = rule.next(nominal) {
		if _, ok := first[nominal]; !ok {
			add("recurring_missing", "occurrence %s of %s (acked created at %s) never reached Kafka", a.rel(nominal), rule.text, a.rel(s.okOnce.CompleteNs))
		}
	}
	return findings, occurrences
}
