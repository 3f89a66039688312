package shard

import (
	"context"
	"slices"
	"time"
)

// Directory is the cluster as the shard layer needs it. The node implements
// it from membership (the live view and the placement computed from it) and
// from the Admin API (questions to other nodes). Gossip only informs: every
// configuration change is made by a shard's Raft leader.
type Directory interface {
	// Desired returns the node ids that should be the shard's voters,
	// preferred leader first. Its length is the replication factor, or the
	// number of placement candidates when there are fewer.
	Desired(shard uint32) []string
	// RaftAddr returns the Raft address a member advertises.
	RaftAddr(node string) (string, bool)
	// Removed reports a node forgotten by an operator (chimectl remove).
	Removed(node string) bool
	// Leaving reports a node an operator is draining.
	Leaving(node string) bool
	// Replication is the cluster's replication factor.
	Replication() int
	// LogIndex asks node for the last index of its replica's Raft log of
	// shard: how far its log has come, which is what promoting it or handing
	// it leadership needs. Not its applied index: a replica restored from an
	// expanded snapshot reference holds state newer than its log (and its
	// Raft configuration) until the entries after the reference arrive.
	LogIndex(ctx context.Context, node string, shard uint32) (uint64, error)
	// Members asks the shard's leader, through any node that knows it, for
	// the shard's current voters and non-voters.
	Members(ctx context.Context, shard uint32) (voters, nonvoters []string, err error)
	// Changes is signalled (coalesced) when the membership view changes. It
	// has one reader: the host.
	Changes() <-chan struct{}
	// Epoch counts membership changes; shard leaders poll it.
	Epoch() uint64
}

// controlInterval is how often the host revisits which replicas it should
// hold, besides membership changes.
const controlInterval = time.Second

// controlLoop opens the replicas the placement gives this node and releases
// the ones a leader has moved away. It runs only with a Directory.
func (h *Host) controlLoop() {
	defer close(h.done)
	t := time.NewTicker(controlInterval)
	defer t.Stop()
	for {
		h.control()
		select {
		case <-h.stop:
			return
		case <-h.cfg.Directory.Changes():
		case <-t.C:
		}
	}
}

func (h *Host) control() {
	dir := h.cfg.Directory
	self := h.cfg.NodeID
	for i := range h.cfg.Shards {
		id := uint32(i)
		wanted := slices.Contains(dir.Desired(id), self)
		s := h.Replica(id)
		switch {
		case wanted && s == nil:
			// An empty replica: the leader adds it as a non-voter, streams
			// it a snapshot and the log, then promotes it.
			if _, err := h.openReplica(id, false); err != nil {
				h.cfg.Logger.Warn("opening a replica", "shard", id, "err", err)
			}
		case !wanted && s != nil && !s.IsLeader():
			// Release only once the leader has taken this node out of the
			// configuration; until then it still counts toward a quorum.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			voters, nonvoters, err := dir.Members(ctx, id)
			cancel()
			if err != nil || slices.Contains(voters, self) || slices.Contains(nonvoters, self) {
				continue
			}
			h.cfg.Logger.Info("releasing replica: no longer in the shard's configuration", "shard", id)
			if err := h.releaseReplica(id); err != nil {
				h.cfg.Logger.Warn("releasing a replica", "shard", id, "err", err)
			}
		}
	}
}
