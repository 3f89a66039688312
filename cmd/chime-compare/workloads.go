package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// workload is one chimectl bench run and the figures of its summary that
// say how it went.
type workload struct {
	name string
	args []string // chimectl bench's; --events first, scaled by --scale
	figs []figure
}

// figure is one number of chimectl bench's --json summary, and the factor
// it is shown with (CPU seconds per 1000 events as µs per event).
type figure struct {
	key, label string
	factor     float64
}

var (
	throughput = figure{"acked_per_second", "acked events/s", 1}
	cpu        = figure{"cpu_seconds_per_1000_events", "CPU µs/event", 1000}
	ackP99     = figure{"ack_p99_ms", "ack p99 ms", 1}
	early      = figure{"early", "early", 1}
	missing    = figure{"missing", "missing", 1}
	lateP99    = figure{"late_p99_ms", "late p99 ms", 1}
	lateMax    = figure{"late_max_ms", "late max ms", 1}
	// The updates of --update: each pending event's next version.
	updatesPerSec = figure{"updates_per_second", "updates/s", 1}
	updateP99     = figure{"update_p99_ms", "update p99 ms", 1}
)

// workloadList are the workloads the targets of BENCHMARKS.md are measured
// with.
var workloadList = []workload{
	{"ingest", []string{"--events", "2000000", "--callers", "16", "--batch", "500", "--delay", "30m", "--no-consume"},
		[]figure{throughput, cpu, ackP99}},
	{"drain", []string{"--events", "1000000", "--callers", "16", "--batch", "500", "--due-at", "50s", "--spread", "1s", "--wait", "60s"},
		[]figure{{"drain_per_second", "drained events/s", 1}, cpu, early, missing, lateP99}},
	{"precision", []string{"--events", "600000", "--callers", "32", "--batch", "100", "--rate", "10000", "--delay", "2s"},
		[]figure{lateP99, lateMax, early, missing, cpu}},
	// update is BENCHMARKS.md's reschedule target: every pending event's due
	// time moved by upserts, 500 a call, at no less than 0.5 times the
	// ingest rate of the same run (updates/ingest).
	{"update", []string{"--events", "300000", "--callers", "16", "--batch", "500", "--delay", "1h", "--no-consume",
		"--update", "--update-batch", "500", "--reschedule", "10m"},
		[]figure{throughput, updatesPerSec, {"update_to_ingest", "updates/ingest", 1}, updateP99, cpu}},
	// update1 is the same reschedule by single Update calls, reported only.
	{"update1", []string{"--events", "30000", "--callers", "32", "--batch", "500", "--delay", "1h", "--no-consume",
		"--update", "--update-batch", "1", "--reschedule", "10m"},
		[]figure{updatesPerSec, updateP99, cpu}},
	// recurring's CPU per occurrence counts from the first occurrence on,
	// to set beside precision's CPU per event (the same 10,000 a second).
	{"recurring", []string{"--recurring", "10000", "--recurring-for", "60s", "--recurring-lead", "30s", "--callers", "32"},
		[]figure{lateP99, lateMax, early, missing, cpu, {"occurrence_cpu_seconds_per_1000", "CPU µs/occurrence", 1000}}},
	// topic is ingest through the Kafka ingest topic (chimed dev consumes
	// chime.schedule): acknowledged means applied, the ingest group's offset
	// committed past the record after Raft committed it. BENCHMARKS.md's
	// target: at least 0.8 times ingest's rate.
	{"topic", []string{"--events", "2000000", "--api", "topic", "--callers", "16", "--batch", "500", "--delay", "30m", "--no-consume"},
		[]figure{throughput, cpu, {"consumer_lag_max_records", "lag max records", 1}}},
}

func workloadNames() []string {
	var names []string
	for _, w := range workloadList {
		names = append(names, w.name)
	}
	return names
}

// pickWorkloads returns the workloads list names (a comma list), their
// event counts multiplied by scale.
func pickWorkloads(list string, scale float64) ([]workload, error) {
	if scale <= 0 || scale > 1 {
		return nil, fmt.Errorf("--scale %v: want a factor in (0, 1]", scale)
	}
	var out []workload
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(workloadList, func(w workload) bool { return w.name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown workload %q (known: %s)", name, strings.Join(workloadNames(), ", "))
		}
		w := workloadList[i]
		w.args = slices.Clone(w.args)
		for j := 0; j+1 < len(w.args); j++ {
			if w.args[j] == "--events" || w.args[j] == "--recurring" {
				n, _ := strconv.Atoi(w.args[j+1])
				w.args[j+1] = strconv.Itoa(max(1, int(float64(n)*scale)))
			}
		}
		out = append(out, w)
	}
	return out, nil
}

// brief is a run's figures on one line, for the progress log.
func (w workload) brief(figs map[string]float64) string {
	var parts []string
	for _, f := range w.figs {
		parts = append(parts, fmt.Sprintf("%s %s", f.label, format(figs[f.key]*f.factor)))
	}
	return strings.Join(parts, ", ")
}

// results are each side's runs of one workload, in the order they ran.
type results map[string][]map[string]float64

func (r results) add(side string, figs map[string]float64) { r[side] = append(r[side], figs) }

// stats are a figure's mean, lowest and highest over runs.
type stats struct{ mean, lo, hi float64 }

func (r results) stats(side string, f figure) stats {
	runs := r[side]
	if len(runs) == 0 {
		return stats{}
	}
	s := stats{lo: math.Inf(1), hi: math.Inf(-1)}
	for _, figs := range runs {
		v := figs[f.key] * f.factor
		s.mean += v / float64(len(runs))
		s.lo, s.hi = min(s.lo, v), max(s.hi, v)
	}
	return s
}

// print writes one table row per figure of w: each side's mean and range,
// and B/A of the means.
func (r results) print(out io.Writer, w workload) {
	fmt.Fprintf(out, "%s: chimectl bench %s (%d runs each)\n", w.name, strings.Join(w.args, " "), len(r["A"]))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tA mean\tA range\tB mean\tB range\tB/A\t")
	for _, f := range w.figs {
		a, b := r.stats("A", f), r.stats("B", f)
		ratio := "-"
		if a.mean != 0 {
			ratio = fmt.Sprintf("%.3f", b.mean/a.mean)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s-%s\t%s\t%s-%s\t%s\t\n", f.label, format(a.mean), format(a.lo), format(a.hi),
			format(b.mean), format(b.lo), format(b.hi), ratio)
	}
	// out is the terminal, as for the Fprint calls around it: a write to it
	// that fails has nowhere to be reported.
	_ = tw.Flush()
	fmt.Fprintln(out)
}

// format shows v with the precision its size deserves.
func format(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}
