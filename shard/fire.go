package shard

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// Firing runs on the leader only. On gaining leadership the shard issues a
// Raft barrier: once it returns, every entry committed before this term has
// been applied, so the wheel (kept warm on every replica) holds every pending
// event due within the horizon. Then the firing loop sleeps until the wheel's next due time, takes
// what fell due out of the wheel, reads the events from Pebble, produces them
// and records the outcome through Raft (MarkFired / MarkDeadLettered).
//
// An event taken out of the wheel is "in flight" until that outcome is
// applied. If the produce or the mark does not complete (leadership lost,
// broker down), the event goes back into the wheel, still pending in the FSM,
// so this replica fires it again if it leads again; another leader fires it
// from its own wheel. That is where duplicates come from: a record produced
// whose MarkFired did not commit. The FSM counts them (Stats.Refired).
//
// A batch goes through these stages, each timed in chime_fire_stage_seconds:
// wake (taken out of the wheel), slot (a free firing slot), read (Pebble),
// hold (an early batch waits for its due time), then it drops the events
// cancelled meanwhile, takes the lease, produces, marks, and settles.

// fireBatch is a set of events taken out of the wheel together.
type fireBatch struct {
	entries []wheel.Entry
	// notBefore is when the batch may be produced: the latest time at which
	// one of its entries falls due by the wheel (a retried entry's Due in
	// entries is its original due time, for lateness; this is its retry
	// time).
	notBefore int64
	// cancelled holds the entries whose cancel was applied while the batch
	// was in flight; one that is still held is not produced. Guarded by
	// firing.mu.
	cancelled map[uint64]bool
	// limited holds the entries a topic rate limit held back before, each
	// with whether it holds a slot of the limit now (it goes without
	// asking again). Set when the batch is taken.
	limited map[uint64]bool
	// early is set when the batch was taken before notBefore.
	early bool
	// sending is set once the batch has dropped its cancelled entries and
	// goes on to produce the rest. Guarded by firing.mu.
	sending bool
	done    chan struct{} // closed when every entry is settled or back in the wheel
	// afterLimited is closed once the batch taken before this one has
	// asked the topic rate limits for its records, and limitedDone once
	// this one has (passLimits): batches ask in the order they were taken,
	// which is priority order, however their reads overlap.
	afterLimited <-chan struct{}
	limitedDone  chan struct{}
	passOnce     sync.Once
}

// passLimits lets the next batch ask the topic rate limits.
func (b *fireBatch) passLimits() {
	if b.limitedDone != nil {
		b.passOnce.Do(func() { close(b.limitedDone) })
	}
}

func (b *fireBatch) all() map[uint64]bool {
	m := make(map[uint64]bool, len(b.entries))
	for _, e := range b.entries {
		m[e.Ref] = true
	}
	return m
}

// leadershipLoop starts the firing loop when raft makes this replica leader
// and stops it when leadership is lost or the shard closes.
func (s *Shard) leadershipLoop() {
	defer s.wg.Done()
	var stopFiring func() // non-nil while the firing loop runs
	for {
		select {
		case leader := <-s.notify:
			if leader && stopFiring == nil {
				stopFiring = s.startFiring()
			} else if !leader && stopFiring != nil {
				stopFiring()
				stopFiring = nil
			}
		case <-s.stop:
			if stopFiring != nil {
				stopFiring()
			}
			return
		}
	}
}

// startFiring runs the leader's loops (firing, the clean-up of settled
// events past the retention, the sweep for events the firing lost and, in a
// cluster, reconciliation) until the returned function is called; that function
// returns once they and their batches have finished.
func (s *Shard) startFiring() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// asked is closed once the firing loop has adopted the other
	// replicas' parked events, which the sweep loop's first mark then
	// includes.
	asked := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.fireLoop(ctx, asked)
	}()
	if s.cfg.Directory != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.reconcileLoop(ctx)
		}()
	}
	if s.tune.Retention > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.expireLoop(ctx)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.sweepLoop(ctx, asked)
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// fireLoop fires this leadership's events: after a barrier, and after
// asking the other replicas for their parked events (closing asked), so
// that none of those is produced again. It returns without closing asked
// only once ctx has ended.
func (s *Shard) fireLoop(ctx context.Context, asked chan<- struct{}) {
	s.logger.Info("leading: barrier, then firing")
	if !s.barrier(ctx) {
		return
	}
	s.metrics.LeaderChanges.Inc()
	s.firing.setFence(s.cfg.Now().UnixNano() + int64(s.tune.ClockSkewBound))
	defer func() {
		s.firing.setFence(never)
		s.lease.end()
	}()
	s.askParked(ctx)
	close(asked)

	t := &firingTerm{slots: make(chan struct{}, s.tune.MaxFiring)}
	s.term.Store(t)
	defer t.wg.Wait()
	defer s.term.Store(nil)
	wake := s.metrics.FireStage.WithLabelValues("wake")
	onTime := func(late int64) { wake.Observe(time.Duration(late).Seconds()) }
	s.firing.run(ctx, int64(s.tune.FireLead), s.tune.FireBatch, onTime, func(batches []*fireBatch) bool {
		return s.dispatch(ctx, batches, t.slots, &t.wg)
	})
}

