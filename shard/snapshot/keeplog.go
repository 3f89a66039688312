package snapshot

import (
	"math"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// A follower too far behind for the log gets the shard's whole state: the
// leader writes it out (an expansion of its latest snapshot reference) and
// sends it, both at the install rate, which for ten million events takes
// tens of seconds. The follower then needs every entry after the
// snapshot's index. With TrailingLogs (128) kept behind each snapshot, and
// a snapshot every SnapshotThreshold entries, a shard taking 5,000 events a
// second had dropped those entries long before the install ended, so the
// follower was sent a new snapshot, and again: adding a replica to a shard
// of 10M events took three installs and 200 s. So while an expansion is
// open, and for keepLogGrace after the last one closes (the follower then
// replays the log), raft keeps its whole log. What the log grows by
// meanwhile is the entries of the install's duration.

// keepLogGrace is how long the log is kept after an install was sent: the
// follower restores it and asks for the entries after it within seconds
// (Knobs.KeepLogGrace replaces it).
const keepLogGrace = 30 * time.Second

// logKeeper counts the open expansions and raises raft's TrailingLogs while
// there are any (and for grace after).
type logKeeper struct {
	grace    time.Duration
	trailing uint64         // raft's TrailingLogs when no expansion is open
	set      func(n uint64) // changes raft's TrailingLogs; nil: nothing is kept
	mu       sync.Mutex     // held across set, so that changes do not interleave
	open     int            // expansions open
	release  *time.Timer    // lowers TrailingLogs again; nil when not pending
	closed   bool           // stop was called
}

// expanding is told when an expansion begins (true) and when it is closed
// (false).
func (k *logKeeper) expanding(begins bool) {
	if k.set == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	if begins {
		if k.open++; k.open == 1 {
			if k.release != nil {
				k.release.Stop()
				k.release = nil
			}
			k.set(math.MaxUint64)
		}
		return
	}
	if k.open--; k.open == 0 {
		k.release = time.AfterFunc(k.grace, func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			if k.open == 0 && !k.closed {
				k.release = nil
				k.set(k.trailing)
			}
		})
	}
}

// stop ends a pending release.
func (k *logKeeper) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	if k.release != nil {
		k.release.Stop()
		k.release = nil
	}
}

// KeepSnapshotEntry wraps raft's log store so that a compaction keeps its
// last entry: the entry at the snapshot's index, whose term raft asks for
// after a follower installs that snapshot. raft deletes entries in two ways:
// a compaction from the first entry up to before the last, and a follower's
// truncation of a conflicting suffix, which reaches the last entry (as does
// a recovery's deletion of everything); only the first is changed.
func KeepSnapshotEntry(l raft.LogStore) raft.LogStore { return keepSnapshotEntry{l} }

type keepSnapshotEntry struct{ raft.LogStore }

// IsMonotonic tells raft whether the log refuses a gap in its indexes, as
// raft-wal does (raft.MonotonicLogStore). A follower that installs a
// snapshot then deletes its whole log; otherwise raft keeps the entries
// before the snapshot's index and appends after it, and raft-wal would
// refuse every append after the install.
func (l keepSnapshotEntry) IsMonotonic() bool {
	m, ok := l.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (l keepSnapshotEntry) DeleteRange(min, max uint64) error {
	last, err := l.LastIndex()
	if err != nil {
		return err
	}
	if max < last {
		if max == min {
			return nil
		}
		max--
	}
	return l.LogStore.DeleteRange(min, max)
}
