package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"golang.org/x/time/rate"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/snapshot"
	"github.com/chimehq/chime/shard/topiclimit"
	"github.com/chimehq/chime/wheel"
)

// Shard is one replica of a shard: a Raft group member whose state machine
// is a slice of the node's Pebble, with a timing wheel of its pending events
// kept warm on every replica. Only the leader proposes and fires.
type Shard struct {
	// Set by Open, read-only after.
	id      uint32
	cfg     Config
	tune    Tuning
	logger  *slog.Logger
	metrics *Metrics
	fsm     *raftfsm.FSM
	raft    *raft.Raft
	trans   raft.Transport
	logs    *logStore
	// transferFailedAt is when the last leadership transfer to each node
	// failed, under transferMu: reconcile's and a closing replica's
	// handovers both record it.
	transferMu       sync.Mutex
	transferFailedAt map[string]time.Time
	// deposed is the last node this replica saw lose the shard's
	// leadership (raft reported no leader after it), and when; under
	// transferMu. leaderWatch keeps it.
	deposed   string
	deposedAt time.Time
	// leaders delivers raft's leader observations to leaderWatch.
	leaders chan raft.Observation
	// reloadMu serialises the changes of raft's reloadable configuration,
	// each a read, a change and a write: the trailing logs (the snapshot
	// store) and the timeouts (settleTimeouts).
	reloadMu sync.Mutex
	snaps    *snapshot.Store
	// pace bounds the rate of the full snapshots this replica writes:
	// expansions sent to followers and backups (Config.Installs).
	pace *rate.Limiter

	// firing is the wheel and the firing state, under its own mutex.
	firing *firing
	// lease is the leader's firing lease, under its own mutex.
	lease *lease
	// markFlight is markLoop's MarkFired entry in flight, for awaitMarks.
	markFlight markFlight
	// term is the firing of the current leadership (nil while this replica
	// does not fire), for a planned handover to quiesce (see quiesce).
	term atomic.Pointer[firingTerm]
	// limits is this shard's share of the node's topic rate limits.
	limits *topiclimit.Limiter
	// notesOpen is set between the observer's BeginNotes and EndNotes, and
	// notesWake when a call between them must wake the firing loop; the
	// apply goroutine alone touches them.
	notesOpen, notesWake bool

	// Channels: each has one reader goroutine (see doc.go).
	proposals chan *proposal
	marks     chan *markRequest
	applying  chan *pendingApply
	notify    chan bool // raft leadership changes

	// refusedSince is when raft began refusing this replica's entries for
	// a leadership transfer (Config.Now, Unix ns; 0 while it accepts
	// them); see Stuck.
	refusedSince atomic.Int64
	// gone is what logGone saw last: raft's last index while raft counted
	// entries its log store no longer held, and since when (0: not so).
	gone struct {
		sync.Mutex
		last  uint64
		since int64
	}

	stop      chan struct{} // closed by Close
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Open opens (or creates) the shard replica described by cfg and starts its
// goroutines.
func Open(cfg Config) (*Shard, error) {
	cfg.Tuning.fill()
	cfg.Knobs.fill(&cfg.Tuning)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	// Raft state never outlives the Pebble it describes: finish a release
	// a crash interrupted, and drop keys with no Raft state beside them.
	if err := prepareReplica(cfg.Store, cfg.ID, cfg.Dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	s := &Shard{
		id: cfg.ID, cfg: cfg, tune: cfg.Tuning,
		logger: cfg.Logger.With("shard", cfg.ID), metrics: cfg.Metrics,
		proposals: make(chan *proposal, 1024),
		marks:     make(chan *markRequest, 1024),
		applying:  make(chan *pendingApply, 256),
		notify:    make(chan bool, 16),
		stop:      make(chan struct{}),
	}
	var err error
	s.limits = topiclimit.NewLimiter(cfg.TopicLimits, cfg.Shares)
	if s.firing, err = newFiring(cfg.Now, &s.tune); err != nil {
		return nil, err
	}
	// The lease runs on the monotonic clock, not Config.Now: it measures
	// intervals, and a node's clock may be skewed on purpose (fault tests).
	s.lease = newLease(s.tune.LeaderLeaseTimeout, time.Now, func(timeout time.Duration) error {
		if hook := cfg.Knobs.LeaseConfirm; hook != nil {
			if err := hook(); err != nil {
				return err
			}
		}
		return s.raft.Barrier(timeout).Error()
	})
	if s.fsm, err = raftfsm.NewFSM(cfg.Store, cfg.ID, (*observer)(s)); err != nil {
		return nil, err
	}
	if err := s.rebuildWheel(); err != nil {
		s.fsm.Close()
		return nil, err
	}
	if err := s.startRaft(); err != nil {
		s.fsm.Close()
		return nil, err
	}
	s.wg.Add(6)
	go s.horizonLoop()
	go s.proposeLoop()
	go s.applyWaitLoop()
	go s.markLoop()
	go s.leadershipLoop()
	go s.leaderWatch()
	return s, nil
}

func (s *Shard) startRaft() error {
	cfg := s.cfg
	rc := s.tune.raftConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.NotifyCh = s.notify
	// raft's lines go to the shard's slog logger, at its handler's level.
	rc.Logger = newRaftLogger(s.logger)
	// Pebble already holds the state up to the FSM's applied index, so a
	// restart replays only the log after it instead of reloading a snapshot.
	s.pace = cfg.Installs
	if s.pace == nil {
		s.pace = snapshot.NewLimiter(s.tune.InstallRate)
	}
	snaps, err := snapshot.Open(snapshot.Config{Dir: cfg.Dir, FSM: s.fsm, Pace: s.pace, Logger: rc.Logger,
		TrailingLogs: s.tune.TrailingLogs, SetTrailingLogs: s.setTrailingLogs,
		Knobs: snapshot.Knobs{KeepLogGrace: cfg.Knobs.KeepLogGrace, ExpansionReuse: cfg.Knobs.ExpansionReuse}})
	if err != nil {
		return fmt.Errorf("shard %d: %w", cfg.ID, err)
	}
	s.snaps = snaps
	restore, err := snaps.RestoreOnStart()
	if err != nil {
		return err
	}
	rc.NoSnapshotRestoreOnStart = !restore

	logs, err := openLogStore(cfg.Dir, s.logger, rc.Logger.Named("wal"))
	if err != nil {
		return fmt.Errorf("shard %d: raft log: %w", cfg.ID, err)
	}
	s.logs = logs
	s.trans = cfg.Transport
	if s.trans == nil {
		nt := raft.NewNetworkTransportWithConfig(transportConfig(cfg.Layer, rc.Logger))
		s.trans = nt
		if cfg.InstallLayer != nil {
			s.trans = snapshot.NewTransport(nt, snapshot.TransportConfig{Layer: cfg.InstallLayer, Dir: cfg.Dir,
				LastLog: logs.LastIndex, Logger: s.logger, Timeout: raftRPCTimeout, SendHook: cfg.Knobs.InstallSend})
		}
		s.trans = boundTransport{s.trans}
	}
	// Every write to the log is watched; raft sends through the gate that silences
	// the replica while one is stalled (watchedLog, stallGate).
	stalled := new(atomic.Int64)
	watched := &watchedLog{LogStore: logs, stable: logs, shard: cfg.ID, after: s.tune.DiskFailAfter, failed: cfg.DiskFailed,
		stallAfter: s.tune.DiskStallAfter, stalled: stalled, before: cfg.Knobs.LogWrite}
	trans := s.trans
	if t, ok := s.trans.(gatedTransport); ok {
		trans = &stallGate{gatedTransport: t, stalled: stalled}
	}
	cache, err := raft.NewLogCache(logCacheEntries, watched)
	if err != nil {
		s.closeTransport()
		_ = logs.Close()
		return err
	}
	r, err := s.newRaft(rc, snapshot.KeepSnapshotEntry(cache), watched, snaps, trans)
	if err != nil {
		s.closeTransport()
		_ = logs.Close()
		return err
	}
	s.raft = r
	s.leaders = make(chan raft.Observation, 16)
	r.RegisterObserver(raft.NewObserver(s.leaders, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	}))
	return nil
}

// leaderWatch records, from raft's leader observations, the last node this
// replica saw lose the shard's leadership (deposed), until the shard closes.
// An observation raft drops because the channel is full costs at most a
// missed record: deposed only holds rebalancing back.
//
// The first leader it hears of also ends the replica's start: raft's
// timeouts go from Tuning.startTimeout to their own (settleTimeouts).
func (s *Shard) leaderWatch() {
	defer s.wg.Done()
	var last raft.ServerID
	settled := false
	if _, id := s.raft.LeaderWithID(); id != "" {
		// Elected before the observer was registered.
		s.settleTimeouts()
		settled = true
	}
	for {
		select {
		case <-s.stop:
			return
		case o := <-s.leaders:
			lo, _ := o.Data.(raft.LeaderObservation)
			if lo.LeaderID != "" && !settled {
				s.settleTimeouts()
				settled = true
			}
			if lo.LeaderID == "" && last != "" {
				s.transferMu.Lock()
				s.deposed, s.deposedAt = string(last), time.Now()
				s.transferMu.Unlock()
			}
			last = lo.LeaderID
		}
	}
}

// settleTimeouts gives raft the heartbeat and election timeouts of the
// Tuning, once the replica has heard of a leader: its start is over.
func (s *Shard) settleTimeouts() {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	rc := s.raft.ReloadableConfig()
	rc.HeartbeatTimeout, rc.ElectionTimeout = s.tune.HeartbeatTimeout, s.tune.ElectionTimeout
	if err := s.raft.ReloadConfig(rc); err != nil {
		s.logger.Warn("changing raft's timeouts", "heartbeat", rc.HeartbeatTimeout, "election", rc.ElectionTimeout, "err", err)
	}
}

// newRaft bootstraps the group if this node founds it, then starts raft.
// trans is s.trans as raft sees it (stallGate).
func (s *Shard) newRaft(rc *raft.Config, cache raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, trans raft.Transport) (*raft.Raft, error) {
	existing, err := raft.HasExistingState(cache, stable, snaps)
	if err != nil {
		return nil, err
	}
	if !existing && len(s.cfg.Bootstrap) > 0 {
		if err := raft.BootstrapCluster(rc, cache, stable, snaps, trans, raft.Configuration{Servers: s.cfg.Bootstrap}); err != nil {
			return nil, fmt.Errorf("shard %d: bootstrap: %w", s.id, err)
		}
	}
	r, err := raft.NewRaft(rc, s.fsm, cache, stable, snaps, trans)
	if err != nil {
		return nil, fmt.Errorf("shard %d: raft: %w", s.id, err)
	}
	return r, nil
}

func (s *Shard) closeTransport() {
	// NetworkTransport.Close leaves its pooled connections open, and with them the peer's reader.
	if c, ok := s.trans.(interface{ CloseStreams() }); ok {
		c.CloseStreams()
	}
	if c, ok := s.trans.(raft.WithClose); ok {
		// Only the network is torn down: a failure loses nothing.
		_ = c.Close()
	}
}

// ID returns the shard id.
func (s *Shard) ID() uint32 { return s.id }

// Raft exposes the shard's Raft instance to the node's admin paths.
func (s *Shard) Raft() *raft.Raft { return s.raft }

// IsLeader reports whether this replica currently leads the shard.
func (s *Shard) IsLeader() bool { return s.raft.State() == raft.Leader }

// Stats returns the shard's replicated counters, as of its applied index.
func (s *Shard) Stats() raftfsm.Stats { return s.fsm.Stats() }

// Close stops the shard gracefully: a leader hands the shard to a caught-up
// voter, no new proposals, the firing loop finishes what it started, Raft
// shuts down, and the FSM is released. The Pebble store and the Publisher
// belong to the caller.
func (s *Shard) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.handOffOnClose()
		close(s.stop)
		s.wg.Wait()
		s.snaps.StopKeepingLog()
		s.fsm.Stopping() // a snapshot persist waiting for a flush would hold up the shutdown
		err = s.raft.Shutdown().Error()
		s.snaps.Close()
		s.closeTransport()
		if cerr := s.logs.Close(); err == nil {
			err = cerr
		}
		s.fsm.Close()
	})
	return err
}