// firingTerm is one leadership's firing: the slots that bound its batches
// in flight, and the batches' goroutines.
type firingTerm struct {
	slots chan struct{}
	wg    sync.WaitGroup
}

// quiesce stops this leader starting produces and waits, at most
// handoffWait, for the batches it has produced to commit their MarkFired;
// it returns the function that lets firing go on. A leader calls it before
// handing its shard over (a drain, leadership balancing, an operator's
// TransferLeader): a batch produced but not yet marked when leadership
// moves is fired again by the next leader, and during the transfer raft
// refuses the MarkFired itself, so every batch in flight became a
// duplicate.
//
// Holding every firing slot is what stops it: a batch holds one from before
// its produce until Kafka answers, so once all are held no produce is under
// way or can start, and the batches' goroutines left are marking. A batch
// taken early holds its slot until its due time, at most FireLead away.
func (s *Shard) quiesce() (resume func()) {
	t := s.term.Load()
	if t == nil {
		return func() {}
	}
	timeout := time.NewTimer(handoffWait)
	defer timeout.Stop()
	held := 0
	release := func() {
		for range held {
			<-t.slots
		}
	}
	for held < cap(t.slots) {
		select {
		case t.slots <- struct{}{}:
			held++
		case <-timeout.C:
			return release
		}
	}
	// With every slot held no batch starts, so no Add races this Wait; the
	// goroutine ends when the marks in flight do (each within markTimeout).
	marked := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(marked)
	}()
	select {
	case <-marked:
	case <-timeout.C:
	}
	return release
}

// barrier waits until every entry committed before this term has been
// applied, retrying until it succeeds or ctx ends.
func (s *Shard) barrier(ctx context.Context) bool {
	for {
		err := s.raft.Barrier(barrierTimeout).Error()
		s.noteRaft(err)
		if err == nil {
			return true
		}
		s.logger.Warn("barrier failed", "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(barrierRetry):
		}
	}
}

// dispatch starts a fire goroutine for each batch once it has a firing
// slot. A batch taken early holds its slot while it waits for its due time:
// the slots also bound what is taken out of the wheel, which is what keeps a
// broker outage from emptying it into batches that wait for the broker. If
// ctx ends first, the batches not started go back into the wheel and it
// returns false.
func (s *Shard) dispatch(ctx context.Context, batches []*fireBatch, slots chan struct{}, wg *sync.WaitGroup) bool {
	for i, batch := range batches {
		taken := time.Now()
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			for _, b := range batches[i:] {
				b.passLimits()
				s.firing.settleBatch(b, b.all(), 0)
			}
			return false
		}
		s.observeStage("slot", taken)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			release := func() { once.Do(func() { <-slots }) }
			defer release()
			s.fire(ctx, batch, release)
		}()
	}
	return true
}

