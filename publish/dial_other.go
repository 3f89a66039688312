//go:build !linux

package publish

import (
	"syscall"
	"time"
)

// userTimeout does nothing where TCP_USER_TIMEOUT is not available: a
// produce into a dead network path then waits out WriteTimeout.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
