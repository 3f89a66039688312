package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/cmd/internal/latency"
	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish/publishtest"
)

// The end-to-end tests run the real chimed binary as a process on loopback:
// gRPC in, Raft with fsync and Pebble underneath, records out to a kfake
// broker that lives in the test process, so killing chimed loses nothing
// Kafka had acknowledged.
//
// A test of processes that spends its time waiting (for elections, failure
// detection, due times) calls t.Parallel, so that its waits overlap
// another's: each process has ports of its own (freeAddr never hands one
// out twice), its own data directory and its own broker. Tests that set
// environment variables (t.Setenv), run chimed dev (whose ports follow
// --grpc-addr unreserved), or are busy rather than waiting run alone.

var chimedBin, chimectlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chimed-e2e")
	if err != nil {
		panic(err)
	}
	chimedBin, chimectlBin = filepath.Join(dir, "chimed"), filepath.Join(dir, "chimectl")
	for bin, pkg := range map[string]string{chimedBin: ".", chimectlBin: "../chimectl"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", pkg, err, out)
			_ = os.RemoveAll(dir) // the build's error is the one to report
			os.Exit(1)
		}
	}
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "removing the built binaries: %v\n", err)
	}
	// Every child process is waited for and every in-process node closed
	// by the tests' cleanups, so nothing of theirs may still run.
	if code == 0 {
		if err := nodetest.FindLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

type daemon struct {
	t                          testing.TB
	cmd                        *exec.Cmd
	nodeID                     string
	dataDir                    string
	grpcAddr, httpAddr, raftAd string
	gossipAddr                 string
	join                       []string
	extra                      []string // more flags
	// env, when set, configures the node as a container does: chimed
	// serve with these CHIME_ variables (and extra) instead of the flags.
	env     []string
	brokers string
	stderr  *lockedBuffer // read while the process writes it
	exited  chan struct{}
	// With TLS (secure): what its clients dial with, and the HTTP client
	// and scheme of its HTTP port.
	creds      credentials.TransportCredentials
	httpClient *http.Client
	scheme     string
}

// freeAddr returns a loopback address whose port is free for TCP and UDP
// (gossip takes both) for chimed to bind later. The port comes from below
// the kernel's ephemeral range: a port the kernel hands out (":0") is in
// that range, where every outgoing connection of every test takes its
// local port too, so one could take it between this check and chimed's
// bind ("address already in use"). Below the range only another listener
// can, and no port is handed out twice in one test binary.
func freeAddr(t testing.TB) string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	low := ephemeralLow()
	for range 1000 {
		port := low - 1 - rand.IntN(low-1024)
		if portsGiven[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", addr)
		_ = ln.Close() // only a probe that the port is free
		if err != nil {
			continue
		}
		_ = pc.Close() // only a probe that the port is free
		portsGiven[port] = true
		return addr
	}
	t.Fatalf("no free port below %d after 1000 tries", low)
	return ""
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read), kept at least 10,000 above the ports freeAddr
// may pick from.
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	return max(low, 11024)
}

func newDaemon(t testing.TB, brokers []string) *daemon {
	return &daemon{
		t: t, nodeID: "e2e", dataDir: t.TempDir(), grpcAddr: freeAddr(t), httpAddr: freeAddr(t), raftAd: freeAddr(t),
		gossipAddr: freeAddr(t), brokers: brokers[0], creds: insecure.NewCredentials(), httpClient: http.DefaultClient, scheme: "http",
	}
}

// start runs chimed serve and waits until /readyz says every shard leads.
func (d *daemon) start() {
	d.t.Helper()
	d.launch()
	d.waitHTTP("/readyz", 30*time.Second)
}

