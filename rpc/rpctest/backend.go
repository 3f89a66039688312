// Package rpctest provides an in-memory rpc.Backend for tests of the gRPC
// server and its clients (chimectl). It follows raftfsm's rules for what a
// request does: idempotency by ContentHash (Created, Existing with the
// original due, Conflict), the first occurrence of an id in one batch wins,
// delays are resolved with the backend's clock, cancel outcomes by state. It
// has no Raft, no durability and no clock of its own that fires: tests move
// events to Fired or DeadLettered with Fire and DeadLetter, or fire all
// that is due by a time of their choosing, recurring occurrences included,
// with FireDue and FireUntil (chimetest's Fake steps a virtual clock with
// FireUntil). The real
// Backend (host.Host, or cluster.Cluster in a cluster) is covered by the
// end-to-end tests.
package rpctest

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

// Backend is an in-memory rpc.Backend. The zero value is not usable; call
// New. It is safe for concurrent use.
type Backend struct {
	now func() time.Time

	mu      sync.Mutex
	events  map[string]*raftfsm.Record
	nextSeq uint64
	calls   []Call
	fail    error
	// schedules are the recurring schedules, by id (see recurring.go).
	schedules map[string]*schedule
}

// Call is one call the Backend received, for tests that assert what reached
// it (or that nothing did).
type Call struct {
	Method string          // "Schedule", "Cancel", "Get", "Update", "List", "Count", "CancelMatching", "Recurring", "GetSchedule" or "ListSchedules"
	Reqs   []shard.Request // Schedule's requests
	ID     string          // Cancel's, Get's and Update's id
	Change shard.Change    // Update's change
	Query  raftfsm.Query   // List's, Count's and CancelMatching's query
	// Recurring is a Recurring call's command (ID is its schedule, or
	// GetSchedule's id, or ListSchedules' prefix).
	Recurring raftfsm.Recurring
}

// New returns an empty Backend whose clock, for resolving delays and stamping
// CreatedAt and CancelledAt, is now (nil: time.Now).
func New(now func() time.Time) *Backend {
	if now == nil {
		now = time.Now
	}
	return &Backend{now: now, events: make(map[string]*raftfsm.Record), nextSeq: 1}
}

// Calls returns the calls received so far, in order.
func (b *Backend) Calls() []Call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

// FailWith makes every later call fail with err (nil: succeed again). The
// call is still recorded.
func (b *Backend) FailWith(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail = err
}

// Schedule implements rpc.Backend.
func (b *Backend) Schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Schedule", Reqs: slices.Clone(reqs)})
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.now().UnixNano()
	out := make([]shard.Result, len(reqs))
	for i, r := range reqs {
		old, ok := b.events[r.ID]
		if ok && r.Scope != nil && !r.Scope.Permits(old.ID, old.Topic) && (r.Replace || old.ContentHash != r.ContentHash) {
			out[i] = shard.Result{Err: shard.Refuse(r.Scope, r.ID)}
			continue
		}
		if ok && !r.Replace {
			rec := old
			o := raftfsm.Existing
			if rec.ContentHash != r.ContentHash {
				o = raftfsm.Conflict
			}
			out[i] = shard.Result{Outcome: o, Seq: rec.Seq, Due: rec.Due}
			continue
		}
		due := r.DeliverAt
		if r.HasDelay {
			due = now + int64(r.Delay)
		}
		rec := &raftfsm.Record{
			Seq:         b.nextSeq,
			ID:          r.ID,
			State:       raftfsm.StateScheduled,
			Due:         due,
			CreatedAt:   now,
			Topic:       r.Topic,
			Key:         slices.Clone(r.Key),
			Payload:     slices.Clone(r.Payload),
			ContentHash: r.ContentHash,
			Version:     1,
			Policy:      r.Policy,
			Output:      r.Output,
		}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, raftfsm.Header{Key: h.Key, Value: slices.Clone(h.Value)})
		}
		outcome := raftfsm.Created
		if ok { // Replace: the next version, pending again
			rec.Version, outcome = old.Version+1, raftfsm.Replaced
			if old.State != raftfsm.StateScheduled {
				outcome = raftfsm.Renewed
			}
		}
		b.nextSeq++
		b.events[r.ID] = rec
		out[i] = shard.Result{Outcome: outcome, Seq: rec.Seq, Due: due, Version: rec.Version}
	}
	return out, nil
}

