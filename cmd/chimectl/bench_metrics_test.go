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

// TestNodeCostSinceAMark: the CPU from a mark counts what each process spent
// after it, not before it, and leaves out a process that had not answered
// at the mark.
func TestNodeCostSinceAMark(t *testing.T) {
	early, late := &fakeProcess{start: 1795470000.25}, &fakeProcess{start: 1795470001.5}
	srvEarly := httptest.NewServer(early)
	t.Cleanup(srvEarly.Close)
	cost, err := newNodeCost([]string{strings.TrimPrefix(srvEarly.URL, "http://")}, &tlsFlags{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cost.sample(ctx)    // early: 1
	early.cpu.Store(20) // 20 s before the mark
	cost.sample(ctx)    // early: 21
	mark := cost.mark() // {early: 21}
	srvLate := httptest.NewServer(late)
	t.Cleanup(srvLate.Close)
	cost.addrs = append(cost.addrs, strings.TrimPrefix(srvLate.URL, "http://"))
	early.cpu.Store(24)
	late.cpu.Store(50)
	cost.sample(ctx) // early: 25, late: 51
	if got := cost.since(mark); got != 4 {
		t.Errorf("since(mark) = %v s, want 4 (early's 25 − 21; late was not at the mark)", got)
	}
	if _, cpu, _ := cost.totals(); cpu != 24 {
		t.Errorf("totals cpu = %v s, want 24 (early's 25 − 1; late's first sample is its last)", cpu)
	}
}