// launch starts chimed serve without waiting for anything.
func (d *daemon) launch() {
	d.t.Helper()
	d.stderr = &lockedBuffer{}
	args := []string{"serve", "--node-id", d.nodeID, "--data-dir", d.dataDir,
		"--grpc-addr", d.grpcAddr, "--http-addr", d.httpAddr, "--raft-addr", d.raftAd,
		"--gossip-addr", d.gossipAddr, "--kafka-brokers", d.brokers, "--shards", "4", "--log-level", "warn",
		// The test broker creates the tests' topics as they come, and
		// serves plaintext on loopback.
		"--kafka-auto-create-topics", "--kafka-insecure"}
	if len(d.join) > 0 {
		args = append(args, "--join", strings.Join(d.join, ","))
	}
	if d.env != nil {
		args = []string{"serve"}
	}
	d.cmd = exec.Command(chimedBin, append(args, d.extra...)...)
	if d.env != nil {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(d.exited) }() // stop reads the exit code from ProcessState
	d.t.Cleanup(func() { d.kill() })
}

// waitHTTP waits until path on the HTTP port answers 200.
func (d *daemon) waitHTTP(path string, timeout time.Duration) {
	d.t.Helper()
	nodetest.WaitFor(d.t, timeout, func() (bool, string) {
		resp, err := d.httpClient.Get(d.scheme + "://" + d.httpAddr + path)
		if err == nil {
			_ = resp.Body.Close() // the status is what is checked; the body is not read
			if resp.StatusCode == 200 {
				return true, ""
			}
		}
		select {
		case <-d.exited:
			d.t.Fatalf("chimed exited during start: %s", d.stderr)
		default:
		}
		return false, fmt.Sprintf("chimed: %s answers 200: %s", path, d.stderr)
	})
}

// kill stops chimed with SIGKILL: no graceful shutdown at all.
func (d *daemon) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL) // fails only when chimed has already exited
	<-d.exited
}

// stop stops chimed with SIGTERM and expects a clean exit.
func (d *daemon) stop() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM) // fails only when chimed has already exited, which ProcessState shows
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.t.Fatal("chimed did not stop within 30s of SIGTERM")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		d.t.Fatalf("chimed exited with %d after SIGTERM: %s", code, d.stderr)
	}
}

func (d *daemon) client() chimev1.SchedulerClient {
	d.t.Helper()
	cc, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(d.creds))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { cc.Close() })
	return chimev1.NewSchedulerClient(cc)
}

func broker(t testing.TB) []string {
	t.Helper()
	return publishtest.NewBroker(t, kfake.DefaultNumPartitions(4)).Addrs()
}

// record is one consumed Kafka record, as an independent client read it.
type record = publishtest.Record

// collector consumes topics in the background from their start.
type collector struct{ *publishtest.Collector }

func collect(t testing.TB, brokers []string, topics ...string) collector {
	t.Helper()
	return collector{publishtest.Collect(t, brokers, topics...)}
}

// byID returns the first record of each id and how many duplicates came.
func (c collector) byID() (map[string]record, int) {
	got := c.Consumed()
	return got.ByID, got.Dups
}

