package shard

import (
	"errors"
	"math"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// The wheel holds only the events due within the near horizon
// (Tuning.WheelHorizon); the rest wait in Pebble's due index, which is what
// bounds a node's memory by the events of the next hour rather than by all
// it holds. horizonLoop, on every replica, moves the horizon forward every
// loadStep and loads the events it passes, in due order and in chunks, so a
// new leader finds its wheel as warm as the old one's. The horizon is kept
// at least WheelHorizon - loadStep ahead of the clock, far more than a load
// takes, so that no event waits for one to be fired.

// errReplaced ends a load whose wheel a rebuild replaced, or whose shard is
// closing.
var errReplaced = errors.New("wheel replaced")

// loadChunk is how many events a load adds to the wheel per hold of
// firing.mu: large enough that the lock is taken rarely, small enough that
// the firing loop and apply never wait long for it (Knobs.LoadChunk
// replaces it).
const loadChunk = 1024

// loadRetry is how long a load that failed to read waits to try again.
const loadRetry = time.Second

// horizonUntil is where the horizon stands when the clock reads now.
func (s *Shard) horizonUntil(now int64) int64 {
	h := int64(s.tune.WheelHorizon)
	if now > math.MaxInt64-h {
		return math.MaxInt64
	}
	return now + h
}

// horizonLoop keeps the wheel loaded ahead of the shard's clock until the
// shard closes.
func (s *Shard) horizonLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.tune.loadStep())
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.loadHorizon(s.horizonUntil(s.cfg.Now().UnixNano()))
	}
}

// loadHorizon moves the horizon to until and loads the events it passes,
// retrying a failed read, until they are in the wheel, the wheel is
// rebuilt, or the shard closes.
func (s *Shard) loadHorizon(until int64) {
	from, gen, ok := s.firing.beginLoad(until)
	if !ok {
		return
	}
	defer s.firing.endLoad(gen)
	for {
		err := s.load(from, until, gen)
		if err == nil || errors.Is(err, errReplaced) {
			return
		}
		s.logger.Warn("loading the events the horizon passes into the wheel", "err", err)
		select {
		case <-s.stop:
			return
		case <-time.After(loadRetry):
		}
		if !s.firing.current(gen) {
			return
		}
	}
}

// loaded is a pending event a load read.
type loaded struct {
	seq uint64
	due int64
	p   raftfsm.Policy
}

// load reads the pending events due in [from, until) and adds them to wheel
// gen. A load that is retried reads its range again: addLoaded leaves out
// what the first attempt added.
func (s *Shard) load(from, until int64, gen uint64) error {
	size := s.cfg.Knobs.LoadChunk
	chunk := make([]loaded, 0, size)
	add := func() error {
		select {
		case <-s.stop:
			return errReplaced
		default:
		}
		if !s.firing.addLoaded(gen, chunk) {
			return errReplaced
		}
		if hook := s.cfg.Knobs.HorizonLoaded; hook != nil && len(chunk) > 0 {
			hook()
		}
		chunk = chunk[:0]
		return nil
	}
	err := s.fsm.ForEachPendingIn(from, until, func(seq uint64, due int64, p raftfsm.Policy) error {
		chunk = append(chunk, loaded{seq, due, p})
		if len(chunk) == size {
			return add()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return add()
}

// WheelEvents is how many events the wheel holds, and how far ahead of the
// shard's clock it holds every pending event (less than
// Tuning.WheelHorizon only while a load lags).
func (s *Shard) WheelEvents() (events int, ahead time.Duration) {
	n, until := s.firing.horizon()
	return n, time.Duration(until - s.cfg.Now().UnixNano())
}
