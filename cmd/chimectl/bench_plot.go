package main

import (
	"fmt"
	"math"

	"github.com/chimehq/chime/cmd/internal/latency"
)

// plot draws the per-second timeline of a bench as one SVG: event rates on
// top, fire lateness (p50, p99, max of the events fired in each second, on
// a symlog scale) below. Seconds without a fired event break the lateness
// lines.
func (r *benchRun) plot() string {
	r.mu.Lock()
	acked := latency.Series{Name: "acknowledged", Color: "#1f77b4", Line: true}
	fired := latency.Series{Name: "fired", Color: "#d62728", Line: true}
	consumed := latency.Series{Name: "consumed", Color: "#2ca02c", Line: true}
	p50 := latency.Series{Name: "p50", Color: "#2ca02c", Line: true}
	p99 := latency.Series{Name: "p99", Color: "#ff7f0e", Line: true}
	pmax := latency.Series{Name: "max", Color: "#d62728", Line: true}
	for i, s := range r.secs {
		x := float64(i)
		acked.Points = append(acked.Points, latency.Point{X: x, Y: float64(s.acked)})
		fired.Points = append(fired.Points, latency.Point{X: x, Y: float64(s.fired)})
		consumed.Points = append(consumed.Points, latency.Point{X: x, Y: float64(s.consumed)})
		l := append([]float64(nil), s.late...)
		q50, q99, qmax := math.NaN(), math.NaN(), math.NaN()
		if len(l) > 0 {
			q50, q99, qmax = latency.Quantile(l, 0.5), latency.Quantile(l, 0.99), latency.Quantile(l, 1)
		}
		p50.Points = append(p50.Points, latency.Point{X: x, Y: q50})
		p99.Points = append(p99.Points, latency.Point{X: x, Y: q99})
		pmax.Points = append(pmax.Points, latency.Point{X: x, Y: qmax})
	}
	title := fmt.Sprintf("chimectl bench: %d events, %d callers, batch %d", r.o.events, r.o.callers, r.o.batch)
	r.mu.Unlock()

	return latency.StackSVG(
		latency.Plot{ID: "rates", Title: title, XLabel: "s since start", YLabel: "events per second",
			Series: []latency.Series{acked, fired, consumed}, LinearY: true},
		latency.Plot{ID: "lateness", Title: "fire lateness", XLabel: "s since start (by chime-fired)", YLabel: "lateness (ms, symlog)",
			Series: []latency.Series{p50, p99, pmax}},
	)
}