// waitIDs waits until every id in want has been consumed.
func (c collector) waitIDs(t testing.TB, want map[string]time.Time, d time.Duration) map[string]record {
	t.Helper()
	var got map[string]record
	nodetest.WaitFor(t, d, func() (bool, string) {
		got, _ = c.byID()
		missing, example := 0, ""
		for id := range want {
			if _, ok := got[id]; !ok {
				missing++
				example = id
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d acknowledged events never reached Kafka (e.g. %s)", missing, len(want), example)
	})
	return got
}

// barrierPrefix starts the ids of the events barrier schedules.
const barrierPrefix = "barrier-"

// barrier is what a check that something was never produced waits for,
// rather than for time to pass: it schedules on topic one event per shard
// (of shards), due at at, and waits until col has read them all. A shard
// fires in due order, so what it was to produce before at it has produced
// by then, and col, reading every partition of the one broker in each
// fetch, has read it: give at a margin past the due times in question, and
// a node running late is waited for instead of missed.
func barrier(t testing.TB, cl chimev1.SchedulerClient, col collector, topic string, shards uint32, at time.Time) {
	t.Helper()
	want := map[string]time.Time{}
	req := &chimev1.BatchScheduleRequest{}
	for s := range shards {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("%s%d-%d", barrierPrefix, at.UnixMilli(), i); chimev1.ShardOf(id, shards) == s {
				req.Events = append(req.Events, &chimev1.Event{Id: id, Topic: topic, DeliverAt: timestamppb.New(at)})
				want[id] = at
				break
			}
		}
	}
	resp, err := retried(func() (*chimev1.BatchScheduleResponse, error) {
		return cl.BatchSchedule(context.Background(), req)
	})
	if err != nil {
		t.Fatalf("barrier: %v", err)
	}
	for _, r := range resp.Results {
		if r.Code != 0 {
			t.Fatalf("barrier: %s: %d %s", r.Id, r.Code, r.Message)
		}
	}
	col.waitIDs(t, want, time.Until(at)+30*time.Second)
}

func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("schedules and fires 10,000 events through a chimed process; skipped with -short")
	}
	brokers := broker(t)
	d := newDaemon(t, brokers)
	d.start()
	cl := d.client()
	ctx := context.Background()
	col := collect(t, brokers, "e2e.orders", "e2e.cancel")

	// 10,000 events with random delays of 0-3 s, from 8 concurrent callers
	// in batches of 250, plus a few single Schedule calls.
	const n, callers, batch = 10_000, 8, 250
	due := make(map[string]time.Time, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c), 1))
			for lo := c * (n / callers); lo < (c+1)*(n/callers); lo += batch {
				req := &chimev1.BatchScheduleRequest{}
				for i := lo; i < lo+batch; i++ {
					id := fmt.Sprintf("ev-%05d", i)
					req.Events = append(req.Events, &chimev1.Event{
						Id: id, Topic: "e2e.orders",
						Delay:   durationpb.New(time.Duration(r.Int64N(int64(3 * time.Second)))),
						Payload: []byte("payload-" + id),
					})
				}
				resp, err := cl.BatchSchedule(ctx, req)
				if err != nil {
					t.Errorf("BatchSchedule: %v", err)
					return
				}
				mu.Lock()
				for i, res := range resp.Results {
					if res.Code != 0 {
						t.Errorf("%s: code %d %s", req.Events[i].Id, res.Code, res.Message)
					}
					due[res.Id] = res.Due.AsTime()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("scheduled %d events in %v", len(due), time.Since(start).Round(time.Millisecond))

	// Cancelled events never fire.
	cancelled := map[string]bool{}
	for i := range 50 {
		id := fmt.Sprintf("cancel-%d", i)
		_, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: id, Topic: "e2e.cancel", Delay: durationpb.New(2 * time.Second)}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cl.Cancel(ctx, &chimev1.CancelRequest{Id: id})
		if err != nil || resp.State != chimev1.EventState_EVENT_STATE_CANCELLED {
			t.Fatalf("cancel %s: %v %v", id, resp, err)
		}
		cancelled[id] = true
	}
	cancelledBy := time.Now()

	// A re-sent id is idempotent; different content for it is refused.
	first, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "ev-00007", Topic: "e2e.orders", Delay: durationpb.New(time.Hour), Payload: []byte("other")}})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("conflicting re-send: %v, %v; want AlreadyExists", first, err)
	}

	got := col.waitIDs(t, due, 30*time.Second)
	var late, fireLate []time.Duration
	for id, dueAt := range due {
		r := got[id]
		if r.Fired.UnixMilli() < dueAt.UnixMilli() {
			t.Errorf("%s fired early: due %v, fired %v", id, dueAt, r.Fired)
		}
		if r.Value() != "payload-"+id {
			t.Errorf("%s: value %q", id, r.Value())
		}
		late = append(late, r.Received.Sub(dueAt))
		fireLate = append(fireLate, time.Duration(r.Fired.UnixMilli()-dueAt.UnixMilli())*time.Millisecond)
	}
	t.Logf("fire lateness (chime-fired-unix-ms - due, ms resolution), %d events: %s", len(fireLate), quantiles(fireLate))
	t.Logf("end-to-end lateness (due -> consumed by an independent client): %s", quantiles(late))

	// Idempotent re-send after firing: the original result, nothing new.
	again, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "cancel-3", Topic: "e2e.cancel", Delay: durationpb.New(2 * time.Second)}})
	if err != nil || !again.Existing {
		t.Fatalf("identical re-send of a cancelled id: %v, %v; want existing", again, err)
	}
	// The claim is that a cancelled event is never produced: watch until
	// every shard has fired past the cancelled events' due times (2 s after
	// they were scheduled), with a second to spare.
	barrier(t, cl, col, "e2e.cancel", 4, cancelledBy.Add(3*time.Second))
	all, _ := col.byID()
	for id := range cancelled {
		if _, ok := all[id]; ok {
			t.Errorf("cancelled event %s was produced", id)
		}
	}
	g, err := cl.Get(ctx, &chimev1.GetRequest{Id: "ev-00042"})
	if err != nil || g.State != chimev1.EventState_EVENT_STATE_FIRED || g.FiredAt == nil || g.FiredAt.AsTime().Before(g.Due.AsTime()) {
		t.Fatalf("get of a fired event: %v, %v", g, err)
	}
	d.stop()
}

