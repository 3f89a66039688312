package publish

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestDialerDropsStalledConnections checks that connections from dialer
// carry TCP_USER_TIMEOUT: a peer that never reads closes its receive
// window, the sender's bytes stay unsent, and the kernel must drop the
// connection with ETIMEDOUT after the unacked timeout instead of letting
// the write wait for its deadline.
func TestDialerDropsStalledConnections(t *testing.T) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()

	const unacked = 500 * time.Millisecond
	c, err := dialer(unacked)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if peer := <-accepted; peer != nil {
		defer peer.Close() // never read
	}
	_ = c.(*net.TCPConn).SetWriteBuffer(4096)
	// The fallback deadline is far longer than the timeout, so that an
	// option that did not take shows as a deadline error, not a pass.
	start := time.Now()
	_ = c.SetWriteDeadline(start.Add(time.Minute))
	buf := make([]byte, 64<<10)
	for {
		if _, err = c.Write(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("write on a stalled connection: %v after %v, want ETIMEDOUT from TCP_USER_TIMEOUT", err, time.Since(start))
	}
	t.Logf("stalled connection dropped %v after the first write", time.Since(start))
}