// Get reads one event on the leader. Every Schedule acknowledged before the
// call is visible: the leader applies an entry before acknowledging it.
func (s *Shard) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	if err := s.readable(ctx); err != nil {
		return raftfsm.Record{}, false, err
	}
	return s.fsm.Get(id)
}

// readable returns once this replica's state holds every entry acknowledged
// before the call, by any leader: it leads under a lease (lease.deadline).
// The lease was asked of a quorum with a Barrier, so no other replica can
// have been elected since, and every entry committed before that moment is
// applied here; the entries this leader acknowledged since, it applied
// first. raft's leader state alone is not enough: a new leader reports
// itself leader before it has applied what the last one acknowledged (a Get
// answered NotFound 27 ms after the Schedule's acknowledgement in the fault
// tests), and a leader paused for seconds still reports it when it wakes.
func (s *Shard) readable(ctx context.Context) error {
	if !s.IsLeader() {
		return ErrNotLeader
	}
	if _, err := s.lease.deadline(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	return nil
}

// Cancel cancels the event id. When it reports Cancelled, no record of the
// event can be produced any more: a fire batch that had already read the
// event has finished or will leave it out, and no produce attempt of it is
// unanswered.
//
// When a record may still land (ErrProduceUnknown, ErrCancelUnsure) it says
// so instead, and keeps saying so for as long as that holds: a repeated
// cancel cannot be told less than the first one. An event outside scope
// (nil: anything) is refused with a *NotPermittedError.
func (s *Shard) Cancel(ctx context.Context, id string, scope Scope) (raftfsm.CancelResult, error) {
	if !s.IsLeader() {
		return raftfsm.CancelResult{}, ErrNotLeader
	}
	if scope != nil {
		// A scoped cancel is decided on the event as this leader has it
		// under its lease: one outside the scope is refused, and an unknown
		// id is answered without an entry, so that no cancel proposed for
		// one credential can meet an event another created meanwhile.
		if err := s.readable(ctx); err != nil {
			return raftfsm.CancelResult{}, err
		}
	}
	rec, ok, err := s.fsm.Get(id)
	switch {
	case err != nil && scope != nil:
		return raftfsm.CancelResult{}, err
	case !ok && scope != nil:
		return raftfsm.CancelResult{Outcome: raftfsm.NotFound}, nil
	case ok && !permits(scope, &rec):
		return raftfsm.CancelResult{}, Refuse(scope, id)
	case err == nil && ok && s.inDoubt(rec):
		switch rec.State {
		case raftfsm.StateScheduled:
			return raftfsm.CancelResult{}, ErrProduceUnknown
		case raftfsm.StateCancelled:
			return raftfsm.CancelResult{}, ErrCancelUnsure
		}
	}
	cmd := raftfsm.Cancel{ProposedAt: s.cfg.Now().UnixNano(), IDs: []string{id}}
	resp, err := s.apply(ctx, raftfsm.AppendCancel(nil, &cmd))
	if err != nil {
		return raftfsm.CancelResult{}, err
	}
	res, ok := resp.(*raftfsm.CancelBatchResult)
	if !ok || len(res.Results) != 1 {
		return raftfsm.CancelResult{}, fmt.Errorf("shard %d: unexpected cancel response %T", s.id, resp)
	}
	if err := s.cancelled(ctx, res.Results[0]); err != nil {
		return raftfsm.CancelResult{}, err
	}
	return res.Results[0], nil
}

// cancelled returns once a cancel's result r can be acknowledged: nil when no
// record of the event can be produced any more, ErrCancelUnsure when one may
// still land.
func (s *Shard) cancelled(ctx context.Context, r raftfsm.CancelResult) error {
	if r.Outcome != raftfsm.Cancelled && r.Outcome != raftfsm.AlreadyCancelled {
		return nil
	}
	// The cancel is applied, so no fire batch that starts from now on will
	// produce the event; wait for one that started before, unless it has not
	// begun to produce: applying the cancel marked the event in that batch,
	// which then leaves it out (fire).
	if b := s.firing.producing(r.Seq); b != nil {
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// That batch may have ended without an answer from Kafka: then its
	// request can still land, and the cancel cannot promise more than that
	// the event will not be fired again.
	if unsure, _ := s.firing.doubt(r.Seq); unsure {
		return ErrCancelUnsure
	}
	return nil
}

// inDoubt reports whether a record of rec may still reach Kafka from a
// produce attempt that is over: one of this leader's that went unanswered,
// or one of an earlier leader's, which this leader cannot see. An earlier
// leader produced only events due by its own clock, so by the time this
// leader started firing (plus the clock skew bound); and only before they
// were cancelled, so not events cancelled well before they fell due.
func (s *Shard) inDoubt(rec raftfsm.Record) bool {
	unsure, fence := s.firing.doubt(rec.Seq)
	if unsure {
		return true
	}
	if rec.Due > fence {
		return false
	}
	switch rec.State {
	case raftfsm.StateScheduled:
		return true
	case raftfsm.StateCancelled:
		return rec.CancelledAt >= rec.Due-int64(s.tune.ClockSkewBound)
	}
	return false
}

// apply proposes one command and waits for its result, bounded by ctx.
func (s *Shard) apply(ctx context.Context, cmd []byte) (any, error) {
	f := s.raft.Apply(cmd, applyTimeout)
	done := make(chan struct{})
	go func() { _ = f.Error(); close(done) }() // waits for the future; its error is read below
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.stop:
		return nil, ErrStopped
	}
	err := f.Error()
	s.noteRaft(err)
	if err != nil {
		return nil, raftErr(err)
	}
	resp := f.Response()
	if err, ok := resp.(error); ok {
		return nil, err
	}
	return resp, nil
}

// noteRaft records what raft answered to one of this replica's entries or
// barriers, for Stuck.
func (s *Shard) noteRaft(err error) {
	switch {
	case err == nil:
		s.refusedSince.Store(0)
	case errors.Is(err, raft.ErrLeadershipTransferInProgress):
		s.refusedSince.CompareAndSwap(0, s.cfg.Now().UnixNano())
	}
}

// Stuck says why this replica's raft is wedged for the life of its raft
// instance, or "" if it is not; the owner of the replica (shard/host)
// reopens a Stuck replica, with a new raft instance. hashicorp/raft
// (v1.7.3) wedges two ways:
//
//   - It can strand a leadership transfer: if the leader's replication of
//     the target is busy when one transfer times out and another starts,
//     the second blocks for good once that replication stops, and raft's
//     "transfer in progress" flag, which refuses every Apply and Barrier,
//     stays set; a node elected leader again later refuses everything, and
//     the shard takes no writes and fires nothing. Stuck once raft has
//     refused all of a leader's entries so far longer than a transfer takes.
//   - A follower that installs a snapshot on a log store that refuses gaps
//     (raft-wal) deletes its whole log but keeps its last index in memory.
//     When its log went past the snapshot (a copy expanded from an older
//     reference carries newer state than its index says), raft takes that
//     index for its last entry, refuses every AppendEntries that follows
//     the snapshot ("failed to get previous log"), and the leader sends the
//     same snapshot again, round and round: in a fault run a shard whose
//     third voter was then killed committed nothing for 20 s. Stuck once a
//     follower's raft has counted, for goneAfter, a last index past both
//     its log store's and its snapshot's (logGone).
func (s *Shard) Stuck() string {
	if since := s.refusedSince.Load(); since != 0 && s.IsLeader() && s.cfg.Now().UnixNano()-since > int64(s.cfg.Knobs.StuckAfter) {
		return "raft has refused its entries for a leadership transfer that never ended"
	}
	if s.logGone() {
		return "raft counts log entries its log store no longer holds, since it installed a snapshot, and refuses every entry after it"
	}
	return ""
}

// goneAfter is how long a follower's raft must count entries its log store
// does not hold before the replica is Stuck: far longer than raft takes
// between truncating a conflicting suffix and appending what replaces it,
// the one moment it does so by design.
const goneAfter = 3 * time.Second

// logGone reports whether this replica's raft, not leading, has counted, for goneAfter
// and with the same last index throughout, a last index past both its log
// store's and its latest snapshot's.
func (s *Shard) logGone() bool {
	last := s.raft.LastIndex()
	gone := false
	if s.raft.State() != raft.Leader {
		stored, err := s.logs.LastIndex()
		snap, _ := strconv.ParseUint(s.raft.Stats()["last_snapshot_index"], 10, 64)
		gone = err == nil && last > stored && last > snap
	}
	now := s.cfg.Now().UnixNano()
	s.gone.Lock()
	defer s.gone.Unlock()
	switch {
	case !gone:
		s.gone.last, s.gone.since = 0, 0
		return false
	case s.gone.since == 0 || s.gone.last != last:
		s.gone.last, s.gone.since = last, now
		return false
	}
	return now-s.gone.since >= int64(goneAfter)
}

// raftErr maps raft's errors onto this package's sentinels.
func raftErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w (%v)", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrStopped
	}
	return err
}