// fire reads, produces and marks one batch. It always settles the batch.
//
// Before producing, the leader confirms with a quorum that it still leads
// (a raft Barrier; see lease.renew), and it hands records to Kafka only
// within the leader lease from the moment it asked: followers do not elect
// a new leader until a heartbeat timeout after they last heard from this
// one, which is longer.
// A leader that was paused (a GC stall, SIGSTOP, a slow disk) finds its
// lease gone when it resumes and starts no produce: the fault tests caught a
// paused leader that resumed and produced events a new leader had already
// cancelled. The answer to a produce under way may take longer than the
// lease and is waited for. What an old leader's produce can still deliver
// after a new leader took over (a pause between the check and the write,
// a request the network held back) is covered on the new leader's side:
// it does not acknowledge a cancel of an event that may have been
// produced (see Shard.inDoubt).
//
// release frees the batch's firing slot: the slots bound the produces in
// flight, and a batch no longer needs its slot once Kafka has answered, so
// the next batch does not wait for this one's MarkFired to commit.
func (s *Shard) fire(ctx context.Context, b *fireBatch, release func()) {
	defer b.passLimits()
	start := time.Now()
	out, planned, err := s.read(b)
	start = s.observeStage("read", start)
	if err != nil {
		s.logger.Error("reading due events", "err", err, "events", len(b.entries))
		s.firing.settleBatch(b, b.all(), s.tune.RetryDelay)
		return
	}
	// Asked before the hold, so that a batch taken early does not keep
	// the batches after it waiting for its due time; a record it holds
	// back goes back no sooner than it is due.
	out = s.limit(ctx, b, out)
	if len(out) > 0 {
		if err := hold(ctx, s.cfg.Now, b.notBefore); err != nil {
			s.firing.settleBatch(b, b.all(), 0)
			return
		}
		start = s.observeStage("hold", start)
		if b.early {
			// Its wake-up: how long after its due time the held batch went on.
			s.metrics.FireStage.WithLabelValues("wake").Observe(time.Duration(max(start.UnixNano()-b.notBefore, 0)).Seconds())
		}
		out = s.firing.dropCancelled(b, out)
	}
	if len(out) == 0 {
		s.firing.settleBatch(b, nil, 0)
		return
	}
	waited, err := s.awaitMarks(ctx)
	if waited {
		start = s.observeStage("stalled", start)
	}
	if err != nil {
		s.firing.settleBatch(b, b.all(), leaseRetry)
		return
	}
	// The lease is taken after the read, just before the produce: a read of
	// a thousand events can take longer than what is left of a lease, and
	// when it was taken first, a draining backlog spent its CPU reading
	// batches whose lease had run out by the time they could be sent.
	deadline, err := s.lease.deadline(ctx)
	start = s.observeStage("lease", start)
	if err != nil {
		s.firing.settleBatch(b, b.all(), leaseRetry)
		return
	}
	outcomes := s.produce(ctx, deadline, out)
	start = s.observeStage("produce", start)
	release()
	marked := s.mark(b, out, outcomes, planned, start)
	requeue, delay := s.firing.settleOutcomes(out, outcomes, marked)
	s.firing.settleBatch(b, requeue, delay)
}

// limit holds back the records of out that a topic rate limit does not let
// go now: they go back into the wheel for when they may (see
// topiclimit.Limiter.Admit), and the rest are returned. Records are asked
// in the batch's order, which is priority order, and batches in the order
// they were taken (fireBatch.afterLimited), so a backlog over a limit is
// let through highest priority first: when batches asked as their reads
// finished, a burst of 100,000 over a limit came out with priorities 9 to
// 5 mixed.
func (s *Shard) limit(ctx context.Context, b *fireBatch, out []publish.Record) []publish.Record {
	defer b.passLimits()
	if len(s.limits.Rules()) == 0 {
		return out
	}
	if b.afterLimited != nil {
		select {
		case <-b.afterLimited:
		case <-ctx.Done():
			return out // the batch goes back whole: its produce needs ctx too
		}
	}
	now := s.cfg.Now()
	priorities := make(map[uint64]uint8, len(b.entries))
	for _, e := range b.entries {
		priorities[e.Ref] = e.Priority
	}
	var held []deferral
	kept := out[:0]
	for _, r := range out {
		reserved, again := b.limited[r.Seq]
		if reserved {
			kept = append(kept, r) // it holds a slot now
			continue
		}
		d := s.limits.Admit(now, r.Topic, priorities[r.Seq], again)
		if !d.Later(now) {
			kept = append(kept, r)
			continue
		}
		held = append(held, deferral{seq: r.Seq, at: d.At.UnixNano(), reserved: d.Reserved})
		s.metrics.RateLimited.WithLabelValues(d.Rule).Inc()
	}
	if len(held) > 0 {
		s.firing.mu.Lock()
		s.firing.deferLocked(b, held)
		s.firing.mu.Unlock()
		s.firing.wake()
	}
	return kept
}