// Cancel implements rpc.Backend.
func (b *Backend) Cancel(ctx context.Context, id string, scope shard.Scope) (raftfsm.CancelResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Cancel", ID: id})
	if err := b.check(ctx); err != nil {
		return raftfsm.CancelResult{}, err
	}
	rec, ok := b.events[id]
	if !ok {
		return raftfsm.CancelResult{Outcome: raftfsm.NotFound}, nil
	}
	if scope != nil && !scope.Permits(rec.ID, rec.Topic) {
		return raftfsm.CancelResult{}, shard.Refuse(scope, id)
	}
	res := raftfsm.CancelResult{Seq: rec.Seq}
	switch rec.State {
	case raftfsm.StateScheduled:
		rec.State = raftfsm.StateCancelled
		rec.CancelledAt = b.now().UnixNano()
		res.Outcome = raftfsm.Cancelled
	case raftfsm.StateCancelled:
		res.Outcome = raftfsm.AlreadyCancelled
	case raftfsm.StateFired:
		res.Outcome = raftfsm.AlreadyFired
	case raftfsm.StateDeadLettered:
		res.Outcome = raftfsm.AlreadyDeadLettered
	}
	return res, nil
}

// Get implements rpc.Backend.
func (b *Backend) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Get", ID: id})
	if err := b.check(ctx); err != nil {
		return raftfsm.Record{}, false, err
	}
	rec, ok := b.events[id]
	if !ok {
		return raftfsm.Record{}, false, nil
	}
	return clone(rec), true, nil
}

// Update implements rpc.Backend: the fields ch sets replace the pending
// event's, and its version goes up by one (its seq stays, unlike raftfsm's).
func (b *Backend) Update(ctx context.Context, ch shard.Change) (raftfsm.ChangeResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Update", ID: ch.ID, Change: ch})
	if err := b.check(ctx); err != nil {
		return raftfsm.ChangeResult{}, err
	}
	rec, ok := b.events[ch.ID]
	if !ok {
		return raftfsm.ChangeResult{Outcome: raftfsm.UpdateNotFound}, nil
	}
	if ch.Scope != nil && !ch.Scope.Permits(rec.ID, rec.Topic) {
		return raftfsm.ChangeResult{}, shard.Refuse(ch.Scope, ch.ID)
	}
	res := raftfsm.ChangeResult{State: rec.State, Seq: rec.Seq, Due: rec.Due, Version: rec.Version}
	switch {
	case rec.State != raftfsm.StateScheduled:
		res.Outcome = raftfsm.UpdateNotPending
		return res, nil
	case ch.IfVersion != 0 && ch.IfVersion != rec.Version:
		res.Outcome = raftfsm.VersionMismatch
		return res, nil
	case rec.Tombstone && ch.Fields&raftfsm.ChangePayload != 0 && len(ch.Payload) > 0:
		return raftfsm.ChangeResult{}, shard.ErrTombstonePayload
	}
	if ch.Fields&raftfsm.ChangeDue != 0 {
		rec.Due = ch.Due
		if ch.HasDelay {
			rec.Due = b.now().UnixNano() + int64(ch.Delay)
		}
	}
	if ch.Fields&raftfsm.ChangeKey != 0 {
		rec.Key = slices.Clone(ch.Key)
	}
	if ch.Fields&raftfsm.ChangePayload != 0 {
		rec.Payload = slices.Clone(ch.Payload)
	}
	if ch.Fields&raftfsm.ChangeHeaders != 0 {
		rec.Headers = nil
		for _, h := range ch.Headers {
			rec.Headers = append(rec.Headers, raftfsm.Header{Key: h.Key, Value: slices.Clone(h.Value)})
		}
	}
	rec.Version++
	return raftfsm.ChangeResult{Outcome: raftfsm.Updated, State: rec.State, Seq: rec.Seq, Due: rec.Due, Version: rec.Version}, nil
}

