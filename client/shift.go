package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// MaxShift is the most events one ShiftMatching moves: it holds what it
// listed in memory until every event is moved.
const MaxShift = 1_000_000

// shiftParallel is how many Updates ShiftMatching has in flight.
const shiftParallel = 16

// ShiftResult counts what ShiftMatching did (so far, to its progress
// function).
type ShiftResult struct {
	// Matched scheduled events, as listed; each is counted once more in
	// Moved or Skipped.
	Matched int64
	// Moved by the offset: the update was applied.
	Moved int64
	// Skipped: fired, cancelled or changed by someone else between the
	// listing and its update (the update named the version listed), left
	// as they are.
	Skipped int64
	Done    bool
}

// ShiftMatching moves the due time of every scheduled event f selects by
// by (later when positive, earlier when negative; an event moved into the
// past fires at once). It lists the events first (at most MaxShift; more
// is an *InvalidError that changes nothing), then updates each with
// IfVersion of the version listed, shiftParallel at a time, so that an
// event someone changed meanwhile is left alone and counted as Skipped.
// progress, when not nil, is called with the running totals about every
// second and once at the end (Done set), from the calling goroutine.
//
// f must select something (an id prefix, a topic or a due range; its
// Priorities only narrow those), and its States none or StateScheduled
// alone. Running it again moves the events again: it lists
// anew. An error that is not the event's (no node answered within the
// RetryPolicy) stops it, with the totals so far.
func (c *Client) ShiftMatching(ctx context.Context, f Filter, by time.Duration, progress func(ShiftResult)) (ShiftResult, error) {
	var res ShiftResult
	switch {
	case by == 0:
		return res, invalidf("by", "must not be zero: it is how far each event moves")
	case f.IDPrefix == "" && f.Topic == "" && f.DueAfter.IsZero() && f.DueBefore.IsZero() && len(f.Priorities) > 0:
		return res, invalidf("filter", "priorities alone select too much for a shift: give an id prefix, a topic or a due range as well")
	case f.IDPrefix == "" && f.Topic == "" && f.DueAfter.IsZero() && f.DueBefore.IsZero():
		return res, invalidf("filter", "must select something (an id prefix, a topic or a due range): a shift of every event is refused")
	case len(f.States) > 1 || len(f.States) == 1 && f.States[0] != StateScheduled:
		return res, invalidf("filter.states", "only scheduled events can be moved: none, or StateScheduled alone")
	}
	f.States = []State{StateScheduled}
	type target struct {
		id      string
		version uint64
		due     time.Time
	}
	var ts []target
	for ev, err := range c.List(ctx, f) {
		if err != nil {
			return res, err
		}
		if len(ts) == MaxShift {
			return res, invalidf("filter", "selects more than %d scheduled events, the most one shift moves: narrow it (a due range, a longer prefix)", MaxShift)
		}
		ts = append(ts, target{ev.ID, ev.Version, ev.Due})
	}
	res.Matched = int64(len(ts))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var moved, skipped atomic.Int64
	var firstErr error
	var errOnce sync.Once
	next := make(chan target)
	var wg sync.WaitGroup
	for range min(shiftParallel, len(ts)) {
		wg.Go(func() {
			for t := range next {
				_, err := c.Update(ctx, t.id, At(t.due.Add(by)), IfVersion(t.version))
				switch {
				case err == nil:
					moved.Add(1)
				case errors.Is(err, ErrConflict), errors.Is(err, ErrAlreadyFired), errors.Is(err, ErrCancelled), errors.Is(err, ErrNotFound):
					skipped.Add(1)
				default:
					errOnce.Do(func() { firstErr = err; cancel() })
				}
			}
		})
	}
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		defer close(next)
		for _, t := range ts {
			select {
			case next <- t:
			case <-ctx.Done():
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); <-fed; close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-tick.C:
			if progress != nil {
				progress(ShiftResult{Matched: res.Matched, Moved: moved.Load(), Skipped: skipped.Load()})
			}
		case <-done:
			running = false
		}
	}
	res.Moved, res.Skipped = moved.Load(), skipped.Load()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return res, firstErr
	}
	res.Done = true
	if progress != nil {
		progress(res)
	}
	return res, nil
}
