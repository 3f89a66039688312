package shard

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/chimehq/chime/raftfsm"
	"github.com/hashicorp/raft"
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
// (only after a restore did not finish) to restore at start; in both cases it
// needs the data, and it needs the size up front (the follower checks it).
// The expanded state is at or after the reference's index; the receiving FSM
// records the index it really holds and skips the entries it already has.
type snapshotStore struct {
	files *raft.FileSnapshotStore
	fsm   *raftfsm.FSM
	dir   string // for expansions
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
		// The state is partial; it cannot stand in for the snapshot. (A
		// replica needs a restore only after one from a received, full
		// snapshot failed, and that snapshot is newer than any reference.)
		return nil, nil, fmt.Errorf("shard %d: snapshot %s is a reference to this replica's state, which is partial after an unfinished restore", s.fsm.Shard(), id)
	}
	f, err := os.CreateTemp(s.dir, "expand-*.tmp")
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*raft.SnapshotMeta, io.ReadCloser, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, nil, fmt.Errorf("shard %d: expanding snapshot %s: %w", s.fsm.Shard(), id, err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
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
	return &m, expansion{f}, nil
}

// expansion is an expanded reference; closing it deletes it.
type expansion struct{ *os.File }

func (e expansion) Close() error {
	err := e.File.Close()
	if rerr := os.Remove(e.Name()); err == nil {
		err = rerr
	}
	return err
}
