package shard

import (
	"context"
	"sync"
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

// markStall is the least time the MarkFired entry in flight may go
// uncommitted before the leader stops starting produces (see markFlight).
// A false alarm costs little: the batches wait only until the slow entry
// commits. Unloaded, an entry commits in a few milliseconds.
const markStall = 30 * time.Millisecond

// markFlight is the MarkFired entry markLoop has in flight. A leader cut
// off from its followers but not from Kafka keeps its lease for up to
// LeaderLeaseTimeout after it last confirmed it, and every batch it
// produced in that time reached Kafka with a mark that could not commit:
// the next leader fired them all again. In the fault tests that made most
// of the duplicates (partition-leader, partition-one, partition-halves,
// disk-stall). A mark stuck for longer than marks have lately taken is the
// first sign of such a cut, well inside the lease, so batches wait for it
// (awaitMarks) before they produce: a cut leader's duplicates are then what
// it produced in that time, not in the lease's.
//
// How long is too long follows the commits, as TCP's retransmission timeout
// follows round trips (RFC 6298): a smoothed time and its variation, and
// the threshold the time plus four variations, at least markStall. A fixed
// 100 ms cost a sixth of the drain throughput: a 500,000-event backlog's
// marks of 8,192 events each take hundreds of milliseconds to commit.
type markFlight struct {
	mu     sync.Mutex
	since  time.Time     // when the entry in flight was proposed; zero if none
	done   chan struct{} // closed when it is answered
	srtt   time.Duration // smoothed commit time; 0 before the first
	rttvar time.Duration // its smoothed variation
}

func (f *markFlight) begin() {
	f.mu.Lock()
	f.since, f.done = time.Now(), make(chan struct{})
	f.mu.Unlock()
}

// end answers the entry in flight; committed says whether it committed,
// and only a commit's time teaches how long commits take.
func (f *markFlight) end(committed bool) {
	f.mu.Lock()
	if committed {
		f.observe(time.Since(f.since))
	}
	close(f.done)
	f.since, f.done = time.Time{}, nil
	f.mu.Unlock()
}

func (f *markFlight) observe(d time.Duration) {
	if f.srtt == 0 {
		f.srtt, f.rttvar = d, d/2
		return
	}
	f.rttvar = (3*f.rttvar + (f.srtt - d).Abs()) / 4
	f.srtt = (7*f.srtt + d) / 8
}

// stallAfter is how long an entry may wait before it counts as stuck.
func (f *markFlight) stallAfter() time.Duration {
	return max(markStall, f.srtt+4*f.rttvar)
}

// stalled returns, if the entry in flight has been waiting for longer than
// stallAfter, a channel closed when it is answered.
func (f *markFlight) stalled() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since.IsZero() || time.Since(f.since) < f.stallAfter() {
		return nil
	}
	return f.done
}

// awaitMarks waits while the shard's marks are stalled (see markFlight)
// and reports whether it waited.
func (s *Shard) awaitMarks(ctx context.Context) (waited bool, err error) {
	for {
		done := s.markFlight.stalled()
		if done == nil {
			return waited, nil
		}
		waited = true
		select {
		case <-done:
		case <-ctx.Done():
			return waited, ctx.Err()
		}
	}
}

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
		s.markFlight.begin()
		err := s.raft.Apply(raftfsm.AppendMarkFired(nil, &cmd), applyTimeout).Error()
		s.markFlight.end(err == nil)
		s.noteRaft(err)
		if err != nil {
			err = raftErr(err)
		}
		for _, r := range reqs {
			r.done <- err
		}
	}
}

// Parked returns this replica's parked events: Kafka acknowledged their
// records while it led, and their MarkFired has not committed. Another
// replica that now leads asks for them (askParked) so as not to produce
// them again.
func (s *Shard) Parked() []raftfsm.Fired {
	return s.firing.parkedEvents()
}

// parkedWait bounds how long a new leader waits for the other replicas'
// parked events before it fires. A replica answers within milliseconds and
// a stopped node refuses at once; only one cut off or paused costs the
// whole wait. It leaves room for one resend of a lost segment (TCP's
// shortest retransmission timeout is 200 ms): under packet loss, where
// parked events come from, a question or its answer is often lost once.
const parkedWait = 500 * time.Millisecond

// askParked asks every other replica of the shard's Raft configuration for
// its parked events and adopts those this replica's wheel holds (firing.adopt),
// so that markParked marks them rather than the firing producing them
// again. Only the replica that parked an event knows Kafka took its record:
// under packet loss a leader that had parked a batch won the shard back
// three times, each time failing to mark it, and then lost it for good to
// another node, which produced all 35 events again.
func (s *Shard) askParked(ctx context.Context) {
	if s.cfg.Directory == nil {
		return
	}
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, parkedWait)
	defer cancel()
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		fired []raftfsm.Fired
	)
	for _, srv := range cf.Configuration().Servers {
		node := string(srv.ID)
		if node == s.cfg.NodeID {
			continue
		}
		wg.Go(func() {
			// A replica that does not answer (stopped, cut off, of a
			// release without the question) has nothing to give in time.
			got, err := s.cfg.Directory.Parked(ctx, node, s.id)
			if err != nil || len(got) == 0 {
				return
			}
			mu.Lock()
			fired = append(fired, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if n := s.firing.adopt(fired); n > 0 {
		s.logger.Info("marking events another replica produced as leader and could not mark, rather than producing them again", "events", n)
	}
}

// markParked proposes a MarkFired of the parked events (firing.parked): in
// Kafka, their marks not committed. Once it commits they settle, which
// takes them out of the set; until then they stay parked, for the next try.
func (s *Shard) markParked() {
	fired := s.firing.parkedEvents()
	if len(fired) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
	defer cancel()
	if err := s.markFired(ctx, fired); err != nil {
		s.logger.Warn("marking fired events produced earlier, whose marks did not commit", "err", err, "events", len(fired))
		return
	}
	s.metrics.Fired.Add(float64(len(fired)))
}
