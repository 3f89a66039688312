package snapshot

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"golang.org/x/time/rate"

	"github.com/chimehq/chime/raftfsm"
)

// Config configures a replica's snapshot store.
type Config struct {
	// Dir is the replica's raft directory: raft's snapshots, expansions
	// and received copies are kept in it.
	Dir string
	// FSM is the replica's state machine, whose state an expansion writes
	// out.
	FSM *raftfsm.FSM
	// Pace bounds the rate at which expansions are written and read
	// (NewLimiter); the node shares one among its replicas.
	Pace *rate.Limiter
	// Logger is raft's file snapshot store's, and the store's own (nil:
	// raft's default, and none).
	Logger hclog.Logger
	// TrailingLogs is how many entries raft keeps behind a snapshot when no
	// copy is being sent; SetTrailingLogs changes raft's (all of them,
	// math.MaxUint64, while one is). Nil: the log is not kept.
	TrailingLogs    uint64
	SetTrailingLogs func(n uint64)
	Knobs           Knobs
}

// Knobs let a test shrink the store's durations; a zero field takes the
// default.
type Knobs struct {
	// KeepLogGrace, if positive, replaces keepLogGrace: how long raft keeps
	// its whole log after an install was sent.
	KeepLogGrace time.Duration
	// ExpansionReuse, if positive, replaces expansionReuse: how long an
	// expansion of the shard is kept after its last reader closed.
	ExpansionReuse time.Duration
}

func (k *Knobs) fill() {
	if k.KeepLogGrace <= 0 {
		k.KeepLogGrace = keepLogGrace
	}
	if k.ExpansionReuse <= 0 {
		k.ExpansionReuse = expansionReuse
	}
}

// Store is raft's snapshot store for a shard whose state lives in
// Pebble. Snapshots this replica takes are references (raftfsm.FSM.Snapshot):
// a few bytes naming the applied index, so raft can snapshot and truncate its
// log often at no cost. Snapshots received from a leader are full streams.
// Both are kept by a raft.FileSnapshotStore.
//
// Opening a reference expands it: the shard's current state is written to a
// temporary file as a full stream, and that is what raft reads. raft opens a
// snapshot to send it to a follower that is too far behind for the log, and
// needs the data and the size up front (the follower checks it). raft also
// opens its latest snapshot to restore at start when RestoreOnStart says so,
// which is never for a reference over the state it names (Open refuses one
// after an unfinished restore).
// The expanded state is at or after the reference's index; the receiving FSM
// records the index it really holds and skips the entries it already has.
type Store struct {
	files  *raft.FileSnapshotStore
	fsm    *raftfsm.FSM
	logger hclog.Logger
	dir    string        // for expansions
	pace   *rate.Limiter // expansions are written and read no faster
	// keep holds raft's log while an expansion is open (expanding).
	keep      logKeeper
	keepFor   time.Duration // how long the latest expansion is kept unused (Knobs.ExpansionReuse)
	sent      atomic.Uint64 // expansions opened: full copies sent to followers
	bytesSent atomic.Uint64 // bytes of them read to be sent

	mu     sync.Mutex
	cur    *expanded // the latest expansion, kept for keepFor after use
	closed bool
}

var _ raft.SnapshotStore = (*Store)(nil)

// Open opens the snapshot store in cfg.Dir and deletes the expansions and the
// half-written snapshots a crash left behind.
func Open(cfg Config) (*Store, error) {
	cfg.Knobs.fill()
	files, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, cfg.Logger)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &Store{files: files, fsm: cfg.FSM, logger: logger, dir: cfg.Dir, pace: cfg.Pace, keepFor: cfg.Knobs.ExpansionReuse,
		keep: logKeeper{grace: cfg.Knobs.KeepLogGrace, trailing: cfg.TrailingLogs, set: cfg.SetTrailingLogs}}
	if err := s.removeLeftovers(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	return s.files.Create(version, index, term, configuration, configurationIndex, trans)
}

func (s *Store) List() ([]*raft.SnapshotMeta, error) { return s.files.List() }

func (s *Store) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.files.Open(id)
	if err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(rc)
	if !raftfsm.IsSnapshotReference(br) {
		return meta, struct {
			io.Reader
			io.Closer
		}{br, rc}, nil
	}
	_ = rc.Close() // read only
	if s.fsm.NeedsRestore() {
		// The state is partial; it cannot stand in for the snapshot. (Only
		// a restore the version before left unfinished does that; the
		// received full snapshot it was restoring is newer than any
		// reference.)
		return nil, nil, fmt.Errorf("shard %d: snapshot %s is a reference to this replica's state, which is partial after an unfinished restore", s.fsm.Shard(), id)
	}
	s.sent.Add(1)
	if r := s.reuse(); r != nil {
		m := r.x.meta
		return &m, r, nil
	}
	x, err := s.expand(meta)
	if err != nil {
		return nil, nil, fmt.Errorf("shard %d: expanding snapshot %s: %w", s.fsm.Shard(), id, err)
	}
	r, err := s.openExpanded(x)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	old := s.cur
	s.cur = x
	if old != nil && old.refs == 0 {
		s.dropLocked(old)
	}
	s.mu.Unlock()
	m := x.meta
	return &m, r, nil
}

