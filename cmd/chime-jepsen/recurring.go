package main

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// The run's recurring schedules: second-level cron rules in several zones and one interval,
// all catching up every missed occurrence and ending with the workload, so that the checker
// can demand every occurrence up to the end. rd is deleted half-way through. The checker
// computes these rules by itself (every k seconds of the minute, or an interval from start),
// which is why they take these forms.
var recurringSchedules = []struct {
	id, cron, zone string
	every          time.Duration
}{
	{id: "r1", cron: "*/2 * * * * *", zone: "Europe/Paris"},
	{id: "r2", cron: "*/3 * * * * *", zone: "America/New_York"},
	{id: "r3", every: 1500 * time.Millisecond, zone: "Australia/Lord_Howe"},
	{id: "r4", cron: "*/1 * * * * *", zone: "Asia/Kathmandu"},
	{id: "rd", cron: "*/2 * * * * *", zone: "Pacific/Chatham"},
}

const recurringTopic = "jepsen.r"

// backfillSchedule is an interval schedule whose rule starts backfillPast before it is
// created: its own sequence never makes those instants, so any record of one was made by
// a backfill, which the checker holds to the backfill's range (check 11 h).
const (
	backfillSchedule = "rb"
	backfillPast     = 10 * time.Minute
)

// The rates of the extra recurring ops, per round of the pause loop (one round every 1.5 to
// 8.5 s): small, so that the schedules' own sequences stay what most of the run checks.
const (
	triggerChance       = 3 // 1 in 3 rounds triggers a random schedule
	backfillChance      = 4 // 1 in 4 rounds backfills a stretch of rb's past
	pauseBackfillChance = 3 // 1 in 3 pauses backfills what the pause held back
)

// recurrer is process p of the workload: it creates the recurring schedules and rb, then
// pauses a random one and resumes it a few seconds later, over and over, and deletes rd
// half-way to end. Now and then it triggers a schedule, backfills a stretch of rb's past,
// or backfills what a pause held back before resuming. When ctx ends it still resumes what
// it paused, for a few seconds at most, so that the schedules run to their end.
func (w *workload) recurrer(ctx context.Context, p int, r *rand.Rand, end time.Time) {
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	for _, s := range recurringSchedules {
		rule := &chimev1.RecurringRule{TimeZone: s.zone, Start: timestamppb.New(start), End: timestamppb.New(end), CatchUp: chimev1.CatchUp_CATCH_UP_ALL}
		op := checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionCreate, ID: s.id, TimeZone: s.zone,
			StartNs: start.UnixNano(), EndNs: end.UnixNano(), CatchUp: "all", Topic: recurringTopic, Payload: "p-" + s.id}
		if s.every != 0 {
			rule.Rule, op.EveryNs = &chimev1.RecurringRule_Every{Every: durationpb.New(s.every)}, int64(s.every)
		} else {
			rule.Rule, op.Cron = &chimev1.RecurringRule_Cron{Cron: s.cron}, s.cron
		}
		req := &chimev1.CreateRecurringRequest{Id: s.id, Rule: rule, Target: &chimev1.RecurringTarget{Topic: recurringTopic, Payload: []byte(op.Payload)}}
		// A create is idempotent: sent again until it is acked.
		w.untilDone(ctx, r, op, func(ctx context.Context, rc chimev1.RecurringClient) error {
			_, err := rc.Create(ctx, req)
			return err
		})
	}
	rbStart := start.Add(-backfillPast)
	{
		rule := &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Second)},
			Start: timestamppb.New(rbStart), End: timestamppb.New(end), CatchUp: chimev1.CatchUp_CATCH_UP_ALL}
		op := checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionCreate, ID: backfillSchedule, EveryNs: int64(time.Second),
			StartNs: rbStart.UnixNano(), EndNs: end.UnixNano(), CatchUp: "all", Topic: recurringTopic, Payload: "p-" + backfillSchedule}
		req := &chimev1.CreateRecurringRequest{Id: backfillSchedule, Rule: rule, Target: &chimev1.RecurringTarget{Topic: recurringTopic, Payload: []byte(op.Payload)}}
		w.untilDone(ctx, r, op, func(ctx context.Context, rc chimev1.RecurringClient) error {
			_, err := rc.Create(ctx, req)
			return err
		})
	}
	w.mu.Lock()
	if end.After(w.maxDue) {
		w.maxDue = end // the drain waits for the last occurrence too
	}
	w.mu.Unlock()

	deleteAt := start.Add(end.Sub(start) / 2)
	deleted := false
	for ctx.Err() == nil {
		if !deleted && time.Now().After(deleteAt) {
			deleted = true
			w.untilDone(ctx, r, checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionDelete, ID: "rd"},
				func(ctx context.Context, rc chimev1.RecurringClient) error {
					_, err := rc.Delete(ctx, &chimev1.DeleteRecurringRequest{Id: "rd"})
					return err
				})
		}
		if r.IntN(triggerChance) == 0 {
			ids := []string{backfillSchedule}
			for _, s := range recurringSchedules {
				ids = append(ids, s.id)
			}
			w.trigger(p, r, ids[r.IntN(len(ids))])
		}
		if r.IntN(backfillChance) == 0 {
			from := rbStart.Add(time.Duration(r.IntN(int(backfillPast/time.Second)-60)) * time.Second).Add(time.Duration(r.IntN(1000)) * time.Millisecond)
			w.backfill(p, r, backfillSchedule, from, from.Add(time.Duration(1+r.IntN(30))*time.Second))
		}
		s := recurringSchedules[r.IntN(len(recurringSchedules)-1)] // not rd
		if !sleep(ctx, time.Duration(1000+r.IntN(4000))*time.Millisecond) {
			return
		}
		var resumesFrom *timestamppb.Timestamp
		paused := w.recurringOpFill(r, checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionPause, ID: s.id},
			func(ctx context.Context, rc chimev1.RecurringClient, _ *checker.Op) error {
				resp, err := rc.Pause(ctx, &chimev1.PauseRecurringRequest{Id: s.id})
				resumesFrom = resp.GetResumesFrom()
				return err
			})
		if paused == checker.TypeFail {
			continue
		}
		rctx, cancel := context.WithCancel(context.Background())
		live := sleep(ctx, time.Duration(500+r.IntN(3000))*time.Millisecond)
		if live && r.IntN(pauseBackfillChance) == 0 {
			// What the pause held back: from the first time the schedule has not made (the
			// pending occurrence the pause cancelled, however late it was), to now. The
			// resume then catches up only after the range, so each time is made once. An
			// unknown pause is read back first; if it did not take, nothing is backfilled.
			if resumesFrom == nil {
				resumesFrom = w.pausedFrom(r, s.id)
			}
			if resumesFrom != nil {
				w.backfill(p, r, s.id, resumesFrom.AsTime(), time.Now())
			}
		}
		if !live {
			// The workload is over, and the nemesis holds its last fault until this
			// returns: a few seconds of tries, then the schedule stays paused (the checker
			// then demands nothing after the pause).
			rctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		}
		// Resumed even after ctx ended, so that it runs to its end.
		w.untilDone(rctx, r, checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionResume, ID: s.id},
			func(ctx context.Context, rc chimev1.RecurringClient) error {
				_, err := rc.Resume(ctx, &chimev1.ResumeRecurringRequest{Id: s.id})
				if status.Code(err) == codes.FailedPrecondition {
					return nil // not paused: an unknown pause that did not happen
				}
				return err
			})
		cancel()
	}
}

