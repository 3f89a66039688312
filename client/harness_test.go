package client_test

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/rpctest"
)

// harnessStart is the reading of every harness clock: fixed, so examples
// print the same due times on every run.
var harnessStart = time.Date(2030, 1, 2, 9, 0, 0, 0, time.UTC)

// harness is a Chime API server in the test process: the real rpc.Server
// over the in-memory rpctest.Backend, on a loopback port. It has no Admin
// service, so clients route nothing to leaders.
type harness struct {
	Addr    string
	Backend *rpctest.Backend

	mu  sync.Mutex
	now time.Time

	gs     *grpc.Server
	served chan error
}

// startHarness starts a server; opts are its gRPC server options
// (interceptors that fail or count calls). Stop stops it.
func startHarness(opts ...grpc.ServerOption) (*harness, error) {
	h := &harness{now: harnessStart, served: make(chan error, 1)}
	h.Backend = rpctest.New(h.Now)
	srv := rpc.NewServer(h.Backend, rpc.Limits{}, h.Now, slog.New(slog.DiscardHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h.Addr = ln.Addr().String()
	h.gs = grpc.NewServer(opts...)
	rpc.Register(h.gs, srv)
	go func() { h.served <- h.gs.Serve(ln) }()
	return h, nil
}

// newHarness is startHarness for a test, stopped by its cleanup.
func newHarness(tb testing.TB, opts ...grpc.ServerOption) *harness {
	tb.Helper()
	h, err := startHarness(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Stop)
	return h
}

// Now is the server's clock.
func (h *harness) Now() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

// Stop stops the server at once.
func (h *harness) Stop() {
	h.gs.Stop()
	<-h.served
	h.served <- nil // Stop again returns at once
}

// dial connects a client to h, closed by the test's cleanup.
func (h *harness) dial(tb testing.TB, opts ...client.Option) *client.Client {
	tb.Helper()
	c, err := client.Dial(context.Background(), h.Addr, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// testCtx is a context for one test's calls.
func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// exampleServer is the server the examples dial: started by the first
// example, left running until the test binary exits.
var exampleServer = sync.OnceValue(func() *harness {
	h, err := startHarness()
	if err != nil {
		panic(err)
	}
	return h
})

// chimeAddr is the address of a Chime cluster's node, for the examples.
func chimeAddr() string { return exampleServer().Addr }
