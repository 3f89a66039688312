package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestShutdownEndsAtItsTimeout: a close that ignores the shutdown's deadline does not hold
// the process past the deadline and the grace; one that finishes in time returns its own
// error.
func TestShutdownEndsAtItsTimeout(t *testing.T) {
	hung := make(chan struct{})
	defer close(hung) // lets the abandoned close end with the test
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := closeWithin(ctx, 100*time.Millisecond, func(context.Context) error { <-hung; return nil })
	if err == nil || !strings.Contains(err.Error(), "--shutdown-timeout") {
		t.Fatalf("a close that never returns: %v, want the timeout named", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("returned after %v, want the deadline and the grace (150 ms)", took)
	}

	want := errors.New("shard 3: closing")
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if err := closeWithin(ctx2, time.Second, func(context.Context) error { return want }); !errors.Is(err, want) {
		t.Fatalf("a close that returns: %v, want %v", err, want)
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel3()
	if err := closeWithin(ctx3, time.Minute, func(ctx context.Context) error { <-ctx.Done(); return nil }); err != nil {
		t.Fatalf("a close that stops at the deadline: %v, want nil", err)
	}
}
