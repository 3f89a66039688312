package console

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chimehq/chime/shard"
)

// TestQuantile: the estimates Prometheus's histogram_quantile gives for the
// same buckets.
func TestQuantile(t *testing.T) {
	bounds := []float64{1, 2, 4}
	cum := []float64{10, 20, 30, 40} // 10 in each bucket, 10 past the last bound
	for _, tc := range []struct{ q, want float64 }{
		{0.1, 0.4}, {0.25, 1}, {0.5, 2}, {0.6, 2.8}, {0.75, 4}, {0.99, 4}, {1, 4},
	} {
		if got := quantile(tc.q, bounds, cum); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := quantile(0.5, bounds, []float64{0, 0, 0, 0}); !math.IsNaN(got) {
		t.Errorf("quantile of nothing = %v, want NaN", got)
	}
	if got := quantile(0.5, bounds, []float64{0, 4, 4, 4}); got != 1.5 {
		t.Errorf("quantile with an empty first bucket = %v, want 1.5", got)
	}
	for _, tc := range []struct {
		cum        []float64
		bound      float64
		past, some bool
	}{
		{[]float64{10, 20, 20, 20}, 2, false, true},
		{[]float64{0, 0, 0, 5}, 4, true, true},
		{[]float64{3, 3, 3, 3}, 1, false, true},
		{[]float64{0, 0, 0, 0}, 0, false, false},
	} {
		b, past, ok := highest(bounds, tc.cum)
		if b != tc.bound || past != tc.past || ok != tc.some {
			t.Errorf("highest(%v) = %v, %v, %v; want %v, %v, %v", tc.cum, b, past, ok, tc.bound, tc.past, tc.some)
		}
	}
	for _, tc := range []struct {
		s    float64
		want string
	}{{0.0005, "0.5 ms"}, {0.0123, "12.3 ms"}, {0.25, "250 ms"}, {2.5, "2.5 s"}, {30, "30 s"}, {math.NaN(), "–"}} {
		if got := seconds(tc.s); got != tc.want {
			t.Errorf("seconds(%v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestRing keeps the first sample of each step, the newest keep of them,
// and finds a window's samples from the last one at or before its start.
func TestRing(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 9, 0, 0, 0, time.UTC)
	r := ring{ringSpec: ringSpec{step: time.Minute, keep: 3}}
	for _, off := range []time.Duration{5 * time.Second, 15 * time.Second, 62 * time.Second, 120 * time.Second, 210 * time.Second} {
		r.offer(sample{at: t0.Add(off)})
	}
	var kept []time.Duration
	for _, s := range r.samples {
		kept = append(kept, s.at.Sub(t0))
	}
	if want := []time.Duration{62 * time.Second, 120 * time.Second, 210 * time.Second}; !reflect.DeepEqual(kept, want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	for _, tc := range []struct {
		from time.Duration
		n    int
	}{{150 * time.Second, 2}, {120 * time.Second, 2}, {0, 3}, {300 * time.Second, 1}} {
		if got := r.since(t0.Add(tc.from)); len(got) != tc.n {
			t.Errorf("since(+%v): %d samples, want %d", tc.from, len(got), tc.n)
		}
	}
}

// TestWindowsAndMerge: a window's figures are the differences from its
// first sample (a zero one for the node's own counters, the first that has
// it for a shard's refires), and the cluster's are the nodes' summed, but
// refires, of which each shard's replicas count the same, the most any
// node saw.
func TestWindowsAndMerge(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 9, 0, 0, 0, time.UTC)
	bounds := []float64{0.01, 0.1}
	smp := func(off time.Duration, alpha []float64, early, retries float64, refired map[string]float64) sample {
		return sample{at: t0.Add(off), bounds: bounds, topics: map[string]histo{"alpha": {Buckets: alpha, Sum: alpha[2], Early: early}},
			retries: retries, refired: refired}
	}
	ss := []sample{
		{at: t0, zero: true},
		smp(time.Minute, []float64{1, 2, 2}, 0, 1, map[string]float64{"0": 7}),
		smp(2*time.Minute, []float64{3, 5, 6}, 0, 4, map[string]float64{"0": 9, "1": 1}),
	}
	latest := smp(150*time.Second, []float64{4, 8, 10}, 1, 5, map[string]float64{"0": 10, "1": 3})
	w := windowOf(ss, latest, time.Hour)
	if w.Covered != 150 || w.Retries != 5 {
		t.Errorf("covered %v, retries %v", w.Covered, w.Retries)
	}
	if got := w.Topics["alpha"]; !reflect.DeepEqual(got.Buckets, []float64{4, 8, 10}) || got.Early != 1 {
		t.Errorf("alpha %+v", got)
	}
	if !reflect.DeepEqual(w.Refired, map[string]float64{"0": 3, "1": 2}) {
		t.Errorf("refired %v", w.Refired)
	}
	w2 := windowOf(ss[1:], latest, time.Hour)
	if got := w2.Topics["alpha"].Buckets; !reflect.DeepEqual(got, []float64{3, 6, 8}) || w2.Retries != 4 {
		t.Errorf("from the first real sample: %v, retries %v", got, w2.Retries)
	}

	a := nodeFigures{Node: "a", Bounds: bounds, Windows: []windowFigures{w}}
	b := nodeFigures{Node: "b", Bounds: bounds, Windows: []windowFigures{{Window: 3600, Covered: 3600, Bounds: bounds,
		Topics:  map[string]histo{"alpha": {Buckets: []float64{0, 0, 2}}, "beta": {Buckets: []float64{1, 1, 1}}},
		Refired: map[string]float64{"0": 2, "1": 5}, DeadLettered: 2}}}
	down := nodeFigures{Node: "c", Error: "unreachable"}
	v := mergeWindows([]nodeFigures{a, b, down}, 0, "Last hour")
	if len(v.Rows) != 2 || v.Rows[0].Topic != "alpha" || v.Rows[0].Fired != 12 || v.Rows[0].Early != 1 || v.Rows[1].Fired != 1 {
		t.Fatalf("rows %+v", v.Rows)
	}
	if v.All.Fired != 13 || v.Dupes != 8 || v.Retries != 5 || v.DeadLettered != 2 {
		t.Errorf("all %+v, dupes %d, retries %d, dead %d", v.All, v.Dupes, v.Retries, v.DeadLettered)
	}
	if v.Rows[0].Max != "> 100 ms" || v.Rows[1].Max != "≤ 10 ms" {
		t.Errorf("max %q, %q", v.Rows[0].Max, v.Rows[1].Max)
	}
	if len(v.Short) != 1 || v.Short[0] != "a (2m30s)" {
		t.Errorf("short %v", v.Short)
	}
}

// TestGatherSample reads the instruments package shard registers, by the
// names the sampler knows them by.
func TestGatherSample(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := shard.NewMetrics(reg)
	m.TopicLateness.WithLabelValues("alpha").Observe(0.003)
	m.TopicLateness.WithLabelValues("alpha").Observe(0.2)
	m.TopicLateness.WithLabelValues("beta").Observe(40)
	m.Early.WithLabelValues("beta").Add(0) // present, and zero
	m.DeadLettered.Add(2)
	s, err := gatherSample(reg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.bounds) != 15 || s.deadLettered != 2 {
		t.Fatalf("bounds %v, dead-lettered %v", s.bounds, s.deadLettered)
	}
	alpha, beta := s.topics["alpha"], s.topics["beta"]
	if alpha.count() != 2 || beta.count() != 1 || beta.Buckets[14] != 0 || alpha.Buckets[3] != 1 {
		t.Errorf("alpha %+v beta %+v", alpha, beta)
	}
	if b, past, _ := highest(s.bounds, beta.Buckets); b != 30 || !past {
		t.Errorf("beta's highest %v past %v", b, past)
	}
}
