package main

import (
	"context"
	"fmt"
	"time"
)

// shutdownGrace is how long a shutdown may run on after --shutdown-timeout ended before the
// process exits without it: the parts of a node's Close that take the deadline stop at it,
// and need a moment to return.
const shutdownGrace = 5 * time.Second

// closeWithin runs closeAll with ctx, the shutdown's deadline, and returns its error, or an
// error saying it had not finished grace after ctx ended. Not every part of a node's Close
// takes the deadline (the ingest consumer's leaving its group waits for the group): in a fault
// test a node was still closing 40 s after a SIGTERM with --shutdown-timeout 30s, and only
// SIGKILL ended it. Exiting then is what the flag promises, and is no worse than a crash,
// which a node recovers from; the closing goroutine ends with the process, which exits
// when serve returns.
func closeWithin(ctx context.Context, grace time.Duration, closeAll func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- closeAll(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
		return fmt.Errorf("not finished %v after --shutdown-timeout ended: exiting without it", grace)
	}
}
