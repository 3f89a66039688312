package nodetest

import (
	"time"

	"go.uber.org/goleak"
)

// FindLeaks reports the goroutines still running after a test's nodes have
// closed, as goleak.Find does, but waits up to 10 s for them to end rather
// than goleak's 2 s: memberlist's Shutdown does not wait for a probe in
// flight, which ends within the probe interval (1 s) plus its ack wait, and
// once outlived goleak's wait under load. A goroutine that never ends still
// fails.
func FindLeaks() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find() // retries for about 2 s before it reports
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}