// observer keeps the wheel in step with the FSM. Its methods run on the raft
// apply goroutine.
type observer Shard

// The calls of one applied batch come between BeginNotes and EndNotes, under
// firing.mu held throughout: the firing loop sees all of a batch's events or
// none, so a burst applied after its due time is taken by priority as a
// whole, not in the order the calls arrive. notesOpen and notesWake are
// touched only by the apply goroutine.
func (o *observer) BeginNotes() {
	o.firing.mu.Lock()
	o.notesOpen = true
}

func (o *observer) EndNotes() {
	o.notesOpen = false
	wake := o.notesWake
	o.notesWake = false
	o.firing.mu.Unlock()
	if wake {
		o.firing.wake()
	}
}

func (o *observer) Scheduled(seq uint64, due int64, p raftfsm.Policy) {
	if o.notesOpen {
		o.notesWake = o.firing.scheduledLocked(seq, due, p) || o.notesWake
		return
	}
	o.firing.scheduled(seq, due, p)
}

func (o *observer) Settled(seq uint64) {
	if o.notesOpen {
		o.firing.settledLocked(seq)
		return
	}
	o.firing.settled(seq)
}

func (o *observer) Reset() {
	s := (*Shard)(o)
	if err := s.rebuildWheel(); err != nil {
		// The FSM's state is readable or Restore would have failed; a read
		// error here means the node cannot trust what it holds.
		panic(fmt.Sprintf("shard %d: rebuilding the wheel after a restore: %v", s.id, err))
	}
}

