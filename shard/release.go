package shard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/chimehq/chime/internal/durable"
	"github.com/chimehq/chime/raftfsm"
)

// A replica lives on two disks that no single write spans: its keys in the node's Pebble and
// its Raft state (log, stable store, snapshots) in its directory. Raft state is a claim about
// Pebble: a snapshot reference says "Pebble holds the log up to index I", and raft will not
// ask for what it believes it has. So the claim must never outlive what it names:
//
//   - Releasing a replica first makes its Raft state unusable, durably (its directory is
//     renamed to a tombstone and the parent directory synced), then drops its Pebble keys
//     (flushed), then deletes the tombstone. A crash between any two steps leaves a tombstone,
//     or nothing: never Raft state over a dropped shard.
//   - Before a replica opens, an interrupted release is finished, and Pebble keys with no
//     Raft state beside them are dropped: a new Raft log starts at index 1, and an FSM whose
//     applied index is already past it would skip the new entries as replayed.
//   - A replica whose Pebble is behind its own snapshot reference does not start
//     (ErrStateLost, from snapshot.Store.RestoreOnStart).

// releasedSuffix names the tombstone of a replica's Raft directory.
const releasedSuffix = ".released"

// releaseSteps are the steps of deleting a released replica's data, in order. A crash
// between any two of them leaves a state that finishRelease completes. The shard must be
// closed.
func releaseSteps(st *raftfsm.Store, id uint32, dir string) []func() error {
	tomb := dir + releasedSuffix
	return []func() error{
		func() error {
			// A missing directory is Raft state already gone; the keys are still dropped.
			if err := os.Rename(dir, tomb); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("shard %d: release: %w", id, err)
			}
			return durable.SyncDir(filepath.Dir(dir))
		},
		func() error { return st.DropShard(id) },
		func() error {
			if err := os.RemoveAll(tomb); err != nil {
				return fmt.Errorf("shard %d: release: %w", id, err)
			}
			return durable.SyncDir(filepath.Dir(dir))
		},
	}
}

// ReleaseData deletes the data of the closed replica of shard id whose Raft directory
// is dir, crash-atomically: after a crash, the replica that opens is either the whole old one
// or a new, empty one.
func ReleaseData(st *raftfsm.Store, id uint32, dir string) error {
	for _, step := range releaseSteps(st, id, dir) {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// finishRelease completes a release of shard id that a crash interrupted, if there was one.
func finishRelease(st *raftfsm.Store, id uint32, dir string) error {
	if _, err := os.Stat(dir + releasedSuffix); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("shard %d: finish release: %w", id, err)
	}
	for _, step := range releaseSteps(st, id, dir)[1:] {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// FinishReleases completes every interrupted release on the node, held replica or not, so
// that no dropped replica's keys stay in Pebble.
func FinishReleases(st *raftfsm.Store, shards int, dirOf func(uint32) string) error {
	for i := range shards {
		if err := finishRelease(st, uint32(i), dirOf(uint32(i))); err != nil {
			return err
		}
	}
	return nil
}

// prepareReplica readies the disks for opening the replica of shard id whose Raft directory
// is dir: it finishes an interrupted release, and drops Pebble keys of the shard that have no
// Raft state beside them.
func prepareReplica(st *raftfsm.Store, id uint32, dir string) error {
	if err := finishRelease(st, id, dir); err != nil {
		return err
	}
	has, err := hasRaftState(dir)
	if err != nil || has {
		return err
	}
	return st.DropShard(id)
}

// hasRaftState reports whether dir holds a Raft log store (raft-wal's, or the raft-boltdb
// file of an older build, which openLogStore moves into one) or a snapshot. A wal.tmp is a
// move not finished, beside the raft.db it copies.
func hasRaftState(dir string) (bool, error) {
	for _, name := range []string{walDirName, boltLogName} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	snaps, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	// A snapshot raft did not finish writing is a directory ending in .tmp, which raft ignores.
	for _, e := range snaps {
		if !strings.HasSuffix(e.Name(), ".tmp") {
			return true, nil
		}
	}
	return false, err
}
