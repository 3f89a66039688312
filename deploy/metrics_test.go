package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The metric names the alerts and the dashboard may use are what chimed
// exports, found two ways: every "chime_..." string literal in the
// repository's Go code (which finds metrics registered only in states a short
// run does not reach, such as the per-rule rate-limit counter), and the
// families a running chimed dev serves on /metrics (which adds the Go and
// process collectors' go_* and process_* families, and proves that the scan
// finds how chimed names its metrics: every chime_* family scraped must be
// among the literals).

var metricLiteral = regexp.MustCompile(`"(chime_[a-z0-9_]+)"`)

// staticMetricNames returns every "chime_..." string literal of the non-test
// Go files under root.
func staticMetricNames(root string) (map[string]bool, error) {
	names := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricLiteral.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	return names, err
}

var scraped struct {
	once     sync.Once
	families map[string]string // name -> type
	err      error
}

// scrapedFamilies runs chimed dev once per test binary on free loopback
// ports, waits until its shards have leaders (the per-shard gauges exist
// from then on), and returns the metric families of one scrape of /metrics
// with their types.
func scrapedFamilies(t *testing.T) map[string]string {
	t.Helper()
	chimed, _ := builtBinaries(t)
	scraped.once.Do(func() { scraped.families, scraped.err = scrapeDev(chimed) })
	if scraped.err != nil {
		t.Fatal(scraped.err)
	}
	return scraped.families
}

func scrapeDev(chimed string) (map[string]string, error) {
	dataDir, err := os.MkdirTemp("", "chime-deploy-dev")
	if err != nil {
		return nil, err
	}
	// A data directory left behind is a temporary one the system cleans;
	// the scrape's outcome is what this returns.
	defer func() { _ = os.RemoveAll(dataDir) }()
	addrs := make([]string, 5)
	for i := range addrs {
		if addrs[i], err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	httpAddr := addrs[3]
	var stderr lockedBuffer
	cmd := exec.Command(chimed, "dev", "--log-level", "warn", "--shards", "2", "--data-dir", dataDir,
		"--grpc-addr", addrs[0], "--raft-addr", addrs[1], "--gossip-addr", addrs[2], "--http-addr", httpAddr, "--kafka-addr", addrs[4])
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // how the dev node exits after the scrape is not checked
	// Stopped however the scrape ends: SIGTERM, then SIGKILL if it has not
	// exited within its own shutdown timeout.
	defer func() {
		// Signal and Kill fail only for a process that has already exited.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(35 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	// Polls /readyz: the process reports readiness nowhere else.
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		resp, err := client.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close() // the status is the answer; the body is not read
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("chimed dev exited before it was ready: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("chimed dev: /readyz not 200 within 90 s: %s", stderr.String())
		}
		<-poll.C
	}
	resp, err := client.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return metricFamilies(resp.Body)
}

// metricFamilies reads the "# TYPE name type" lines of a Prometheus text
// exposition.
func metricFamilies(r io.Reader) (map[string]string, error) {
	families := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = f[3]
		}
	}
	return families, sc.Err()
}

func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

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

// exportedMetrics is the union of the two: what the alerts and the
// dashboard may name.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	static, err := staticMetricNames(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for name := range static {
		exported[name] = true
	}
	for name := range scrapedFamilies(t) {
		exported[name] = true
	}
	return exported
}

// TestStaticScanFindsScrapedMetrics: every chime_* family a running node
// serves is among the literals the static scan finds. If chimed built a
// name at run time (a prefix joined to a suffix), the scan would miss it and
// this fails, rather than the metric checks passing on an incomplete list.
func TestStaticScanFindsScrapedMetrics(t *testing.T) {
	static, err := staticMetricNames(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	families := scrapedFamilies(t)
	var chime, missing []string
	for name := range families {
		if strings.HasPrefix(name, "chime_") {
			chime = append(chime, name)
			if !static[name] {
				missing = append(missing, name)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("chimed dev serves metric families no \"chime_...\" literal in the Go code names: %v", missing)
	}
	// A node serves its own instruments, the per-shard gauges and the
	// publisher's counters; fewer than that means the scrape did not reach
	// a working node.
	for _, want := range []string{"chime_fire_lateness_seconds", "chime_shard_is_leader", "chime_publish_produced_total"} {
		if _, ok := families[want]; !ok {
			t.Errorf("chimed dev does not serve %s (it served %d chime_* families)", want, len(chime))
		}
	}
}

// metricToken finds what may be a metric name in a PromQL expression:
// Chime's, the Go and process collectors', and Prometheus's own up.
var metricToken = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_:$])((?:chime|go|process)_[a-zA-Z0-9_:]+|up)\b`)

// metricsIn returns the metric names an expression uses.
func metricsIn(expr string) []string {
	var names []string
	for _, m := range metricToken.FindAllStringSubmatch(expr, -1) {
		names = append(names, m[1])
	}
	return names
}

// unknownMetrics returns the names expr uses that exported lacks. A
// histogram is exported under its family name and queried as _bucket, _sum
// or _count; up is made by Prometheus for every target.
func unknownMetrics(expr string, exported map[string]bool) []string {
	var unknown []string
	for _, name := range metricsIn(expr) {
		if name == "up" || exported[name] {
			continue
		}
		found := false
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
				found = true
			}
		}
		if !found {
			unknown = append(unknown, name)
		}
	}
	return unknown
}

func TestUnknownMetricsIsStrict(t *testing.T) {
	exported := map[string]bool{"chime_fired_total": true, "chime_fire_lateness_seconds": true, "process_resident_memory_bytes": true}
	for expr, want := range map[string]string{
		`rate(chime_fired_total[5m])`: "",
		`histogram_quantile(0.99, sum by (le) (rate(chime_fire_lateness_seconds_bucket[5m])))`: "",
		`up{job="chime"} == 0`:                                 "",
		`process_resident_memory_bytes{instance=~"$instance"}`: "",
		`rate(chime_fired_totl[5m])`:                           "chime_fired_totl",
		`chime_fire_lateness_seconds_total`:                    "chime_fire_lateness_seconds_total",
		`sum(chime_fired_total) / go_no_such_metric`:           "go_no_such_metric",
		`rate(chime_fired_bucket[5m])`:                         "chime_fired_bucket",
	} {
		got := strings.Join(unknownMetrics(expr, exported), ",")
		if got != want {
			t.Errorf("unknownMetrics(%q) = %q, want %q", expr, got, want)
		}
	}
}
