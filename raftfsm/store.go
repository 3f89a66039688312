package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// StoreOptions configures the node's Pebble. The zero value is fine for production.
type StoreOptions struct {
	// FS is the filesystem Pebble uses; nil means the OS's. Tests inject
	// vfs.NewCrashableMem to drop unsynced writes the way a power cut does.
	FS vfs.FS
	// CacheSize is Pebble's block cache in bytes; 0 means 256 MiB. Every
	// new event's id lookup reads the bloom filter blocks of the tables it
	// may be in; with 64 MiB they were evicted and re-read (with a
	// checksum) on every lookup, half of the CPU of an ingest benchmark.
	CacheSize int64
	// Logger receives Pebble's log lines; nil means Pebble's default (the standard log
	// package).
	Logger pebble.Logger
	// SnapshotFlushWait bounds how long a snapshot's Persist waits for Pebble to flush by
	// itself before it asks for a flush; 0 means 10 s. Its own flush, one per snapshot
	// (each shard takes one every 256 entries), wrote memtables out at a fraction of their
	// size: twice the flushes and the compactions of Pebble's own pace in an ingest run.
	// While Persist waits, raft keeps the log entries the snapshot would let it discard.
	SnapshotFlushWait time.Duration
	// Failed is called once, from one of Pebble's goroutines, when the store can no longer
	// make its state durable: Pebble's flushes and compactions have failed for FailAfter
	// without one succeeding, or one disk operation has been under way for FailAfter. The
	// caller is expected to stop the process, without closing the store (Close would wait
	// for a flush that cannot happen): what the memtables held is in the Raft log, and the
	// node's shards are led by replicas whose disks work. nil: only the log says so.
	Failed func(error)
	// FailAfter is how long a failing or stalled disk is tolerated; 0 means
	// DefaultFailAfter. A stalled operation is reported from 5 s on (Pebble's disk health
	// checks, which run on the OS's filesystem only: FS nil), so a stall is noticed after
	// max(FailAfter, 5 s) or up to 2 s later.
	FailAfter time.Duration
	// Knobs are for tests; the zero value is production's.
	Knobs Knobs
}

// Knobs let a test reach into a Store's FSMs: hooks at chosen points of their background
// reads, and sizes shrunk to test scale. A zero field changes nothing.
type Knobs struct {
	// IDScan, if set, runs in every id filter scan once its iterator is open, on the scan's
	// goroutine: a test holds a scan there to apply events while it runs.
	IDScan func()
	// PendingBuild, if set, runs in every build of a pending set once its iterator is open,
	// on the build's goroutine: a test holds a build there to apply events while it runs. It
	// must return once stop is closed.
	PendingBuild func(stop <-chan struct{})
	// MinFilterIDs, if positive, replaces the least capacity of an id filter generation
	// (minFilterIDs), so that a test fills generations with a few thousand ids.
	MinFilterIDs int
	// PrefixScanLimit, if set, is asked at each List for how many id entries it reads under
	// a prefix before it walks the shard in due order instead (prefixScanLimit otherwise);
	// 0 makes every List walk. A test compares both ways of listing on one FSM with it.
	PrefixScanLimit func() int
}

// ErrShardOpen is returned by NewFSM when the shard already has an open FSM in this Store:
// two appliers on one key span would corrupt it.
var ErrShardOpen = errors.New("raftfsm: shard already has an open FSM in this store")

// Store is one node's Pebble database, holding the state of every shard on the node. It is
// safe for concurrent use. Close it after the FSMs using it are closed and their snapshots
// released.
type Store struct {
	db   *pebble.DB
	opts *pebble.Options // as opened, defaults filled in: restores write tables with them
	fs   vfs.FS
	dir  string

	mu     sync.Mutex
	shards map[uint32]struct{} // shards with an open FSM; guarded by mu

	// Background reads of the FSMs (their id filters' scans, their pending sets' builds)
	// stop when closing is closed, and Close waits for them, so that none reads a closed
	// database. Scans run one at a time, holding scanSlot, and builds one at a time, holding
	// pendingSlot: a build is what lets a restarted shard settle fired events without
	// reading them, so it does not queue behind the far longer id scans.
	closing     chan struct{}
	closeOnce   sync.Once
	scans       sync.WaitGroup
	scanSlot    chan struct{}
	pendingSlot chan struct{}

	// flushes is closed and replaced whenever Pebble ends a flush, waking the snapshot
	// persists waiting for their state to become durable (FSM.waitDurable).
	flushMu   sync.Mutex
	flushes   chan struct{}
	flushWait time.Duration // StoreOptions.SnapshotFlushWait

	knobs     Knobs
	filterMin int // the least capacity of an id filter generation
}

