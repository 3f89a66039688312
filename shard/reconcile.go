package shard

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// The shard leader moves its own Raft configuration toward the placement,
// one change at a time and never below a quorum of the voters that remain:
//
//  1. a non-voter that is desired is promoted once it has caught up (it was
//     streamed a snapshot and the log); one that is not desired is dropped.
//     While a non-voter is catching up, nothing else changes.
//  2. a voter an operator removed is dropped at once.
//  3. a desired node missing from the configuration is added as a non-voter.
//  4. with more voters than desired, one that is not desired is removed; if
//     that is the leader itself, it first hands leadership to a desired
//     voter that has caught up.
//  5. for a while after the membership changed, leadership moves to the
//     preferred leader (the first desired node), which spreads leaders
//     evenly over the nodes.

const (
	reconcileInterval = 500 * time.Millisecond
	// balanceWindow is how long after a membership change the leader hands
	// leadership to the preferred node. Outside it, leadership stays where
	// an election or an operator (transfer-leader) put it.
	balanceWindow = time.Minute
	// caughtUpLag is how many log entries a non-voter may trail the leader's
	// applied index and still be promoted.
	caughtUpLag    = 64
	configTimeout  = 10 * time.Second
	caughtUpPolled = 2 * time.Second
)

func (s *Shard) reconcileLoop(ctx context.Context) {
	dir := s.cfg.Directory
	t := time.NewTicker(reconcileInterval)
	defer t.Stop()
	epoch := dir.Epoch()
	changed := time.Now() // gaining leadership counts as a change
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if e := dir.Epoch(); e != epoch {
			epoch, changed = e, time.Now()
		}
		s.reconcile(ctx, time.Since(changed) < balanceWindow)
	}
}

// reconcile makes at most one configuration change (or one leadership
// transfer) toward the placement.
func (s *Shard) reconcile(ctx context.Context, balance bool) {
	dir := s.cfg.Directory
	desired := dir.Desired(s.id)
	if len(desired) == 0 {
		return
	}
	voters, nonvoters, err := s.Configuration()
	if err != nil {
		return
	}
	self := s.cfg.NodeID
	log := s.logger.With("voters", voters, "nonvoters", nonvoters, "desired", desired)

	for _, nv := range nonvoters { // 1
		if !slices.Contains(desired, nv) || dir.Removed(nv) {
			log.Info("dropping a non-voter the placement no longer wants", "node", nv)
			s.configChange(s.raft.RemoveServer(raft.ServerID(nv), 0, configTimeout))
			return
		}
		if s.caughtUp(ctx, nv) {
			if addr, ok := dir.RaftAddr(nv); ok {
				log.Info("promoting a caught-up non-voter", "node", nv)
				s.configChange(s.raft.AddVoter(raft.ServerID(nv), raft.ServerAddress(addr), 0, configTimeout))
			}
		}
		return
	}
	for _, v := range voters { // 2
		if v != self && dir.Removed(v) && len(voters) > 1 {
			log.Info("dropping a removed node", "node", v)
			s.configChange(s.raft.RemoveServer(raft.ServerID(v), 0, configTimeout))
			return
		}
	}
	for _, d := range desired { // 3
		if slices.Contains(voters, d) {
			continue
		}
		if addr, ok := dir.RaftAddr(d); ok {
			log.Info("adding a non-voter", "node", d)
			s.configChange(s.raft.AddNonvoter(raft.ServerID(d), raft.ServerAddress(addr), 0, configTimeout))
			return
		}
	}
	if len(voters) > len(desired) { // 4
		for _, v := range voters {
			if slices.Contains(desired, v) {
				continue
			}
			if v == self {
				log.Info("handing leadership over before leaving the shard")
				s.transferLeadership(ctx, desired)
			} else {
				log.Info("removing a voter the placement no longer wants", "node", v)
				s.configChange(s.raft.RemoveServer(raft.ServerID(v), 0, configTimeout))
			}
			return
		}
	}
	if balance && desired[0] != self && slices.Contains(voters, desired[0]) { // 5
		s.transferLeadership(ctx, desired[:1])
	}
}

// transferLeadership hands leadership to the first of to that has caught up.
func (s *Shard) transferLeadership(ctx context.Context, to []string) {
	for _, n := range to {
		if n == s.cfg.NodeID || !s.caughtUp(ctx, n) {
			continue
		}
		addr, ok := s.cfg.Directory.RaftAddr(n)
		if !ok {
			continue
		}
		if err := s.raft.LeadershipTransferToServer(raft.ServerID(n), raft.ServerAddress(addr)).Error(); err != nil {
			s.logger.Warn("leadership transfer", "to", n, "err", err)
		} else {
			s.logger.Info("leadership transferred", "to", n)
		}
		return
	}
}

// TransferLeadership hands this leader's shard to node, a voter.
func (s *Shard) TransferLeadership(node, addr string) error {
	if !s.IsLeader() {
		return ErrNotLeader
	}
	return raftErr(s.raft.LeadershipTransferToServer(raft.ServerID(node), raft.ServerAddress(addr)).Error())
}

// caughtUp reports whether node's replica has applied nearly everything this
// leader has.
func (s *Shard) caughtUp(ctx context.Context, node string) bool {
	ctx, cancel := context.WithTimeout(ctx, caughtUpPolled)
	defer cancel()
	applied, err := s.cfg.Directory.Applied(ctx, node, s.id)
	if err != nil {
		return false
	}
	return applied+caughtUpLag >= s.fsm.AppliedIndex()
}

func (s *Shard) configChange(f raft.IndexFuture) {
	if err := f.Error(); err != nil {
		s.logger.Warn("configuration change", "err", err)
	}
}

// Configuration returns the shard's latest Raft configuration as this replica
// knows it: voters and non-voters by node id.
func (s *Shard) Configuration() (voters, nonvoters []string, err error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, nil, raftErr(err)
	}
	for _, sv := range f.Configuration().Servers {
		if sv.Suffrage == raft.Voter {
			voters = append(voters, string(sv.ID))
		} else {
			nonvoters = append(nonvoters, string(sv.ID))
		}
	}
	return voters, nonvoters, nil
}

// Leader returns the node id of the shard's leader as this replica knows it.
func (s *Shard) Leader() string {
	_, id := s.raft.LeaderWithID()
	return string(id)
}

// Digest fingerprints this replica's state; see raftfsm.FSM.Digest.
func (s *Shard) Digest() (applied, digest uint64, err error) { return s.fsm.Digest() }

// AppliedIndex returns the last log index applied to this replica's state.
func (s *Shard) AppliedIndex() uint64 { return s.fsm.AppliedIndex() }

// RaftStats returns raft's own counters (state, last_log_index, commit_index...).
func (s *Shard) RaftStats() map[string]string { return s.raft.Stats() }
