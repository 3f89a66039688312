package shard

import (
	"context"
	"errors"
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
// event. Then the firing loop sleeps until the wheel's next due time, takes
// what fell due out of the wheel, reads the events from Pebble, produces them
// and records the outcome through Raft (MarkFired / MarkDeadLettered).
//
// An event taken out of the wheel is "in flight" until that outcome is
// applied. If the produce or the mark does not complete (leadership lost,
// broker down), the event goes back into the wheel, still pending in the FSM,
// so this replica fires it again if it leads again; another leader fires it
// from its own wheel. That is where duplicates come from: a record produced
// whose MarkFired did not commit. The FSM counts them (Stats.Refired).

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
	// Shard.mu.
	cancelled map[uint64]bool
	// early is set when the batch was taken before notBefore.
	early bool
	// sending is set once the batch has dropped its cancelled entries and
	// goes on to produce the rest. Guarded by Shard.mu.
	sending bool
	done    chan struct{} // closed when every entry is settled or back in the wheel
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

// startFiring runs the leader's loops (firing and, in a cluster,
// reconciliation) until the returned function is called; that function
// returns once they and their batches have finished.
func (s *Shard) startFiring() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.fireLoop(ctx)
	}()
	if s.cfg.Directory != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.reconcileLoop(ctx)
		}()
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

