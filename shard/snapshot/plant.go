package snapshot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/internal/durable"
	"github.com/chimehq/chime/raftfsm"
)

// Plant writes a full snapshot stream of a shard into dir as its raft
// snapshot store's one snapshot, with self as the only voter, at raft
// index h.AppliedIndex (at least 1) and term 1, and syncs it. h is the
// stream's header (raftfsm.VerifySnapshot); stream is read to its end. The
// caller checks that dir holds no raft state.
//
// A replica opened on it with no Pebble keys of the shard finds a full
// stream holding more than Pebble, so raft restores it (RestoreOnStart)
// before it starts. The index must not be below the FSM's applied index, or
// the FSM would skip the new cluster's first entries as already applied;
// the term is 1 because the stable store is empty (current term 0), so the
// first election (term 1) is not behind its own log.
func Plant(dir string, self raft.Server, h raftfsm.SnapshotHeader, stream io.Reader) error {
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
		err = fmt.Errorf("shard %d: writing the snapshot: %w", h.Shard, err)
		// Cancel removes the partial snapshot, unless flushing it fails
		// first (as on a full disk): raft never reaps one left behind, so
		// the error names it.
		if cerr := sink.Cancel(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("shard %d: removing the partial snapshot in %s: %w", h.Shard, dir, cerr))
		}
		return err
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
