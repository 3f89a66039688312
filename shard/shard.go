package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/wheel"
)

// Config configures one shard replica.
type Config struct {
	ID     uint32
	NodeID string // this node's Raft server id
	Dir    string // the shard's own directory: Raft log, stable store, snapshots
	Store  *raftfsm.Store
	Layer  raft.StreamLayer // from the node's Mux
	// Publisher produces due events; shared by every shard of the node.
	Publisher *publish.Publisher
	// Bootstrap is the initial voter set when the shard is created on this
	// node; ignored when the shard already has Raft state.
	Bootstrap []raft.Server
	// Directory, when set, makes the leader reconcile the shard's Raft
	// configuration toward the placement.
	Directory Directory
	Tuning    Tuning
	Now       func() time.Time
	Logger    *slog.Logger
	Metrics   *Metrics
}

// Tuning holds the knobs with defaults sized for a 2-core machine.
type Tuning struct {
	// Resolution is the timing wheel's tick: the most an event fires late
	// beyond the leader's own scheduling delay. Default 1 ms.
	Resolution time.Duration
	// ProposeBatch caps the events grouped into one Raft entry. Default 1024.
	ProposeBatch int
	// FireBatch caps the events read and produced together. Default 1024.
	FireBatch int
	// MaxFiring bounds the fire batches in flight per shard. Default 16:
	// a batch takes a produce round trip, and at 10,000 events a second
	// under load four were too few, so the firing loop waited for a slot
	// while events fell due.
	MaxFiring int
	// FireLead is how long before its due time an event is taken out of
	// the wheel and read, so that at the due time only the produce is left
	// to do. Default 20 ms; negative means none. See fireLoop.
	FireLead time.Duration
	// Raft timeouts; zero keeps hashicorp/raft's defaults.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout, CommitTimeout time.Duration
	// SnapshotThreshold is the number of log entries between snapshots.
	// Default 256 (snapshots are references; see snapshotStore).
	SnapshotThreshold uint64
	// TrailingLogs is how many entries the log keeps behind a snapshot, for
	// followers that lag. Default 128.
	TrailingLogs uint64
	// ClockSkewBound is how far apart the nodes' clocks are assumed to be
	// at most. A new leader cannot know which events its predecessor
	// handed to Kafka without an answer, so for this long past its own
	// start it treats every unfired event due by then as possibly
	// produced: a cancel of one is refused (retryable) until it fires.
	// Default 1 s.
	ClockSkewBound time.Duration
}

func (t *Tuning) fill() {
	if t.Resolution <= 0 {
		t.Resolution = wheel.DefaultResolution
	}
	if t.ProposeBatch <= 0 {
		t.ProposeBatch = 1024
	}
	if t.FireBatch <= 0 {
		t.FireBatch = 1024
	}
	if t.MaxFiring <= 0 {
		t.MaxFiring = 16
	}
	switch {
	case t.FireLead == 0:
		t.FireLead = 20 * time.Millisecond
	case t.FireLead < 0:
		t.FireLead = 0
	}
	if t.ClockSkewBound <= 0 {
		t.ClockSkewBound = time.Second
	}
}

const (
	// applyTimeout bounds enqueueing a command in raft, not its commit.
	applyTimeout = 5 * time.Second
	// markTimeout bounds recording a firing result through Raft.
	markTimeout = 10 * time.Second
	// retryDelay is how long an event whose produce could not be completed
	// waits before this leader tries it again; it doubles with each batch
	// in a row that fails, up to maxRetryDelay, because every attempt sent
	// into a broker that does not answer may still land later, as one
	// more duplicate.
	retryDelay    = time.Second
	maxRetryDelay = 8 * time.Second
	// unsureTTL is how long an unanswered produce is remembered for an
	// event that was cancelled meanwhile: far longer than the producer or
	// the kernel keep retrying a request.
	unsureTTL = time.Hour
)