func (s *Shard) fireLoop(ctx context.Context) {
	s.logger.Info("leading: barrier, then firing")
	for {
		err := s.raft.Barrier(10 * time.Second).Error()
		if err == nil {
			break
		}
		s.logger.Warn("barrier failed", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	s.metrics.LeaderChanges.Inc()
	s.mu.Lock()
	s.fenceUntil = s.cfg.Now().UnixNano() + int64(s.tune.ClockSkewBound)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.fenceUntil = 1<<63 - 1
		s.mu.Unlock()
		// A lease confirmed in this term must not serve the next one.
		s.leaseWG.Wait()
		s.leaseMu.Lock()
		s.leaseAsked, s.leaseStarted, s.leaseErr = time.Time{}, time.Time{}, nil
		s.leaseMu.Unlock()
	}()

	slots := make(chan struct{}, s.tune.MaxFiring)
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	lead := int64(s.tune.FireLead)
	var (
		due     []wheel.Entry
		batches []*fireBatch
	)
	for {
		now := s.cfg.Now().UnixNano()
		s.mu.Lock()
		due = s.wheel.Advance(now+lead, due[:0], s.tune.FireBatch)
		batches = s.takeBatches(due, now, batches[:0])
		if len(batches) > 0 {
			s.sleepUntil = now
		} else if next, ok := s.wheel.NextDue(); ok {
			s.sleepUntil = next
		} else {
			s.sleepUntil = 1<<63 - 1
		}
		sleepUntil := s.sleepUntil
		s.mu.Unlock()

		for i, batch := range batches {
			// A batch taken early holds its slot while it waits for its
			// due time: the slots also bound what is taken out of the
			// wheel, which is what keeps a broker outage from emptying it
			// into batches that wait for the broker.
			taken := time.Now()
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				for _, b := range batches[i:] {
					s.settle(b, b.all(), 0)
				}
				return
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
		if len(batches) > 0 {
			clear(batches)
			continue
		}
		// Drain a stale kick before sleeping: the wheel was read after it.
		select {
		case <-s.kick:
		default:
		}
		timer.Reset(time.Duration(min(max(sleepUntil-lead-now, 0), int64(time.Hour))))
		select {
		case <-timer.C:
		case <-s.kick:
			if !timer.Stop() {
				<-timer.C
			}
		case <-ctx.Done():
			return
		}
	}
}

// takeBatches turns entries just taken out of the wheel (in due order, due
// by now+FireLead) into fire batches, marks them in flight and appends them
// to out. Entries due by now make one batch, sent at once. The rest are
// taken early, up to FireLead before they fall due, so that their read,
// their wait for a firing slot and the firing loop's own wake-up are done
// before the due time and cannot make them late: under load each of those
// took 10-50 ms now and then (a memtable flush, three on one 2-core machine,
// holding the cores for a second). They are grouped by wheel tick, and each
// group is held after its read until its last entry is due (fireBatch.notBefore).
// s.mu must be held.
func (s *Shard) takeBatches(due []wheel.Entry, now int64, out []*fireBatch) []*fireBatch {
	res := int64(s.tune.Resolution)
	for len(due) > 0 {
		n := 1
		if due[0].Due <= now {
			for n < len(due) && due[n].Due <= now {
				n++
			}
		} else {
			for n < len(due) && due[n].Due-due[0].Due < res {
				n++
			}
		}
		b := &fireBatch{entries: slices.Clone(due[:n]), done: make(chan struct{})}
		earliest := due[0].Due
		for i, e := range b.entries {
			earliest = min(earliest, e.Due)
			b.notBefore = max(b.notBefore, e.Due)
			s.handles.delete(e.Ref)
			s.inflight[e.Ref] = b
			if d, ok := s.retrying[e.Ref]; ok {
				b.entries[i].Due = d
				delete(s.retrying, e.Ref)
			}
		}
		if b.early = b.notBefore > now; !b.early {
			s.metrics.FireStage.WithLabelValues("wake").Observe(time.Duration(now - earliest).Seconds())
		}
		out = append(out, b)
		due = due[n:]
	}
	return out
}

// fire reads, produces and marks one batch. It always settles the batch.
//
// Before producing, the leader confirms with a quorum that it still leads
// (a raft Barrier; see renewLease), and it hands records to Kafka only
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
	refs := make([]raftfsm.Ref, len(b.entries))
	for i, e := range b.entries {
		refs[i] = raftfsm.Ref{Seq: e.Ref, Due: e.Due}
	}
	start := time.Now()
	recs, err := s.fsm.ReadForFire(refs, nil)
	start = s.observeStage("read", start)
	if err != nil {
		s.logger.Error("reading due events", "err", err, "events", len(refs))
		s.settle(b, b.all(), retryDelay)
		return
	}
	out := make([]publish.Record, 0, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.State != raftfsm.StateScheduled {
			continue // cancelled (or settled) after it entered the wheel
		}
		out = append(out, publish.Record{
			Seq: r.Seq, ID: r.ID, Topic: r.Topic, Key: r.Key, Value: r.Payload,
			Headers: toPublishHeaders(r.Headers), Due: r.Due, Attempts: r.Attempts,
		})
	}
	if len(out) == 0 {
		s.settle(b, nil, 0)
		return
	}
	if err := s.hold(ctx, b.notBefore); err != nil {
		s.settle(b, b.all(), 0)
		return
	}
	start = s.observeStage("hold", start)
	if b.early {
		// Its wake-up: how long after its due time the held batch went on.
		s.metrics.FireStage.WithLabelValues("wake").Observe(time.Duration(max(start.UnixNano()-b.notBefore, 0)).Seconds())
	}
	// From here on the batch produces what it holds; a cancel applied
	// before this point keeps its event out (see Shard.Cancel).
	s.mu.Lock()
	b.sending = true
	if len(b.cancelled) > 0 {
		out = slices.DeleteFunc(out, func(r publish.Record) bool { return b.cancelled[r.Seq] })
	}
	s.mu.Unlock()
	if len(out) == 0 {
		s.settle(b, nil, 0)
		return
	}
	// The lease is taken after the read, just before the produce: a read of
	// a thousand events can take longer than what is left of a lease, and
	// when it was taken first, a draining backlog spent its CPU reading
	// batches whose lease had run out by the time they could be sent.
	deadline, err := s.leaseDeadline(ctx)
	start = s.observeStage("lease", start)
	if err != nil {
		s.settle(b, b.all(), leaseRetry)
		return
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	outcomes := s.cfg.Publisher.Publish(ctx, out)
	start = s.observeStage("produce", start)
	release()

	var (
		fired []raftfsm.Fired
		dead  []raftfsm.DeadLettered
	)
	marked := make(map[uint64]bool, len(outcomes))
	for i, o := range outcomes {
		if !o.Done {
			continue
		}
		if o.DeadLettered {
			dead = append(dead, raftfsm.DeadLettered{Seq: o.Seq, At: o.FiredAt, Attempts: o.Attempts, Error: o.Err, Topic: s.cfg.Publisher.DeadLetterTopic(), Due: out[i].Due})
			s.metrics.DeadLettered.Inc()
			continue
		}
		fired = append(fired, raftfsm.Fired{Seq: o.Seq, FiredAt: o.FiredAt, Attempts: o.Attempts, Due: out[i].Due})
		s.metrics.Lateness.Observe(time.Duration(o.FiredAt - out[i].Due).Seconds())
	}
	// The records are in Kafka: record that even if leadership was just
	// lost, to spare the next leader a duplicate. Not bound by ctx.
	mctx, cancel := context.WithTimeout(context.Background(), markTimeout)
	defer cancel()
	if len(fired) > 0 {
		err := s.markFired(mctx, fired)
		s.observeStage("mark", start)
		if err == nil {
			for _, f := range fired {
				marked[f.Seq] = true
			}
			s.metrics.Fired.Add(float64(len(fired)))
		} else {
			s.logger.Warn("marking fired events", "err", err, "events", len(fired))
		}
	}
	if len(dead) > 0 {
		cmd := raftfsm.MarkDeadLettered{ProposedAt: s.cfg.Now().UnixNano(), DueKnown: true, Entries: dead}
		if _, err := s.apply(mctx, raftfsm.AppendMarkDeadLettered(nil, &cmd)); err == nil {
			for _, d := range dead {
				marked[d.Seq] = true
			}
		} else {
			s.logger.Warn("marking dead-lettered events", "err", err, "events", len(dead))
		}
	}
	// Whatever was due for production here and is not marked goes back, and
	// stays in doubt: an unanswered request (of this call, or of an earlier
	// attempt within it) may still land, and a produced record whose mark
	// did not commit is in Kafka already. Events that were skipped above
	// are settled and dropped.
	unsettled := make(map[uint64]bool, len(out))
	now := s.cfg.Now().UnixNano()
	failed := false // a produce went out and did not come back marked
	s.mu.Lock()
	for i, r := range out {
		if marked[r.Seq] {
			delete(s.unsure, r.Seq)
			continue
		}
		unsettled[r.Seq] = true
		if outcomes[i].Sent || outcomes[i].Done {
			s.unsure[r.Seq] = now
			failed = true
		}
		// Neither sent nor done: the lease ran out while the record waited
		// for its turn in the publisher. It never left; fire it again at
		// once, under a fresh lease.
	}
	delay := time.Duration(0)
	if !failed {
		if len(unsettled) == 0 {
			s.failedBatches = 0
		}
	} else {
		s.failedBatches++
		delay = min(retryDelay<<min(s.failedBatches-1, 8), maxRetryDelay)
		if len(s.unsure) > 1024 {
			for seq, at := range s.unsure {
				if now-at > int64(unsureTTL) {
					delete(s.unsure, seq)
				}
			}
		}
	}
	s.mu.Unlock()
	s.settle(b, unsettled, delay)
}

// hold waits until notBefore (Unix ns) by the shard's clock: a batch taken
// out of the wheel early is produced no sooner than its entries are due.
func (s *Shard) hold(ctx context.Context, notBefore int64) error {
	for {
		d := time.Duration(notBefore - s.cfg.Now().UnixNano())
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

// leaseDeadline returns until when this leader may hand records to Kafka: a
// leader lease from the last time it asked a quorum (renewLease) whether it
// still leads. Batches share a lease instead of asking each. Renewals run in
// the background, one started every quarter of a lease while the shard
// fires and up to maxLeaseRenewals at once, and batches keep using the
// lease they have meanwhile: under load a quorum round trip took 20-150 ms
// (a barrier, more while Raft's apply queue is long), and when the renewal
// was made in line every batch of that moment waited for it, which made
// most of the firing tail at 10,000 events a second. Overlapping renewals
// keep a lease valid even when one takes longer than a lease. A batch waits
// only when less than leaseMargin of the lease is left.
func (s *Shard) leaseDeadline(ctx context.Context) (time.Time, error) {
	for waits := 0; ; waits++ {
		s.leaseMu.Lock()
		now := time.Now()
		short := s.leaseAsked.Add(s.lease).Sub(now) < leaseMargin
		due := now.Sub(s.leaseAsked) > s.lease/4 && now.Sub(s.leaseStarted) > s.lease/4
		if (due && s.leaseRenewing < maxLeaseRenewals) || (short && s.leaseRenewing == 0) {
			s.leaseStarted = now
			s.leaseRenewing++
			s.leaseWG.Add(1)
			go s.renewLease(now)
		}
		deadline, changed, lastErr := s.leaseAsked.Add(s.lease), s.leaseChanged, s.leaseErr
		s.leaseMu.Unlock()
		if deadline.Sub(now) >= leaseMargin {
			return deadline, nil
		}
		if waits > 0 && lastErr != nil {
			return time.Time{}, lastErr
		}
		if waits >= maxLeaseRenewals {
			return time.Time{}, errors.New("shard: leader lease not renewed")
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

const (
	// leaseMargin is the least lease a batch starts its produce with.
	leaseMargin = 25 * time.Millisecond
	// maxLeaseRenewals bounds the renewals in flight.
	maxLeaseRenewals = 3
	// leaseRetry is how long a batch that got no lease waits to fire again.
	leaseRetry = 50 * time.Millisecond
)

// renewLease asks a quorum whether this replica still leads and, if so,
// starts a new lease from asked, the moment it asked. It then wakes the
// batches waiting for a lease. The firing loop waits for it (leaseWG)
// before it ends, so a renewal of one term never lands in the next.
//
// It asks with a Barrier, a log entry made after the moment it asked, which
// commits only once a quorum has accepted it: proof that a quorum still
// followed this leader after that moment. raft's VerifyLeader is not such a
// proof. It counts any successful reply the leader reads after the call,
// and a leader paused for seconds (SIGSTOP in the fault tests) reads, on
// waking, the replies to heartbeats it sent before the pause: it verified,
// took a lease from the moment it woke, and produced an event that a new
// leader had cancelled eight seconds earlier. A Barrier costs a log append;
// about four are made per lease while the shard fires.
func (s *Shard) renewLease(asked time.Time) {
	defer s.leaseWG.Done()
	err := s.raft.Barrier(s.lease).Error()
	s.leaseMu.Lock()
	if err == nil && asked.After(s.leaseAsked) {
		s.leaseAsked = asked
	}
	s.leaseErr = err
	s.leaseRenewing--
	close(s.leaseChanged)
	s.leaseChanged = make(chan struct{})
	s.leaseMu.Unlock()
}

// settle ends a batch: entries in requeue go back into the wheel, due no
// sooner than delay from now; the rest are dropped from the in-flight set.
func (s *Shard) settle(b *fireBatch, requeue map[uint64]bool, delay time.Duration) {
	retryAt := s.cfg.Now().UnixNano() + int64(delay)
	s.mu.Lock()
	for _, e := range b.entries {
		delete(s.inflight, e.Ref)
		if requeue[e.Ref] {
			s.handles.set(e.Ref, s.wheel.Add(e.Ref, max(e.Due, retryAt)))
			if retryAt > e.Due {
				s.retrying[e.Ref] = e.Due
			}
		}
	}
	s.mu.Unlock()
	close(b.done)
	if len(requeue) > 0 {
		s.wake()
	}
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
