package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
)

// Scheduling is group-committed: concurrent Schedule calls on a shard are
// gathered by one proposer goroutine into a single ScheduleBatch Raft entry,
// so a burst of requests costs one log append and one fsync instead of one
// each. An entry takes calls until it holds Tuning.ProposeBatch events or
// more (a call is not split for it), and never more than ProposeBytes of
// encoded events unless one event alone is larger (a call larger than that
// is split over entries).
// The proposer does not wait for the commit: it hands the future to
// applyWaitLoop and goes on gathering, so several entries are in flight at
// once and raft pipelines their appends.

type proposal struct {
	ctx   context.Context
	reqs  []Request
	bytes int                 // the encoded size of reqs in an entry, at most
	done  chan proposalResult // buffered: the waiter never blocks
}

type proposalResult struct {
	results []Result
	err     error
}

type pendingApply struct {
	future raft.ApplyFuture
	props  []*proposal
}

// Schedule proposes reqs through Raft and returns their results once
// applied on this leader. reqs go into the next ScheduleBatch entry, or,
// if they exceed an entry's bounds, into several; an error means some may
// have been applied (a retry with the same ids finds them).
//
// A Replace request is refused on its own (Result.Err, nothing changed)
// when the pending event it would replace is being fired, or another change
// of it is under way; see pinReplaced. A request whose id is bound to an
// event outside its Scope is refused with a *NotPermittedError, whether it
// replaces or collides.
func (s *Shard) Schedule(ctx context.Context, reqs []Request) ([]Result, error) {
	if !s.IsLeader() {
		return nil, ErrNotLeader
	}
	if !slices.ContainsFunc(reqs, func(r Request) bool { return r.Replace }) {
		out, err := s.schedule(ctx, reqs)
		if err != nil {
			return nil, err
		}
		return s.refuseHidden(reqs, out)
	}
	todo, refused, pinned, err := s.pinReplaced(ctx, reqs)
	defer func() {
		for _, seq := range pinned {
			s.firing.unpin(seq)
		}
	}()
	if err != nil {
		return nil, err
	}
	var res []Result
	if len(todo) > 0 {
		if res, err = s.schedule(ctx, todo); err != nil {
			return nil, err
		}
	}
	out := make([]Result, len(reqs))
	for i := range out {
		if refused[i] != nil {
			out[i] = Result{Err: refused[i]}
			continue
		}
		out[i], res = res[0], res[1:]
		if out[i].Outcome == raftfsm.Moved {
			// Another change superseded the pinned event before this one
			// committed: nothing changed.
			out[i] = Result{Err: ErrChanging}
		}
	}
	return s.refuseHidden(reqs, out)
}

// refuseHidden turns each Conflict of a scoped request whose id is bound to
// an event outside the caller's scope into the refusal any other operation
// on that id gets: ALREADY_EXISTS would tell the caller that someone else's
// id exists. A conflict changed nothing, so this is decided after the entry,
// on the event as this leader has it.
func (s *Shard) refuseHidden(reqs []Request, out []Result) ([]Result, error) {
	for i := range out {
		if out[i].Outcome != raftfsm.Conflict || reqs[i].Scope == nil {
			continue
		}
		rec, ok, err := s.fsm.Get(reqs[i].ID)
		if err != nil {
			return nil, err
		}
		if ok && !permits(reqs[i].Scope, &rec) {
			out[i] = Result{Err: Refuse(reqs[i].Scope, reqs[i].ID)}
		}
	}
	return out, nil
}

