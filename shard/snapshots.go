package shard

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/chimehq/chime/raftfsm"
	"github.com/hashicorp/raft"
	"golang.org/x/time/rate"
)

// snapshotStore is raft's snapshot store for a shard whose state lives in
// Pebble. Snapshots this replica takes are references (raftfsm.FSM.Snapshot):
// a few bytes naming the applied index, so raft can snapshot and truncate its
// log often at no cost. Snapshots received from a leader are full streams.
// Both are kept by a raft.FileSnapshotStore.
//
// Opening a reference expands it: the shard's current state is written to a
// temporary file as a full stream, and that is what raft reads. raft opens a
// snapshot to send it to a follower that is too far behind for the log, and
// needs the data and the size up front (the follower checks it). raft also
// opens its latest snapshot to restore at start when restoreOnStart says so,
// which is never for a reference over the state it names (Open refuses one
// after an unfinished restore).
// The expanded state is at or after the reference's index; the receiving FSM
// records the index it really holds and skips the entries it already has.

type snapshotStore struct {
	files *raft.FileSnapshotStore
	fsm   *raftfsm.FSM
	dir   string        // for expansions
	pace  *rate.Limiter // expansions are written and read no faster (Tuning.InstallRate)
	// expanding, if set, is told when an expansion begins (true) and when
	// it is closed (false): the shard keeps its log meanwhile (keepLog).
	expanding func(begins bool)
	sent      atomic.Uint64 // expansions opened: full copies sent to followers
}

var _ raft.SnapshotStore = (*snapshotStore)(nil)

func (s *snapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	return s.files.Create(version, index, term, configuration, configurationIndex, trans)
}

func (s *snapshotStore) List() ([]*raft.SnapshotMeta, error) { return s.files.List() }

func (s *snapshotStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
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
	rc.Close()
	if s.fsm.NeedsRestore() {
		// The state is partial; it cannot stand in for the snapshot. (Only
		// a restore the version before left unfinished does that; the
		// received full snapshot it was restoring is newer than any
		// reference.)
		return nil, nil, fmt.Errorf("shard %d: snapshot %s is a reference to this replica's state, which is partial after an unfinished restore", s.fsm.Shard(), id)
	}
	done := func() {}
	if s.expanding != nil {
		s.expanding(true)
		done = func() { s.expanding(false) }
	}
	s.sent.Add(1)
	f, err := os.CreateTemp(s.dir, "expand-*.tmp")
	if err != nil {
		done()
		return nil, nil, err
	}
	fail := func(err error) (*raft.SnapshotMeta, io.ReadCloser, error) {
		f.Close()
		os.Remove(f.Name())
		done()
		return nil, nil, fmt.Errorf("shard %d: expanding snapshot %s: %w", s.fsm.Shard(), id, err)
	}
	bw := bufio.NewWriterSize(pacedWriter{f, s.pace}, 1<<20)
	if _, err := s.fsm.WriteSnapshot(bw); err != nil {
		return fail(err)
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fail(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	m := *meta
	m.Size = size
	return &m, expansion{f: f, pace: s.pace, done: done}, nil
}

// InstallsSent is how many full copies of the shard this replica has opened
// to send to followers too far behind for its log, since it opened.
func (s *Shard) InstallsSent() uint64 { return s.snaps.sent.Load() }

// ErrStateLost is returned when a replica opens with a Pebble that is behind its own latest
// snapshot reference: raft would take the reference's index as applied and never re-apply
// what Pebble lost, so the replica cannot start. Nothing Chime does leaves such a state; a
// lost or replaced Pebble directory does. Raft state of a voter cannot simply be wiped either
// (it may have voted and acknowledged entries): an operator removes the node from the shard
// and clears its data directory.
var ErrStateLost = errors.New("replica's Pebble state is behind its own snapshot reference")

// restoreOnStart decides whether raft must restore its latest snapshot when the replica
// starts (that is, not raft.Config.NoSnapshotRestoreOnStart). Pebble holds the state up to
// the FSM's applied index, so a start normally replays only the log after it. It compares that
// index with the one the snapshot's header records, the FSM's when it was taken, not raft's
// (raft.SnapshotMeta.Index), which counts the no-op and barrier entries raft applies without
// the FSM: after a leader change it is past anything the FSM records, and comparing with it
// made the next start restore the whole shard from its own reference. The snapshot is
// restored only when a restore of the version before did not finish, or when it is a full stream (received from a
// leader) holding more than Pebble. A reference is never restored over the Pebble it names:
// Pebble behind it is ErrStateLost.
func (s *snapshotStore) restoreOnStart() (bool, error) {
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
	rc.Close()
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

// expansion is an expanded reference, read at the install rate; closing it
// deletes it. It has only Read and Close: were the file's WriteTo promoted,
// io.Copy (raft's send) would use it and skip the pacing.
type expansion struct {
	f    *os.File
	pace *rate.Limiter
	done func() // called by Close
}

func (e expansion) Read(p []byte) (int, error) {
	p = p[:min(len(p), e.pace.Burst())]
	n, err := e.f.Read(p)
	if n > 0 {
		_ = e.pace.WaitN(context.Background(), n) // n is at most the burst, so it cannot fail
	}
	return n, err
}

func (e expansion) Close() error {
	err := e.f.Close()
	if rerr := os.Remove(e.f.Name()); err == nil {
		err = rerr
	}
	e.done()
	return err
}

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

// newInstallLimiter paces snapshot installs at bytesPerSecond, in bursts of
// 256 KiB (a few milliseconds of the default rate).
func newInstallLimiter(bytesPerSecond int) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(bytesPerSecond), min(256<<10, bytesPerSecond))
}

// NewInstallLimiter is the limiter a node shares among its replicas
// (Config.Installs), at Tuning.InstallRate (0: the default).
func NewInstallLimiter(t Tuning) *rate.Limiter {
	t.fill()
	return newInstallLimiter(t.InstallRate)
}
