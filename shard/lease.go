package shard

import (
	"context"
	"errors"
	"sync"
	"time"
)

// lease bounds how long after confirming its leadership the leader may hand
// records to Kafka: raft's LeaderLeaseTimeout, shorter than the heartbeat
// timeout after which followers may elect another leader.
//
// Batches share a lease instead of asking each. Renewals run in the
// background, one started every quarter of a lease while the shard fires
// and up to maxLeaseRenewals at once, and batches keep using the lease they
// have meanwhile: under load a quorum round trip took 20-150 ms (a barrier,
// more while Raft's apply queue is long), and when the renewal was made in
// line every batch of that moment waited for it, which made most of the
// firing tail at 10,000 events a second. Overlapping renewals keep a lease
// valid even when one takes longer than a lease. A batch waits only when
// less than leaseMargin of the lease is left.
type lease struct {
	length time.Duration
	now    func() time.Time // the lease's clock: a monotonic one in production
	// confirm asks a quorum whether this replica still leads, waiting at
	// most timeout: a raft Barrier (see renew for why not VerifyLeader).
	confirm func(timeout time.Duration) error

	// mu guards the fields below. asked is when this leader last asked a
	// quorum whether it leads and was told yes; started is when the latest
	// renewal started, renewing counts those in flight, changed is closed
	// (and replaced) each time one ends, and err is the last one's error.
	mu       sync.Mutex
	asked    time.Time
	started  time.Time
	renewing int
	changed  chan struct{}
	err      error
	// revoked is when the lease was last revoked: a renewal asked before
	// then grants nothing.
	revoked time.Time

	wg sync.WaitGroup // renew goroutines; end waits for them
}

func newLease(length time.Duration, now func() time.Time, confirm func(time.Duration) error) *lease {
	return &lease{length: length, now: now, confirm: confirm, changed: make(chan struct{})}
}

// deadline returns until when this leader may hand records to Kafka: a
// lease from the last time it asked a quorum whether it still leads.
func (l *lease) deadline(ctx context.Context) (time.Time, error) {
	for waits := 0; ; waits++ {
		l.mu.Lock()
		now := l.now()
		short := l.asked.Add(l.length).Sub(now) < leaseMargin
		due := now.Sub(l.asked) > l.length/4 && now.Sub(l.started) > l.length/4
		if (due && l.renewing < maxLeaseRenewals) || (short && l.renewing == 0) {
			l.started = now
			l.renewing++
			l.wg.Add(1)
			go l.renew(now)
		}
		deadline, changed, lastErr := l.asked.Add(l.length), l.changed, l.err
		l.mu.Unlock()
		if deadline.Sub(now) >= leaseMargin {
			return deadline, nil
		}
		if waits > 0 && lastErr != nil {
			return time.Time{}, lastErr
		}
		if waits >= maxLeaseRenewals {
			return time.Time{}, errors.New("shard: leader lease not renewed")
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// renew asks a quorum whether this replica still leads and, if so, starts
// a new lease from asked, the moment it asked. It then wakes the batches
// waiting for a lease.
//
// It asks with a Barrier, a log entry made after the moment it asked, which
// commits only once a quorum has accepted it: proof that a quorum still
// followed this leader after that moment. raft's VerifyLeader is not such a
// proof. It counts any successful reply the leader reads after the call,
// and a leader paused for seconds (SIGSTOP in the fault tests) reads, on
// waking, the replies to heartbeats it sent before the pause: it verified,
// took a lease from the moment it woke, and produced an event that a new
// leader had cancelled eight seconds earlier. A Barrier costs a log append;
// about four are made per lease while the shard fires.
func (l *lease) renew(asked time.Time) {
	defer l.wg.Done()
	err := l.confirm(l.length)
	l.mu.Lock()
	if err == nil && asked.After(l.asked) && asked.After(l.revoked) {
		l.asked = asked
	}
	l.err = err
	l.renewing--
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// revoke ends the lease at once. After a leadership transfer the new leader
// is elected without waiting out a heartbeat timeout, so what is left of a
// lease proves nothing; a renewal in flight, asked before, grants nothing
// either.
func (l *lease) revoke() {
	l.mu.Lock()
	l.asked, l.revoked = time.Time{}, l.now()
	l.mu.Unlock()
}

// end forgets the lease once every renewal has returned: a lease confirmed
// in one term must not serve the next.
func (l *lease) end() {
	l.wg.Wait()
	l.mu.Lock()
	l.asked, l.started, l.err = time.Time{}, time.Time{}, nil
	l.mu.Unlock()
}
