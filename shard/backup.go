package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/snapshot"
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
	go func() { _ = f.Error(); close(done) }() // waits for the future; its error is read below
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
	return s.fsm.WriteSnapshot(snapshot.Paced(w, s.pace))
}

// PlantSnapshot makes dir the Raft directory of a replica that starts its
// shard anew from a full snapshot stream of it (a backup): raft's snapshot
// store holds the stream as its one snapshot, with self as the only voter,
// at raft index h.AppliedIndex (at least 1) and term 1. h is the stream's
// header (raftfsm.VerifySnapshot); stream is read to its end.
//
// Opened on it, with no Pebble keys of the shard, the replica finds raft
// state (so it never bootstraps) and a full stream that holds more than
// Pebble, so raft restores it (snapshot.Store.RestoreOnStart; FSM.Restore checks it once
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
	return snapshot.Plant(dir, self, h, stream)
}
