package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// authNode starts a chimed with TLS, no client certificates asked for, and
// an auth file that knows one scheduler token, "good-token": a node whose
// clients authenticate with tokens.
func authNode(t testing.TB) *daemon {
	t.Helper()
	p := newSecurePKI(t)
	d := newDaemon(t, broker(t))
	authFile := p.dir + "/auth.json"
	if err := os.WriteFile(authFile, []byte(fmt.Sprintf(`{"tokens": [{"name": "app", "sha256": "%s", "role": "scheduler", "topics": ["*"]}]}`,
		sha256Hex("good-token"))), 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := p.nodes.Node(d.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	d.extra = []string{"--auth-file", authFile, "--shards", "1", "--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", p.nodes.File}
	src := clientSource(t, certstest.Pair{}, p.nodes.File)
	d.creds = credentials.NewTLS(src.ClientConfig(""))
	d.httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig("")}}
	d.scheme = "https"
	d.start()
	return d
}

// flood sends calls concurrent Schedule calls of an event with a payload
// of size bytes and no credentials to d, and returns how many ended with
// each code.
func flood(t testing.TB, d *daemon, calls, size int) map[codes.Code]int {
	t.Helper()
	cc, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(d.creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(size+1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cl := chimev1.NewSchedulerClient(cc)
	payload := make([]byte, size)
	var mu sync.Mutex
	got := map[codes.Code]int{}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
				Id: fmt.Sprintf("flood-%d", i), Topic: "flood", Payload: payload, Delay: durationpb.New(time.Hour)}})
			mu.Lock()
			got[status.Code(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

// peakRSS is the process's peak resident set so far (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmHWM", pid)
	return 0
}

// TestUnauthenticatedCallsAreRefusedBeforeTheirBodies: calls without
// credentials are refused from their headers, UNAUTHENTICATED, before the
// node reads their bodies; eight of 15 MiB each would take 120 MiB to read,
// and the node's peak memory grows by much less. A call with a token still
// goes through.
func TestUnauthenticatedCallsAreRefusedBeforeTheirBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a chimed process; skipped with -short")
	}
	d := authNode(t)
	before := peakRSS(t, d.cmd.Process.Pid)
	const calls, size = 8, 15 << 20
	got := flood(t, d, calls, size)
	if got[codes.Unauthenticated] != calls {
		t.Errorf("%d calls without credentials ended %v; want each UNAUTHENTICATED", calls, got)
	}
	if grew := peakRSS(t, d.cmd.Process.Pid) - before; grew > calls*size/2 {
		t.Errorf("the node's peak RSS grew by %d MiB for %d refused calls of %d MiB: their bodies were read", grew>>20, calls, size>>20)
	}
	ctx, cancel := context.WithTimeout(withToken(context.Background(), "good-token"), 10*time.Second)
	defer cancel()
	if _, err := d.client().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "ok-1", Topic: "t", Delay: durationpb.New(time.Hour)}}); err != nil {
		t.Errorf("a call with a token: %v", err)
	}
}

// BenchmarkUnauthenticatedFlood measures how much a node's peak RSS grows
// while 50 concurrent calls of 15 MiB each, without credentials, are
// refused (the target is under 50 MB); each must be UNAUTHENTICATED.
//
//	go test ./cmd/chimed -run '^$' -bench UnauthenticatedFlood -benchtime 1x
func BenchmarkUnauthenticatedFlood(b *testing.B) {
	d := authNode(b)
	const calls, size = 50, 15 << 20
	before := peakRSS(b, d.cmd.Process.Pid)
	for b.Loop() {
		if got := flood(b, d, calls, size); got[codes.Unauthenticated] != calls {
			b.Fatalf("%d calls without credentials ended %v; want each UNAUTHENTICATED", calls, got)
		}
	}
	b.ReportMetric(float64(peakRSS(b, d.cmd.Process.Pid)-before)/1e6, "peak-RSS-MB-growth")
	b.ReportMetric(float64(before)/1e6, "peak-RSS-MB-before")
}
