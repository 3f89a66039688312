package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// nodeCost reads what each chimed process costs from the process_* metrics
// its /metrics exports (the Prometheus process collector):
// process_cpu_seconds_total and process_resident_memory_bytes. It works for
// any node bench can reach, local or not.
//
// Several nodes can share one process (chimed dev --nodes 3), and each of
// their /metrics then reports that process: a process is counted once, known
// by its host and its process_start_time_seconds.
type nodeCost struct {
	addrs  []string // host:port of each node's HTTP server
	client *http.Client
	scheme string // http, or https with --tls

	mu sync.Mutex
	// CPU seconds of each process at its first and latest answered
	// sample: a process that misses a sample costs nothing in the sum.
	firstCPU, lastCPU map[string]float64
	addrOf            map[string]string // a process's first address
	peakRSS           int64             // the largest RSS any one process had at a sample
}

// newNodeCost reads the nodes' /metrics over HTTP, or HTTPS when the --tls
// flags are set (a node with TLS serves its HTTP port in TLS too).
func newNodeCost(addrs []string, t *tlsFlags) (*nodeCost, error) {
	m := &nodeCost{addrs: addrs, client: &http.Client{Timeout: 2 * time.Second}, scheme: "http",
		firstCPU: map[string]float64{}, lastCPU: map[string]float64{}, addrOf: map[string]string{}}
	if t.on() {
		cfg, err := t.config("")
		if err != nil {
			return nil, err
		}
		m.client.Transport = &http.Transport{TLSClientConfig: cfg}
		m.scheme = "https"
	}
	return m, nil
}

// sample reads every node once and returns the CPU seconds so far and the
// resident memory now, summed over the nodes that answered.
func (m *nodeCost) sample(ctx context.Context) (cpu float64, rss int64) {
	type reading struct {
		addr            string
		cpu, rss, start float64
		err             error
	}
	out := make([]reading, len(m.addrs))
	var wg sync.WaitGroup
	for i, addr := range m.addrs {
		wg.Go(func() {
			out[i].addr = addr
			out[i].cpu, out[i].rss, out[i].start, out[i].err = m.read(ctx, addr)
		})
	}
	wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range out {
		if r.err != nil {
			continue
		}
		host, _, _ := net.SplitHostPort(r.addr)
		proc := host + "|" + strconv.FormatFloat(r.start, 'f', -1, 64)
		if seen[proc] {
			continue
		}
		seen[proc] = true
		if _, ok := m.firstCPU[proc]; !ok {
			m.firstCPU[proc], m.addrOf[proc] = r.cpu, r.addr
		}
		m.lastCPU[proc] = r.cpu
		m.peakRSS = max(m.peakRSS, int64(r.rss))
		cpu += r.cpu
		rss += int64(r.rss)
	}
	return cpu, rss
}

// totals is the processes that answered at least once (by the first address
// each answered on), the CPU seconds they spent between their first and
// latest sample, and the largest resident memory any one of them had at a
// sample.
func (m *nodeCost) totals() (answered []string, cpu float64, peakRSS int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	answered = []string{}
	for proc, first := range m.firstCPU {
		answered = append(answered, m.addrOf[proc])
		cpu += m.lastCPU[proc] - first
	}
	slices.Sort(answered)
	return answered, cpu, m.peakRSS
}

// mark is each process's CPU seconds at its latest answered sample.
func (m *nodeCost) mark() map[string]float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.lastCPU)
}

// since is the CPU seconds the processes of mark spent from it to their
// latest sample.
func (m *nodeCost) since(mark map[string]float64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	cpu := 0.0
	for proc, at := range mark {
		cpu += m.lastCPU[proc] - at
	}
	return cpu
}

// read scrapes http://addr/metrics for the process's CPU seconds, resident
// bytes and start time.
func (m *nodeCost) read(ctx context.Context, addr string) (cpu, rss, start float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.scheme+"://"+addr+"/metrics", nil)
	if err != nil {
		return 0, 0, 0, err
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = resp.Body.Close() }() // read only: a read error is what matters
	if resp.StatusCode != http.StatusOK {
		return 0, 0, 0, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s/metrics: %w", addr, err)
	}
	c, r, st := fams["process_cpu_seconds_total"], fams["process_resident_memory_bytes"], fams["process_start_time_seconds"]
	if len(c.GetMetric()) == 0 || len(r.GetMetric()) == 0 || len(st.GetMetric()) == 0 {
		return 0, 0, 0, fmt.Errorf("%s/metrics has no process_cpu_seconds_total, process_resident_memory_bytes or process_start_time_seconds", addr)
	}
	return c.GetMetric()[0].GetCounter().GetValue(), r.GetMetric()[0].GetGauge().GetValue(), st.GetMetric()[0].GetGauge().GetValue(), nil
}

// devHTTPAddr is the HTTP address chimed dev derives from its gRPC address
// when --http-addr is not given: the same host, the gRPC port + 10.
func devHTTPAddr(grpcAddr string) (string, bool) {
	host, port, err := net.SplitHostPort(grpcAddr)
	if err != nil {
		return "", false
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", false
	}
	return net.JoinHostPort(host, strconv.Itoa(p+10)), true
}