// pausedFrom reads schedule id and returns where its resume would start, or nil if it is not
// paused or the read fails.
func (w *workload) pausedFrom(r *rand.Rand, id string) *timestamppb.Timestamp {
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	s, err := w.node(r).recurring().Get(ctx, &chimev1.GetRecurringRequest{Id: id})
	if err != nil || s.GetState() != chimev1.RecurringState_RECURRING_STATE_PAUSED {
		return nil
	}
	return s.GetResumesFrom()
}

// trigger triggers schedule id once, with an occurrence time chosen before the call, as a
// client retrying it would send each time. It is never on a millisecond that is a multiple
// of 500: every rule of the run occurs only at such instants, and a trigger there would be
// that occurrence.
func (w *workload) trigger(p int, r *rand.Rand, id string) {
	at := time.Now()
	if at.UnixMilli()%500 == 0 {
		at = at.Add(time.Millisecond)
	}
	op := checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionTrigger, ID: id, AtNs: at.UnixNano()}
	req := &chimev1.TriggerRecurringRequest{Id: id, At: timestamppb.New(at)}
	w.recurringOpFill(r, op, func(ctx context.Context, rc chimev1.RecurringClient, op *checker.Op) error {
		resp, err := rc.Trigger(ctx, req)
		if err == nil {
			op.Existing = resp.Existing
		}
		return err
	})
}

// backfill backfills schedule id's rule over [from, to).
func (w *workload) backfill(p int, r *rand.Rand, id string, from, to time.Time) {
	op := checker.Op{Process: p, F: checker.FRecurring, Action: checker.ActionBackfill, ID: id, FromNs: from.UnixNano(), ToNs: to.UnixNano()}
	req := &chimev1.BackfillRecurringRequest{Id: id, From: timestamppb.New(from), To: timestamppb.New(to)}
	w.recurringOpFill(r, op, func(ctx context.Context, rc chimev1.RecurringClient, op *checker.Op) error {
		resp, err := rc.Backfill(ctx, req)
		if err == nil {
			op.BackfillExisting = int(resp.Existing)
			for _, t := range resp.CreatedOccurrences {
				op.CreatedNs = append(op.CreatedNs, t.AsTime().UnixNano())
			}
		}
		return err
	})
}

// recurringOp sends one recurring op to a random node and records it. ABORTED means that the
// change was refused while an occurrence was being produced: nothing changed.
func (w *workload) recurringOp(r *rand.Rand, op checker.Op, call func(context.Context, chimev1.RecurringClient) error) string {
	return w.recurringOpFill(r, op, func(ctx context.Context, rc chimev1.RecurringClient, _ *checker.Op) error { return call(ctx, rc) })
}

// recurringOpFill is recurringOp for a call that records what the answer said in op.
func (w *workload) recurringOpFill(r *rand.Rand, op checker.Op, call func(context.Context, chimev1.RecurringClient, *checker.Op) error) string {
	n := w.node(r)
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op.Node, op.InvokeNs = n.id, time.Now().UnixNano()
	err := call(ctx, n.recurring(), &op)
	op.CompleteNs = time.Now().UnixNano()
	op.Type, op.Code = classify(err)
	if status.Code(err) == codes.Aborted {
		op.Type = checker.TypeFail
	}
	if err != nil {
		op.Error = err.Error()
	}
	w.record(op)
	return op.Type
}

// untilDone repeats a recurring op until it is ok, for at most two minutes or until ctx
// ends.
func (w *workload) untilDone(ctx context.Context, r *rand.Rand, op checker.Op, call func(context.Context, chimev1.RecurringClient) error) {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; {
		if w.recurringOp(r, op, call) == checker.TypeOK {
			return
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
