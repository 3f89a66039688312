package shard

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// watchedLog is the shard's Raft log and stable store, each write of which calls failed
// once it has been under way for after. Raft appends the leader's entries on its main
// goroutine: an append that never returns (a disk that hangs rather than fails) stops the
// leader from ever stepping down, while its replication goroutines go on heartbeating, so
// the followers elect no one else and the shard fires nothing. A write that fails is
// raft's to handle: a leader whose append fails steps down.
//
// The watch is a timer per write rather than a goroutine: one that has nothing to do
// costs nothing, and the timer's function runs only for a stalled write.
type watchedLog struct {
	raft.LogStore
	stable raft.StableStore
	shard  uint32
	after  time.Duration
	failed func(error)
}

func (w *watchedLog) watch(what string) *time.Timer {
	started := time.Now()
	return time.AfterFunc(w.after, func() {
		w.failed(fmt.Errorf("shard %d: a Raft log %s has been under way for %s since %s",
			w.shard, what, time.Since(started).Round(time.Millisecond), started.UTC().Format(time.RFC3339Nano)))
	})
}

func (w *watchedLog) StoreLog(l *raft.Log) error {
	defer w.watch("append").Stop()
	return w.LogStore.StoreLog(l)
}

func (w *watchedLog) StoreLogs(ls []*raft.Log) error {
	defer w.watch("append").Stop()
	return w.LogStore.StoreLogs(ls)
}

func (w *watchedLog) DeleteRange(lo, hi uint64) error {
	defer w.watch("truncation").Stop()
	return w.LogStore.DeleteRange(lo, hi)
}

func (w *watchedLog) Set(k, v []byte) error {
	defer w.watch("vote or term write").Stop()
	return w.stable.Set(k, v)
}

func (w *watchedLog) SetUint64(k []byte, v uint64) error {
	defer w.watch("vote or term write").Stop()
	return w.stable.SetUint64(k, v)
}

// IsMonotonic passes on whether the log refuses a gap (see
// snapshot.KeepSnapshotEntry).
func (w *watchedLog) IsMonotonic() bool { return isMonotonic(w.LogStore) }

func (w *watchedLog) Get(k []byte) ([]byte, error)       { return w.stable.Get(k) }
func (w *watchedLog) GetUint64(k []byte) (uint64, error) { return w.stable.GetUint64(k) }

// isMonotonic reports whether s says it refuses a gap in its indexes.
func isMonotonic(s raft.LogStore) bool {
	m, ok := s.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
