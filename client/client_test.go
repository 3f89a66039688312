package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
	"github.com/chimehq/chime/rpc/rpctest"
)

func TestTokenRefusedInPlaintext(t *testing.T) {
	ctx := context.Background()
	for _, target := range []string{"10.0.0.1:7443", "127.0.0.1:7443,chime.internal:7443", "dns:///chime.internal:7443"} {
		for _, opt := range []client.Option{client.WithToken("secret"), client.WithTokenFile(writeToken(t, "secret"))} {
			c, err := client.Dial(ctx, target, opt)
			if err == nil {
				_ = c.Close() // the Dial should have failed; that it did not is the error
				t.Errorf("Dial(%q) with a token in plaintext succeeded", target)
			} else if !strings.Contains(err.Error(), "refusing to send the bearer token in plaintext") {
				t.Errorf("Dial(%q): %v", target, err)
			}
		}
	}
	// Loopback, or TLS, is fine.
	for _, tc := range []struct {
		target string
		opts   []client.Option
	}{
		{"127.0.0.1:7443,localhost:7444,[::1]:7445", []client.Option{client.WithToken("secret")}},
		{"10.0.0.1:7443", []client.Option{client.WithToken("secret"), client.WithTLS(&tls.Config{ServerName: "chime"})}},
		{"dns:///chime.internal:7443", []client.Option{client.WithTLS(nil), client.WithToken("secret")}},
		{"10.0.0.1:7443", nil},
	} {
		c, err := client.Dial(ctx, tc.target, tc.opts...)
		if err != nil {
			t.Errorf("Dial(%q): %v", tc.target, err)
			continue
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if _, err := client.Dial(ctx, "127.0.0.1:1", client.WithTokenFile(filepath.Join(t.TempDir(), "missing"))); err == nil {
		t.Error("Dial with a missing token file succeeded")
	}
	if _, err := client.Dial(ctx, "127.0.0.1:1", client.WithTLSFiles(filepath.Join(t.TempDir(), "missing.pem"), "", "")); err == nil {
		t.Error("Dial with a missing CA file succeeded")
	}
}

func writeToken(t *testing.T, tok string) string {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// authSeen records the authorization header of each call.
type authSeen struct {
	mu   sync.Mutex
	last string
}

func (a *authSeen) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	a.last = strings.Join(md.Get("authorization"), ",")
	a.mu.Unlock()
	return handler(ctx, req)
}

func (a *authSeen) get() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

func TestTokenSent(t *testing.T) {
	seen := &authSeen{}
	h := newHarness(t, grpc.UnaryInterceptor(seen.unary))
	ctx := testCtx(t)

	// The server knows no event: each Get fails, and what it sent is checked.
	c := h.dial(t, client.WithToken("tok-1"))
	_, _ = c.Get(ctx, "x")
	if got := seen.get(); got != "Bearer tok-1" {
		t.Errorf("authorization %q", got)
	}

	path := writeToken(t, "file-1")
	c = h.dial(t, client.WithTokenFile(path))
	_, _ = c.Get(ctx, "x")
	if got := seen.get(); got != "Bearer file-1" {
		t.Errorf("authorization %q", got)
	}
	// A rotated token is read again.
	if err := os.WriteFile(path, []byte("file-two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Get(ctx, "x")
	if got := seen.get(); got != "Bearer file-two" {
		t.Errorf("authorization after rotation %q", got)
	}
	// A token file gone is the call's error, not retried.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "x"); !errors.Is(err, client.ErrUnauthenticated) {
		t.Errorf("Get without the token file = %v", err)
	}
}

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := certstest.NewCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Node("n1")
	if err != nil {
		t.Fatal(err)
	}
	src, err := certs.Load(certs.Files{Cert: node.Cert, Key: node.Key, CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := &authSeen{}
	h := newHarness(t, grpc.Creds(src.ServerCredentials()), grpc.UnaryInterceptor(seen.unary))
	_, port, _ := net.SplitHostPort(h.Addr)
	ctx := testCtx(t)

	c, err := client.Dial(ctx, "localhost:"+port, client.WithTLSFiles(ca.File, "", ""), client.WithToken("over-tls"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Schedule(ctx, client.Event{ID: "tls", Topic: "t"}, client.In(time.Hour)); err != nil {
		t.Fatalf("Schedule over TLS: %v", err)
	}
	if seen.get() != "Bearer over-tls" {
		t.Errorf("authorization %q", seen.get())
	}

	// Plaintext to a TLS port fails, as unavailable, fast.
	p := client.RetryPolicy{MaxAttempts: 2}
	c2, err := client.Dial(ctx, "localhost:"+port, client.WithRetry(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Get(ctx, "tls"); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("plaintext Get of a TLS node = %v", err)
	}
}

func TestDialBufconn(t *testing.T) {
	backend := rpctest.New(func() time.Time { return harnessStart })
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	rpc.Register(gs, rpc.NewServer(backend, rpc.Limits{}, func() time.Time { return harnessStart }, slog.New(slog.DiscardHandler)))
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	defer func() { gs.Stop(); <-served }()
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })

	for _, target := range []string{"passthrough:///bufnet", "bufnet"} {
		c, err := client.Dial(context.Background(), target, client.WithGRPCDialOptions(dialer))
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Schedule(testCtx(t), client.Event{ID: "buf", Topic: "t"}, client.In(time.Minute))
		if err != nil {
			t.Errorf("Dial(%q): Schedule: %v", target, err)
		}
		if target == "bufnet" && !res.Existing {
			t.Errorf("second Schedule: %+v", res)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func TestCloseStopsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h, err := startHarness()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()

	c, err := client.Dial(context.Background(), h.Addr) // leader routing on: its goroutine runs
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := c.ScheduleBatch(ctx, []client.Event{{Topic: "t"}, {Topic: "t"}}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, err := range c.List(ctx, client.Filter{}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
	if _, err := c.Get(ctx, "x"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Get after Close = %v", err)
	}
}

// fakeAdmin serves a fixed cluster map.
type fakeAdmin struct {
	chimev1.UnimplementedAdminServer
	mu    sync.Mutex
	m     *chimev1.ClusterMap // set before the first call, or with setMap
	calls atomic.Int32
}

func (a *fakeAdmin) GetClusterMap(context.Context, *chimev1.GetClusterMapRequest) (*chimev1.ClusterMap, error) {
	a.calls.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m, nil
}

// setMap replaces the map while calls may read it.
func (a *fakeAdmin) setMap(m *chimev1.ClusterMap) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.m = m
}

// node is one server of a two-node cluster that shares a backend.
type node struct {
	addr   string
	faults *faults
	gs     *grpc.Server
	served chan error
}

func startNode(t *testing.T, srv *rpc.Server, admin *fakeAdmin) *node {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{addr: ln.Addr().String(), faults: newFaults(), served: make(chan error, 1)}
	n.gs = grpc.NewServer(n.faults.opts()...)
	rpc.Register(n.gs, srv)
	chimev1.RegisterAdminServer(n.gs, admin)
	go func() { n.served <- n.gs.Serve(ln) }()
	var once sync.Once
	t.Cleanup(func() { once.Do(n.stop) })
	return n
}

func (n *node) stop() { n.gs.Stop(); <-n.served; n.served <- nil }

// idIn returns an id with prefix that maps to shard s of count.
func idIn(prefix string, s, count uint32) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); chimev1.ShardOf(id, count) == s {
			return id
		}
	}
}

func TestLeaderRouting(t *testing.T) {
	now := func() time.Time { return harnessStart }
	srv := rpc.NewServer(rpctest.New(now), rpc.Limits{}, now, slog.New(slog.DiscardHandler))
	admin := &fakeAdmin{}
	a, b := startNode(t, srv, admin), startNode(t, srv, admin)
	admin.m = &chimev1.ClusterMap{
		ShardCount: 2,
		Members:    []*chimev1.Member{{Id: "n1", GrpcAddr: a.addr}, {Id: "n2", GrpcAddr: b.addr}},
		Shards:     []*chimev1.Shard{{Id: 0, Leader: "n1"}, {Id: 1, Leader: "n2"}},
	}
	// The client knows only a; the map leads it to b for shard 1.
	c, err := client.Dial(context.Background(), a.addr, client.WithRetry(fastRetry))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	on1 := idIn("r", 1, 2)
	waitFor(t, 5*time.Second, "the client reads the cluster map", func() bool { return client.HasClusterMap(c) })
	_, _ = c.Get(ctx, on1) // where it went is checked, not its answer
	if b.faults.n("Get") == 0 {
		t.Fatal("with the map read, a call for shard 1 did not go to its leader")
	}

	// A batch is split by shard; each part goes to its leader.
	var evs []client.Event
	for i := range 6 {
		evs = append(evs, client.Event{ID: idIn(fmt.Sprintf("b%d", i), uint32(i%2), 2), Topic: "t"})
	}
	evs[3].Topic = "bad topic" // second of shard 1's part
	rs, err := c.ScheduleBatch(ctx, evs, client.In(time.Hour))
	var inv *client.InvalidError
	if !errors.As(err, &inv) || inv.Field != "events[3].topic" {
		t.Errorf("ScheduleBatch error %v, want events[3].topic invalid", err)
	}
	for i, r := range rs {
		if (r.Err != nil) != (i == 3) {
			t.Errorf("results[%d] = %+v", i, r)
		}
	}
	for n, want := range map[*node]uint32{a: 0, b: 1} {
		reqs := n.faults.requests("BatchSchedule")
		if len(reqs) != 1 {
			t.Fatalf("node got %d BatchSchedule calls, want 1", len(reqs))
		}
		for _, ev := range reqs[0].(*chimev1.BatchScheduleRequest).Events {
			if s := chimev1.ShardOf(ev.Id, 2); s != want {
				t.Errorf("event %q of shard %d sent to the leader of shard %d", ev.Id, s, want)
			}
		}
	}

	// A leader that stops answering: the call goes to any node instead.
	b.stop()
	before := a.faults.n("Schedule")
	if _, err := c.Schedule(ctx, client.Event{ID: idIn("late", 1, 2), Topic: "t"}, client.In(time.Hour)); err != nil {
		t.Fatalf("Schedule with shard 1's leader down: %v", err)
	}
	if a.faults.n("Schedule") != before+1 {
		t.Errorf("the Schedule did not fall back to the node dialled")
	}

	// Routing off: everything goes to the node dialled.
	c2, err := client.Dial(context.Background(), a.addr, client.WithLeaderRouting(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	calls := admin.calls.Load()
	if _, err := c2.Get(ctx, on1); err != nil && !errors.Is(err, client.ErrNotFound) {
		t.Fatal(err)
	}
	// Close returns only once the router's loop, the one reader of the map,
	// has returned, so a read it finished is counted by then: the count is
	// checked after Close rather than after a pause.
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if admin.calls.Load() != calls {
		t.Error("a client without leader routing read the cluster map")
	}
}

// TestLeaderMovedHeader: a node that passed a call on to the shard's leader
// says so in a response header, and the client reads the cluster map again
// at once rather than sending that shard's calls to the wrong node until its
// map is 30 s old.
func TestLeaderMovedHeader(t *testing.T) {
	now := func() time.Time { return harnessStart }
	srv := rpc.NewServer(rpctest.New(now), rpc.Limits{}, now, slog.New(slog.DiscardHandler))
	admin := &fakeAdmin{}
	a, b := startNode(t, srv, admin), startNode(t, srv, admin)
	members := []*chimev1.Member{{Id: "n1", GrpcAddr: a.addr}, {Id: "n2", GrpcAddr: b.addr}}
	admin.m = &chimev1.ClusterMap{ShardCount: 2, Members: members, Shards: []*chimev1.Shard{{Id: 0, Leader: "n1"}, {Id: 1, Leader: "n1"}}}
	c, err := client.Dial(context.Background(), a.addr, client.WithRetry(fastRetry))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	on1 := idIn("m", 1, 2)
	// No call is made before the first map is in place: a call would find
	// the map missing and ask for another, which could read the next map
	// without the header's help.
	waitFor(t, 5*time.Second, "the client reads the cluster map", func() bool { return client.HasClusterMap(c) })
	// Shard 1's leadership moves to n2; n1 forwards, and says so.
	admin.setMap(&chimev1.ClusterMap{ShardCount: 2, Members: members, Shards: []*chimev1.Shard{{Id: 0, Leader: "n1"}, {Id: 1, Leader: "n2"}}})
	a.faults.mu.Lock()
	a.faults.before = func(ctx context.Context, method string, n int) error {
		if method == "Get" {
			if err := grpc.SetHeader(ctx, metadata.Pairs(chimev1.LeaderMovedHeader, "n2")); err != nil {
				return err
			}
		}
		return nil
	}
	a.faults.mu.Unlock()
	// The map is read again at most once a second, not at each answer.
	waitFor(t, 5*time.Second, "calls for shard 1 to follow the header to n2", func() bool {
		_, _ = c.Get(ctx, on1) // where it went is checked, not its answer
		return b.faults.n("Get") > 0
	})
}

// waitFor polls cond until it holds, and fails the test if it does not
// within d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("not within %v: %s", d, what)
		}
	}
}

// TestConnAndDo: Conn reaches the services the client has no methods for
// (Admin here) with the client's credentials, once per call; Do retries a
// call on it as the client's own calls are retried, and returns gRPC's
// error unmapped.
func TestConnAndDo(t *testing.T) {
	now := func() time.Time { return harnessStart }
	srv := rpc.NewServer(rpctest.New(now), rpc.Limits{}, now, slog.New(slog.DiscardHandler))
	admin := &fakeAdmin{m: &chimev1.ClusterMap{ClusterId: "c-1", ShardCount: 1}}
	n := startNode(t, srv, admin)
	c, err := client.Dial(context.Background(), n.addr, client.WithToken("tok-1"), client.WithRetry(fastRetry), client.WithLeaderRouting(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	ac := chimev1.NewAdminClient(c.Conn())
	// fail answers the first k calls of GetClusterMap with err, and notes
	// the token every call carried.
	var auth []string
	var mu sync.Mutex
	fail := func(k int, err error) {
		first := failFirst("GetClusterMap", k, err)
		n.faults.mu.Lock()
		n.faults.before = func(ctx context.Context, m string, i int) error {
			md, _ := metadata.FromIncomingContext(ctx)
			mu.Lock()
			auth = append(auth, strings.Join(md.Get("authorization"), ","))
			mu.Unlock()
			return first(ctx, m, i)
		}
		n.faults.mu.Unlock()
	}
	unavailable := status.Error(codes.Unavailable, "no leader yet")

	// Sent once: Conn does not retry.
	fail(1, unavailable)
	if _, err := ac.GetClusterMap(ctx, &chimev1.GetClusterMapRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetClusterMap on Conn, answered UNAVAILABLE once = %v, want that error", err)
	}
	if got := n.faults.n("GetClusterMap"); got != 1 {
		t.Errorf("GetClusterMap on Conn: %d calls, want 1", got)
	}

	// Do retries it.
	fail(2, unavailable)
	var m *chimev1.ClusterMap
	err = c.Do(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		m, err = chimev1.NewAdminClient(cc).GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
		return err
	})
	if err != nil || m.GetClusterId() != "c-1" {
		t.Fatalf("Do(GetClusterMap) = %v, %v", m, err)
	}
	if got := n.faults.n("GetClusterMap"); got != 4 {
		t.Errorf("GetClusterMap: %d calls in all, want 4 (1 on Conn, then 2 failed and 1 answered through Do)", got)
	}

	// An answer that is not retryable comes back at once, as gRPC gave it.
	fail(1, status.Error(codes.PermissionDenied, "not an admin"))
	err = c.Do(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) error {
		_, err := chimev1.NewAdminClient(cc).GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
		return err
	})
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || st.Message() != "not an admin" {
		t.Errorf("Do answered PERMISSION_DENIED = %v, want the status itself", err)
	}
	if got := n.faults.n("GetClusterMap"); got != 5 {
		t.Errorf("GetClusterMap: %d calls in all, want 5", got)
	}
	mu.Lock()
	for i, a := range auth {
		if a != "Bearer tok-1" {
			t.Errorf("call %d on Conn carried authorization %q, want the client's token", i+1, a)
		}
	}
	mu.Unlock()

	// The raw Scheduler stub works on Conn too.
	if _, err := chimev1.NewSchedulerClient(c.Conn()).Get(ctx, &chimev1.GetRequest{Id: "none"}); status.Code(err) != codes.NotFound {
		t.Errorf("raw Get on Conn = %v, want NOT_FOUND", err)
	}

	// After Close, Do fails at once with CANCELED.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, func(context.Context, grpc.ClientConnInterface) error { return nil }); status.Code(err) != codes.Canceled {
		t.Errorf("Do after Close = %v, want CANCELED", err)
	}
}
