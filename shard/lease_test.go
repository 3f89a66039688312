package shard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/chimehq/chime/raftfsm"
)

// TestLeaseRenewedAhead pins how firing batches get their lease, on
// synctest's clock so every time is exact: a batch with no lease waits one
// quorum round trip for a lease from the moment it asked; one that still has
// time left is used at once while a renewal runs in the background; only a
// lease about to run out makes a batch wait; a failed renewal fails the
// batch; and a lease does not outlive its term.
func TestLeaseRenewedAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			length = 100 * time.Millisecond
			quorum = 10 * time.Millisecond // a Barrier's round trip
		)
		var confirms atomic.Int32
		var refuse atomic.Bool
		l := newLease(length, time.Now, func(timeout time.Duration) error {
			if timeout != length {
				t.Errorf("confirm waits %v, want the lease length %v", timeout, length)
			}
			confirms.Add(1)
			time.Sleep(quorum)
			if refuse.Load() {
				return errors.New("not the leader")
			}
			return nil
		})
		defer l.end()
		ctx := context.Background()
		start := time.Now()
		// at sleeps until start+d and lets renewals due by then finish.
		at := func(d time.Duration) {
			time.Sleep(time.Until(start.Add(d)))
			synctest.Wait()
		}
		want := func(what string, got, wantDeadline time.Time, wantNow time.Duration, wantConfirms int32) {
			t.Helper()
			synctest.Wait() // renewals started in the background have asked
			if !got.Equal(wantDeadline) || time.Since(start) != wantNow || confirms.Load() != wantConfirms {
				t.Fatalf("%s: deadline +%v at +%v after %d confirms; want +%v at +%v after %d", what,
					got.Sub(start), time.Since(start), confirms.Load(), wantDeadline.Sub(start), wantNow, wantConfirms)
			}
		}

		d, err := l.deadline(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want("no lease yet", d, start.Add(length), quorum, 1)

		// More than a quarter of the lease gone, more than the margin
		// left: the batch gets the lease it has, and a renewal starts.
		at(length / 2)
		d, _ = l.deadline(ctx)
		want("half the lease left", d, start.Add(length), length/2, 2)
		at(length/2 + quorum)
		d, _ = l.deadline(ctx)
		want("after the background renewal", d, start.Add(length/2+length), length/2+quorum, 2)

		// Less than the margin left: the batch waits for a fresh lease.
		short := length/2 + length - leaseMargin/2
		at(short)
		d, _ = l.deadline(ctx)
		want("lease about to run out", d, start.Add(short+length), short+quorum, 3)

		// The quorum refuses: once the lease has run out, the batch gets
		// the renewal's error and no lease.
		refuse.Store(true)
		at(short + length)
		if _, err := l.deadline(ctx); err == nil || time.Since(start) != short+length+quorum {
			t.Fatalf("refused renewal: err %v at +%v, want an error at +%v", err, time.Since(start), short+length+quorum)
		}

		// (The failed batch left a renewal under way for the next one.)
		synctest.Wait()
		if n := confirms.Load(); n != 5 {
			t.Fatalf("%d confirms after the refusal, want 5", n)
		}

		// A new term starts without a lease.
		refuse.Store(false)
		l.end()
		now := time.Since(start)
		d, _ = l.deadline(ctx)
		want("next term", d, start.Add(now+length), now+quorum, 6)
	})
}

// TestHoldUntilDue: a batch taken early is let go exactly when its last
// entry falls due by the shard's clock (even a clock behind the timer's),
// and a hold ends with its context.
func TestHoldUntilDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		behind := func() time.Time { return time.Now().Add(-3 * time.Millisecond) }
		notBefore := behind().Add(40 * time.Millisecond).UnixNano()
		if err := hold(context.Background(), behind, notBefore); err != nil {
			t.Fatal(err)
		}
		if got := behind().UnixNano(); got != notBefore {
			t.Fatalf("held until %v past notBefore", time.Duration(got-notBefore))
		}
		if err := hold(context.Background(), time.Now, time.Now().Add(-time.Second).UnixNano()); err != nil {
			t.Fatal(err)
		}

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := hold(ctx, time.Now, start.Add(time.Second).UnixNano()); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hold past its context: %v", err)
		}
		if took := time.Since(start); took != 10*time.Millisecond {
			t.Fatalf("hold ended %v after its context's 10ms", took)
		}
	})
}

// TestGetOnlyUnderALease: a leader answers Get only under a lease a quorum
// confirmed, not because raft reports it leader: a new leader reports that
// before it has applied what the last one acknowledged, and a paused one
// when it wakes. Here the renewals fail, as they would for a leader cut off
// from its followers: once the lease runs out Get refuses, and it answers
// again once a renewal succeeds.
func TestGetOnlyUnderALease(t *testing.T) {
	var refuse atomic.Bool
	n := openNodeWith(t, t.TempDir(), "", startBroker(t), 1, Knobs{LeaseConfirm: func() error {
		if refuse.Load() {
			return errors.New("no quorum (the test)")
		}
		return nil
	}})
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	r := Request{ID: "e1", Delay: time.Hour, HasDelay: true, Topic: "lease", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	if _, err := s.Schedule(ctx, []Request{r}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get(ctx, "e1"); err != nil || !ok {
		t.Fatalf("Get under a lease = %v, %v; want the event", ok, err)
	}
	refuse.Store(true)
	// What the lease had left runs out; no renewal started before the
	// refusals can still extend it.
	waitFor(t, 5*time.Second, "the lease runs out", func() bool {
		l := s.lease
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.renewing == 0 && l.asked.Add(l.length).Sub(l.now()) < leaseMargin
	})
	if !s.IsLeader() {
		t.Fatal("the replica no longer reports itself leader: the test did not reach its case")
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, ok, err := s.Get(gctx, "e1"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Get with no lease = %v, %v; want ErrNotLeader", ok, err)
	}
	refuse.Store(false)
	waitFor(t, 5*time.Second, "Get answers under a renewed lease", func() bool {
		_, ok, err := s.Get(ctx, "e1")
		return err == nil && ok
	})
}

// TestLeaseRevoked: after a leadership transfer the lease is revoked at
// once, and a renewal asked before the revocation (a Barrier that committed
// just before the transfer) does not bring it back: the next batch waits for
// a renewal asked after it.
func TestLeaseRevoked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const length, quorum = 100 * time.Millisecond, 10 * time.Millisecond
		l := newLease(length, time.Now, func(time.Duration) error { time.Sleep(quorum); return nil })
		defer l.end()
		ctx := context.Background()
		if _, err := l.deadline(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(length / 2) // a renewal is due: the next batch starts one in the background
		if _, err := l.deadline(ctx); err != nil {
			t.Fatal(err)
		}
		revokedAt := time.Now()
		l.revoke() // while that renewal is in flight
		synctest.Wait()
		d, err := l.deadline(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if asked := d.Add(-length); !asked.After(revokedAt) {
			t.Errorf("after revoke, a lease from %v before the revocation", revokedAt.Sub(asked))
		}
	})
}