// OpenStore opens (creating if needed) the Pebble database in dir.
func OpenStore(dir string, opts StoreOptions) (*Store, error) {
	size := opts.CacheSize
	if size <= 0 {
		size = 256 << 20
	}
	cache := pebble.NewCache(size)
	defer cache.Unref()
	s := &Store{shards: make(map[uint32]struct{}), closing: make(chan struct{}), scanSlot: make(chan struct{}, 1), pendingSlot: make(chan struct{}, 1),
		flushes: make(chan struct{}), flushWait: opts.SnapshotFlushWait, knobs: opts.Knobs, filterMin: minFilterIDs}
	if opts.Knobs.MinFilterIDs > 0 {
		s.filterMin = opts.Knobs.MinFilterIDs
	}
	if s.flushWait <= 0 {
		s.flushWait = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = pebble.DefaultLogger
	}
	po := &pebble.Options{
		FS:     opts.FS,
		Cache:  cache,
		Logger: opts.Logger,
		// The newest format with row-oriented blocks: the columnar blocks of
		// later formats cost more CPU to write, and this store is written far
		// more than it is scanned (a 3-node cluster ingested 10% more with these).
		FormatMajorVersion: pebble.FormatFlushableIngestExcises,
		// Write-heavy tuning. Every event is written (three keys) on each
		// replica and most are rewritten or deleted when they fire, so
		// compaction, not the write itself, is what scheduling costs: with
		// Pebble's 4 MiB memtables it took 69% of a 3-node cluster's CPU
		// at 15k events/s. Large memtables flush less
		// often, and a short-lived event's keys may die in the memtable
		// or in L0 before they are compacted further.
		MemTableSize:                64 << 20,
		MemTableStopWritesThreshold: 4,
		// With tables cut at region boundaries (regionSpans) only the id
		// region, keyed by random ids, stacks up sublevels in L0; each of
		// its compactions rewrites the whole id region below. Letting 12
		// stack up (a lookup then consults 12 bloom filters) cut what a
		// 4.5M-event ingest compacted into L6 from 145 to 41 MB per node
		// and raised the cluster's rate from 74,820 to 84,406 events/s.
		L0CompactionThreshold: 12,
		L0StopWritesThreshold: 24,
		LBaseMaxBytes:         512 << 20,
		// No WAL: it repeated the Raft log, which already holds every write apply makes
		// (1.7 GB per node in an 8M-event ingest, where flushes wrote 0.34 GB). Without it a
		// crash loses what the memtables held and Pebble reopens at an older "log up to
		// AppliedIndex", which raft re-applies; flush makes state durable where nothing
		// could re-create it (doc.go, invariant 4).
		DisableWAL: true,
	}
	watch := newDiskWatch(opts.FailAfter, opts.Failed, po.Logger)
	po.EventListener = &pebble.EventListener{
		FlushEnd: func(info pebble.FlushInfo) {
			watch.flushEnded(info)
			s.flushEnded(info)
		},
		CompactionEnd:   watch.compactionEnded,
		BackgroundError: watch.backgroundError,
		DiskSlow:        watch.diskSlow,
	}
	po.Experimental.SpanPolicyFunc = regionSpans
	// Every created event first checks that its id is new, a Get that misses. Without
	// filters a miss searches every level; with them it is answered from memory. (Deeper
	// levels inherit L0's policy.)
	po.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	// On the OS's filesystem (FS nil), EnsureDefaults wraps it in Pebble's disk health
	// checks, which time every write, sync and file operation and report one under way for
	// 5 s, again every 2 s while it lasts, to EventListener.DiskSlow; closing the database
	// stops them.
	po.EnsureDefaults()
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("raftfsm: open pebble in %s: %w", dir, err)
	}
	s.db, s.opts, s.fs, s.dir = db, po, po.FS, dir
	// A restore a crash interrupted left its staging tables; nothing refers to them.
	names, err := s.fs.List(dir)
	if err != nil {
		_ = db.Close() // nothing was written yet; the List error is the one to report
		return nil, err
	}
	for _, n := range names {
		if strings.HasPrefix(n, stagingPrefix) {
			if err := s.fs.RemoveAll(s.fs.PathJoin(dir, n)); err != nil {
				_ = db.Close() // nothing was written yet; the RemoveAll error is the one to report
				return nil, err
			}
		}
	}
	return s, nil
}

