package shard

import (
	"context"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
	"golang.org/x/time/rate"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/topiclimit"
	"github.com/chimehq/chime/wheel"
)

// Publisher produces due events to Kafka. *publish.Publisher implements it;
// the shard needs no more of it than this.
type Publisher interface {
	// Publish produces recs and returns outcome i for recs[i]; see
	// publish.Publisher.Publish. ctx's deadline bounds when records may be
	// handed to the broker.
	Publish(ctx context.Context, recs []publish.Record) []publish.Outcome
	// DeadLetterTopic names the topic dead-lettered records went to.
	DeadLetterTopic() string
}

// Config configures one shard replica.
type Config struct {
	ID     uint32
	NodeID string // this node's Raft server id
	Dir    string // the shard's own directory: Raft log, stable store, snapshots
	Store  *raftfsm.Store
	Layer  raft.StreamLayer // from the node's Mux
	// InstallLayer, from the node's Mux (InstallLayerID), carries the
	// copies of the shard this replica sends and receives, resumably; nil
	// sends them inside raft's requests, from the start each time.
	InstallLayer raft.StreamLayer
	// Transport, when set, carries the shard's Raft traffic instead of a
	// network transport over Layer (tests use raft's in-memory transport).
	// The shard closes it if it has a Close method.
	Transport raft.Transport
	// Publisher produces due events; shared by every shard of the node.
	Publisher Publisher
	// Bootstrap is the initial voter set when the shard is created on this
	// node; ignored when the shard already has Raft state.
	Bootstrap []raft.Server
	// Directory, when set, makes the leader reconcile the shard's Raft
	// configuration toward the placement.
	Directory Directory
	// Installs paces the full snapshots this replica writes and sends to
	// followers, and the backups it writes (Tuning.InstallRate), shared by
	// the node's replicas so that together they stay within the rate; nil
	// gives the replica its own.
	Installs *rate.Limiter
	// TopicLimits are the node's per-topic fire rate limits, of which the
	// shard's leader enforces a share, one of Shares (the cluster's shard
	// count); nil: none.
	TopicLimits *topiclimit.Table
	Shares      int
	Tuning      Tuning
	Now         func() time.Time
	Logger      *slog.Logger
	Metrics     *Metrics
	// DiskFailed, when set, is called when a write to the shard's Raft log
	// or stable store has been under way for Tuning.DiskFailAfter (see
	// watchedLog); the node stops its process on it. nil: nothing is called
	// (a stalled write still silences the leader after DiskStallAfter).
	DiskFailed func(error)
	// Knobs are for tests; the zero value is production's.
	Knobs Knobs
}

// Knobs let a test reach into a replica: hooks that run at chosen points,
// and durations and sizes shrunk to test scale. A zero field changes
// nothing; Open fills the durations and sizes with their defaults.
type Knobs struct {
	// LeaseConfirm, if set, runs before each lease renewal's Barrier; an
	// error fails the renewal, so a test makes a leader lose its lease the
	// way one cut off from its followers does.
	LeaseConfirm func() error
	// HorizonLoaded, if set, runs after each chunk of events a horizon load
	// adds to the wheel, on the load's goroutine, so a test can cut the
	// power in the middle of a load.
	HorizonLoaded func()
	// InstallSend, if set, is called as a leader sends a copy of the shard
	// on the install layer, with the bytes of it sent so far; an error cuts
	// the send, so a test makes an install resume.
	InstallSend func(sent, size int64) error
	// RecurringRead, if set, runs between the read a change of a recurring
	// schedule was checked against and its proposal, so a test can change
	// the schedule in between.
	RecurringRead func()
	// BatchMark, if set, runs before a fire batch proposes the MarkFired of
	// the records Kafka acknowledged; an error fails that mark as one
	// proposed as leadership went does.
	BatchMark func() error
	// UpdatePinned, if set, runs between an Update's pin of the event and
	// its proposal, so a test can hold a pinned event past its due time.
	UpdatePinned func()
	// LoadChunk, if positive, replaces loadChunk: how many events a load
	// adds to the wheel per hold of its lock, so that a few hundred events
	// make many chunks.
	LoadChunk int
	// KeepLogGrace and ExpansionReuse, if positive, replace how long raft
	// keeps its whole log after an install was sent, and how long an
	// expansion of the shard is kept after its last reader closed
	// (snapshot.Knobs, which fills them).
	KeepLogGrace   time.Duration
	ExpansionReuse time.Duration
	// LogWrite, if set, runs before each write to the Raft log or stable
	// store, inside its watch, so that a test can make the disk hang.
	LogWrite func()
	// StuckAfter, if positive, replaces how long raft may refuse every
	// entry of this leader for a leadership transfer before the replica
	// counts as Stuck (twice what a transfer that works can take).
	StuckAfter time.Duration
}

