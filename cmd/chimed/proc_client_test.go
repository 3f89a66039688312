package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/node/nodetest"
)

// The Go client against real chimed processes: what its retries promise
// when answers are lost, leaders die and nodes do not answer.

// blackhole is a TCP proxy to a node's gRPC port that, once armed, drops
// the next bytes the node sends back and everything after them on that
// connection, then cuts it after a while: the node did the work, the
// caller never hears of it. It disarms itself, so the retry goes through.
type blackhole struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	cut    time.Duration

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBlackhole(t *testing.T, target string, cut time.Duration) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target, cut: cut}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) accept() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = in.Close() // the proxy drops the connection it cannot forward
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, in, out)
		b.mu.Unlock()
		b.wg.Add(2)
		// Copy ends when either side is closed: an error is one of the
		// cuts this proxy makes, or the test's end.
		go func() { defer b.wg.Done(); _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() {
			defer b.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := out.Read(buf)
				if n > 0 && b.armed.CompareAndSwap(true, false) {
					// The answer is lost: after a while, so that the node
					// has surely committed what it was asked, the line drops.
					time.AfterFunc(b.cut, func() { _ = in.Close(); _ = out.Close() })
					_, _ = io.Copy(io.Discard, out) // ends with the cut
					return
				}
				if n > 0 {
					if _, werr := in.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = in.Close() // the proxy drops the connection it cannot forward
					return
				}
			}
		}()
	}
}

func (b *blackhole) close() {
	_ = b.ln.Close() // the test's teardown: the proxy only releases what it held
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.Close() // the test's teardown: the proxy only releases what it held
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// TestClientRetriesALostAnswer: a Schedule whose answer is lost after the
// node committed it is sent again with the same client-chosen id, and the
// retry finds the event it made: one event, one record, Existing.
func TestClientRetriesALostAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a chimed process; skipped with -short")
	}
	t.Parallel()
	brokers := broker(t)
	d := newDaemon(t, brokers)
	d.start()
	col := collect(t, brokers, "client.lost")
	proxy := newBlackhole(t, d.grpcAddr, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, proxy.addr(), client.WithLeaderRouting(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A first call through the proxy opens its connection.
	if _, err := c.Schedule(ctx, client.Event{Topic: "client.lost", Payload: []byte("warm")}, client.In(time.Hour)); err != nil {
		t.Fatal(err)
	}
	proxy.armed.Store(true)
	res, err := c.Schedule(ctx, client.Event{Topic: "client.lost", Payload: []byte("once")}, client.In(time.Second))
	if err != nil {
		t.Fatalf("Schedule whose first answer was lost: %v", err)
	}
	if res.ID == "" || !res.Existing {
		t.Fatalf("Schedule = %+v; want the id the client chose, found Existing by the retry (the first attempt committed)", res)
	}
	got := col.waitIDs(t, map[string]time.Time{res.ID: {}}, 20*time.Second)
	if n, err := c.Count(ctx, client.Filter{Topic: "client.lost"}); err != nil || n != 2 {
		t.Fatalf("Count = %d, %v; want 2 events (the warm-up and the one retried)", n, err)
	}
	// A second record, which must not come, would be produced before the
	// node records the event fired; and read before the barrier's records,
	// produced after that.
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		ev, err := c.Get(ctx, res.ID)
		return err == nil && ev.State == client.StateFired, fmt.Sprintf("%s recorded fired: %+v, %v", res.ID, ev, err)
	})
	barrier(t, d.client(), col, "client.lost", 4, time.Now())
	if _, dups := col.byID(); dups != 0 || string(got[res.ID].Value()) != "once" {
		t.Fatalf("records of %s: %+v, %d duplicates", res.ID, got[res.ID], dups)
	}
}