// pinReplaced prepares the Replace requests of reqs: each reads the event
// its id is bound to, under the lease, and a pending one is refused if a
// produce of it may be under way (ErrFiring, ErrProduceUnknown), else pinned
// out of the wheel (firing.pin), so that no fire batch reads the version it
// replaces, and named in the entry, which the FSM refuses (Moved) if another
// change superseded it meanwhile. It returns the requests to propose, in
// order, the refusal of each request (nil for the proposed ones) and the
// seqs pinned, which the caller unpins once the entry is applied or given up.
func (s *Shard) pinReplaced(ctx context.Context, reqs []Request) (todo []Request, refused []error, pinned []uint64, err error) {
	if err := s.readable(ctx); err != nil {
		return nil, nil, nil, err
	}
	var ids []string
	for _, r := range reqs {
		if r.Replace {
			ids = append(ids, r.ID)
		}
	}
	found, err := s.fsm.PendingOf(ids)
	if err != nil {
		return nil, nil, nil, err
	}
	refused = make([]error, len(reqs))
	todo = make([]Request, 0, len(reqs))
	for i, r := range reqs {
		if r.Replace {
			p := found[0]
			found = found[1:]
			if r.Scope != nil {
				// The event the id is bound to, pending or settled, must
				// be the caller's to replace. If another is created once
				// this read is done, the entry's pin (none pending) makes
				// the FSM refuse it as Moved.
				rec, ok, err := s.fsm.Get(r.ID)
				if err != nil {
					return nil, nil, nil, err
				}
				if ok && !permits(r.Scope, &rec) {
					refused[i] = Refuse(r.Scope, r.ID)
					continue
				}
			}
			if p.Pending {
				if s.inDoubt(raftfsm.Record{Seq: p.Seq, Due: p.Due, State: raftfsm.StateScheduled}) {
					refused[i] = ErrProduceUnknown
				} else if refused[i] = s.firing.pin(p.Seq, p.Due, p.Policy); refused[i] == nil {
					pinned = append(pinned, p.Seq)
					r.pending = p.Seq
				}
			}
			if refused[i] != nil {
				continue
			}
		}
		todo = append(todo, r)
	}
	return todo, refused, pinned, nil
}

// schedule proposes reqs, group-committed with other calls.
func (s *Shard) schedule(ctx context.Context, reqs []Request) ([]Result, error) {
	start := time.Now()
	props := s.proposalsFor(ctx, reqs)
	for _, p := range props {
		select {
		case s.proposals <- p:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.stop:
			return nil, ErrStopped
		}
	}
	out := make([]Result, 0, len(reqs))
	for _, p := range props {
		select {
		case r := <-p.done:
			if r.err != nil {
				return nil, r.err
			}
			out = append(out, r.results...)
		case <-ctx.Done():
			// The entry may still commit; the caller learns the outcome by
			// retrying with the same ids.
			return nil, ctx.Err()
		}
	}
	s.metrics.Ingest.Observe(time.Since(start).Seconds())
	return out, nil
}

// proposalsFor splits reqs, in order, into proposals of at most
// ProposeBytes bytes each, or one event.
func (s *Shard) proposalsFor(ctx context.Context, reqs []Request) []*proposal {
	var props []*proposal
	start, bytes := 0, 0
	for i := range reqs {
		n := requestBytes(&reqs[i])
		if i > start && bytes+n > s.tune.ProposeBytes {
			props = append(props, &proposal{ctx: ctx, reqs: reqs[start:i], bytes: bytes, done: make(chan proposalResult, 1)})
			start, bytes = i, 0
		}
		bytes += n
	}
	return append(props, &proposal{ctx: ctx, reqs: reqs[start:], bytes: bytes, done: make(chan proposalResult, 1)})
}

