package shard

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
)

// Scheduling is group-committed: concurrent Schedule calls on a shard are
// gathered by one proposer goroutine into a single ScheduleBatch Raft entry
// (up to Tuning.ProposeBatch events), so a burst of requests costs one log
// append and one fsync instead of one each. The proposer does not wait for
// the commit: it hands the future to applyWaitLoop and goes on gathering, so
// several entries are in flight at once and raft pipelines their appends.

type proposal struct {
	ctx  context.Context
	reqs []Request
	done chan proposalResult // buffered: the waiter never blocks
}

type proposalResult struct {
	results []Result
	err     error
}

type pendingApply struct {
	future raft.ApplyFuture
	props  []*proposal
}

// Schedule proposes reqs through Raft as part of the next ScheduleBatch and
// returns their results once the batch is applied on this leader.
func (s *Shard) Schedule(ctx context.Context, reqs []Request) ([]Result, error) {
	if !s.IsLeader() {
		return nil, ErrNotLeader
	}
	p := &proposal{ctx: ctx, reqs: reqs, done: make(chan proposalResult, 1)}
	select {
	case s.proposals <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.stop:
		return nil, ErrStopped
	}
	select {
	case r := <-p.done:
		return r.results, r.err
	case <-ctx.Done():
		// The entry may still commit; the caller learns the outcome by
		// retrying with the same id.
		return nil, ctx.Err()
	}
}

func (s *Shard) proposeLoop() {
	defer s.wg.Done()
	defer close(s.applying)
	for {
		var first *proposal
		select {
		case first = <-s.proposals:
		case <-s.stop:
			s.failQueued(ErrStopped)
			return
		}
		props := []*proposal{first}
		n := len(first.reqs)
	gather:
		for n < s.tune.ProposeBatch {
			select {
			case p := <-s.proposals:
				props = append(props, p)
				n += len(p.reqs)
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
		var results []raftfsm.ScheduleResult
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
			err = raftErr(err)
		}
		off := 0
		for _, p := range pa.props {
			if err != nil {
				p.done <- proposalResult{err: err}
				continue
			}
			out := make([]Result, len(p.reqs))
			for i := range out {
				r := results[off+i]
				out[i] = Result{Outcome: r.Outcome, Seq: r.Seq, Due: r.Due}
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