// fill sets every zero duration and size to its default; t is filled.
func (k *Knobs) fill(t *Tuning) {
	if k.LoadChunk <= 0 {
		k.LoadChunk = loadChunk
	}
	if k.StuckAfter <= 0 {
		// A leadership transfer that works holds raft's entries back for
		// at most an election timeout of catching up, one TimeoutNow RPC
		// and an election timeout of waiting for the target to win; twice
		// that is past doubt.
		k.StuckAfter = 2 * (2*t.ElectionTimeout + raftRPCTimeout)
	}
}

// Tuning holds a replica's timings and sizes. A zero field takes the
// default in fill, where each default stands with the measurement that
// chose it; they are sized for a 2-core machine.
type Tuning struct {
	// Resolution is the timing wheel's tick: the most an event fires late
	// beyond the leader's own scheduling delay.
	Resolution time.Duration
	// DiskFailAfter is how long one write to the Raft log may be under way
	// before Config.DiskFailed is called.
	DiskFailAfter time.Duration
	// DiskStallAfter is how long one write to the Raft log may be under way
	// before the replica stops sending AppendEntries, heartbeats included,
	// until the write returns: a leader whose disk hangs so hands its shard
	// to a follower instead of holding it while it can persist nothing.
	DiskStallAfter time.Duration
	// ProposeBatch is how many events an entry gathers before it is
	// proposed (one Schedule call is never split for it, so an entry may
	// hold more); ProposeBytes bounds an entry's encoded events: a call
	// larger than it is split over entries, and only an event larger than
	// it alone makes a larger entry.
	ProposeBatch int
	ProposeBytes int
	// FireBatch caps the events read and produced together.
	FireBatch int
	// MaxFiring bounds the fire batches in flight per shard.
	MaxFiring int
	// FireLead is how long before its due time an event is taken out of
	// the wheel and read, so that at the due time only the produce is left
	// to do; negative means none (see takeBatches).
	FireLead time.Duration
	// Raft timeouts. LeaderLeaseTimeout is also the firing lease: how long
	// after a quorum confirmed this leader it may hand records to Kafka.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout, CommitTimeout time.Duration
	// SnapshotThreshold is the number of log entries between snapshots.
	SnapshotThreshold uint64
	// TrailingLogs is how many entries the log keeps behind a snapshot, for
	// followers that lag.
	TrailingLogs uint64
	// ClockSkewBound is how far apart the nodes' clocks are assumed to be
	// at most. A new leader cannot know which events its predecessor
	// handed to Kafka without an answer, so for this long past its own
	// start it treats every unfired event due by then as possibly
	// produced: a cancel of one is refused (retryable) until it fires.
	ClockSkewBound time.Duration
	// RetryDelay is how long an event whose produce could not be completed
	// waits before this leader fires it again; it doubles with each batch
	// in a row that fails, up to MaxRetryDelay. The first produce that
	// succeeds afterwards brings every waiting event forward (firing.heal).
	RetryDelay, MaxRetryDelay time.Duration
	// InstallRate bounds, in bytes a second, how fast a leader writes a
	// full snapshot of its shard for a follower too far behind for the log,
	// and sends it: reading and compressing the shard, and on the follower
	// decompressing it and building tables, takes CPU the shards serving
	// events need. Default 32 MiB/s of the compressed stream (about 100
	// MiB/s of keys and values).
	InstallRate int
	// Retention is how long a settled (fired, cancelled or dead-lettered)
	// event is kept after it settles: its id stays an idempotency key and
	// Get shows its outcome until then, and the leader removes it after.
	// Zero keeps settled events forever. It has no default here: the node
	// passes the cluster's (chimed --retention, 7 days unless set).
	Retention time.Duration
	// WheelHorizon is how far ahead of now the timing wheel holds pending
	// events; later ones stay in Pebble's due index until the horizon
	// reaches them. Memory then follows the events due within it, not all
	// a shard holds: a wheel entry costs 32 bytes and its handle 8 (among
	// neighbouring seqs) to about 150 (scattered ones), so ten million
	// events spread over a month cost over 400 MB in a wheel holding them
	// all but, with the 1-hour default, under 3 MB. It must be well over
	// FireLead and the time a load takes; fill raises it to at least a
	// second.
	WheelHorizon time.Duration
}

