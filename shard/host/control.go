package host

import (
	"context"
	"slices"
	"sync"
	"time"
)

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
	// The replicas to open are opened together, as Open opens them: opening
	// an empty replica takes up to a second or two (its Pebble keys are
	// dropped first), and one after another, a node that joined had its
	// last replica open many seconds after the first. The leaders wait for
	// each to open before they add it (shard.Directory.LogIndex).
	var opens sync.WaitGroup
	defer opens.Wait()
	for i := range h.cfg.Shards {
		id := uint32(i)
		wanted := slices.Contains(dir.Desired(id), self)
		s := h.Replica(id)
		stuck := ""
		if s != nil {
			stuck = s.Stuck()
		}
		switch {
		case stuck != "":
			h.cfg.Logger.Error("reopening replica: "+stuck, "shard", id)
			if err := h.reopenReplica(id); err != nil {
				h.cfg.Logger.Warn("reopening a replica", "shard", id, "err", err)
			}
		case wanted && s == nil:
			// An empty replica: once it is open, the leader adds it as a
			// non-voter, streams it a snapshot and the log, then promotes it.
			opens.Go(func() {
				if _, err := h.openReplica(id, false); err != nil {
					h.cfg.Logger.Warn("opening a replica", "shard", id, "err", err)
				}
			})
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