// TestClientRidesOutALeaderKill: a stream of Schedule calls through every
// node while one node, leading shards, is killed: no call fails (the
// client retries), and every acknowledged event fires, any second copy with
// the same chime-id.
func TestClientRidesOutALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster; skipped with -short")
	}
	t.Parallel()
	c := newCluster(t, 3)
	st := c.waitSettled(60 * time.Second)
	victim := st.Shards[0].Leader
	var addrs []string
	for _, id := range c.order {
		addrs = append(addrs, c.nodes[id].grpcAddr)
	}
	col := collect(t, c.brokers, "client.kill")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := client.Dial(ctx, strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var (
		mu    sync.Mutex
		acked = map[string]time.Time{}
		fails []error
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pace := time.NewTicker(5 * time.Millisecond)
			defer pace.Stop()
			for i := 0; ; i++ {
				callCtx, done := context.WithTimeout(ctx, 30*time.Second)
				res, err := cl.Schedule(callCtx, client.Event{ID: fmt.Sprintf("k%d-%d", w, i), Topic: "client.kill", Payload: []byte("x")}, client.In(2*time.Second))
				done()
				mu.Lock()
				if err != nil {
					fails = append(fails, err)
				} else {
					acked[res.ID] = res.Due
				}
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-pace.C:
				}
			}
		}()
	}
	ackedSoFar := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	// The calls are under way before the kill, and go on through the
	// failover until a good many more are acknowledged after it.
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		return ackedSoFar() >= 50, fmt.Sprintf("50 calls acknowledged before the kill: %d", ackedSoFar())
	})
	c.nodes[victim].kill()
	survivor := c.order[0]
	if survivor == victim {
		survivor = c.order[1]
	}
	c.waitLedWithout(victim, survivor, 30*time.Second)
	after := ackedSoFar()
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		n := ackedSoFar()
		return n >= after+200, fmt.Sprintf("200 calls acknowledged after the failover: %d", n-after)
	})
	close(stop)
	wg.Wait()
	if len(fails) > 0 {
		t.Fatalf("%d of %d calls failed while %s was killed, e.g. %v", len(fails), len(fails)+len(acked), victim, fails[0])
	}
	if len(acked) < 100 {
		t.Fatalf("only %d calls were acknowledged", len(acked))
	}
	got := col.waitIDs(t, acked, 60*time.Second)
	for id, r := range got {
		if r.ID != id {
			t.Fatalf("record %q carries chime-id %q", id, r.ID)
		}
	}
	t.Logf("%d events scheduled across the kill of %s, all fired", len(acked), victim)
}

// TestClientFailsFastWithNoNode: with no node answering, a call fails
// within its context, naming the addresses it tried.
func TestClientFailsFastWithNoNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, dead)
	if err != nil {
		t.Fatal(err) // Dial is lazy: a dead node shows on the first call
	}
	defer c.Close()
	callCtx, done := context.WithTimeout(ctx, 2*time.Second)
	defer done()
	start := time.Now()
	_, err = c.Schedule(callCtx, client.Event{Topic: "t", Payload: []byte("x")}, client.In(time.Hour))
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), dead) {
		t.Fatalf("Schedule with no node = %v; want an error naming %s", err, dead)
	}
	if took > 3*time.Second {
		t.Fatalf("Schedule with no node took %v past a 2 s context", took)
	}
}

// TestClientUpdateAtAStaleVersion: Update with IfVersion of a version the
// event has left is ErrConflict, carrying the stored version.
func TestClientUpdateAtAStaleVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a chimed process; skipped with -short")
	}
	t.Parallel()
	d := newDaemon(t, broker(t))
	d.start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, d.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Schedule(ctx, client.Event{ID: "stale-1", Topic: "client.stale", Payload: []byte("v1")}, client.In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Update(ctx, "stale-1", client.SetPayload([]byte("v2")), client.IfVersion(res.Version)); err != nil {
		t.Fatal(err)
	}
	_, err = c.Update(ctx, "stale-1", client.SetPayload([]byte("v3")), client.IfVersion(res.Version))
	var ce *client.ConflictError
	if !errors.Is(err, client.ErrConflict) || !errors.As(err, &ce) || ce.Version != res.Version+1 {
		t.Fatalf("Update at stale version %d = %v; want ErrConflict at version %d", res.Version, err, res.Version+1)
	}
	ev, err := c.Get(ctx, "stale-1")
	if err != nil || string(ev.Payload) != "v2" {
		t.Fatalf("Get = %+v, %v; want payload v2", ev, err)
	}
}
