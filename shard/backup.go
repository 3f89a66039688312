package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/internal/durable"
	"github.com/chimehq/chime/raftfsm"
)

// backupBarrierTimeout bounds the barrier a backup waits for: every entry
// committed before it must be applied, which under load is a few entries.
const backupBarrierTimeout = 10 * time.Second

// Backup writes a consistent copy of the shard's whole state to w, as a full
// snapshot stream (raftfsm.FSM.WriteSnapshot), and returns its header. Only
// the leader takes one (ErrNotLeader otherwise). It first waits for a Raft
// barrier, so that every entry committed before the call, and with it every
// event acknowledged before it, is applied and in the copy; the copy is then
// read from a Pebble snapshot at the applied index that reached, so the
// shard goes on taking entries and firing meanwhile. It writes at most at
// the node's install rate (Tuning.InstallRate, shared with the full
// snapshots sent to followers): reading and compressing a whole shard takes
// CPU the shards serving events need. ctx bounds the barrier; an error from
// w (a client that went away) ends the copy.
func (s *Shard) Backup(ctx context.Context, w io.Writer) (raftfsm.SnapshotHeader, error) {
	if !s.IsLeader() {
		return raftfsm.SnapshotHeader{}, ErrNotLeader
	}
	f := s.raft.Barrier(backupBarrierTimeout)
	done := make(chan struct{})
	go func() { f.Error(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return raftfsm.SnapshotHeader{}, ctx.Err()
	case <-s.stop:
		return raftfsm.SnapshotHeader{}, ErrStopped
	}
	err := f.Error()
	s.noteRaft(err)
	if err != nil {
		return raftfsm.SnapshotHeader{}, fmt.Errorf("shard %d: backup barrier: %w", s.id, raftErr(err))
	}
	return s.fsm.WriteSnapshot(pacedWriter{w, s.pace})
}

// PlantSnapshot makes dir the Raft directory of a replica that starts its
// shard anew from a full snapshot stream of it (a backup): raft's snapshot
// store holds the stream as its one snapshot, with self as the only voter,
// at raft index h.AppliedIndex (at least 1) and term 1. h is the stream's
// header (raftfsm.VerifySnapshot); stream is read to its end.
//
// Opened on it, with no Pebble keys of the shard, the replica finds raft
// state (so it never bootstraps) and a full stream that holds more than
// Pebble, so raft restores it (restoreOnStart; FSM.Restore checks it once
// more) before it starts, and its rebuilt wheel holds every pending event,
// overdue ones included. Raft's log then starts after the snapshot:
//
//   - its index must not be below the FSM's applied index, or the FSM
//     would skip the new cluster's first entries as already applied;
//   - its term is 1 because the stable store is empty (current term 0): the
//     group starts its terms again, as a new cluster does, and the first
//     election (term 1) is not behind its own log, whose terms then grow
//     from the snapshot's. The FSM's applied term, from the old cluster,
//     only labels its state.
//
// dir must not hold Raft state. self's address must be the Raft address
// the node will advertise (chimed --raft-addr): the other replicas dial it
// once they join the shard.
func PlantSnapshot(dir string, self raft.Server, h raftfsm.SnapshotHeader, stream io.Reader) error {
	if has, err := hasRaftState(dir); err != nil || has {
		if err == nil {
			err = errors.New("it already holds Raft state")
		}
		return fmt.Errorf("shard %d: %s: %w", h.Shard, dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hclog.NewNullLogger())
	if err != nil {
		return fmt.Errorf("shard %d: %w", h.Shard, err)
	}
	index := max(h.AppliedIndex, 1)
	sink, err := files.Create(raft.SnapshotVersionMax, index, 1, raft.Configuration{Servers: []raft.Server{self}}, index, addrEncoder{})
	if err != nil {
		return fmt.Errorf("shard %d: %w", h.Shard, err)
	}
	if _, err := io.Copy(sink, stream); err != nil {
		sink.Cancel()
		return fmt.Errorf("shard %d: writing the snapshot: %w", h.Shard, err)
	}
	// Close syncs the state and meta files, and renames the snapshot into
	// place only after.
	if err := sink.Close(); err != nil {
		return fmt.Errorf("shard %d: writing the snapshot: %w", h.Shard, err)
	}
	return durable.SyncDir(filepath.Dir(dir))
}

// addrEncoder encodes a peer as raft's network transport does (its address),
// for the legacy peers field of a snapshot's metadata; it is the only part
// of a transport that creating a snapshot uses.
type addrEncoder struct{ raft.Transport }

func (addrEncoder) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte { return []byte(addr) }
