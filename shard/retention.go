package shard

import (
	"context"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// expireLoop removes settled events once Tuning.Retention has passed since
// they settled, by proposing Expire entries, while this replica leads. Every
// replica applies the same entries, so every replica removes the same
// events; only the leader's clock decides when, and one ahead by s removes
// events up to s early, as it would fire them.
func (s *Shard) expireLoop(ctx context.Context) {
	t := time.NewTicker(expireInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil && s.expireOnce() {
		}
	}
}

// expireOnce proposes one Expire entry if the oldest settled event is past
// the retention, and reports whether another may be needed at once.
func (s *Shard) expireOnce() bool {
	before := s.cfg.Now().Add(-s.tune.Retention).UnixNano()
	oldest, ok, err := s.fsm.OldestSettled()
	if err != nil || !ok || oldest >= before {
		return false
	}
	resp, err := s.apply(context.Background(), raftfsm.AppendExpire(nil, &raftfsm.Expire{Before: before, Limit: expireLimit}))
	if err != nil {
		s.logger.Warn("removing settled events past the retention", "err", err)
		return false
	}
	r, _ := resp.(*raftfsm.ExpireResult)
	if r == nil {
		return false
	}
	return r.Expired == expireLimit
}

// CleanupLag is how far the clean-up is behind the retention: how long ago
// the oldest settled event still stored should have been removed, or 0.
// Zero when the retention is off.
func (s *Shard) CleanupLag() time.Duration {
	if s.tune.Retention <= 0 {
		return 0
	}
	oldest, ok, err := s.fsm.OldestSettled()
	if err != nil || !ok {
		return 0
	}
	return max(0, s.cfg.Now().Add(-s.tune.Retention).Sub(time.Unix(0, oldest)))
}

// ReclaimedBytes is the size of the keys and values the clean-up has
// deleted on this replica since it opened.
func (s *Shard) ReclaimedBytes() uint64 { return s.fsm.ReclaimedBytes() }