// read reads the batch's events and returns the records of those still
// scheduled: an event cancelled (or settled) after it entered the wheel is
// left out. planned holds, for those with a window, the point of it they
// were to fire at (spreadAt), which their lateness counts from.
func (s *Shard) read(b *fireBatch) (out []publish.Record, planned map[uint64]int64, err error) {
	refs := make([]raftfsm.Ref, len(b.entries))
	for i, e := range b.entries {
		refs[i] = raftfsm.Ref{Seq: e.Ref, Due: e.Due}
	}
	recs, err := s.fsm.ReadForFire(refs, nil)
	if err != nil {
		return nil, nil, err
	}
	// ReadForFire answers in key order, which is due order; a batch taken
	// by priority (firing.take) is produced highest priority first, so that
	// one partition's records of it are in that order too.
	slices.SortStableFunc(recs, func(a, b raftfsm.Record) int { return int(b.Priority) - int(a.Priority) })
	out = make([]publish.Record, 0, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.State != raftfsm.StateScheduled {
			continue
		}
		if r.Window > 0 {
			if planned == nil {
				planned = make(map[uint64]int64)
			}
			planned[r.Seq] = spreadAt(r.Seq, r.Due, r.Window)
		}
		out = append(out, publish.Record{
			Seq: r.Seq, ID: r.ID, Topic: r.Topic, Key: r.Key, Value: r.Payload,
			Headers: toPublishHeaders(r.Headers), Due: r.Due, Attempts: r.Attempts,
			Version: r.Version, Partition: r.Partition, HasPartition: r.HasPartition, Tombstone: r.Tombstone,
		})
	}
	return out, planned, nil
}

// hold waits until notBefore (Unix ns) by the clock now: a batch taken out
// of the wheel early is produced no sooner than its entries are due.
func hold(ctx context.Context, now func() time.Time, notBefore int64) error {
	for {
		d := time.Duration(notBefore - now().UnixNano())
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// produce hands out to the publisher, handing records to Kafka only until
// deadline (the lease).
func (s *Shard) produce(ctx context.Context, deadline time.Time, out []publish.Record) []publish.Outcome {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return s.cfg.Publisher.Publish(ctx, out)
}

// mark records through Raft the outcome of every record Kafka acknowledged
// and returns the events whose mark committed. The records are in Kafka:
// the marks are made even if leadership was just lost, to spare the next
// leader a duplicate, so they are not bound by the firing context.
func (s *Shard) mark(b *fireBatch, out []publish.Record, outcomes []publish.Outcome, planned map[uint64]int64, start time.Time) map[uint64]bool {
	var (
		fired []raftfsm.Fired
		dead  []raftfsm.DeadLettered
	)
	for i, o := range outcomes {
		switch {
		case !o.Done:
		case o.DeadLettered:
			dead = append(dead, raftfsm.DeadLettered{Seq: o.Seq, At: o.FiredAt, Attempts: o.Attempts, Error: o.Err, Topic: s.cfg.Publisher.DeadLetterTopic(), Due: out[i].Due})
			s.metrics.DeadLettered.Inc()
		default:
			fired = append(fired, raftfsm.Fired{Seq: o.Seq, FiredAt: o.FiredAt, Attempts: o.Attempts, Due: out[i].Due})
			at, ok := planned[o.Seq]
			if !ok {
				at = out[i].Due
			}
			late := time.Duration(o.FiredAt - at).Seconds()
			if _, limited := b.limited[o.Seq]; limited {
				s.metrics.RateLimitedLateness.Observe(late)
			} else {
				s.metrics.Lateness.Observe(late)
				s.metrics.observeFired(out[i].Topic, late)
			}
		}
	}
	marked := make(map[uint64]bool, len(outcomes))
	ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
	defer cancel()
	if len(fired) > 0 {
		var err error
		if hook := s.cfg.Knobs.BatchMark; hook != nil {
			err = hook()
		}
		if err == nil {
			err = s.markFired(ctx, fired)
		}
		s.observeStage("mark", start)
		if err != nil {
			s.logger.Warn("marking fired events", "err", err, "events", len(fired))
		} else {
			for _, f := range fired {
				marked[f.Seq] = true
			}
			s.metrics.Fired.Add(float64(len(fired)))
		}
	}
	if len(dead) > 0 {
		cmd := raftfsm.MarkDeadLettered{ProposedAt: s.cfg.Now().UnixNano(), DueKnown: true, Entries: dead}
		if _, err := s.apply(ctx, raftfsm.AppendMarkDeadLettered(nil, &cmd)); err != nil {
			s.logger.Warn("marking dead-lettered events", "err", err, "events", len(dead))
		} else {
			for _, d := range dead {
				marked[d.Seq] = true
			}
		}
	}
	return marked
}

// observeStage records the time since start as stage of a fire batch and
// returns the time it read.
func (s *Shard) observeStage(stage string, start time.Time) time.Time {
	now := time.Now()
	s.metrics.FireStage.WithLabelValues(stage).Observe(now.Sub(start).Seconds())
	return now
}

func toPublishHeaders(hs []raftfsm.Header) []publish.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]publish.Header, len(hs))
	for i, h := range hs {
		out[i] = publish.Header{Key: h.Key, Value: h.Value}
	}
	return out
}
