package shard

import (
	"context"
	"testing"
	"time"
)

// TestLeaseRenewedAhead pins how firing batches get their lease: one that
// still has time left is used at once while a renewal runs in the
// background, and only a lease about to run out makes a batch wait.
func TestLeaseRenewedAhead(t *testing.T) {
	n := openNode(t, t.TempDir(), "", startBroker(t), 1)
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	setAsked := func(at time.Time) {
		s.leaseMu.Lock()
		s.leaseAsked = at
		s.leaseMu.Unlock()
	}
	asked := func() time.Time {
		s.leaseMu.Lock()
		defer s.leaseMu.Unlock()
		return s.leaseAsked
	}

	// More than a quarter of the lease gone, more than the margin left: the
	// batch gets the lease it has, and a renewal starts.
	old := time.Now().Add(-s.lease / 2)
	setAsked(old)
	d, err := s.leaseDeadline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Equal(old.Add(s.lease)) {
		t.Fatalf("deadline %v, want the current lease's %v (no wait for the renewal)", d, old.Add(s.lease))
	}
	waitFor(t, 5*time.Second, "the background renewal", func() bool { return asked().After(old) })

	// Less than the margin left: the batch waits for a fresh lease.
	old = time.Now().Add(-s.lease + leaseMargin/2)
	setAsked(old)
	before := time.Now()
	if d, err = s.leaseDeadline(ctx); err != nil {
		t.Fatal(err)
	}
	if !d.After(before) || d.Sub(before) < s.lease-time.Second/10 && !d.After(old.Add(s.lease)) {
		t.Fatalf("deadline %v from a lease asked at %v: want a renewed lease", d, old)
	}
	if !asked().After(before) {
		t.Fatalf("lease asked at %v, before the call at %v", asked(), before)
	}
}