// Shard is one replica of a shard: a Raft group member whose state machine
// is a slice of the node's Pebble, with a timing wheel of its pending events
// kept warm on every replica. Only the leader proposes and fires.
type Shard struct {
	id      uint32
	cfg     Config
	tune    Tuning
	logger  *slog.Logger
	metrics *Metrics

	fsm  *raftfsm.FSM
	raft *raft.Raft
	// lease bounds how long after confirming its leadership the leader may
	// hand records to Kafka: raft's LeaderLeaseTimeout, shorter than the
	// heartbeat timeout after which followers may elect another leader.
	lease time.Duration
	// leaseAsked is when this leader last asked a quorum whether it leads
	// and was told yes; leaseStarted is when the latest renewal started,
	// leaseRenewing counts those in flight, leaseChanged is closed (and
	// replaced) each time one ends, and leaseErr is the last one's error.
	// See leaseDeadline.
	leaseMu       sync.Mutex
	leaseAsked    time.Time
	leaseStarted  time.Time
	leaseRenewing int
	leaseChanged  chan struct{}
	leaseErr      error
	leaseWG       sync.WaitGroup // renewLease goroutines
	trans         *raft.NetworkTransport
	logs          *raftboltdb.BoltStore

	// mu guards the wheel and the maps beside it. It is taken by the raft
	// apply goroutine (through observer), the firing loop and Cancel; each
	// holds it only for in-memory work.
	mu       sync.Mutex
	wheel    *wheel.Wheel
	handles  handleTable           // pending events in the wheel, by seq
	inflight map[uint64]*fireBatch // events taken out of the wheel and not yet settled here
	// retrying holds the due time of every event the wheel holds at a later
	// retry time (settle), by seq. The wheel keeps one time per event, and
	// the firing path needs the due time: it is half of the body's key.
	retrying map[uint64]int64
	// unsure holds, with the time it was noted, every event a produce
	// attempt of which ended without the record being marked fired (a
	// timeout, a lost leadership): the request may still reach the broker
	// later, so this leader cannot promise that a cancel stops it. Only
	// marking the event fired clears it; entries of cancelled events
	// expire after unsureTTL.
	unsure map[uint64]int64
	// fenceUntil: unfired events due by then may have been handed to Kafka
	// by an earlier leader (see Tuning.ClockSkewBound). It is the end of
	// time until the firing loop has passed its barrier.
	fenceUntil int64
	// failedBatches counts fire batches in a row that left events
	// unproduced; it sets the retry delay.
	failedBatches int
	// sleepUntil is when the firing loop next wakes (Unix ns); an event due
	// earlier kicks it.
	sleepUntil int64
	kick       chan struct{}

	proposals chan *proposal
	marks     chan *markRequest
	applying  chan *pendingApply
	notify    chan bool // raft leadership changes
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Open opens (or creates) the shard replica described by cfg and starts its
// goroutines.
func Open(cfg Config) (*Shard, error) {
	cfg.Tuning.fill()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	s := &Shard{
		id:           cfg.ID,
		cfg:          cfg,
		tune:         cfg.Tuning,
		logger:       cfg.Logger.With("shard", cfg.ID),
		metrics:      cfg.Metrics,
		inflight:     make(map[uint64]*fireBatch),
		retrying:     make(map[uint64]int64),
		unsure:       make(map[uint64]int64),
		fenceUntil:   1<<63 - 1,
		sleepUntil:   1<<63 - 1,
		kick:         make(chan struct{}, 1),
		leaseChanged: make(chan struct{}),
		proposals:    make(chan *proposal, 1024),
		marks:        make(chan *markRequest, 1024),
		applying:     make(chan *pendingApply, 256),
		notify:       make(chan bool, 16),
		stop:         make(chan struct{}),
	}
	var err error
	if s.wheel, err = wheel.New(cfg.Now().UnixNano(), s.tune.Resolution); err != nil {
		return nil, err
	}
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
	s.wg.Add(4)
	go s.proposeLoop()
	go s.applyWaitLoop()
	go s.markLoop()
	go s.leadershipLoop()
	return s, nil
}

func (s *Shard) startRaft() error {
	cfg := s.cfg
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.NotifyCh = s.notify
	rc.Logger = hclog.New(&hclog.LoggerOptions{
		Name:   fmt.Sprintf("raft.shard%d", cfg.ID),
		Level:  hclog.Warn,
		Output: os.Stderr,
	})
	t := s.tune
	if t.HeartbeatTimeout > 0 {
		rc.HeartbeatTimeout = t.HeartbeatTimeout
	}
	if t.ElectionTimeout > 0 {
		rc.ElectionTimeout = t.ElectionTimeout
	}
	if t.LeaderLeaseTimeout > 0 {
		rc.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	}
	if t.CommitTimeout > 0 {
		rc.CommitTimeout = t.CommitTimeout
	}
	// Snapshots are references to the state in Pebble (snapshotStore); each
	// waits for Pebble's next flush (Pebble runs without a WAL) and costs
	// little else, so take them often: the log after the last one is what a
	// restart reads back and replays. TrailingLogs is what raft keeps
	// behind a snapshot for followers that lag; one further behind gets the
	// whole shard. It also bounds the log files, and bbolt touches most of
	// what it writes through its file mapping, which counts in the node's
	// RSS: ingesting 10M events on one node (entries of ~1000 events) left
	// 1.88 GB RSS with 2048, 1.48 GB with 128 (BENCHMARKS.md).
	rc.SnapshotThreshold = 256
	// Raft checks SnapshotThreshold only every SnapshotInterval, so under
	// load the interval is what bounds the log: at 18 entries a second per
	// shard (10M events into one node), 10 s let each shard's log reach 52
	// MB, 419 MB of RSS in all.
	rc.SnapshotInterval = 2 * time.Second
	rc.TrailingLogs = 128
	if t.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = t.SnapshotThreshold
	}
	if t.TrailingLogs > 0 {
		rc.TrailingLogs = t.TrailingLogs
	}
	s.lease = rc.LeaderLeaseTimeout
	// Pebble already holds the state up to the FSM's applied index, so a
	// restart replays only the log after it instead of reloading a snapshot.
	files, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, rc.Logger)
	if err != nil {
		return err
	}
	snaps := &snapshotStore{files: files, fsm: s.fsm, dir: cfg.Dir}
	restore, err := snaps.restoreOnStart()
	if err != nil {
		return err
	}
	rc.NoSnapshotRestoreOnStart = !restore

	logs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.Dir, "raft.db")})
	if err != nil {
		return fmt.Errorf("shard %d: raft log: %w", cfg.ID, err)
	}
	s.logs = logs
	s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  cfg.Layer,
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  rc.Logger,
	})
	// The cache serves followers the entries they are about to be sent;
	// an entry holds up to ProposeBatch events (~100 KiB), so 1024 of them
	// per shard held 900 MB of a node with 8 shards under load.
	cache, err := raft.NewLogCache(64, logs)
	if err != nil {
		return err
	}
	existing, err := raft.HasExistingState(cache, logs, snaps)
	if err != nil {
		return err
	}
	if !existing && len(cfg.Bootstrap) > 0 {
		if err := raft.BootstrapCluster(rc, cache, logs, snaps, s.trans, raft.Configuration{Servers: cfg.Bootstrap}); err != nil {
			return fmt.Errorf("shard %d: bootstrap: %w", cfg.ID, err)
		}
	}
	r, err := raft.NewRaft(rc, s.fsm, cache, logs, snaps, s.trans)
	if err != nil {
		s.trans.Close()
		logs.Close()
		return fmt.Errorf("shard %d: raft: %w", cfg.ID, err)
	}
	s.raft = r
	return nil
}

