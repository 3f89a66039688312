package raftfsm

import (
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// DefaultFailAfter is StoreOptions.FailAfter's default.
const DefaultFailAfter = 20 * time.Second

// errorLogEvery spaces the log lines of repeated background errors: Pebble retries a failed
// flush at once, and a data directory removed under a running node logged 50,000 identical
// lines a second.
const errorLogEvery = 5 * time.Second

// diskWatch tells a store whose disk has failed from one that had a passing error. Pebble
// runs without a WAL here, so a write is durable only once flushed; a flush that fails is
// retried at once and forever, and writes pile up in the memtables until they stall. A
// leader whose disk broke so kept its shards (its heartbeats still went out), applied
// nothing and fired nothing, and only a process that stops lets another replica take over.
// So the store is failed, and StoreOptions.Failed called, when Pebble's background errors
// have gone on for failAfter without a flush or compaction succeeding in between, or when
// one disk operation has been under way for failAfter.
type diskWatch struct {
	failAfter time.Duration
	failed    func(error) // nil: nothing is called
	log       pebble.Logger
	now       func() time.Time

	mu sync.Mutex
	// since is when the current run of errors began (zero when there is none), and
	// last its latest error: an error more than failAfter after the one before it
	// begins a new run, so that sporadic errors far apart never add up to a failure.
	since, last time.Time
	// logged is when an error or a slow operation was last logged, and unlogged how
	// many have not been since.
	logged   time.Time
	unlogged int
	done     bool // failed was called
}

func newDiskWatch(failAfter time.Duration, failed func(error), log pebble.Logger) *diskWatch {
	if failAfter <= 0 {
		failAfter = DefaultFailAfter
	}
	// Pebble's event listener passes no time, and how long disk errors have
	// gone on is measured on the wall clock; none of it enters the replicated
	// state, which is what the rule against time.Now in raftfsm protects.
	return &diskWatch{failAfter: failAfter, failed: failed, log: log, now: time.Now} //nolint:forbidigo // see above
}

// backgroundError is Pebble's EventListener.BackgroundError.
func (w *diskWatch) backgroundError(err error) {
	now := w.now()
	w.mu.Lock()
	if w.since.IsZero() || now.Sub(w.last) > w.failAfter {
		w.since = now
	}
	w.last = now
	skipped, log := w.shouldLogLocked(now)
	lasted := now.Sub(w.since)
	fail := w.failLocked(lasted >= w.failAfter)
	w.mu.Unlock()
	if log {
		w.log.Errorf("background error: %v (%d more not logged; errors for %s)", err, skipped, lasted.Round(time.Millisecond))
	}
	if fail {
		w.failed(fmt.Errorf("raftfsm: Pebble has failed to write for %s without a success: %w", lasted.Round(time.Millisecond), err))
	}
}

// diskSlow is Pebble's EventListener.DiskSlow, called every few seconds while a disk
// operation is slower than the health check's threshold.
func (w *diskWatch) diskSlow(info vfs.DiskSlowInfo) {
	now := w.now()
	w.mu.Lock()
	skipped, log := w.shouldLogLocked(now)
	fail := w.failLocked(info.Duration >= w.failAfter)
	w.mu.Unlock()
	if log {
		w.log.Errorf("%s (%d more not logged)", info, skipped)
	}
	if fail {
		w.failed(fmt.Errorf("raftfsm: a disk operation has been under way for %s: %s", info.Duration.Round(time.Millisecond), info))
	}
}

// succeeded ends a run of errors: a flush or a compaction wrote its tables.
func (w *diskWatch) succeeded() {
	w.mu.Lock()
	w.since = time.Time{}
	w.mu.Unlock()
}

func (w *diskWatch) shouldLogLocked(now time.Time) (skipped int, log bool) {
	if now.Sub(w.logged) < errorLogEvery {
		w.unlogged++
		return 0, false
	}
	skipped, w.unlogged, w.logged = w.unlogged, 0, now
	return skipped, true
}

// failLocked reports whether failed is to be called now: the first time cond holds.
func (w *diskWatch) failLocked(cond bool) bool {
	if !cond || w.done || w.failed == nil {
		return false
	}
	w.done = true
	return true
}

// flushEnded and compactionEnded end a run of errors when the flush or compaction
// succeeded. A flush that wrote no table (everything in it deleted) reports an error that
// Pebble does not export; its text is what identifies it.
func (w *diskWatch) flushEnded(info pebble.FlushInfo) {
	if info.Err == nil || info.Err.Error() == "pebble: empty table" {
		w.succeeded()
	}
}

func (w *diskWatch) compactionEnded(info pebble.CompactionInfo) {
	if info.Err == nil {
		w.succeeded()
	}
}