// TestUpdateThroughChimed: an event moved from +10 s to +2 s fires at +2 s
// and never at +10 s; one moved from +2 s to +10 s does not fire at +2 s,
// and fires at +10 s; each as its second version.
func TestUpdateThroughChimed(t *testing.T) {
	if testing.Short() {
		t.Skip("watches two events for 12 s through a chimed process; skipped with -short")
	}
	t.Parallel()
	brokers := broker(t)
	d := newDaemon(t, brokers)
	d.start()
	cl := d.client()
	ctx := context.Background()
	col := collect(t, brokers, "e2e.update")
	start := time.Now()
	for id, delay := range map[string]time.Duration{"sooner": 10 * time.Second, "later": 2 * time.Second} {
		_, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: id, Topic: "e2e.update", Delay: durationpb.New(delay), Payload: []byte("v1")}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for id, delay := range map[string]time.Duration{"sooner": 2 * time.Second, "later": 10 * time.Second} {
		resp, err := cl.Update(ctx, &chimev1.UpdateRequest{Id: id, Delay: durationpb.New(delay), Payload: []byte("v2"), ExpectedVersion: 1})
		if err != nil || resp.Version != 2 {
			t.Fatalf("Update(%s) = %v, %v", id, resp, err)
		}
	}
	// Watch until every shard has fired past the first version's due time
	// of "sooner" (+10 s), with 2 s to spare: it must not come.
	barrier(t, cl, col, "e2e.update", 4, start.Add(12*time.Second))
	got := col.Consumed()
	got.Records = slices.DeleteFunc(got.Records, func(r record) bool { return strings.HasPrefix(r.ID, barrierPrefix) })
	for id, at := range map[string]time.Duration{"sooner": 2 * time.Second, "later": 10 * time.Second} {
		r, ok := got.ByID[id]
		switch {
		case !ok:
			t.Errorf("%s was never produced", id)
		case r.Version != 2 || r.Value() != "v2":
			t.Errorf("%s: produced version %d %q, want the update's", id, r.Version, r.Value())
		case r.Fired.Sub(start) < at-50*time.Millisecond || r.Fired.Sub(start) > at+2*time.Second:
			t.Errorf("%s: fired %v after it was scheduled, want about %v", id, r.Fired.Sub(start), at)
		}
	}
	if len(got.Records) != 2 {
		t.Errorf("read %d records, want 2 (one per event): %+v", len(got.Records), got.Records)
	}
	g, err := cl.Get(ctx, &chimev1.GetRequest{Id: "sooner"})
	if err != nil || g.Version != 2 || g.State != chimev1.EventState_EVENT_STATE_FIRED {
		t.Fatalf("Get(sooner) = %v, %v", g, err)
	}
	d.stop()
}