// expand writes the shard's current state out to a new file.
func (s *Store) expand(meta *raft.SnapshotMeta) (_ *expanded, err error) {
	s.keep.expanding(true)
	defer func() {
		if err != nil {
			s.keep.expanding(false)
		}
	}()
	x := &expanded{meta: *meta}
	if _, err := rand.Read(x.uid[:]); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(s.dir, expansionPrefix+"*.tmp")
	if err != nil {
		return nil, err
	}
	x.path = f.Name()
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			// A file left behind holds up to a whole shard until the next
			// Open (removeLeftovers): the error says so.
			if rerr := os.Remove(x.path); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	bw := bufio.NewWriterSize(pacedWriter{f, s.pace}, 1<<20)
	if _, err := s.fsm.WriteSnapshot(bw); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	if x.meta.Size, err = f.Seek(0, io.SeekCurrent); err != nil {
		return nil, err
	}
	return x, nil
}

// reuse opens the kept expansion, if there is one.
func (s *Store) reuse() *expansion {
	s.mu.Lock()
	x := s.cur
	s.mu.Unlock()
	if x == nil {
		return nil
	}
	r, err := s.openExpanded(x)
	if err != nil {
		return nil // dropped meanwhile
	}
	return r
}

// openExpanded opens a reader of x and counts it.
func (s *Store) openExpanded(x *expanded) (*expansion, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x.dropped {
		return nil, os.ErrNotExist
	}
	f, err := os.Open(x.path)
	if err != nil {
		return nil, err
	}
	if x.drop != nil {
		x.drop.Stop()
		x.drop = nil
	}
	x.refs++
	return &expansion{x: x, f: f, store: s}, nil
}

// release counts a reader of x closed: the last one removes it, or, for
// the kept expansion, arms its removal after s.keepFor.
func (s *Store) release(x *expanded) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x.refs--; x.refs > 0 || x.dropped {
		return
	}
	if s.cur != x || s.closed {
		s.dropLocked(x)
		return
	}
	x.drop = time.AfterFunc(s.keepFor, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if x.refs == 0 && !x.dropped {
			s.dropLocked(x)
		}
	})
}

// forget stops x from being reused; it is removed once its readers close.
func (s *Store) forget(x *expanded) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != x {
		return
	}
	s.cur = nil
	if x.refs == 0 && !x.dropped {
		s.dropLocked(x)
	}
}

// dropLocked removes x; s.mu is held.
func (s *Store) dropLocked(x *expanded) {
	x.dropped = true
	if x.drop != nil {
		x.drop.Stop()
		x.drop = nil
	}
	if s.cur == x {
		s.cur = nil
	}
	// A file left behind holds up to a whole shard until the next Open
	// (removeLeftovers).
	if err := os.Remove(x.path); err != nil {
		s.logger.Warn("removing an expansion of the shard", "error", err)
	}
	s.keep.expanding(false)
}

// StopKeepingLog ends a pending release of raft's log: after it, the store
// changes raft's TrailingLogs no more. The replica calls it before raft
// shuts down.
func (s *Store) StopKeepingLog() { s.keep.stop() }

// Close removes the kept expansion; expansions still being read go when
// they are closed. Called once raft has shut down.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if x := s.cur; x != nil && x.refs == 0 {
		s.dropLocked(x)
	}
	s.cur = nil
}

// removeLeftovers deletes expansions a crash left behind.
func (s *Store) removeLeftovers() error {
	left, err := filepath.Glob(filepath.Join(s.dir, expansionPrefix+"*"))
	for _, name := range left {
		if rerr := os.Remove(name); err == nil {
			err = rerr
		}
	}
	// A snapshot raft's file store was writing when the process ended stays in a
	// directory named <id>.tmp, which the store skips when it lists and never reaps:
	// each kill during a Persist, or during the receipt of a leader's full copy of the
	// shard, left one for good, a copy the size of the shard for the second. Only the
	// sink that created one ever renames it, so none is in use while the store opens.
	tmps, gerr := filepath.Glob(filepath.Join(s.dir, snapshotsDir, "*"+snapshotTmpSuffix))
	if err == nil {
		err = gerr
	}
	for _, name := range tmps {
		if rerr := os.RemoveAll(name); err == nil {
			err = rerr
		}
	}
	return err
}

// snapshotsDir and snapshotTmpSuffix are where raft's file snapshot store keeps its
// snapshots in the replica's raft directory, and how it names one being written
// (raft.FileSnapshotStore's unexported snapPath and tmpSuffix).
const (
	snapshotsDir      = "snapshots"
	snapshotTmpSuffix = ".tmp"
)

// Sent is how many full copies of the shard this store has opened to send
// to followers too far behind for its log, since it opened.
func (s *Store) Sent() uint64 { return s.sent.Load() }

// BytesSent is how many bytes of those copies it has sent: a copy whose
// send was cut is sent on from where it was cut.
func (s *Store) BytesSent() uint64 { return s.bytesSent.Load() }

