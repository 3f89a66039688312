package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"

	"github.com/chimehq/chime/cluster"
	"github.com/chimehq/chime/membership"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/shard/host"
)

// startNode runs one real Chime node in the test process: Raft with fsync,
// Pebble, the gRPC server and a kfake broker on loopback.
func startNode(t *testing.T) (addr string, brokers []string) {
	t.Helper()
	brokers = publishtest.NewBroker(t).Addrs()
	return startNodeWith(t, brokers, publish.Security{}), brokers
}

// startNodeWith runs the node of startNode against brokers, which it
// reaches with sec.
func startNodeWith(t *testing.T, brokers []string, sec publish.Security) (addr string) {
	t.Helper()
	dir := t.TempDir()
	store, err := raftfsm.OpenStore(filepath.Join(dir, "pebble"), raftfsm.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(publish.Config{Brokers: brokers, Security: sec})
	if err != nil {
		t.Fatal(err)
	}
	rln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.Open(host.Config{NodeID: "n1", DataDir: filepath.Join(dir, "raft"), Shards: 2,
		RaftListener: rln, Store: store, Publisher: pub, Bootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	publishtest.WaitFor(t, 30*time.Second, "every shard has a leader", h.Ready)
	// The request path of a node alone, as chimed dev's.
	cl, err := cluster.New(cluster.Config{Self: membership.Meta{NodeID: "n1"}, Shards: 2, Replication: 1})
	if err != nil {
		t.Fatal(err)
	}
	cl.SetHost(h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.Register(gs, rpc.NewServer(cl, rpc.DefaultLimits(), time.Now, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the node: %v", err)
		}
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
		cl.Close()
		if err := h.Close(); err != nil {
			t.Errorf("host close: %v", err)
		}
		if err := pub.Close(); err != nil {
			t.Errorf("publisher close: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
	})
	return ln.Addr().String()
}

// serveProcessMetrics serves /metrics with the Prometheus process collector
// of the test process (where the node of startNode runs), as chimed does,
// and returns its address.
func serveProcessMetrics(t *testing.T) string {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func TestBenchAgainstARealNode(t *testing.T) {
	addr, brokers := startNode(t)
	svg := filepath.Join(t.TempDir(), "bench.svg")
	const events = 3000
	r := chimectl(t, nil, "", "--addr", addr, "--json", "bench", "--events", fmt.Sprint(events), "--callers", "4",
		"--batch", "50", "--delay", "200ms", "--delay-max", "700ms", "--brokers", strings.Join(brokers, ","),
		"--metrics", serveProcessMetrics(t), "--svg", svg, "--wait", "10s")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("--json output: %v\n%s", err, r.stdout)
	}
	for k, want := range map[string]float64{"acked": events, "consumed": events, "missing": 0, "early": 0, "failed": 0} {
		if s[k] != want {
			t.Errorf("%s = %v, want %v", k, s[k], want)
		}
	}
	// The records fell due over 0.5 s (200-700 ms after each call) and
	// went out after the first fell due.
	if s["drain_fired"] != float64(events) || s["drain_seconds"].(float64) < 0.4 || s["drain_seconds"].(float64) > 30 ||
		s["drain_per_second"].(float64) != float64(events)/s["drain_seconds"].(float64) {
		t.Errorf("drain figures: %v records over %v s at %v/s", s["drain_fired"], s["drain_seconds"], s["drain_per_second"])
	}
	if p, _ := s["processes"].([]any); len(p) != 1 {
		t.Errorf("processes = %v, want the one --metrics address", s["processes"])
	}
	if s["late_max_ms"].(float64) > 5000 || s["ack_p50_ms"].(float64) <= 0 || s["cpu_seconds_per_1000_events"].(float64) <= 0 || s["peak_rss_bytes"].(float64) <= 0 {
		t.Errorf("implausible figures: %s", r.stdout)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !strings.HasPrefix(string(b), "<svg xmlns=") || strings.Count(string(b), `class="line"`) != 6 {
		t.Errorf("--svg wrote %d bytes (%v), not a plot", len(b), err)
	}
	// The per-second lines go to stderr; --json keeps stdout for the summary.
	if strings.Contains(r.stdout, "acked/s") {
		t.Errorf("per-second lines on stdout with --json")
	}
}

// TestBenchRecurring: 20 schedules, each every second for 3 s, measured as 80 occurrences,
// with their phases spread over the second and aligned on it.
func TestBenchRecurring(t *testing.T) {
	addr, brokers := startNode(t)
	for _, aligned := range []string{"false", "true"} {
		benchRecurring(t, addr, brokers, aligned)
	}
}

func benchRecurring(t *testing.T, addr string, brokers []string, aligned string) {
	r := chimectl(t, nil, "", "--addr", addr, "--json", "bench", "--recurring", "20", "--recurring-for", "3s", "--recurring-aligned="+aligned,
		"--recurring-lead", "2s", "--callers", "4", "--brokers", strings.Join(brokers, ","), "--wait", "10s",
		"--metrics", serveProcessMetrics(t))
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("--json output: %v\n%s", err, r.stdout)
	}
	for k, want := range map[string]float64{"events": 80, "acked": 80, "consumed": 80, "missing": 0, "early": 0, "failed": 0, "calls": 20} {
		if s[k] != want {
			t.Errorf("aligned %s: %s = %v, want %v", aligned, k, s[k], want)
		}
	}
	if s["late_max_ms"].(float64) > 5000 {
		t.Errorf("implausible lateness: %s", r.stdout)
	}
	// The occurrences' CPU leaves out the creation and the lead: read from
	// the first occurrence on, it is some of the whole run's, not all.
	occ, _ := s["occurrence_cpu_seconds_per_1000"].(float64)
	if all := s["cpu_seconds_per_1000_events"].(float64); occ <= 0 || occ >= all {
		t.Errorf("aligned %s: occurrence_cpu_seconds_per_1000 = %v, want in (0, %v), the whole run's", aligned, occ, all)
	}
}

func TestBenchRejectsBadFlags(t *testing.T) {
	for _, c := range []struct{ args, msg string }{
		{"--events 0", "--events must be at least 1"},
		{"--batch 0", "--batch must be at least 1"},
		{"--delay 2s --delay-max 1s", "--delay-max (1s) must not be below --delay (2s)"},
		{"--rate -1", "--rate must not be negative"},
		{"--recurring 5 --recurring-for 0s", "--recurring-for and --recurring-lead must be at least 1s"},
		{"--recurring 5 --no-consume", "--recurring measures occurrences"},
		{"--api both --batch 5 --route=false", "--api both compares single Schedule calls"},
		{"--reschedule 1m", "--reschedule moves the due time of the updates: it needs --update"},
		{"--update --reschedule -5s", "--reschedule -5s: a negative --reschedule must be shorter than --delay (5s)"},
		{"--update --delay 1m --reschedule -2m", "a negative --reschedule must be shorter than --delay (1m0s)"},
		{"--update --due-at 3s --reschedule -10s", "--reschedule -10s: a negative --reschedule must be shorter than --due-at (3s)"},
	} {
		r := chimectl(t, nil, "", append([]string{"bench"}, strings.Fields(c.args)...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("bench %s: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.msg)
		}
	}
	// What the rule lets through: any later due time, and an earlier one
	// by less than the lead.
	for _, o := range []benchOptions{
		{update: true, reschedule: 10 * time.Minute, delay: 5 * time.Second},
		{update: true, reschedule: -4999 * time.Millisecond, delay: 5 * time.Second},
		{update: true, reschedule: -9 * time.Second, delay: 5 * time.Second, dueAt: 10 * time.Second},
	} {
		o.events, o.callers, o.batch, o.updateBatch, o.topic, o.api = 1, 1, 1, 1, "t", "client"
		if err := o.validate(); err != nil {
			t.Errorf("--update --reschedule %v --delay %v --due-at %v: %v", o.reschedule, o.delay, o.dueAt, err)
		}
	}
}

func TestBenchUpdate(t *testing.T) {
	addr, brokers := startNode(t)
	// Every update must reach its event before it fires: with -race on a
	// loaded 2-core machine, scheduling and updating 500 events took over
	// the 2 s this once gave them, and the late updates found events fired.
	const events = 500
	r := chimectl(t, nil, "", "--addr", addr, "--json", "bench", "--events", fmt.Sprint(events), "--callers", "4",
		"--batch", "50", "--delay", "8s", "--update", "--brokers", strings.Join(brokers, ","), "--wait", "10s")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("--json output: %v\n%s", err, r.stdout)
	}
	for k, want := range map[string]float64{"acked": events, "updated": events, "consumed": events, "missing": 0, "early": 0} {
		if s[k] != want {
			t.Errorf("%s = %v, want %v", k, s[k], want)
		}
	}
	if s["updates_per_second"].(float64) <= 0 || s["update_p50_ms"].(float64) <= 0 {
		t.Errorf("implausible update figures: %s", r.stdout)
	}
}

// TestBenchReschedule: with --update --reschedule, by single Update calls
// (the client's and the raw stub's) and by upserts, each event's due time
// moves and nothing else changes, which the events read back show (version
// 2, the new due time, the payload and priority they were scheduled with).
// The records' lateness is measured against the new due times (against the
// old, they would be early or late by the whole move), and bench waits for
// them until --wait after the new last due time (after the old, it would
// stop before they fall due).
func TestBenchReschedule(t *testing.T) {
	addr, brokers := startNode(t)
	const events = 300
	bench := func(args ...string) map[string]any {
		t.Helper()
		r := chimectl(t, nil, "", append([]string{"--addr", addr, "--json", "bench", "--events", fmt.Sprint(events), "--callers", "4",
			"--batch", "50", "--update", "--brokers", strings.Join(brokers, ",")}, args...)...)
		if r.code != 0 {
			t.Fatalf("bench %v: exit %d: %s", args, r.code, r.stderr)
		}
		var s map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("--json output: %v\n%s", err, r.stdout)
		}
		for k, want := range map[string]float64{"acked": events, "updated": events, "consumed": events, "missing": 0, "early": 0, "duplicates": 0} {
			if s[k] != want {
				t.Errorf("bench %v: %s = %v, want %v", args, k, s[k], want)
			}
		}
		if s["update_failed"] != nil {
			t.Errorf("bench %v: update_failed = %v", args, s["update_failed"])
		}
		// Measured against the old due times, the records would be a whole
		// --reschedule (4 s or more) late or early.
		if p50 := s["late_p50_ms"].(float64); p50 < 0 || p50 > 2000 {
			t.Errorf("bench %v: late_p50_ms = %v, not measured against the new due times", args, p50)
		}
		ratio, ups, aps := s["update_to_ingest"], s["updates_per_second"].(float64), s["acked_per_second"].(float64)
		if r, ok := ratio.(float64); !ok || r <= 0 || math.Abs(r-ups/aps) > 1e-9*r {
			t.Errorf("bench %v: update_to_ingest = %v, want updates_per_second/acked_per_second = %v", args, ratio, ups/aps)
		}
		return s
	}
	// get reads event id back once it is fired: its record can reach the
	// consumer a moment before the node records that it fired.
	get := func(id string) getJSON {
		t.Helper()
		var g getJSON
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for deadline := time.Now().Add(10 * time.Second); ; <-tick.C {
			r := chimectl(t, nil, "", "--addr", addr, "--json", "get", id)
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &g) != nil {
				t.Fatalf("get %s: exit %d: %s%s", id, r.code, r.stdout, r.stderr)
			}
			if g.State == "fired" || time.Now().After(deadline) {
				break
			}
		}
		if g.State != "fired" || g.Version != 2 || g.Payload != string(benchPayload(64)) {
			t.Errorf("%s: %s at version %d, payload %q; want fired at version 2 with the payload it was scheduled with", id, g.State, g.Version, g.Payload)
		}
		return g
	}
	parse := func(s *string) time.Time {
		t.Helper()
		if s == nil {
			t.Fatal("no time")
		}
		at, err := time.Parse(time.RFC3339Nano, *s)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}

	// Single Update calls, 8 s later: an Update keeps the event's
	// created_at, and the due time it was scheduled with was created_at +
	// --delay, so the new one is exactly 8 s after that. Bench waits for
	// the records until --wait after the last due time: the new one, or
	// it would stop 2 s before they fall due.
	bench("--delay", "5s", "--reschedule", "8s", "--wait", "6s", "--id-prefix", "later-")
	for _, n := range []int{0, 149, 299} {
		g := get(fmt.Sprintf("later-%d", n))
		if due, created := parse(g.Due), parse(g.CreatedAt); !due.Equal(created.Add(5*time.Second + 8*time.Second)) {
			t.Errorf("later-%d: due %v, created %v: want due = created + --delay 5s + --reschedule 8s", n, due, created)
		}
	}

	// The same through the raw stubs: an UpdateRequest with deliver_at
	// alone.
	bench("--api", "grpc", "--delay", "3s", "--reschedule", "3s", "--wait", "10s", "--id-prefix", "raw-")
	for _, n := range []int{0, 299} {
		g := get(fmt.Sprintf("raw-%d", n))
		if due, created := parse(g.Due), parse(g.CreatedAt); !due.Equal(created.Add(3*time.Second + 3*time.Second)) {
			t.Errorf("raw-%d: due %v, created %v: want due = created + --delay 3s + --reschedule 3s", n, due, created)
		}
	}

	// Upserts, 50 a call, 4 s earlier, with priorities: every event was due
	// at the bench's start + --due-at 10s, and is now at start + 6 s, with
	// its priority kept.
	before := time.Now()
	bench("--due-at", "10s", "--reschedule", "-4s", "--update-batch", "50", "--priorities", "--wait", "10s", "--id-prefix", "earlier-")
	var first time.Time
	for _, n := range []int{0, 137, 299} {
		g := get(fmt.Sprintf("earlier-%d", n))
		due := parse(g.Due)
		if first.IsZero() {
			first = due
		}
		if want := before.Add(6 * time.Second); !due.Equal(first) || due.Before(want) || due.After(want.Add(time.Second)) {
			t.Errorf("earlier-%d: due %v; want the same for all, between %v and a second later", n, due, want)
		}
		if g.Priority != uint32(n%10) {
			t.Errorf("earlier-%d: priority %d, want %d as scheduled", n, g.Priority, n%10)
		}
	}
}

// TestBenchRescheduleRecords: with --reschedule, a record's lateness is
// measured against the due time of its version, whether or not the
// update's answer was counted before the record arrived.
func TestBenchRescheduleRecords(t *testing.T) {
	const orig, move = int64(100_000) * 1e6, 4 * time.Second // unix ns: 100 s, and the move
	r := &benchRun{o: benchOptions{reschedule: move}, start: time.Unix(100, 0), prefix: "p-", dues: make([]int64, 4), seen: make([]bool, 4), moved: make([]bool, 4)}
	for n := range r.dues {
		r.dues[n] = orig
	}
	r.dues[1], r.moved[1] = orig+int64(move), true // update answered
	r.dues[3], r.moved[3] = orig+int64(move), true // answered, after its first version fired (an upsert renewed it)
	rec := func(n int, version uint64, firedMs int64) *kgo.Record {
		return &kgo.Record{Headers: []kgo.RecordHeader{{Key: chimev1.HeaderID, Value: []byte(fmt.Sprintf("p-%d", n))},
			{Key: chimev1.HeaderFired, Value: []byte(fmt.Sprint(firedMs))}, {Key: chimev1.HeaderVersion, Value: []byte(fmt.Sprint(version))}}}
	}
	now := time.Unix(200, 0)
	r.record(rec(0, 2, 104_010), now) // updated, its answer not counted yet: due at 104 s
	r.record(rec(1, 2, 104_020), now) // updated and counted
	r.record(rec(2, 1, 100_030), now) // never updated
	r.record(rec(3, 1, 100_040), now) // fired before the update
	if want := []float64{10, 20, 30, 40}; !slices.Equal(r.late, want) || r.early != 0 {
		t.Errorf("lateness %v, early %d; want %v, 0", r.late, r.early, want)
	}
}

// TestBenchOverTLSAndSASL: against a Kafka that takes only TLS with a
// client certificate and only SCRAM users, the node fires through its
// publish.Security and bench's consumer reads every record back with the
// --kafka-tls* and --kafka-sasl-* flags; with a wrong password bench stops
// before scheduling anything, saying why.
func TestBenchOverTLSAndSASL(t *testing.T) {
	ca := publishtest.NewCA(t, "kafka-ca")
	b := publishtest.NewBroker(t, kfake.TLS(ca.ServerTLS(t, true)), kfake.EnableSASL(),
		kfake.Superuser(publish.SASLScramSHA512, "chime", "s3cret"))
	node := ca.Issue(t, "node")
	addr := startNodeWith(t, b.Addrs(), publish.Security{
		TLS:  &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{node.TLS}},
		SASL: &publish.SASL{Mechanism: publish.SASLScramSHA512, User: "chime", Password: "s3cret"},
	})
	caFile, certFile, keyFile := ca.WriteFiles(t)
	args := []string{"--addr", addr, "--json", "bench", "--events", "200", "--callers", "2", "--batch", "50",
		"--delay", "200ms", "--brokers", strings.Join(b.Addrs(), ","), "--metrics", serveProcessMetrics(t), "--wait", "10s",
		"--kafka-tls-ca", caFile, "--kafka-tls-cert", certFile, "--kafka-tls-key", keyFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "chime"}

	r := chimectl(t, map[string]string{"CHIME_KAFKA_SASL_PASSWORD": "s3cret"}, "", args...)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("--json output: %v\n%s", err, r.stdout)
	}
	for k, want := range map[string]float64{"acked": 200, "consumed": 200, "missing": 0, "failed": 0} {
		if s[k] != want {
			t.Errorf("%s = %v, want %v", k, s[k], want)
		}
	}

	r = chimectl(t, map[string]string{"CHIME_KAFKA_SASL_PASSWORD": "wrong"}, "", args...)
	if r.code != 1 || !strings.Contains(r.stderr, "reaching the brokers") || strings.Contains(r.stdout, `"acked"`) {
		t.Fatalf("wrong password: exit %d, stdout %q, stderr %q; want exit 1 before scheduling, saying the brokers could not be reached", r.code, r.stdout, r.stderr)
	}
}

// TestBenchClientModes: --batcher gets every event acknowledged and fired
// through one shared Batcher, one ack latency per event; --api both sends
// single Schedule calls alternately through the client and the raw stubs
// and reports each side's latency.
func TestBenchClientModes(t *testing.T) {
	addr, brokers := startNode(t)
	run := func(events int, args ...string) map[string]any {
		t.Helper()
		r := chimectl(t, nil, "", append([]string{"--addr", addr, "--json", "bench", "--events", fmt.Sprint(events),
			"--brokers", strings.Join(brokers, ","), "--wait", "10s"}, args...)...)
		if r.code != 0 {
			t.Fatalf("bench %v: exit %d: %s", args, r.code, r.stderr)
		}
		var s map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("--json output: %v\n%s", err, r.stdout)
		}
		return s
	}
	s := run(2000, "--callers", "16", "--batcher", "--batch", "100", "--delay", "500ms")
	for k, want := range map[string]float64{"acked": 2000, "consumed": 2000, "missing": 0, "early": 0, "failed": 0, "calls": 2000} {
		if s[k] != want {
			t.Errorf("--batcher: %s = %v, want %v", k, s[k], want)
		}
	}
	s = run(200, "--callers", "1", "--batch", "1", "--route=false", "--api", "both", "--delay", "300ms")
	for k, want := range map[string]float64{"acked": 200, "consumed": 200, "missing": 0, "failed": 0, "calls": 100} {
		if s[k] != want {
			t.Errorf("--api both: %s = %v, want %v", k, s[k], want)
		}
	}
	if s["grpc_ack_p50_ms"] == nil || s["grpc_ack_p50_ms"].(float64) <= 0 || s["ack_p50_ms"].(float64) <= 0 {
		t.Errorf("--api both: no latency for each side: %v", s)
	}
}
