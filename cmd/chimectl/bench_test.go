package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
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
	"github.com/chimehq/chime/rpc/ingest"
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
// reaches with sec; with ingestTopics, it consumes them as chimed's
// --ingest-topics (group chime-ingest, Chime's format).
func startNodeWith(t *testing.T, brokers []string, sec publish.Security, ingestTopics ...string) (addr string) {
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
	srv := rpc.NewServer(cl, rpc.DefaultLimits(), time.Now, nil)
	rpc.Register(gs, srv)
	var ic *ingest.Consumer
	if len(ingestTopics) > 0 {
		var srcs []ingest.Source
		for _, topic := range ingestTopics {
			srcs = append(srcs, ingest.Source{Topic: topic})
		}
		if ic, err = ingest.New(ingest.Config{Brokers: brokers, Security: sec, Sources: srcs, API: srv}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the node: %v", err)
		}
	}()
	t.Cleanup(func() {
		if ic != nil {
			ic.Close()
		}
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

// TestBenchTopic: with --api topic, the events go in as records produced to
// the ingest topic; bench counts them acknowledged once the node's ingest
// group committed them, and matches the fired records, whose ids are
// <ingest topic>/<key>, to them: every one back, none early, by delay
// (chime-delay, the due time from the fired record) and by due time
// (chime-deliver-at).
func TestBenchTopic(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	addr := startNodeWith(t, brokers, publish.Security{}, "bench.ingest")
	const events = 2000
	for _, due := range [][]string{{"--delay", "500ms"}, {"--delay", "300ms", "--delay-max", "800ms", "--priorities"}} {
		r := chimectl(t, nil, "", append([]string{"--addr", addr, "--json", "bench", "--api", "topic", "--ingest-topic", "bench.ingest",
			"--events", fmt.Sprint(events), "--callers", "2", "--batch", "100", "--brokers", strings.Join(brokers, ","),
			"--metrics", serveProcessMetrics(t), "--wait", "10s"}, due...)...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", due, r.code, r.stderr)
		}
		var s map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("--json output: %v\n%s", err, r.stdout)
		}
		for k, want := range map[string]any{"api": "topic", "ingest_topic": "bench.ingest", "acked": float64(events), "broker_acked": float64(events),
			"consumed": float64(events), "missing": 0.0, "early": 0.0, "failed": 0.0, "duplicates": 0.0, "calls": float64(events)} {
			if s[k] != want {
				t.Errorf("%v: %s = %v, want %v", due, k, s[k], want)
			}
		}
		// Applied is the broker's acknowledgement and more: Raft's commit.
		if a, b := s["acked_per_second"].(float64), s["broker_acked_per_second"].(float64); a <= 0 || b <= 0 || s["send_seconds"].(float64) < s["broker_seconds"].(float64) {
			t.Errorf("%v: applied %v/s in %v s, broker %v/s in %v s", due, a, s["send_seconds"], b, s["broker_seconds"])
		}
		if s["consumer_lag_samples"] == nil || s["consumer_lag_max_records"] == nil || s["consumer_lag_max_records"].(float64) > events {
			t.Errorf("%v: consumer lag: %v samples, max %v", due, s["consumer_lag_samples"], s["consumer_lag_max_records"])
		}
		if s["late_max_ms"].(float64) > 5000 || s["drain_fired"] != float64(events) {
			t.Errorf("%v: implausible lateness: %s", due, r.stdout)
		}
	}
}

// TestBenchTopicUnapplied: against brokers no Chime consumes the ingest
// topic of, --api topic stops --wait after the last record was produced,
// saying what to check, and counts every record as failed.
func TestBenchTopicUnapplied(t *testing.T) {
	addr, brokers := startNode(t)
	r := chimectl(t, nil, "", "--addr", addr, "--json", "bench", "--api", "topic", "--events", "50", "--callers", "1",
		"--brokers", strings.Join(brokers, ","), "--no-consume", "--wait", "1s")
	if r.code != 1 || !strings.Contains(r.stderr, "50 records not committed by consumer group chime-ingest") {
		t.Fatalf("exit %d, stdout %s, stderr %s; want exit 1 saying the 50 records were not committed", r.code, r.stdout, r.stderr)
	}
}

func TestBenchTopicFlags(t *testing.T) {
	for _, c := range []struct{ args, msg string }{
		{"--api rest", `--api "rest": want client, grpc, both or topic`},
		{"--api topic --update", "--api topic produces each event as a record to the ingest topic: it takes none of"},
		{"--api topic --recurring 3", "it takes none of --update, --recurring and --batcher"},
		{"--api topic --batcher", "it takes none of --update, --recurring and --batcher"},
		{"--api topic --ingest-group=", "--api topic needs --ingest-topic and --ingest-group"},
		{"--api topic --topic chime.schedule", `--topic "chime.schedule" is an ingest topic`},
		{"--api topic --topic x --ingest-rejected-topic x", `--topic "x" is an ingest topic`},
	} {
		r := chimectl(t, nil, "", append([]string{"bench"}, strings.Fields(c.args)...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("bench %s: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.msg)
		}
	}
	// The defaults are chimed's, and --batch, --priorities and the due
	// options go with --api topic.
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	benchCommand().flags(&cli{}, fs)
	for name, want := range map[string]string{"ingest-topic": "chime.schedule", "ingest-group": "chime-ingest", "ingest-rejected-topic": "chime.ingest.rejected"} {
		if f := fs.Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("--%s: %v, want the default %q", name, f, want)
		}
	}
	o := benchOptions{events: 1, callers: 1, batch: 500, updateBatch: 1, topic: "t", api: "topic", ingestTopic: "chime.schedule",
		ingestGroup: "chime-ingest", ingestRejected: "chime.ingest.rejected", priorities: true, dueAt: time.Second, spread: time.Second}
	if err := o.validate(); err != nil {
		t.Errorf("--api topic --batch 500 --priorities --due-at 1s --spread 1s: %v", err)
	}
}

// TestBenchTopicIDs: an event of the ingest topic is <topic>/<key> in
// Chime, and the consumer side matches the fired records by that id (or by
// the key alone, from a node with --ingest-id-from-key), takes the due time
// from chime-due-unix-ms when the bench sent a delay, and counts the
// records the nodes rejected.
func TestBenchTopicIDs(t *testing.T) {
	if got := topicEventID("chime.schedule", "bench-1-7"); got != "chime.schedule/bench-1-7" {
		t.Errorf("topicEventID = %q", got)
	}
	for _, c := range []struct {
		id, rest string
		ok       bool
	}{
		{"chime.schedule/p-7", "7", true},
		{"p-7", "7", true}, // --ingest-id-from-key
		{"other.topic/p-7", "", false},
		{"chime.schedule/q-7", "", false},
		{"chime.schedule/", "", false},
	} {
		if rest, ok := topicIDRest(c.id, "chime.schedule", "p-"); rest != c.rest || ok != c.ok {
			t.Errorf("topicIDRest(%q) = %q, %v; want %q, %v", c.id, rest, ok, c.rest, c.ok)
		}
	}

	rec := func(id string, dueMs, firedMs int64) *kgo.Record {
		return &kgo.Record{Topic: "chime-bench", Headers: []kgo.RecordHeader{{Key: chimev1.HeaderID, Value: []byte(id)},
			{Key: chimev1.HeaderDue, Value: []byte(fmt.Sprint(dueMs))}, {Key: chimev1.HeaderFired, Value: []byte(fmt.Sprint(firedMs))}}}
	}
	o := benchOptions{api: "topic", ingestTopic: "chime.schedule", ingestRejected: "chime.ingest.rejected", delay: time.Second}
	r := &benchRun{o: o, start: time.Unix(100, 0), prefix: "p-", dues: make([]int64, 4), seen: make([]bool, 4), topic: &benchTopic{pending: newTopicPending()}}
	r.dues[2] = 101_000 * 1e6 // sent with chime-deliver-at 101 s
	now := time.Unix(200, 0)
	r.record(rec("chime.schedule/p-0", 102_000, 102_005), now) // chime-delay: due as the record says
	r.record(rec("p-1", 103_000, 103_007), now)                // --ingest-id-from-key
	r.record(rec("chime.schedule/p-2", 101_000, 101_003), now) // chime-deliver-at: due as sent
	r.record(rec("chime.schedule/p-2", 101_000, 101_004), now) // a duplicate
	r.record(rec("other/p-3", 101_000, 101_004), now)          // another topic's event
	r.record(rec("chime.schedule/p-9", 101_000, 101_004), now) // not of this run
	if want := []float64{5, 7, 3}; !slices.Equal(r.late, want) || r.consumed != 3 || r.dups != 1 || r.early != 0 || r.seen[3] {
		t.Errorf("lateness %v, consumed %d, duplicates %d, early %d, seen[3] %v; want %v, 3, 1, 0, false", r.late, r.consumed, r.dups, r.early, r.seen[3], want)
	}
	// The gRPC path's ids are the bench's own: an ingest id is not one.
	g := &benchRun{o: benchOptions{api: "client"}, start: time.Unix(100, 0), prefix: "p-", dues: make([]int64, 4), seen: make([]bool, 4)}
	g.dues[0] = 102_000 * 1e6
	g.record(rec("chime.schedule/p-0", 102_000, 102_005), now)
	if g.consumed != 0 {
		t.Errorf("the gRPC path counted an ingest id as its own")
	}

	// A record the nodes rejected counts as failed, with its chime-error,
	// and is no acknowledged schedule.
	r.rejectedRecord(&kgo.Record{Topic: "chime.ingest.rejected", Key: []byte("p-3"), Headers: []kgo.RecordHeader{{Key: "chime-error", Value: []byte("chime-topic: required")}}})
	r.rejectedRecord(&kgo.Record{Topic: "chime.ingest.rejected", Key: []byte("q-3")})
	r.acked.Store(4)
	r.topic.firstProduce.Store(time.Unix(100, 0).UnixNano())
	r.topic.applied = time.Unix(102, 0)
	s := r.summary(time.Unix(102, 0), time.Unix(103, 0), &nodeCost{firstCPU: map[string]float64{}, lastCPU: map[string]float64{}})
	if s.Rejected != 1 || s.Acked != 3 || s.Failed != 1 || s.SendSeconds != 2 || s.AckedPerSec != 1.5 || s.Missing != 0 ||
		!strings.Contains(s.FirstError, "record p-3 rejected by chimed: chime-topic: required") {
		t.Errorf("rejected %d, acked %d, failed %d, %v s, %v/s, missing %d, first error %q; want 1, 3, 1, 2 s, 1.5/s, 0 and p-3's",
			s.Rejected, s.Acked, s.Failed, s.SendSeconds, s.AckedPerSec, s.Missing, s.FirstError)
	}
}

// TestBenchTopicLag: the records of each partition count as applied once
// the group's committed offset (the next one it reads) is past them,
// whatever order the broker's acknowledgements came in, and the lag is the
// rest.
func TestBenchTopicLag(t *testing.T) {
	p := newTopicPending()
	for _, o := range []int64{10, 12, 11, 13, 14} { // out of order
		p.add(0, pendingRecord{offset: o, n: int(o)})
	}
	for o := int64(100); o < 103; o++ {
		p.add(1, pendingRecord{offset: o, n: int(o)})
	}
	p.add(2, pendingRecord{offset: 0, n: 0})
	nums := func(rs []pendingRecord) []int {
		var out []int
		for _, r := range rs {
			out = append(out, r.n)
		}
		slices.Sort(out)
		return out
	}
	// Nothing committed yet (partition 1 at -1, 2 not answered): all lag.
	applied, lag := p.advance(map[int32]int64{0: 10, 1: -1})
	if len(applied) != 0 || lag != 9 {
		t.Errorf("nothing committed: applied %v, lag %d; want none, 9", nums(applied), lag)
	}
	// 0 committed up to 13 (offsets 10-12 applied), 1 to 101 (100).
	applied, lag = p.advance(map[int32]int64{0: 13, 1: 101})
	if got := nums(applied); !slices.Equal(got, []int{10, 11, 12, 100}) || lag != 5 {
		t.Errorf("applied %v, lag %d; want [10 11 12 100], 5", got, lag)
	}
	// A committed offset that went nowhere applies nothing again.
	if applied, lag = p.advance(map[int32]int64{0: 13, 1: 101}); len(applied) != 0 || lag != 5 {
		t.Errorf("again: applied %v, lag %d; want none, 5", nums(applied), lag)
	}
	p.add(0, pendingRecord{offset: 15, n: 15})
	applied, lag = p.advance(map[int32]int64{0: 16, 1: 103, 2: 1})
	if got := nums(applied); !slices.Equal(got, []int{0, 13, 14, 15, 101, 102}) || lag != 0 {
		t.Errorf("all committed: applied %v, lag %d; want [0 13 14 15 101 102], 0", got, lag)
	}
	if got := p.partitions(); !slices.Equal(got, []int32{0, 1, 2}) {
		t.Errorf("partitions %v", got)
	}
}
