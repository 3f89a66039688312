package checker

import (
	"encoding/json"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// WriteReport writes results.json (res, indented) and report.html (a self-contained page:
// summary tables and two inline SVG plots, no script, no external URL) into dir, creating it.
// ops and recs are the same history Check read; the tolerances come from res.Config.
func WriteReport(dir string, ops []Op, recs []Record, res Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	page := renderReport(ops, recs, res)
	return os.WriteFile(filepath.Join(dir, "report.html"), []byte(page), 0o644)
}

// configFrom rebuilds the Config a Results was checked with. A zero ConfigUsed (Results not
// made by Check) means the defaults; otherwise a zero tolerance was an explicit zero.
func configFrom(c ConfigUsed) Config {
	if c == (ConfigUsed{}) {
		return Config{}
	}
	explicit := func(ns int64) time.Duration {
		if ns == 0 {
			return -1
		}
		return time.Duration(ns)
	}
	return Config{
		EarlyTolerance:  explicit(c.EarlyToleranceNs),
		CancelTolerance: time.Duration(c.CancelToleranceNs),
		DuplicateGrace:  explicit(c.DuplicateGraceNs),
		FinalHealNs:     c.FinalHealNs,
		DeadLetterTopic: c.DeadLetterTopic,
	}
}

func renderReport(ops []Op, recs []Record, res Results) string {
	esc := html.EscapeString
	a := analyze(ops, recs, configFrom(res.Config))
	kindColor, _ := kindColors(a.windows)
	var b strings.Builder

	verdict, verdictClass := "VALID", "good"
	if !res.Valid {
		verdict, verdictClass = "INVALID", "bad"
	}
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n")
	fmt.Fprintf(&b, "<title>chime-jepsen: %s</title>\n", verdict)
	b.WriteString(`<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 10px; text-align: right; }
th { background: #f3f3f3; }
td.l, th.l { text-align: left; }
.good { background: #dff3df; color: #1b5e20; font-weight: bold; }
.bad { background: #fde0e0; color: #b71c1c; font-weight: bold; }
.warn { background: #fff3cd; color: #7a5b00; }
h1 span { padding: 2px 10px; }
code { font-size: 90%; }
svg.plot { display: block; margin-bottom: 1.5em; }
</style>
</head>
<body>
`)
	fmt.Fprintf(&b, "<h1>chime-jepsen run: <span class=\"%s\">%s</span></h1>\n", verdictClass, verdict)
	if a.startNs != 0 {
		fmt.Fprintf(&b, "<p>Start %s (t=0 below); %d ops, %d records, %d fault windows.</p>\n",
			time.Unix(0, a.startNs).UTC().Format(time.RFC3339Nano), len(ops), len(recs), len(a.windows))
	}

	// Summary: the counted checks, then what is only reported.
	b.WriteString("<h2>Checks</h2>\n<table class=\"summary\">\n<tr><th class=\"l\">check</th><th>count</th><th class=\"l\">status</th></tr>\n")
	row := func(name string, n int, counted bool) {
		class, status := "good", "ok"
		switch {
		case n > 0 && counted:
			class, status = "bad", "violated"
		case n > 0:
			class, status = "warn", "reported, not counted"
		case !counted:
			class, status = "", "reported, not counted"
		}
		fmt.Fprintf(&b, "<tr><td class=\"l\">%s</td><td>%d</td><td class=\"l %s\">%s</td></tr>\n", esc(name), n, class, status)
	}
	row("lost", res.Lost, true)
	row("early", res.Early, true)
	row("cancel_violations", res.CancelViolations, true)
	row("phantom", res.Phantom, true)
	row("idempotency_violations", res.IdempotencyViolations, true)
	conv, convClass := "yes", "good"
	if !res.Converged {
		conv, convClass = "no", "bad"
	}
	fmt.Fprintf(&b, "<tr><td class=\"l\">converged</td><td>%d problems</td><td class=\"l %s\">%s</td></tr>\n",
		len(res.ConvergenceProblems), convClass, conv)
	row("early_under_skew", res.EarlyUnderSkew, false)
	row("invalid_accepted", res.InvalidAccepted, false)
	fmt.Fprintf(&b, "<tr><td class=\"l\">duplicates (extra copies)</td><td>%d</td><td class=\"l\">measured</td></tr>\n", res.Duplicates)
	fmt.Fprintf(&b, "<tr><td class=\"l\">acked ids / delivered ids</td><td>%d / %d</td><td class=\"l\"></td></tr>\n", res.AckedIDs, res.DeliveredIDs)
	fmt.Fprintf(&b, "<tr><td class=\"l\">records (dead-letter)</td><td>%d (%d)</td><td class=\"l\"></td></tr>\n", res.Records, res.DeadLetterRecords)
	fmt.Fprintf(&b, "<tr><td class=\"l %s\">valid</td><td></td><td class=\"l %s\">%t</td></tr>\n", verdictClass, verdictClass, res.Valid)
	b.WriteString("</table>\n")
	fmt.Fprintf(&b, "<p>Tolerances: early %s, cancel %s, duplicate grace %s; final heal at %s; dead-letter topic <code>%s</code>.</p>\n",
		time.Duration(res.Config.EarlyToleranceNs), time.Duration(res.Config.CancelToleranceNs),
		time.Duration(res.Config.DuplicateGraceNs), relS(a, res.Config.FinalHealNs), esc(res.Config.DeadLetterTopic))

	// Lateness per period.
	b.WriteString("<h2>Lateness of first copies (ms, append time − due)</h2>\n<table>\n<tr><th class=\"l\">period (by due time)</th><th>count</th><th>p50</th><th>p99</th><th>max</th></tr>\n")
	for _, p := range []struct {
		name string
		q    Quantiles
	}{{"healthy", res.LatenessMs.Healthy}, {"faulty", res.LatenessMs.Faulty}, {"after_heal", res.LatenessMs.AfterHeal}} {
		fmt.Fprintf(&b, "<tr><td class=\"l\">%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			p.name, p.q.Count, trimFloat(p.q.P50), trimFloat(p.q.P99), trimFloat(p.q.Max))
	}
	b.WriteString("</table>\n")

	// Duplicates by fault.
	b.WriteString("<h2>Duplicates by fault</h2>\n<table>\n<tr><th class=\"l\">fault kind</th><th>extra copies</th></tr>\n")
	for _, k := range sortedKeys(res.DuplicatesByFault) {
		fmt.Fprintf(&b, "<tr><td class=\"l\">%s</td><td>%d</td></tr>\n", esc(k), res.DuplicatesByFault[k])
	}
	b.WriteString("</table>\n")

	// Recovery per fault.
	b.WriteString("<h2>Faults and recovery</h2>\n<table>\n<tr><th class=\"l\">kind</th><th class=\"l\">targets</th><th>start (s)</th><th>heal (s)</th><th>recovery (ms)</th></tr>\n")
	for _, r := range res.Recovery {
		fmt.Fprintf(&b, "<tr><td class=\"l\"><span style=\"color:%s\">&#9632;</span> %s</td><td class=\"l\">%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			kindColor[r.Kind], esc(r.Kind), esc(strings.Join(r.Targets, ", ")), relS(a, r.StartNs), relS(a, r.HealNs), trimFloat(r.RecoveryMs))
	}
	b.WriteString("</table>\n")

	// Convergence.
	b.WriteString("<h2>Final state</h2>\n")
	if len(res.ConvergenceProblems) == 0 {
		b.WriteString("<p class=\"good\">Every shard has one leader; its replicas agree on applied index and digest.</p>\n")
	} else {
		b.WriteString("<ul class=\"bad\">\n")
		for _, p := range res.ConvergenceProblems {
			fmt.Fprintf(&b, "<li>%s</li>\n", esc(p))
		}
		b.WriteString("</ul>\n")
	}

	// Operations by f and type.
	b.WriteString("<h2>Operations</h2>\n<table>\n<tr><th class=\"l\">f</th>")
	var types []string
	for _, m := range res.Ops {
		for t := range m {
			if !slices.Contains(types, t) {
				types = append(types, t)
			}
		}
	}
	slices.Sort(types)
	for _, t := range types {
		fmt.Fprintf(&b, "<th>%s</th>", esc(t))
	}
	b.WriteString("</tr>\n")
	for _, f := range sortedKeys(res.Ops) {
		fmt.Fprintf(&b, "<tr><td class=\"l\">%s</td>", esc(f))
		for _, t := range types {
			fmt.Fprintf(&b, "<td>%d</td>", res.Ops[f][t])
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n")

	// Examples.
	if len(res.Examples) > 0 {
		b.WriteString("<h2>Examples</h2>\n")
		for _, check := range sortedKeys(res.Examples) {
			fmt.Fprintf(&b, "<h3>%s</h3>\n<ul>\n", esc(check))
			for _, e := range res.Examples[check] {
				fmt.Fprintf(&b, "<li><code>%s</code>: %s</li>\n", esc(e.ID), esc(e.Why))
			}
			b.WriteString("</ul>\n")
		}
	}

	b.WriteString("<h2>Lateness vs due time</h2>\n")
	renderPlot(&b, latenessPlot(a, kindColor))
	b.WriteString("<h2>Latency over time</h2>\n")
	renderPlot(&b, latencyPlot(a, ops, kindColor))
	b.WriteString("</body>\n</html>\n")
	return b.String()
}

// latenessPlot: one dot per record at (due − start, append − due), classed by the worst thing
// about it.
func latenessPlot(a *analysis, kindColor map[string]string) plotSpec {
	first := series{name: "first copy", color: "#3b78c2", radius: 1.5}
	dup := series{name: "duplicate", color: "#ff9800", radius: 2}
	phantom := series{name: "phantom", color: "#8e24aa", radius: 2.5}
	early := series{name: "early", color: "#d50000", radius: 3}
	for _, id := range a.order {
		h := a.ids[id]
		for i, r := range h.records {
			due := a.dueNs(h, r)
			at := r.AppendMs * 1e6
			pt := point{x: float64(due-a.startNs) / 1e9, y: float64(at-due) / 1e6}
			switch {
			case at < due-int64(a.cfg.EarlyTolerance):
				early.pts = append(early.pts, pt)
			case a.phantom(h, r) != "":
				phantom.pts = append(phantom.pts, pt)
			case i > 0:
				dup.pts = append(dup.pts, pt)
			default:
				first.pts = append(first.pts, pt)
			}
		}
	}
	return plotSpec{
		id: "lateness", title: "Lateness vs due time",
		xLabel: "due time (s since start)", yLabel: "lateness (ms, symlog)",
		series:  []series{first, dup, phantom, early},
		windows: a.windows, startNs: a.startNs, kindColor: kindColor, annotateMax: true,
	}
}

// latencyPlot: one dot per completed client op at (invoke − start, complete − invoke).
func latencyPlot(a *analysis, ops []Op, kindColor map[string]string) plotSpec {
	colors := map[string]string{TypeOK: "#81bffc", TypeInfo: "#ffa400", TypeFail: "#ff1e90"}
	byType := map[string]*series{}
	for i := range ops {
		op := &ops[i]
		if op.F == FNemesis || op.CompleteNs < op.InvokeNs || op.InvokeNs == 0 {
			continue
		}
		s := byType[op.Type]
		if s == nil {
			c := colors[op.Type]
			if c == "" {
				c = "#777777"
			}
			s = &series{name: op.Type, color: c, radius: 1.5}
			byType[op.Type] = s
		}
		s.pts = append(s.pts, point{x: float64(op.InvokeNs-a.startNs) / 1e9, y: float64(op.CompleteNs-op.InvokeNs) / 1e6})
	}
	var ss []series
	for _, t := range []string{TypeOK, TypeInfo, TypeFail} { // failures on top
		if s := byType[t]; s != nil {
			ss = append(ss, *s)
			delete(byType, t)
		}
	}
	for _, t := range sortedKeys(byType) {
		ss = append(ss, *byType[t])
	}
	return plotSpec{
		id: "latency", title: "Latency over time",
		xLabel: "invoke time (s since start)", yLabel: "latency (ms, symlog)",
		series: ss, windows: a.windows, startNs: a.startNs, kindColor: kindColor,
	}
}

func relS(a *analysis, ns int64) string {
	if ns == 0 {
		return "-"
	}
	return trimFloat(float64(ns-a.startNs) / 1e9)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