// regionSpans ends every sstable that flushes and compactions write at the
// end of a region: the keys of one shard with one tag (bodies, due index,
// ids, statuses). New keys arrive at the end of most regions (bodies and the
// due index by due time, statuses by seq), so a memtable's keys are a thin
// slice at the end of each. Flushed into one table per run of keys, that
// table's key range spanned from the end of one region to the end of the
// next and covered all of the second: every compaction into the base level
// rewrote whole regions it added nothing to. Cut at region boundaries, a
// table of new keys overlaps little or nothing below it and mostly moves
// down without being rewritten.
func regionSpans(start []byte) (pebble.SpanPolicy, []byte, error) {
	if len(start) < shardPrefixLen+1 {
		// Every key of this store has a shard and a tag; a shorter one
		// belongs to the region its zero-padded form starts.
		start = append(slices.Clip(start), make([]byte, shardPrefixLen+1-len(start))...)
	}
	shard := binary.BigEndian.Uint32(start)
	tag := start[shardPrefixLen]
	if tag == 0xff {
		if shard == math.MaxUint32 {
			return pebble.SpanPolicy{}, nil, nil
		}
		return pebble.SpanPolicy{}, appendShardTag(nil, shard+1, 0), nil
	}
	return pebble.SpanPolicy{}, appendShardTag(nil, shard, tag+1), nil
}

// LSM describes the node's Pebble: its levels (tables, bytes, what was
// flushed, compacted and moved into each), compactions, memtables, caches.
// It is Pebble's own report, for operators and for profiling the storage.
func (s *Store) LSM() string { return s.db.Metrics().String() }

// Close stops the FSMs' background reads, flushes the memtables, so that a restart need not
// re-apply their writes from the Raft logs, and closes the database.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.scans.Wait()
	err := s.flush()
	return errors.Join(err, s.db.Close())
}

func (s *Store) flushEnded(pebble.FlushInfo) {
	s.flushMu.Lock()
	close(s.flushes)
	s.flushes = make(chan struct{})
	s.flushMu.Unlock()
}

// nextFlush returns a channel closed when the next flush to end has ended.
func (s *Store) nextFlush() <-chan struct{} {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	return s.flushes
}

// flush makes every write committed so far durable. Pebble runs without a WAL, so that is a
// flush of the memtables into synced sstables; it returns once they are installed. Apply
// never calls it (the Raft log is the durability point). Restore, DropShard and Close do, and
// a snapshot's Persist when Pebble has not flushed by itself in time (FSM.waitDurable): where
// raft or the placement will no longer re-create what Pebble could lose.
func (s *Store) flush() error {
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("raftfsm: flush pebble: %w", err)
	}
	return nil
}

func (s *Store) claim(shard uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.shards[shard]; ok {
		return fmt.Errorf("%w: shard %d", ErrShardOpen, shard)
	}
	s.shards[shard] = struct{}{}
	return nil
}

func (s *Store) release(shard uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.shards, shard)
}

// DropShard deletes every key of shard from the store, durably. It is for a replica this node
// no longer holds (moved elsewhere by the placement), and for keys left with no Raft state to
// go with them; the shard must not have an open FSM here. The owner must first make the
// replica's Raft state unusable, durably: a crash after the drop would otherwise leave Raft
// state, whose snapshot says Pebble holds the log up to some index, over an empty shard.
func (s *Store) DropShard(shard uint32) error {
	// Held across the delete, so that NewFSM cannot claim the shard half way through.
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, open := s.shards[shard]; open {
		return fmt.Errorf("%w: shard %d", ErrShardOpen, shard)
	}
	start, end := shardSpan(shard)
	if err := s.db.DeleteRange(start, end, pebble.NoSync); err != nil {
		return fmt.Errorf("raftfsm: drop shard %d: %w", shard, err)
	}
	return s.flush()
}