// TestReplaceThroughChimed: ON_CONFLICT_REPLACE of a pending id makes the
// new content the only one produced, at its own time; of a fired id,
// schedules it anew.
func TestReplaceThroughChimed(t *testing.T) {
	if testing.Short() {
		t.Skip("watches two events for 6 s through a chimed process; skipped with -short")
	}
	t.Parallel()
	brokers := broker(t)
	d := newDaemon(t, brokers)
	d.start()
	cl := d.client()
	ctx := context.Background()
	col := collect(t, brokers, "e2e.replace")
	sched := func(id, payload string, delay time.Duration, replace bool) *chimev1.ScheduleResponse {
		t.Helper()
		ev := &chimev1.Event{Id: id, Topic: "e2e.replace", Delay: durationpb.New(delay), Payload: []byte(payload)}
		if replace {
			ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REPLACE
		}
		resp, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: ev})
		if err != nil {
			t.Fatalf("Schedule(%s, %s): %v", id, payload, err)
		}
		return resp
	}
	start := time.Now()
	sched("pending", "v1", 5*time.Second, false)
	sched("fired", "v1", 0, false)
	if r := sched("pending", "v2", time.Second, true); r.Version != 2 || r.Existing {
		t.Fatalf("REPLACE of a pending id: %v", r)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		g, err := cl.Get(ctx, &chimev1.GetRequest{Id: "fired"})
		return err == nil && g.State == chimev1.EventState_EVENT_STATE_FIRED, fmt.Sprintf("the first event fires: %v, %v", g, err)
	})
	if r := sched("fired", "v2", 500*time.Millisecond, true); r.Version != 2 || r.Existing {
		t.Fatalf("REPLACE of a fired id: %v", r)
	}
	// Watch until every shard has fired past the first version's due time
	// of "pending" (+5 s), with a second to spare: it must not come.
	barrier(t, cl, col, "e2e.replace", 4, start.Add(6*time.Second))
	byVersion := map[string][]string{}
	for _, r := range col.Consumed().Records {
		byVersion[r.ID] = append(byVersion[r.ID], fmt.Sprintf("v%d:%s", r.Version, r.Value()))
	}
	if got := strings.Join(byVersion["pending"], ","); got != "v2:v2" {
		t.Errorf("the replaced pending id produced %s, want only its second version", got)
	}
	if got := strings.Join(byVersion["fired"], ","); got != "v1:v1,v2:v2" {
		t.Errorf("the replaced fired id produced %s, want both versions in order", got)
	}
	d.stop()
}

// quantiles describes ds by nearest rank, as the fault checker does.
func quantiles(ds []time.Duration) string {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / 1e6
	}
	q := func(p float64) time.Duration {
		return time.Duration(latency.Quantile(ms, p) * 1e6).Round(time.Microsecond)
	}
	return fmt.Sprintf("p50 %v  p99 %v  max %v", q(0.5), q(0.99), q(1))
}