// ID returns the shard id.
func (s *Shard) ID() uint32 { return s.id }

// Raft exposes the shard's Raft instance to the node's admin paths.
func (s *Shard) Raft() *raft.Raft { return s.raft }

// IsLeader reports whether this replica currently leads the shard.
func (s *Shard) IsLeader() bool { return s.raft.State() == raft.Leader }

// Stats returns the shard's replicated counters, as of its applied index.
func (s *Shard) Stats() raftfsm.Stats { return s.fsm.Stats() }

// Close stops the shard gracefully: no new proposals, the firing loop
// finishes what it started, Raft shuts down, and the FSM is released. The
// Pebble store and the Publisher belong to the caller.
func (s *Shard) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.fsm.Stopping() // a snapshot persist waiting for a flush would hold up the shutdown
		err = s.raft.Shutdown().Error()
		s.trans.Close()
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
	if !s.IsLeader() {
		return raftfsm.Record{}, false, ErrNotLeader
	}
	return s.fsm.Get(id)
}

// Cancel cancels the event id. When it reports Cancelled, no record of the
// event can be produced any more: a fire batch that had already read the
// event has finished or will leave it out, and no produce attempt of it is
// unanswered.
//
// When a record may still land (ErrProduceUnknown, ErrCancelUnsure) it says
// so instead, and keeps saying so for as long as that holds: a repeated
// cancel cannot be told less than the first one.
func (s *Shard) Cancel(ctx context.Context, id string) (raftfsm.CancelResult, error) {
	if !s.IsLeader() {
		return raftfsm.CancelResult{}, ErrNotLeader
	}
	if rec, ok, err := s.fsm.Get(id); err == nil && ok && s.inDoubt(rec) {
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
	r := res.Results[0]
	if r.Outcome == raftfsm.Cancelled || r.Outcome == raftfsm.AlreadyCancelled {
		// The cancel is applied, so no fire batch that starts from now on
		// will produce the event; wait for one that started before,
		// unless it has not begun to produce: applying the cancel marked
		// the event in that batch, which then leaves it out (fire).
		s.mu.Lock()
		b := s.inflight[r.Seq]
		if b != nil && !b.sending && b.cancelled[r.Seq] {
			b = nil
		}
		s.mu.Unlock()
		if b != nil {
			select {
			case <-b.done:
			case <-ctx.Done():
				return raftfsm.CancelResult{}, ctx.Err()
			}
		}
		// That batch may have ended without an answer from Kafka: then
		// its request can still land, and the cancel cannot promise more
		// than that the event will not be fired again.
		s.mu.Lock()
		_, unsure := s.unsure[r.Seq]
		s.mu.Unlock()
		if unsure {
			return raftfsm.CancelResult{}, ErrCancelUnsure
		}
	}
	return r, nil
}

// inDoubt reports whether a record of rec may still reach Kafka from a
// produce attempt that is over: one of this leader's that went unanswered,
// or one of an earlier leader's, which this leader cannot see. An earlier
// leader produced only events due by its own clock, so by the time this
// leader started firing (plus the clock skew bound); and only before they
// were cancelled, so not events cancelled well before they fell due.
func (s *Shard) inDoubt(rec raftfsm.Record) bool {
	s.mu.Lock()
	_, unsure := s.unsure[rec.Seq]
	fence := s.fenceUntil
	s.mu.Unlock()
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
	go func() { f.Error(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.stop:
		return nil, ErrStopped
	}
	if err := f.Error(); err != nil {
		return nil, raftErr(err)
	}
	resp := f.Response()
	if err, ok := resp.(error); ok {
		return nil, err
	}
	return resp, nil
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

func (o *observer) Scheduled(seq uint64, due int64) {
	s := (*Shard)(o)
	s.mu.Lock()
	s.handles.set(seq, s.wheel.Add(seq, due))
	wake := due < s.sleepUntil
	s.mu.Unlock()
	if wake {
		s.wake()
	}
}

func (o *observer) Settled(seq uint64) {
	s := (*Shard)(o)
	s.mu.Lock()
	if h, ok := s.handles.get(seq); ok {
		s.wheel.Remove(h)
		s.handles.delete(seq)
		delete(s.retrying, seq)
	} else if b := s.inflight[seq]; b != nil && !b.sending {
		// A fire batch holds it, reading it or waiting for its due time
		// (Tuning.FireLead). Until the batch starts to produce, a cancel
		// keeps the event out of it (fire), as it would if the event were
		// still in the wheel. (Once it produces, the batch's own MarkFired
		// lands here for every event; there is nothing to mark then.)
		if b.cancelled == nil {
			b.cancelled = make(map[uint64]bool)
		}
		b.cancelled[seq] = true
	}
	s.mu.Unlock()
}

func (o *observer) Reset() {
	s := (*Shard)(o)
	if err := s.rebuildWheel(); err != nil {
		// The FSM's state is readable or Restore would have failed; a read
		// error here means the node cannot trust what it holds.
		panic(fmt.Sprintf("shard %d: rebuilding the wheel after a restore: %v", s.id, err))
	}
	s.wake()
}

// rebuildWheel replaces the wheel with one built from the pending events in
// Pebble. Events that fell due while the node was down are overdue in the new
// wheel and fire at once. The same pass builds the FSM's in-memory pending
// set (FSM.LoadPending), so it runs only before raft starts and from
// Observer.Reset, never beside an apply.
func (s *Shard) rebuildWheel() error {
	w, err := wheel.New(s.cfg.Now().UnixNano(), s.tune.Resolution)
	if err != nil {
		return err
	}
	var handles handleTable
	err = s.fsm.LoadPending(func(seq uint64, due int64) error {
		handles.set(seq, w.Add(seq, due))
		return nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.wheel, s.handles = w, handles
	clear(s.retrying)
	s.mu.Unlock()
	return nil
}

func (s *Shard) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