// Defaults that are not knobs.
const (
	// snapshotInterval is how often raft checks SnapshotThreshold. Under
	// load it is what bounds the log: at 18 entries a second per shard
	// (10M events into one node), 10 s let each shard's log reach 52 MB,
	// 419 MB of RSS in all.
	snapshotInterval = 2 * time.Second
	// logCacheEntries is the raft log cache: it serves followers the
	// entries they are about to be sent. An entry holds up to ProposeBatch
	// events and ProposeBytes (~100 KiB under the benchmarks' load), so
	// 1024 of them per shard held 900 MB of a node with 8 shards under
	// load.
	logCacheEntries = 64
	// raftRPCTimeout bounds one Raft RPC over the network transport.
	raftRPCTimeout = 10 * time.Second
	// applyTimeout bounds enqueueing a command in raft, not its commit.
	applyTimeout = 5 * time.Second
	// markTimeout bounds recording a firing result through Raft.
	markTimeout = 10 * time.Second
	// handoffWait bounds how long a leader about to hand its shard over
	// waits for its batches in flight to be produced and marked: a marked
	// batch is not fired again by the next leader. Under load a produce
	// and its MarkFired take tens of milliseconds.
	handoffWait = 2 * time.Second
	// closeHandoffWait bounds how long a closing leader looks for a voter
	// to hand its shard to; the transfer itself is bounded by raft (an
	// election timeout).
	closeHandoffWait = 3 * time.Second
	// barrierTimeout bounds the barrier a new leader issues before firing;
	// barrierRetry is the pause before it tries again.
	barrierTimeout = 10 * time.Second
	barrierRetry   = 100 * time.Millisecond
	// unsureTTL is how long an unanswered produce is remembered for an
	// event that was cancelled meanwhile: far longer than the producer or
	// the kernel keep retrying a request.
	unsureTTL = time.Hour
	// unsureSweep is the size of the unsure set above which expired
	// entries are swept after a failed batch.
	unsureSweep = 1024
	// probeInterval paces the firing loop while produces fail: at most
	// this often it brings one waiting event forward to fire as a probe of
	// the broker, and at most this often a success brings every waiting
	// event forward (firing.heal). A probe that fails costs one more
	// attempt, which may land later as a duplicate; one a second keeps the
	// wait after Kafka comes back under two seconds.
	probeInterval = time.Second
	// leaseMargin is the least lease a batch starts its produce with.
	leaseMargin = 25 * time.Millisecond
	// maxLeaseRenewals bounds the renewals in flight.
	maxLeaseRenewals = 3
	// leaseRetry is how long a batch that got no lease waits to fire again.
	leaseRetry = 50 * time.Millisecond
	// expireInterval is how often the leader looks for settled events past
	// the retention (one read of the settled index's first key). The
	// clean-up lags the retention by at most this plus the entries it
	// takes.
	expireInterval = time.Second
	// expireLimit bounds the events one Expire entry removes: each costs a
	// read of its body and three deletions on every replica, so an entry
	// stays a short apply however far behind the clean-up is.
	expireLimit = 1024
)

// loadStep is how often the horizon moves forward, and so how far past
// WheelHorizon the wheel holds events at most: an eighth of it, between
// 100 ms and 5 minutes. Each step loads the events of one step's worth of
// time, in one pass over that part of the due index.
func (t *Tuning) loadStep() time.Duration {
	return min(max(t.WheelHorizon/8, 100*time.Millisecond), 5*time.Minute)
}

