package shard

import (
	"context"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// Marking fired events is group-committed like scheduling. At 10,000 events
// a second a shard's leader fires a batch every millisecond tick, and a
// MarkFired entry per batch cost each replica a log append and fsync per
// millisecond: the Raft logs, not the CPU, became the bottleneck, and fire
// lateness grew to hundreds of milliseconds. One markLoop
// per shard gathers the marks that queued while the previous entry
// committed into the next entry.

// maxMarkBatch bounds the events in one MarkFired entry.
const maxMarkBatch = 8192

// markLinger is how long markLoop waits for more marks after the first
// before it proposes them. At 10,000 events a second a shard's leader fires
// a batch about every 10 ms, and an entry commits in less, so without it
// almost every batch got its own entry: 84 of a shard's 190 entries a
// second, each appended and fsynced on every replica. A mark waits here only
// after its records are in Kafka (it holds no firing slot); what the wait
// costs is that a leader change within it finds those events still pending,
// and their new leader fires them again.
const markLinger = 20 * time.Millisecond

type markRequest struct {
	fired []raftfsm.Fired
	done  chan error // buffered: markLoop never blocks on it
}

// markFired records fired through Raft, together with other batches' marks,
// and reports whether the entry committed on this leader.
func (s *Shard) markFired(ctx context.Context, fired []raftfsm.Fired) error {
	r := &markRequest{fired: fired, done: make(chan error, 1)}
	select {
	case s.marks <- r:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return ErrStopped
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Shard) markLoop() {
	defer s.wg.Done()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
loop:
	for {
		var first *markRequest
		select {
		case first = <-s.marks:
		case <-s.stop:
			for {
				select {
				case r := <-s.marks:
					r.done <- ErrStopped
				default:
					return
				}
			}
		}
		reqs := []*markRequest{first}
		n := len(first.fired)
		linger.Reset(markLinger)
	gather:
		for n < maxMarkBatch {
			select {
			case r := <-s.marks:
				reqs = append(reqs, r)
				n += len(r.fired)
			case <-linger.C:
				break gather
			case <-s.stop:
				for _, r := range reqs {
					r.done <- ErrStopped
				}
				continue loop
			}
		}
		linger.Stop()
		cmd := raftfsm.MarkFired{ProposedAt: s.cfg.Now().UnixNano(), DueKnown: true, Entries: make([]raftfsm.Fired, 0, n)}
		for _, r := range reqs {
			cmd.Entries = append(cmd.Entries, r.fired...)
		}
		err := s.raft.Apply(raftfsm.AppendMarkFired(nil, &cmd), applyTimeout).Error()
		s.noteRaft(err)
		if err != nil {
			err = raftErr(err)
		}
		for _, r := range reqs {
			r.done <- err
		}
	}
}
