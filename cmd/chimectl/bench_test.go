package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"

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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.Register(gs, rpc.NewServer(h, rpc.DefaultLimits(), time.Now, nil))
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(ln) }()
	t.Cleanup(func() {
		gs.Stop()
		<-done
		h.Close()
		pub.Close()
		store.Close()
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
		"--recurring-lead", "2s", "--callers", "4", "--brokers", strings.Join(brokers, ","), "--wait", "10s")
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
	} {
		r := chimectl(t, nil, "", append([]string{"bench"}, strings.Fields(c.args)...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("bench %s: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.msg)
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