// fill sets every zero field to its default.
func (t *Tuning) fill() {
	setDur := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	setInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	setDur(&t.Resolution, wheel.DefaultResolution)
	setDur(&t.DiskFailAfter, raftfsm.DefaultFailAfter)
	setInt(&t.ProposeBatch, 1024)
	// 1 MiB: an entry is written to the Raft log, sent to each follower
	// (up to 64 entries per AppendEntries) and held in the log cache
	// (logCacheEntries per shard). Bounded only in events, 1,024 events of
	// up to 1 MiB each could make one entry of a gigabyte. Events of a few
	// hundred bytes fill an entry by count long before this.
	setInt(&t.ProposeBytes, 1<<20)
	setInt(&t.FireBatch, 1024)
	setInt(&t.InstallRate, 32<<20)
	setDur(&t.WheelHorizon, time.Hour)
	t.WheelHorizon = max(t.WheelHorizon, time.Second)
	// 16: a batch takes a produce round trip, and at 10,000 events a
	// second under load four were too few, so the firing loop waited for a
	// slot while events fell due.
	setInt(&t.MaxFiring, 16)
	// 20 ms: under load an early batch's read, its wait for a slot and the
	// loop's wake-up each took 10-50 ms now and then (a memtable flush,
	// three on one 2-core machine, held the cores for a second).
	switch {
	case t.FireLead == 0:
		t.FireLead = 20 * time.Millisecond
	case t.FireLead < 0:
		t.FireLead = 0
	}
	// Heartbeats, every HeartbeatTimeout/10 per follower of every shard,
	// are most of what an idle cluster costs, and HeartbeatTimeout also
	// bounds failover (a follower waits 1-2x it before standing for
	// election). On an idle 3-node cluster of 8 shards, 500 ms cost 5.2%
	// of a core per node; 1 s cost 3.5% but took 2.3 s to replace a killed
	// leader; 750 ms sits between. The election timeout follows it, and
	// the lease is half of it: raft requires it no longer, and followers
	// elect no one else until a heartbeat timeout after they last heard
	// from the leader. Idle commit notifications go every CommitTimeout
	// instead of raft's 50 ms: followers learn the commit index with the
	// next write or heartbeat anyway.
	setDur(&t.HeartbeatTimeout, 750*time.Millisecond)
	setDur(&t.ElectionTimeout, t.HeartbeatTimeout)
	setDur(&t.LeaderLeaseTimeout, t.HeartbeatTimeout/2)
	setDur(&t.CommitTimeout, 500*time.Millisecond)
	// An election timeout: an fsync takes 170-290 µs here, so an append
	// still under way after 750 ms is a disk that hangs, not a busy one.
	// A write that returns soon after costs nothing (the followers hear
	// from the leader before a heartbeat timeout of silence makes them
	// stand); one that does not hands the shard over a heartbeat timeout
	// later, where the process stopping would take DiskFailAfter (20 s).
	setDur(&t.DiskStallAfter, t.ElectionTimeout)
	// Snapshots are references to the state in Pebble (snapshot.Store); each
	// waits for Pebble's next flush (Pebble runs without a WAL) and costs
	// little else, so take them often: the log after the last one is what a
	// restart reads back and replays.
	if t.SnapshotThreshold == 0 {
		t.SnapshotThreshold = 256
	}
	// TrailingLogs is how far behind a follower can be and still be sent
	// entries; a follower further behind gets the whole shard. On
	// raft-boltdb, which read its file through a mapping counted in the
	// node's RSS, ingesting 10M events on one node (entries of ~1000
	// events) left 1.88 GB RSS with 2048, 1.48 GB with 128. raft-wal reads
	// its segments with pread, and frees their disk a whole segment at a
	// time, once a compaction passes a segment's last entry.
	if t.TrailingLogs == 0 {
		t.TrailingLogs = 128
	}
	setDur(&t.ClockSkewBound, time.Second)
	// Every attempt sent into a broker that does not answer may still land
	// later, as one more duplicate, so failed batches back off: 1 s, then
	// doubling up to 8 s.
	setDur(&t.RetryDelay, time.Second)
	setDur(&t.MaxRetryDelay, max(8*time.Second, t.RetryDelay))
}

// raftConfig is the shard's raft configuration from t (filled), as a
// replica starts: with its heartbeat and election timeouts at
// startTimeout until it first hears of a leader.
func (t *Tuning) raftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.HeartbeatTimeout = t.startTimeout()
	rc.ElectionTimeout = t.startTimeout()
	rc.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	rc.CommitTimeout = t.CommitTimeout
	rc.SnapshotThreshold = t.SnapshotThreshold
	rc.SnapshotInterval = snapshotInterval
	rc.TrailingLogs = t.TrailingLogs
	return rc
}

// startTimeout is a starting replica's heartbeat and election timeout,
// until it first hears of a leader (Shard.settleTimeouts). After every
// node of a shard restarted at once (a power loss, a kill of every node)
// there is no leader to wait for, and a follower stands after 1-2x its
// heartbeat timeout: at HeartbeatTimeout that alone was most of the
// 1.6-1.9 s a cluster took to fire again. Half of it keeps the lease
// safe: a follower that acknowledged a leader votes for no other until a
// heartbeat timeout after, at least the lease's length; and a restarted
// node that stands while the others still have a leader is refused its
// pre-vote, which disturbs nobody.
func (t *Tuning) startTimeout() time.Duration {
	return max(t.LeaderLeaseTimeout, t.HeartbeatTimeout/2)
}
