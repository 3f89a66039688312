package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeProcess serves the process_* metrics of one process whose CPU time
// grows by one second per scrape.
type fakeProcess struct {
	start float64
	cpu   atomic.Int64
}

func (p *fakeProcess) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	cpu := p.cpu.Add(1)
	fmt.Fprintf(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %d\n", cpu)
	fmt.Fprintf(w, "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %d\n", 1000*cpu)
	fmt.Fprintf(w, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %g\n", p.start)
}

// TestNodeCostCountsAProcessOnce: the three nodes of `chimed dev --nodes 3`
// share one process, and each one's /metrics reports all of its CPU time.
func TestNodeCostCountsAProcessOnce(t *testing.T) {
	shared := &fakeProcess{start: 1795470000.25}
	other := &fakeProcess{start: 1795470001.5}
	var addrs []string
	for _, h := range []http.Handler{shared, shared, shared, other} {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		addrs = append(addrs, strings.TrimPrefix(srv.URL, "http://"))
	}
	cost, err := newNodeCost(addrs, &tlsFlags{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cost.sample(ctx)
	shared.cpu.Store(10) // ten more seconds in the shared process, whichever node is asked
	other.cpu.Store(3)
	cost.sample(ctx)
	answered, cpu, _ := cost.totals()
	if len(answered) != 2 {
		t.Errorf("answered %v, want one address per process (2)", answered)
	}
	// The shared process's first answer read 1, 2 or 3 and its last 11,
	// 12 or 13, depending on which node was read first; the other one went
	// from 1 to 4.
	if cpu < 8+3 || cpu > 12+3 {
		t.Errorf("cpu = %v s, want the shared process counted once (about 10 s) plus 3 s", cpu)
	}
}