// rebuildWheel replaces the wheel with one built from the events in Pebble
// due within the horizon. Events that fell due while the node was down are
// overdue in the new wheel and fire at once. It also starts the rebuild of
// the FSM's in-memory pending set (FSM.LoadPending), so it runs only before
// raft starts and from Observer.Reset, never beside an apply.
func (s *Shard) rebuildWheel() error {
	now := s.cfg.Now().UnixNano()
	w, err := wheel.New(now, s.tune.Resolution)
	if err != nil {
		return err
	}
	ws := newWheelSet(w)
	until := s.horizonUntil(now)
	err = s.fsm.LoadPending(until, func(seq uint64, due int64, p raftfsm.Policy) error {
		ws.place(seq, due, p)
		return nil
	})
	if err != nil {
		return err
	}
	s.firing.replace(ws, until)
	return nil
}

// transportConfig is the configuration of a replica's Raft network transport over layer.
//
// MaxRPCsInFlight 1 turns raft's pipelined replication off: every AppendEntries is a
// request and its answer, bounded by raftRPCTimeout. The pipeline (raft 1.7.3) can wedge
// for good after a follower answers Success=false: its decoder stops reading answers
// while the replication goroutine parks sending the next request into the full pipeline,
// and only the pipeline's Close, deferred in that same goroutine, would free it. The
// follower then gets heartbeats but never another entry, and raft's Shutdown waits for the
// parked goroutine forever: in a fault test a leader's shutdown hung 40 s in
// netPipeline.AppendEntries until SIGQUIT. raft's own measurements found the pipeline of
// little benefit to batched replication, which is what a shard's group commit sends.
func transportConfig(layer raft.StreamLayer, logger hclog.Logger) *raft.NetworkTransportConfig {
	return &raft.NetworkTransportConfig{Stream: layer, MaxPool: 3, MaxRPCsInFlight: 1, Timeout: raftRPCTimeout, Logger: logger}
}