func TestBadInputIsRejectedAndLeavesNoTrace(t *testing.T) {
	brokers := broker(t)
	d := newDaemon(t, brokers)
	d.start()
	cl := d.client()
	ctx := context.Background()
	in := func(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
	long := string(bytes.Repeat([]byte("x"), 257))
	cases := []struct {
		name  string
		ev    *chimev1.Event
		field string
	}{
		{"empty topic", &chimev1.Event{Id: "bad-1", Delay: in(time.Second)}, "event.topic"},
		{"invalid topic", &chimev1.Event{Id: "bad-2", Topic: "no spaces", Delay: in(time.Second)}, "event.topic"},
		{"id too long", &chimev1.Event{Id: long, Topic: "t", Delay: in(time.Second)}, "event.id"},
		{"payload too large", &chimev1.Event{Id: "bad-4", Topic: "t", Delay: in(time.Second), Payload: make([]byte, 1<<20+1)}, "event.payload"},
		{"beyond horizon", &chimev1.Event{Id: "bad-5", Topic: "t", DeliverAt: timestamppb.New(time.Now().AddDate(11, 0, 0))}, "event.deliver_at"},
		{"both times", &chimev1.Event{Id: "bad-6", Topic: "t", Delay: in(time.Second), DeliverAt: timestamppb.Now()}, "deliver_at"},
		{"neither time", &chimev1.Event{Id: "bad-7", Topic: "t"}, "deliver_at"},
		{"negative delay", &chimev1.Event{Id: "bad-8", Topic: "t", Delay: in(-time.Second)}, "event.delay"},
	}
	for _, c := range cases {
		_, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: c.ev})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v; want InvalidArgument", c.name, err)
			continue
		}
		if msg := status.Convert(err).Message(); !bytes.Contains([]byte(msg), []byte(c.field)) {
			t.Errorf("%s: message %q does not name %s", c.name, msg, c.field)
		}
		if c.ev.Id != long {
			if _, err := cl.Get(ctx, &chimev1.GetRequest{Id: c.ev.Id}); status.Code(err) != codes.NotFound {
				t.Errorf("%s: after rejection Get says %v; want NotFound", c.name, err)
			}
		}
	}
	if _, err := cl.Cancel(ctx, &chimev1.CancelRequest{Id: "never-scheduled"}); status.Code(err) != codes.NotFound {
		t.Errorf("cancel of an unknown id: %v; want NotFound", err)
	}
	// A due time in the past fires at once; cancelling it afterwards fails.
	if _, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "past", Topic: "e2e.past", DeliverAt: timestamppb.New(time.Now().Add(-time.Hour))}}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		g, err := cl.Get(ctx, &chimev1.GetRequest{Id: "past"})
		return err == nil && g.State == chimev1.EventState_EVENT_STATE_FIRED, fmt.Sprintf("a past-due event fires: %v %v", g, err)
	})
	if _, err := cl.Cancel(ctx, &chimev1.CancelRequest{Id: "past"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("cancel of a fired event: %v; want FailedPrecondition", err)
	}
}

// TestKillAndRestart kills chimed without any shutdown right after it
// acknowledged events, starts it again on the same data, and expects every
// acknowledged event in Kafka.
func TestKillAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a chimed process; skipped with -short")
	}
	t.Parallel()
	brokers := broker(t)
	d := newDaemon(t, brokers)
	d.start()
	cl := d.client()
	ctx := context.Background()
	col := collect(t, brokers, "e2e.kill")
	due := map[string]time.Time{}
	for b := range 8 {
		req := &chimev1.BatchScheduleRequest{}
		for i := range 250 {
			req.Events = append(req.Events, &chimev1.Event{
				Id: fmt.Sprintf("k-%d-%d", b, i), Topic: "e2e.kill",
				Delay: durationpb.New(time.Duration(i%40) * 100 * time.Millisecond),
			})
		}
		resp, err := cl.BatchSchedule(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Results {
			if r.Code != 0 {
				t.Fatalf("%s: %d %s", r.Id, r.Code, r.Message)
			}
			due[r.Id] = r.Due.AsTime()
		}
	}
	d.kill()
	killedAt := time.Now()
	d.start()
	got := col.waitIDs(t, due, 30*time.Second)
	early := 0
	for id, at := range due {
		if got[id].Fired.UnixMilli() < at.UnixMilli() {
			early++
		}
	}
	if early > 0 {
		t.Fatalf("%d events fired early", early)
	}
	_, dups := col.byID()
	t.Logf("all %d acknowledged events fired after kill -9 and restart (restart took %v; %d duplicates)", len(due), time.Since(killedAt).Round(time.Millisecond), dups)
}

