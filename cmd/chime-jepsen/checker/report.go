package checker

import (
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/chimehq/chime/cmd/internal/latency"
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
		EarlyTolerance:    explicit(c.EarlyToleranceNs),
		CancelTolerance:   time.Duration(c.CancelToleranceNs),
		DuplicateGrace:    explicit(c.DuplicateGraceNs),
		FinalHealNs:       c.FinalHealNs,
		DeadLetterTopic:   c.DeadLetterTopic,
		PriorityTolerance: explicit(c.PriorityToleranceNs),
	}
}

// reportPage is the report's template. html/template escapes every value by its context
// (element text, attribute); only the SVG plots, which renderPlot escapes itself, go in as
// template.HTML, and the fault colours, from faultPalette, as template.CSS.
var reportPage = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<title>chime-jepsen: {{.Verdict}}</title>
<style>
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
<h1>chime-jepsen run: <span class="{{.VerdictClass}}">{{.Verdict}}</span></h1>
{{with .Start}}<p>Start {{.}} (t=0 below); {{$.Ops}} ops, {{$.Records}} records, {{$.Windows}} fault windows.</p>
{{end}}<h2>Checks</h2>
<table class="summary">
<tr><th class="l">check</th><th>count</th><th class="l">status</th></tr>
{{range .Checks}}<tr><td class="l{{with .NameClass}} {{.}}{{end}}">{{.Name}}</td><td>{{.Count}}</td><td class="l{{with .Class}} {{.}}{{end}}">{{.Status}}</td></tr>
{{end}}</table>
<p>Tolerances: early {{.Tolerances.Early}}, cancel {{.Tolerances.Cancel}}, duplicate grace {{.Tolerances.Grace}}, priority {{.Tolerances.Priority}}; final heal at {{.Tolerances.FinalHeal}}; dead-letter topic <code>{{.Tolerances.DeadLetter}}</code>.</p>
<h2>Lateness of first copies (ms, append time − due)</h2>
<table>
<tr><th class="l">period (by due time)</th><th>count</th><th>p50</th><th>p99</th><th>max</th></tr>
{{range .Lateness}}<tr><td class="l">{{.Name}}</td><td>{{.Count}}</td><td>{{.P50}}</td><td>{{.P99}}</td><td>{{.Max}}</td></tr>
{{end}}</table>
<h2>Duplicates by fault</h2>
<table>
<tr><th class="l">fault kind</th><th>extra copies</th></tr>
{{range .Duplicates}}<tr><td class="l">{{.Kind}}</td><td>{{.Count}}</td></tr>
{{end}}</table>
<h2>Faults and recovery</h2>
<table>
<tr><th class="l">kind</th><th class="l">targets</th><th>start (s)</th><th>heal (s)</th><th>recovery (ms)</th></tr>
{{range .Recovery}}<tr><td class="l"><span style="color:{{.Color}}">&#9632;</span> {{.Kind}}</td><td class="l">{{.Targets}}</td><td>{{.Start}}</td><td>{{.Heal}}</td><td>{{.RecoveryMs}}</td></tr>
{{end}}</table>
{{if .Backups}}<h2>Backups</h2>
<table>
<tr><th class="l">directory</th><th class="l">node</th><th>invoked (s)</th><th>took (s)</th><th class="l">outcome</th><th>shards</th><th>events</th><th class="l">error</th></tr>
{{range .Backups}}<tr><td class="l"><code>{{.Dir}}</code></td><td class="l">{{.Node}}</td><td>{{.Invoked}}</td><td>{{.Took}}</td><td class="l{{with .Class}} {{.}}{{end}}">{{.Outcome}}</td><td>{{.Shards}}</td><td>{{.Events}}</td><td class="l">{{.Error}}</td></tr>
{{end}}</table>
{{end}}{{if .Bursts}}<h2>Bursts (priority under a backlog)</h2>
<table>
<tr><th class="l">burst</th><th>due (s)</th><th>events</th><th>compared</th><th>drain (ms)</th><th class="l">status</th><th>violations</th></tr>
{{range .Bursts}}<tr><td class="l"><code>{{.Burst}}</code></td><td>{{.Due}}</td><td>{{.Events}}</td><td>{{.Judged}}</td><td>{{.Drain}}</td><td class="l{{with .Class}} {{.}}{{end}}">{{.Status}}</td><td>{{.Violations}}</td></tr>
{{end}}</table>
{{end}}<h2>Final state</h2>
{{if .Problems}}<ul class="bad">
{{range .Problems}}<li>{{.}}</li>
{{end}}</ul>
{{else}}<p class="good">Every shard has one leader; its replicas agree on applied index and digest.</p>
{{end}}<h2>Operations</h2>
<table>
<tr><th class="l">f</th>{{range .OpTypes}}<th>{{.}}</th>{{end}}</tr>
{{range .OpRows}}<tr><td class="l">{{.F}}</td>{{range .Counts}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{if .Examples}}<h2>Examples</h2>
{{range .Examples}}<h3>{{.Check}}</h3>
<ul>
{{range .Items}}<li><code>{{.ID}}</code>: {{.Why}}</li>
{{end}}</ul>
{{end}}{{end}}<h2>Lateness vs due time</h2>
{{.LatenessPlot}}<h2>Latency over time</h2>
{{.LatencyPlot}}</body>
</html>
`))

// ListSummary says how the list ops ended: "N ok, N failed, N unknown".
func (r Results) ListSummary() string {
	l := r.Ops[FList]
	return fmt.Sprintf("%d ok, %d failed, %d unknown", l[TypeOK], l[TypeFail], l[TypeInfo])
}

// IngestSummary says what went through the ingest topic: "N ids (N fired): N schedules and
// N tombstones acked, N failed, N unknown".
func (r Results) IngestSummary() string {
	i := r.Ingest
	return fmt.Sprintf("%d ids (%d fired): %d schedules and %d tombstones acked, %d failed, %d unknown",
		i.IDs, i.Fired, i.Schedules, i.Tombstones, r.Ops[FIngest][TypeFail], i.Unknown)
}

// BulkCancelSummary says how the cancel_matching ops ended and what the ok ones that were
// not dry runs did: "N ok (N cancelled, N skipped fired, N skipped held), N dry runs, N
// failed, N unknown".
func (r Results) BulkCancelSummary() string {
	c, b := r.Ops[FCancelMatching], r.BulkCancels
	return fmt.Sprintf("%d ok (%d cancelled, %d skipped fired, %d skipped held), %d dry runs, %d failed, %d unknown",
		b.Ops, b.Cancelled, b.SkippedFired, b.SkippedHeld, c[TypeOK]-b.Ops, c[TypeFail], c[TypeInfo])
}

// reportCheck is one row of the Checks table; NameClass and Class colour its first and last cells.
type reportCheck struct {
	Name, Count, Class, Status, NameClass string
}

func renderReport(ops []Op, recs []Record, res Results) string {
	a := analyze(ops, recs, configFrom(res.Config))
	kindColor, _ := kindColors(a.windows)
	bands := faultBands(a.windows, a.startNs, kindColor)
	type tolerances struct{ Early, Cancel, Grace, Priority, FinalHeal, DeadLetter string }
	type period struct {
		Name          string
		Count         int
		P50, P99, Max string
	}
	type dup struct {
		Kind  string
		Count int
	}
	type recovery struct {
		Color                                  template.CSS
		Kind, Targets, Start, Heal, RecoveryMs string
	}
	type opRow struct {
		F      string
		Counts []int
	}
	type backupRow struct {
		Dir, Node, Invoked, Took, Outcome, Class, Error string
		Shards, Events                                  int
	}
	type burstRow struct {
		Burst, Due, Drain, Status, Class string
		Events, Judged, Violations       int
	}
	type example struct{ ID, Why string }
	type exampleGroup struct {
		Check string
		Items []example
	}
	v := struct {
		Verdict, VerdictClass, Start string
		Ops, Records, Windows        int
		Checks                       []reportCheck
		Tolerances                   tolerances
		Lateness                     []period
		Duplicates                   []dup
		Recovery                     []recovery
		Backups                      []backupRow
		Bursts                       []burstRow
		Problems                     []string
		OpTypes                      []string
		OpRows                       []opRow
		Examples                     []exampleGroup
		LatenessPlot, LatencyPlot    template.HTML
	}{Verdict: "VALID", VerdictClass: "good", Ops: len(ops), Records: len(recs), Windows: len(a.windows),
		Problems: res.ConvergenceProblems}
	if !res.Valid {
		v.Verdict, v.VerdictClass = "INVALID", "bad"
	}
	if a.startNs != 0 {
		v.Start = time.Unix(0, a.startNs).UTC().Format(time.RFC3339Nano)
	}

	// Summary: the counted checks, then what is only reported.
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
		v.Checks = append(v.Checks, reportCheck{Name: name, Count: fmt.Sprint(n), Class: class, Status: status})
	}
	row("lost", res.Lost, true)
	row("early", res.Early, true)
	row("cancel_violations", res.CancelViolations, true)
	row("phantom", res.Phantom, true)
	row("idempotency_violations", res.IdempotencyViolations, true)
	row("expired_early", res.ExpiredEarly, true)
	row("resurrected", res.Resurrected, true)
	row("backup_lost", res.BackupLost, true)
	row("backup_phantom", res.BackupPhantom, true)
	row("backup_wrong_state", res.BackupWrongState, true)
	row("backup_invalid", res.BackupInvalid, true)
	row("update_violations", res.UpdateViolations, true)
	row("stale_reads", res.StaleReads, true)
	row("bulk_cancel_violations", res.BulkCancelViolations, true)
	row("recurring_missing", res.RecurringMissing, true)
	row("recurring_early", res.RecurringEarly, true)
	row("recurring_phantom", res.RecurringPhantom, true)
	row("recurring_after_stop", res.RecurringAfterStop, true)
	row("recurring_trigger_lost", res.RecurringTriggerLost, true)
	row("recurring_trigger_early", res.RecurringTriggerEarly, true)
	row("recurring_backfill_lost", res.RecurringBackfillLost, true)
	row("recurring_backfill_outside", res.RecurringBackfillOutside, true)
	row("priority_violations", res.PriorityViolations, true)
	row("tenant_violations", res.TenantViolations, true)
	row("ingest_lost", res.IngestLost, true)
	row("ingest_after_tombstone", res.IngestAfterTombstone, true)
	row("ingest_after_replace", res.IngestAfterReplace, true)
	row("ingest_rejected", res.IngestRejected, true)
	row("crashes", res.Crashes, true)
	conv, convClass := "yes", "good"
	if !res.Converged {
		conv, convClass = "no", "bad"
	}
	v.Checks = append(v.Checks, reportCheck{Name: "converged", Count: fmt.Sprintf("%d problems", len(res.ConvergenceProblems)), Class: convClass, Status: conv})
	row("early_under_skew", res.EarlyUnderSkew, false)
	row("invalid_accepted", res.InvalidAccepted, false)
	row("format_refusals", res.FormatRefusals, false)
	row("disk_exits", res.DiskExits, false)
	row("firing_orphans", res.FiringOrphans, false)
	v.Checks = append(v.Checks,
		reportCheck{Name: "duplicates (extra copies)", Count: fmt.Sprint(res.Duplicates), Status: "measured"},
		reportCheck{Name: "lists", Count: res.ListSummary()},
		reportCheck{Name: "bulk cancels", Count: res.BulkCancelSummary()},
		reportCheck{Name: "recurring occurrences", Count: fmt.Sprint(res.Occurrences), Status: "measured"},
		reportCheck{Name: "ingest", Count: res.IngestSummary(), Status: "measured"},
		reportCheck{Name: "bursts checked / skipped", Count: fmt.Sprintf("%d / %d", res.BurstsChecked, res.BurstsSkipped)},
		reportCheck{Name: "acked ids / delivered ids", Count: fmt.Sprintf("%d / %d", res.AckedIDs, res.DeliveredIDs)},
		reportCheck{Name: "records (dead-letter)", Count: fmt.Sprintf("%d (%d)", res.Records, res.DeadLetterRecords)},
		reportCheck{Name: "valid", Class: v.VerdictClass, Status: fmt.Sprint(res.Valid), NameClass: v.VerdictClass})
	v.Tolerances = tolerances{
		Early: time.Duration(res.Config.EarlyToleranceNs).String(), Cancel: time.Duration(res.Config.CancelToleranceNs).String(),
		Grace: time.Duration(res.Config.DuplicateGraceNs).String(), Priority: time.Duration(res.Config.PriorityToleranceNs).String(),
		FinalHeal:  relS(a, res.Config.FinalHealNs),
		DeadLetter: res.Config.DeadLetterTopic,
	}
	for _, p := range []struct {
		name string
		q    Quantiles
	}{{"healthy", res.LatenessMs.Healthy}, {"faulty", res.LatenessMs.Faulty}, {"after_heal", res.LatenessMs.AfterHeal}} {
		v.Lateness = append(v.Lateness, period{p.name, p.q.Count, latency.Format(p.q.P50), latency.Format(p.q.P99), latency.Format(p.q.Max)})
	}
	for _, k := range sortedKeys(res.DuplicatesByFault) {
		v.Duplicates = append(v.Duplicates, dup{k, res.DuplicatesByFault[k]})
	}
	for _, r := range res.Recovery {
		v.Recovery = append(v.Recovery, recovery{template.CSS(kindColor[r.Kind]), r.Kind, strings.Join(r.Targets, ", "),
			relS(a, r.StartNs), relS(a, r.HealNs), latency.Format(r.RecoveryMs)})
	}
	for _, b := range a.backups {
		r := backupRow{Dir: b.Dir, Node: b.Node, Invoked: relS(a, b.InvokeNs), Took: latency.Format(float64(b.CompleteNs-b.InvokeNs) / 1e9),
			Outcome: b.Type, Error: b.Error, Shards: len(b.BackupShards), Events: len(b.BackupEvents)}
		if why := backupInvalid(b); why != "" {
			r.Class, r.Error = "bad", why
		} else if b.Type != TypeOK {
			r.Class = "warn"
		}
		v.Backups = append(v.Backups, r)
	}
	for _, b := range res.Bursts {
		r := burstRow{Burst: b.Burst, Due: relS(a, b.DueNs), Drain: latency.Format(b.DrainMs), Status: "checked",
			Events: b.Events, Judged: b.Judged, Violations: b.Violations}
		switch {
		case b.Skipped != "":
			r.Status, r.Class = "skipped: "+b.Skipped, "warn"
			if b.LastAppendNs == 0 {
				r.Drain = "-"
			}
		case b.Violations > 0:
			r.Class = "bad"
		default:
			r.Class = "good"
		}
		v.Bursts = append(v.Bursts, r)
	}
	for _, m := range res.Ops {
		for t := range m {
			if !slices.Contains(v.OpTypes, t) {
				v.OpTypes = append(v.OpTypes, t)
			}
		}
	}
	slices.Sort(v.OpTypes)
	for _, f := range sortedKeys(res.Ops) {
		r := opRow{F: f}
		for _, t := range v.OpTypes {
			r.Counts = append(r.Counts, res.Ops[f][t])
		}
		v.OpRows = append(v.OpRows, r)
	}
	for _, check := range sortedKeys(res.Examples) {
		g := exampleGroup{Check: check}
		for _, e := range res.Examples[check] {
			g.Items = append(g.Items, example(e))
		}
		v.Examples = append(v.Examples, g)
	}

	var plot strings.Builder
	latency.Render(&plot, latenessPlot(a, bands))
	v.LatenessPlot = template.HTML(plot.String())
	plot.Reset()
	latency.Render(&plot, latencyPlot(a, ops, bands))
	v.LatencyPlot = template.HTML(plot.String())

	var b strings.Builder
	if err := reportPage.Execute(&b, v); err != nil {
		// The template and the view are fixed here: a failure is a bug in this file.
		panic(fmt.Sprintf("checker: report template: %v", err))
	}
	return b.String()
}

// latenessPlot: one dot per record at (due − start, append − due), classed by the worst thing
// about it.
func latenessPlot(a *analysis, bands []latency.Band) latency.Plot {
	first := latency.Series{Name: "first copy", Color: "#3b78c2", Radius: 1.5}
	dup := latency.Series{Name: "duplicate", Color: "#ff9800", Radius: 2}
	phantom := latency.Series{Name: "phantom", Color: "#8e24aa", Radius: 2.5}
	early := latency.Series{Name: "early", Color: "#d50000", Radius: 3}
	// The first copies of bursts' events, which a rate limit delays by design (check 12).
	burst := latency.Series{Name: "burst", Color: "#2e9e6b", Radius: 1.5}
	for _, id := range a.order {
		h := a.ids[id]
		for i, r := range h.records {
			due := a.dueNs(h, r)
			at := r.AppendMs * 1e6
			pt := latency.Point{X: float64(due-a.startNs) / 1e9, Y: float64(pastWindow(at-due, h.windowNs(r))) / 1e6}
			switch {
			case at < due-int64(a.cfg.EarlyTolerance):
				early.Points = append(early.Points, pt)
			case a.phantom(h, r) != "":
				phantom.Points = append(phantom.Points, pt)
			case i > 0:
				dup.Points = append(dup.Points, pt)
			case h.burst != "":
				burst.Points = append(burst.Points, pt)
			default:
				first.Points = append(first.Points, pt)
			}
		}
	}
	series := []latency.Series{first, dup, phantom, early}
	if len(burst.Points) > 0 { // a run without bursts keeps its legend as it was
		series = slices.Insert(series, 1, burst)
	}
	return latency.Plot{
		ID: "lateness", Title: "Lateness vs due time",
		XLabel: "due time (s since start)", YLabel: "lateness (ms, symlog)",
		Series: series,
		Bands:  bands, AnnotateMax: true,
	}
}

// latencyPlot: one dot per completed client op at (invoke − start, complete − invoke).
// Backups, which take seconds by design, are in their own table.
func latencyPlot(a *analysis, ops []Op, bands []latency.Band) latency.Plot {
	colors := map[string]string{TypeOK: "#81bffc", TypeInfo: "#ffa400", TypeFail: "#ff1e90"}
	byType := map[string]*latency.Series{}
	for i := range ops {
		op := &ops[i]
		if op.F == FNemesis || op.F == FBackup || op.CompleteNs < op.InvokeNs || op.InvokeNs == 0 {
			continue
		}
		s := byType[op.Type]
		if s == nil {
			c := colors[op.Type]
			if c == "" {
				c = "#777777"
			}
			s = &latency.Series{Name: op.Type, Color: c, Radius: 1.5}
			byType[op.Type] = s
		}
		s.Points = append(s.Points, latency.Point{X: float64(op.InvokeNs-a.startNs) / 1e9, Y: float64(op.CompleteNs-op.InvokeNs) / 1e6})
	}
	var ss []latency.Series
	for _, t := range []string{TypeOK, TypeInfo, TypeFail} { // failures on top
		if s := byType[t]; s != nil {
			ss = append(ss, *s)
			delete(byType, t)
		}
	}
	for _, t := range sortedKeys(byType) {
		ss = append(ss, *byType[t])
	}
	return latency.Plot{
		ID: "latency", Title: "Latency over time",
		XLabel: "invoke time (s since start)", YLabel: "latency (ms, symlog)",
		Series: ss, Bands: bands,
	}
}

func relS(a *analysis, ns int64) string {
	if ns == 0 {
		return "-"
	}
	return latency.Format(float64(ns-a.startNs) / 1e9)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
