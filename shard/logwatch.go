package shard

import (
	"errors"
	"fmt"
	"sync/atomic"
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
// A write under way for stallAfter (much less than after) also counts in stalled while it
// lasts, and stallGate, the shard's transport, sends no AppendEntries meanwhile: a leader
// whose disk hangs falls silent, and its followers elect another leader a heartbeat timeout
// later, instead of waiting out after for the process to stop. A write that returns in
// time, however slow, costs nothing: the followers hear from the leader again before they
// would stand for election.
//
// The watch is two timers per write rather than a goroutine: one that has nothing to do
// costs nothing, and the timers' functions run only for a stalled write.
type watchedLog struct {
	raft.LogStore
	stable raft.StableStore
	shard  uint32
	after  time.Duration
	failed func(error) // nil: nothing is called
	// stallAfter, when positive, is how long a write may be under way before it counts
	// in stalled.
	stallAfter time.Duration
	stalled    *atomic.Int64
	// before, if set, runs before each write, inside its watch (Knobs.LogWrite).
	before func()
}

// watch starts watching a write, and returns what ends the watch when it returns.
func (w *watchedLog) watch(what string) (done func()) {
	started := time.Now()
	var fail, stall *time.Timer
	if w.failed != nil {
		fail = time.AfterFunc(w.after, func() {
			w.failed(fmt.Errorf("shard %d: a Raft log %s has been under way for %s since %s",
				w.shard, what, time.Since(started).Round(time.Millisecond), started.UTC().Format(time.RFC3339Nano)))
		})
	}
	if w.stallAfter > 0 && w.stalled != nil {
		stall = time.AfterFunc(w.stallAfter, func() { w.stalled.Add(1) })
	}
	if w.before != nil {
		w.before()
	}
	return func() {
		if fail != nil {
			fail.Stop()
		}
		// Stop is false once the function ran or runs: its count is taken back. Run
		// concurrently, the count may dip below zero for a moment, which reads as
		// not stalled, as it is.
		if stall != nil && !stall.Stop() {
			w.stalled.Add(-1)
		}
	}
}

func (w *watchedLog) StoreLog(l *raft.Log) error {
	defer w.watch("append")()
	return w.LogStore.StoreLog(l)
}

func (w *watchedLog) StoreLogs(ls []*raft.Log) error {
	defer w.watch("append")()
	return w.LogStore.StoreLogs(ls)
}

func (w *watchedLog) DeleteRange(lo, hi uint64) error {
	defer w.watch("truncation")()
	return w.LogStore.DeleteRange(lo, hi)
}

func (w *watchedLog) Set(k, v []byte) error {
	defer w.watch("vote or term write")()
	return w.stable.Set(k, v)
}

func (w *watchedLog) SetUint64(k []byte, v uint64) error {
	defer w.watch("vote or term write")()
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

// errLogStalled is what stallGate answers raft instead of sending an AppendEntries.
var errLogStalled = errors.New("shard: a write to the Raft log is stalled: not replicating, so that another replica leads")

// stallGate is the shard's raft transport, which sends no AppendEntries, heartbeats
// included, while stalled counts a write to the Raft log (watchedLog). It keeps the two
// optional abilities raft looks for, PreVote and Close; the shard closes the transport it
// wraps itself.
type stallGate struct {
	gatedTransport
	stalled *atomic.Int64
}

// gatedTransport is what stallGate wraps: the network transport, and raft's in-memory one.
type gatedTransport interface {
	raft.Transport
	raft.WithPreVote
	raft.WithClose
}

func (g *stallGate) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if g.stalled.Load() > 0 {
		return errLogStalled
	}
	return g.gatedTransport.AppendEntries(id, target, args, resp)
}

func (g *stallGate) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := g.gatedTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return &stallGatedPipeline{AppendPipeline: p, stalled: g.stalled}, nil
}

type stallGatedPipeline struct {
	raft.AppendPipeline
	stalled *atomic.Int64
}

func (p *stallGatedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	if p.stalled.Load() > 0 {
		return nil, errLogStalled
	}
	return p.AppendPipeline.AppendEntries(args, resp)
}