// ErrStateLost is returned when a replica opens with a Pebble that is behind its own latest
// snapshot reference: raft would take the reference's index as applied and never re-apply
// what Pebble lost, so the replica cannot start. Nothing Chime does leaves such a state; a
// lost or replaced Pebble directory does. Raft state of a voter cannot simply be wiped either
// (it may have voted and acknowledged entries): an operator removes the node from the shard
// and clears its data directory.
var ErrStateLost = errors.New("replica's Pebble state is behind its own snapshot reference")

// RestoreOnStart decides whether raft must restore its latest snapshot when the replica
// starts (that is, not raft.Config.NoSnapshotRestoreOnStart). Pebble holds the state up to
// the FSM's applied index, so a start normally replays only the log after it. It compares that
// index with the one the snapshot's header records, the FSM's when it was taken, not raft's
// (raft.SnapshotMeta.Index), which counts the no-op and barrier entries raft applies without
// the FSM: after a leader change it is past anything the FSM records, and comparing with it
// made the next start restore the whole shard from its own reference. The snapshot is
// restored only when a restore of the version before did not finish, or when it is a full stream (received from a
// leader) holding more than Pebble. A reference is never restored over the Pebble it names:
// Pebble behind it is ErrStateLost.
func (s *Store) RestoreOnStart() (bool, error) {
	if s.fsm.NeedsRestore() {
		return true, nil
	}
	metas, err := s.files.List()
	if err != nil || len(metas) == 0 {
		return false, err
	}
	latest := metas[0]
	_, rc, err := s.files.Open(latest.ID)
	if err != nil {
		return false, fmt.Errorf("shard %d: open snapshot %s: %w", s.fsm.Shard(), latest.ID, err)
	}
	h, err := raftfsm.ReadSnapshotHeader(bufio.NewReader(rc))
	_ = rc.Close() // read only
	if err != nil {
		return false, fmt.Errorf("shard %d: snapshot %s: %w", s.fsm.Shard(), latest.ID, err)
	}
	applied := s.fsm.AppliedIndex()
	switch {
	case applied >= h.AppliedIndex:
		return false, nil
	case !h.Reference:
		return true, nil
	}
	return false, fmt.Errorf("%w: shard %d: snapshot %s (raft index %d) says Pebble holds the log up to index %d; Pebble holds it up to %d",
		ErrStateLost, s.fsm.Shard(), latest.ID, latest.Index, h.AppliedIndex, applied)
}

// expansionPrefix names the files expansions are written to.
const expansionPrefix = "expand-"

// expansionReuse is how long an expansion is kept after its last reader
// closed: an install raft restarts within it (after a failed send, or for
// another follower) sends the same bytes, so a follower that holds part of
// them is sent only the rest, and the shard is not written out again. The
// shard keeps its whole log meanwhile (expanding), so that the followers
// can replay what came after the copy (Knobs.ExpansionReuse replaces it).
const expansionReuse = time.Minute

// expanded is one expansion: the shard's state written out as a full
// stream, and the meta raft sends with it.
type expanded struct {
	path string
	meta raft.SnapshotMeta // Size is the file's
	uid  [16]byte          // names these bytes to a follower that holds part of them

	// Under Store.mu.
	refs    int
	drop    *time.Timer // removes it once unused for Store.keepFor
	dropped bool
}

// expansion reads an expanded reference at the install rate. It has only
// Read and Close: were the file's WriteTo promoted, io.Copy (raft's send)
// would use it and skip the pacing.
type expansion struct {
	x     *expanded
	f     *os.File
	store *Store
}

func (e *expansion) Read(p []byte) (int, error) {
	pace := e.store.pace
	p = p[:min(len(p), pace.Burst())]
	n, err := e.f.Read(p)
	if n > 0 {
		_ = pace.WaitN(context.Background(), n) // n is at most the burst, so it cannot fail
		e.store.bytesSent.Add(uint64(n))
	}
	return n, err
}

// seek moves the reader to offset.
func (e *expansion) seek(offset int64) error {
	_, err := e.f.Seek(offset, io.SeekStart)
	return err
}

func (e *expansion) Close() error {
	err := e.f.Close()
	e.store.release(e.x)
	return err
}

// Paced returns a writer that passes on to w at most pace's rate: a full
// stream written for a backup goes at the install rate, as expansions do.
func Paced(w io.Writer, pace *rate.Limiter) io.Writer { return pacedWriter{w, pace} }

// pacedWriter writes at most a limiter's rate.
type pacedWriter struct {
	w    io.Writer
	pace *rate.Limiter
}

func (p pacedWriter) Write(b []byte) (n int, err error) {
	for len(b) > 0 {
		c := min(len(b), p.pace.Burst())
		_ = p.pace.WaitN(context.Background(), c)
		m, err := p.w.Write(b[:c])
		n += m
		if err != nil {
			return n, err
		}
		b = b[c:]
	}
	return n, nil
}

// NewLimiter paces snapshot installs at bytesPerSecond, in bursts of
// 256 KiB (a few milliseconds of the default rate).
func NewLimiter(bytesPerSecond int) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(bytesPerSecond), min(256<<10, bytesPerSecond))
}