// lockedBuffer is a bytes.Buffer that a process's output goroutine writes
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// devPorts returns a loopback gRPC address whose port + 1, + 2 and + 10
// (where chimed dev puts Raft, gossip and HTTP) are free too.
func devPorts(t *testing.T) (grpcAddr string, port int) {
	t.Helper()
	for range 50 {
		_, p, _ := net.SplitHostPort(freeAddr(t))
		port, _ = strconv.Atoi(p)
		free := true
		for _, off := range []int{0, 1, 2, 10} {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+off))
			if err != nil {
				free = false
				break
			}
			_ = ln.Close() // only a probe that the port is free
		}
		if free {
			return fmt.Sprintf("127.0.0.1:%d", port), port
		}
	}
	t.Fatal("no free run of ports for chimed dev")
	return "", 0
}

// devProcess is one `chimed dev` run by TestTwoDevNodesSideBySide.
type devProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	exited         chan struct{}
}

func startDev(t *testing.T, args ...string) *devProcess {
	t.Helper()
	p := &devProcess{cmd: exec.Command(chimedBin, append([]string{"dev", "--log-level", "warn"}, args...)...),
		stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The tests judge the dev cluster by what it prints and serves; how it
	// exits once they are done is not checked, and Signal and Kill fail
	// only for a process that has already exited.
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// banner waits for the startup banner, which ends with the hints.
func (p *devProcess) banner(t *testing.T) string {
	t.Helper()
	nodetest.WaitFor(t, 60*time.Second, func() (bool, string) {
		if strings.Contains(p.stdout.String(), "kcat ") {
			return true, ""
		}
		select {
		case <-p.exited:
			t.Fatalf("chimed dev exited before its banner: %s", p.stderr)
		default:
		}
		return false, fmt.Sprintf("the banner: %s%s", p.stdout, p.stderr)
	})
	return p.stdout.String()
}

// TestTwoDevNodesSideBySide runs two `chimed dev` given only --grpc-addr,
// --kafka-addr and --data-dir: the other ports follow --grpc-addr, so they
// do not collide, every hint names the real addresses, both schedule and
// fire, and a third dev on a data directory in use stops naming --data-dir.
func TestTwoDevNodesSideBySide(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three chimed dev processes; skipped with -short")
	}
	type dev struct {
		p                   *devProcess
		grpcAddr, kafkaAddr string
		port                int
		dataDir             string
	}
	var devs []*dev
	for range 2 {
		d := &dev{kafkaAddr: freeAddr(t), dataDir: t.TempDir()}
		d.grpcAddr, d.port = devPorts(t)
		d.p = startDev(t, "--grpc-addr", d.grpcAddr, "--kafka-addr", d.kafkaAddr, "--data-dir", d.dataDir, "--shards", "2")
		devs = append(devs, d)
	}
	for i, d := range devs {
		b := d.p.banner(t)
		for _, want := range []string{
			fmt.Sprintf("gRPC   %s ", d.grpcAddr),
			fmt.Sprintf("Raft   127.0.0.1:%d\n", d.port+1),
			fmt.Sprintf("HTTP   http://127.0.0.1:%d ", d.port+10),
			fmt.Sprintf("Kafka  %s ", d.kafkaAddr),
			fmt.Sprintf("chimectl tail --brokers %s ", d.kafkaAddr),
			fmt.Sprintf("chimectl --addr %s schedule ", d.grpcAddr),
			fmt.Sprintf("' %s chime.v1.Scheduler/Schedule", d.grpcAddr),
			fmt.Sprintf("kcat -C -b %s ", d.kafkaAddr),
		} {
			if !strings.Contains(b, want) {
				t.Errorf("dev %d: banner lacks %q:\n%s", i, want, b)
			}
		}
		for _, other := range []string{"127.0.0.1:7070", "127.0.0.1:7071", "127.0.0.1:7080", "127.0.0.1:9092"} {
			if strings.Contains(b, other) {
				t.Errorf("dev %d: banner names the default address %s:\n%s", i, other, b)
			}
		}
	}

	ctx := context.Background()
	for i, d := range devs {
		col := collect(t, []string{d.kafkaAddr}, "side.by.side")
		cc, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		id := fmt.Sprintf("dev-%d", i)
		resp, err := chimev1.NewSchedulerClient(cc).Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
			Id: id, Topic: "side.by.side", Delay: durationpb.New(300 * time.Millisecond)}})
		if err != nil {
			t.Fatalf("dev %d: schedule: %v", i, err)
		}
		got := col.waitIDs(t, map[string]time.Time{id: resp.Due.AsTime()}, 30*time.Second)
		if got[id].Fired.Before(resp.Due.AsTime().Truncate(time.Millisecond)) {
			t.Errorf("dev %d: %s fired at %v, before its due time %v", i, id, got[id].Fired, resp.Due.AsTime())
		}
	}

	grpcAddr, _ := devPorts(t)
	third := startDev(t, "--grpc-addr", grpcAddr, "--kafka-addr", freeAddr(t), "--data-dir", devs[0].dataDir)
	select {
	case <-third.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("a dev on a data directory in use is still running after 30 s")
	}
	if code := third.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(third.stderr.String(), "--data-dir "+devs[0].dataDir+" is in use") {
		t.Errorf("a dev on a data directory in use: exit %d, stderr %s; want an error naming --data-dir", code, third.stderr)
	}
}

