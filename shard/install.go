package shard

import (
	"golang.org/x/time/rate"

	"github.com/chimehq/chime/shard/snapshot"
)

// The replica's snapshots, the copies of the shard it sends and receives,
// and the log it keeps meanwhile belong to package snapshot; what is here
// wires them to the replica's raft and names them to the node.

// InstallLayerID is the raftmux layer id of shard id's install layer.
func InstallLayerID(id uint32) uint32 { return id | 1<<31 }

// LayerShard is the shard whose raft transport or install layer is raftmux
// layer id.
func LayerShard(id uint32) uint32 { return id &^ (1 << 31) }

// ErrStateLost is returned when a replica opens with a Pebble that is
// behind its own latest snapshot reference (see snapshot.ErrStateLost).
var ErrStateLost = snapshot.ErrStateLost

// InstallsSent is how many full copies of the shard this replica has opened
// to send to followers too far behind for its log, since it opened.
func (s *Shard) InstallsSent() uint64 { return s.snaps.Sent() }

// InstallBytesSent is how many bytes of those copies it has sent: a copy
// whose send was cut is sent on from where it was cut.
func (s *Shard) InstallBytesSent() uint64 { return s.snaps.BytesSent() }

// NewInstallLimiter is the limiter a node shares among its replicas
// (Config.Installs), at Tuning.InstallRate (0: the default).
func NewInstallLimiter(t Tuning) *rate.Limiter {
	t.fill()
	return snapshot.NewLimiter(t.InstallRate)
}

// setTrailingLogs changes how many entries raft keeps behind a snapshot;
// the snapshot store raises it to all of them while a copy is sent, and
// calls it one change at a time.
func (s *Shard) setTrailingLogs(n uint64) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	rc := s.raft.ReloadableConfig()
	rc.TrailingLogs = n
	if err := s.raft.ReloadConfig(rc); err != nil {
		s.logger.Warn("changing raft's trailing logs", "to", n, "err", err)
	}
}