// Fire moves a pending event to Fired at the given time, as a MarkFired
// would; it reports false when id is unknown or not pending.
func (b *Backend) Fire(id string, at time.Time, attempts uint32) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec, ok := b.events[id]
	if !ok || rec.State != raftfsm.StateScheduled {
		return false
	}
	rec.State = raftfsm.StateFired
	rec.FiredAt = at.UnixNano()
	rec.Attempts = attempts
	return true
}

// DeadLetter moves a pending event to DeadLettered, as a MarkDeadLettered
// would; it reports false when id is unknown or not pending.
func (b *Backend) DeadLetter(id string, at time.Time, attempts uint32, lastError, topic string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec, ok := b.events[id]
	if !ok || rec.State != raftfsm.StateScheduled {
		return false
	}
	rec.State = raftfsm.StateDeadLettered
	rec.DeadLetteredAt = at.UnixNano()
	rec.Attempts = attempts
	rec.LastError = lastError
	rec.DeadLetterTopic = topic
	return true
}

// matching returns the events q selects after after, in List's order.
// Called with b.mu held.
func (b *Backend) matching(q raftfsm.Query, after *raftfsm.Position) []*raftfsm.Record {
	var out []*raftfsm.Record
	for _, rec := range b.events {
		if q.Matches(rec) && (after == nil || after.Less(raftfsm.Position{Due: rec.Due, ID: rec.ID})) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(x, y *raftfsm.Record) int {
		return cmp.Or(cmp.Compare(x.Due, y.Due), strings.Compare(x.ID, y.ID))
	})
	return out
}

// List implements rpc.Backend.
func (b *Backend) List(ctx context.Context, q raftfsm.Query, after *raftfsm.Position, limit int, _ bool) ([]raftfsm.Record, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "List", Query: q})
	if err := b.check(ctx); err != nil {
		return nil, false, err
	}
	var out []raftfsm.Record
	for _, rec := range b.matching(q, after) {
		if len(out) == limit {
			break
		}
		out = append(out, clone(rec))
	}
	return out, false, nil
}

// Count implements rpc.Backend.
func (b *Backend) Count(ctx context.Context, q raftfsm.Query, _ bool) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "Count", Query: q})
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	return uint64(len(b.matching(q, nil))), nil
}

// CancelMatching implements rpc.Backend, in one step.
func (b *Backend) CancelMatching(ctx context.Context, q raftfsm.Query, dryRun bool, progress func(shard.CancelStep)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{Method: "CancelMatching", Query: q})
	if err := b.check(ctx); err != nil {
		return err
	}
	q.States = raftfsm.StatesOf(raftfsm.StateScheduled)
	var step shard.CancelStep
	for _, rec := range b.matching(q, nil) {
		step.Matched++
		if !dryRun {
			rec.State, rec.CancelledAt = raftfsm.StateCancelled, b.now().UnixNano()
			step.Cancelled++
		}
	}
	progress(step)
	return nil
}

// check returns the injected failure or the context's error. Called with
// b.mu held.
func (b *Backend) check(ctx context.Context) error {
	if b.fail != nil {
		return b.fail
	}
	return ctx.Err()
}

func clone(rec *raftfsm.Record) raftfsm.Record {
	c := *rec
	c.Key = slices.Clone(rec.Key)
	c.Payload = slices.Clone(rec.Payload)
	c.Headers = nil
	for _, h := range rec.Headers {
		c.Headers = append(c.Headers, raftfsm.Header{Key: h.Key, Value: slices.Clone(h.Value)})
	}
	return c
}