// requestBytes bounds what r adds to an encoded ScheduleBatch entry
// (raftfsm.AppendScheduleBatch): its strings and bytes, plus at most 48
// bytes of lengths, due time and content hash (11 more of flags and the
// pinned seq, which every event of an entry with a Replace carries), and 10
// of lengths per header.
func requestBytes(r *Request) int {
	n := 48 + 11 + len(r.ID) + len(r.Topic) + len(r.Key) + len(r.Payload)
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

func (s *Shard) proposeLoop() {
	defer s.wg.Done()
	defer close(s.applying)
	var next *proposal // taken from the queue but left for the next entry
	for {
		first := next
		if first == nil {
			select {
			case first = <-s.proposals:
			case <-s.stop:
				s.failQueued(ErrStopped)
				return
			}
		}
		next = nil
		props := []*proposal{first}
		n, bytes := len(first.reqs), first.bytes
	gather:
		for n < s.tune.ProposeBatch && bytes < s.tune.ProposeBytes {
			select {
			case p := <-s.proposals:
				if bytes+p.bytes > s.tune.ProposeBytes {
					next = p
					break gather
				}
				props = append(props, p)
				n, bytes = n+len(p.reqs), bytes+p.bytes
			default:
				break gather
			}
		}
		s.propose(props, n)
	}
}

// propose encodes the live proposals as one ScheduleBatch and hands the
// future to the waiter.
func (s *Shard) propose(props []*proposal, n int) {
	live := props[:0]
	for _, p := range props {
		if p.ctx.Err() != nil {
			p.done <- proposalResult{err: p.ctx.Err()}
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	now := s.cfg.Now().UnixNano()
	cmd := raftfsm.ScheduleBatch{ProposedAt: now, Events: make([]raftfsm.NewEvent, 0, n)}
	for _, p := range live {
		for i := range p.reqs {
			r := &p.reqs[i]
			due := r.DeliverAt
			if r.HasDelay {
				due = now + int64(r.Delay)
			}
			cmd.Events = append(cmd.Events, raftfsm.NewEvent{
				ID: r.ID, Due: due, Topic: r.Topic, Key: r.Key, Payload: r.Payload,
				Headers: r.Headers, ContentHash: r.ContentHash,
				Replace: r.Replace, CheckPending: r.Replace, Pending: r.pending,
				Policy: r.Policy, Output: r.Output,
			})
		}
	}
	f := s.raft.Apply(raftfsm.AppendScheduleBatch(nil, &cmd), applyTimeout)
	s.metrics.ScheduleBatchEvents.Observe(float64(len(cmd.Events)))
	s.applying <- &pendingApply{future: f, props: live}
}

// applyWaitLoop waits for each proposed entry in order and answers its
// proposals. It ends when proposeLoop closes s.applying.
func (s *Shard) applyWaitLoop() {
	defer s.wg.Done()
	for pa := range s.applying {
		err := pa.future.Error()
		s.noteRaft(err)
		var (
			results []raftfsm.ScheduleResult
			unsure  bool
		)
		if err == nil {
			switch resp := pa.future.Response().(type) {
			case *raftfsm.ScheduleBatchResult:
				results = resp.Results
			case error:
				err = resp
			default:
				err = fmt.Errorf("shard %d: unexpected schedule response %T", s.id, resp)
			}
		} else {
			// Leadership lost or raft shut down once the entry was handed
			// over: it may be in the log and commit under the next leader. A
			// plain Schedule retried then finds its id (Existing), but a
			// Replace makes another version, which fires again if the first
			// had fired, or is refused as in doubt once the first is pending
			// and due: its outcome is unknown.
			unsure = errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrRaftShutdown)
			err = raftErr(err)
		}
		off := 0
		for _, p := range pa.props {
			if err != nil {
				if unsure && slices.ContainsFunc(p.reqs, func(r Request) bool { return r.Replace }) {
					p.done <- proposalResult{err: fmt.Errorf("%w (%v)", ErrChangeUnknown, err)}
					continue
				}
				p.done <- proposalResult{err: err}
				continue
			}
			out := make([]Result, len(p.reqs))
			for i := range out {
				r := results[off+i]
				out[i] = Result{Outcome: r.Outcome, Seq: r.Seq, Due: r.Due, Version: r.Version}
			}
			off += len(p.reqs)
			p.done <- proposalResult{results: out}
		}
	}
}

func (s *Shard) failQueued(err error) {
	for {
		select {
		case p := <-s.proposals:
			p.done <- proposalResult{err: err}
		default:
			return
		}
	}
}