// TestChimectlAgainstDevWithoutWaiting runs the chimed binary's dev mode and,
// at once, without waiting for /readyz or the banner, `chimectl schedule`
// and `chimectl status` against it: both succeed, and the event fires.
func TestChimectlAgainstDevWithoutWaiting(t *testing.T) {
	grpcAddr, _ := devPorts(t)
	kafkaAddr := freeAddr(t)
	p := startDev(t, "--grpc-addr", grpcAddr, "--kafka-addr", kafkaAddr, "--data-dir", t.TempDir(), "--shards", "2")
	chimectl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(chimectlBin, append([]string{"--addr", grpcAddr}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("chimectl %s: %v\n%s%s\nchimed: %s", strings.Join(args, " "), err, stdout.String(), stderr.String(), p.stderr)
		}
		return stdout.String()
	}
	out := chimectl("schedule", "--topic", "dev.chimectl", "--in", "1s", "--id", "first", "--payload", "hello")
	t.Logf("chimectl schedule: %s", strings.TrimSpace(out))
	st := chimectl("status")
	if !strings.Contains(st, "dev") || !strings.Contains(st, "alive") {
		t.Errorf("chimectl status does not show the dev node alive:\n%s", st)
	}
	col := collect(t, []string{kafkaAddr}, "dev.chimectl")
	got := col.waitIDs(t, map[string]time.Time{"first": {}}, 30*time.Second)
	if got["first"].Value() != "hello" {
		t.Errorf("record value %q, want hello", got["first"].Value())
	}
}

// TestDebugEndpointsOnlyWhenAsked: profiles and the LSM report are served
// only with --debug-endpoints.
func TestDebugEndpointsOnlyWhenAsked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two chimed processes; skipped with -short")
	}
	t.Parallel()
	brokers := broker(t)
	for _, on := range []bool{false, true} {
		d := newDaemon(t, brokers)
		if on {
			d.extra = []string{"--debug-endpoints"}
		}
		d.start()
		for _, path := range []string{"/debug/pprof/", "/debug/pebble"} {
			resp, err := http.Get("http://" + d.httpAddr + path)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close() // the status is what is checked; the body is not read
			if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; resp.StatusCode != want {
				t.Errorf("--debug-endpoints=%v: GET %s = %d, want %d", on, path, resp.StatusCode, want)
			}
		}
		d.stop()
	}
}
