package checker

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestWriteReport(t *testing.T) {
	g := genClean(11, 650)
	// Make the page show something in each class: an early record, a duplicate, a phantom.
	early := g.pick("acked", g.awayFromFaults)
	g.recs[g.recsOf(early)[0]].AppendMs -= 50
	dup := g.recs[g.recsOf(g.pick("acked_resend", nil))[0]]
	dup.Offset, dup.AppendMs = 424242, dup.AppendMs+1500
	g.recs = append(g.recs, dup)
	g.recs = append(g.recs, Record{ID: "ghost<&>", Topic: "reminders", Payload: "x", AppendMs: at(30*time.Second) / 1e6})
	res := g.check()
	if res.Valid || res.Early != 1 || res.Phantom != 1 || res.Duplicates != 1 {
		t.Fatalf("setup: valid %v early %d phantom %d duplicates %d", res.Valid, res.Early, res.Phantom, res.Duplicates)
	}

	dir := filepath.Join(t.TempDir(), "out")
	if err := WriteReport(dir, g.ops, g.recs, res); err != nil {
		t.Fatal(err)
	}

	// results.json: indented, round-trips to the same Results, has every documented key.
	js, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(js), "{\n  \"valid\": false,") {
		t.Errorf("results.json is not indented or does not start with valid: %.40q", js)
	}
	var back Results
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, res) {
		t.Errorf("results.json does not round-trip:\n got %+v\nwant %+v", back, res)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(js, &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"valid", "lost", "early", "early_under_skew", "cancel_violations", "phantom",
		"idempotency_violations", "expired_early", "resurrected", "backup_lost", "backup_phantom",
		"backup_wrong_state", "backup_invalid", "update_violations", "stale_reads", "bulk_cancel_violations", "bulk_cancels",
		"priority_violations", "bursts_checked", "bursts_skipped", "bursts",
		"duplicates", "duplicates_by_fault", "converged", "convergence_problems",
		"lateness_ms", "recovery", "ops", "examples"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("results.json has no %q", k)
		}
	}
	var late map[string]map[string]float64
	if err := json.Unmarshal(keys["lateness_ms"], &late); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"healthy", "faulty", "after_heal"} {
		for _, f := range []string{"count", "p50", "p99", "max"} {
			if _, ok := late[p][f]; !ok {
				t.Errorf("lateness_ms.%s has no %s", p, f)
			}
		}
	}
	var rec []map[string]any
	if err := json.Unmarshal(keys["recovery"], &rec); err != nil || len(rec) != len(genWindows) {
		t.Fatalf("recovery: %v, %d entries", err, len(rec))
	}
	for _, f := range []string{"kind", "targets", "start_ns", "heal_ns", "recovery_ms"} {
		if _, ok := rec[0][f]; !ok {
			t.Errorf("recovery[0] has no %s", f)
		}
	}

	// report.html: well-formed, self-contained, both plots with bands and legends.
	b, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict = true
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("report.html is not well-formed: %v", err)
		}
	}
	for _, bad := range []string{"http://", "https://", "<script", "src=", "@import"} {
		if strings.Contains(page, bad) {
			t.Errorf("report.html contains %q", bad)
		}
	}
	if n := strings.Count(page, "<svg "); n != 2 {
		t.Errorf("%d <svg> elements, want 2", n)
	}
	for _, want := range []string{
		`<span class="bad">INVALID</span>`,
		`id="lateness"`, `id="latency"`, "Lateness vs due time", "Latency over time",
		`data-series="first copy"`, `data-series="duplicate"`, `data-series="early"`, `data-series="phantom"`, `data-series="burst"`,
		`data-series="ok"`, `data-series="info"`, `data-series="fail"`,
		"ghost&lt;&amp;&gt;", "max ",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
	if n := strings.Count(page, `class="legend"`); n != 2 {
		t.Errorf("%d legends, want 2", n)
	}
	if n := strings.Count(page, `<g class="faults">`); n != 2 {
		t.Errorf("%d fault band groups, want 2", n)
	}
	for _, w := range genWindows {
		if n := strings.Count(page, "fault: "+w.kind+"<"); n != 2 {
			t.Errorf("legend entry for %s appears %d times, want 2 (one per plot)", w.kind, n)
		}
		if n := strings.Count(page, "<title>"+w.kind+" "); n != 2 {
			t.Errorf("band for %s appears %d times, want 2", w.kind, n)
		}
	}
	// The row for early is flagged, the ones for lost, backup_lost and bulk_cancel_violations are not.
	if !regexp.MustCompile(`<td class="l">early</td><td>1</td><td class="l bad">`).MatchString(page) ||
		!regexp.MustCompile(`<td class="l">lost</td><td>0</td><td class="l good">`).MatchString(page) ||
		!regexp.MustCompile(`<td class="l">backup_lost</td><td>0</td><td class="l good">`).MatchString(page) ||
		!regexp.MustCompile(`<td class="l">bulk_cancel_violations</td><td>0</td><td class="l good">`).MatchString(page) {
		t.Errorf("summary rows are not highlighted as expected")
	}
	// Bursts: a row for the rule, one for how many were judged, and a table, the skipped one
	// flagged with its reason.
	if !regexp.MustCompile(`<td class="l">priority_violations</td><td>0</td><td class="l good">`).MatchString(page) ||
		!strings.Contains(page, `<td class="l">bursts checked / skipped</td><td>1 / 1</td>`) ||
		!strings.Contains(page, "<h2>Bursts (priority under a backlog)</h2>") ||
		!regexp.MustCompile(`<td class="l"><code>burst2</code></td>.*<td class="l warn">skipped: fault window kill `).MatchString(page) ||
		!regexp.MustCompile(`<td class="l"><code>burst1</code></td><td>[\d.]+</td><td>30</td><td>30</td><td>[\d.]+</td><td class="l good">checked</td><td>0</td>`).MatchString(page) ||
		!strings.Contains(page, "priority 500ms") {
		t.Errorf("report.html lacks the burst rows and table")
	}
	// Lists and bulk cancels are summed up.
	if want := `<td class="l">lists</td><td>` + res.ListSummary() + `</td>`; !strings.Contains(page, want) ||
		!regexp.MustCompile(`<td class="l">bulk cancels</td><td>[1-9]\d* ok \([1-9]\d* cancelled, \d+ skipped fired, \d+ skipped held\), [1-9]\d* dry runs, [1-9]\d* failed, \d+ unknown</td>`).MatchString(page) {
		t.Errorf("report.html lacks the list and bulk cancel rows (%s; %s)", res.ListSummary(), res.BulkCancelSummary())
	}
	// Backups have a table of their own (the failed one flagged), and no dot in the latency plot.
	if !strings.Contains(page, "<h2>Backups</h2>") || strings.Count(page, "<td class=\"l\"><code>backup-0") != len(genBackups) ||
		!strings.Contains(page, `<td class="l warn">fail</td>`) {
		t.Errorf("report.html lacks the backups table, with a row per backup and the failed one flagged")
	}
	clientOps, dots := 0, 0
	for _, op := range g.ops {
		if op.F != FNemesis && op.F != FBackup && op.InvokeNs != 0 && op.CompleteNs >= op.InvokeNs {
			clientOps++
		}
	}
	for _, s := range latencyPlot(analyze(g.ops, g.recs, g.cfg), g.ops, nil).Series {
		dots += len(s.Points)
	}
	if dots != clientOps {
		t.Errorf("the latency plot has %d dots for %d client ops", dots, clientOps)
	}
}

func TestJSONLRoundTrip(t *testing.T) {
	dir := t.TempDir()
	g := genClean(2, 100)
	path := filepath.Join(dir, "history.jsonl")
	if err := WriteJSONL(path, g.ops); err != nil {
		t.Fatal(err)
	}
	ops, err := ReadJSONL[Op](path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ops, g.ops) {
		t.Errorf("ops do not round-trip")
	}
	// Field names are the documented ones.
	raw, _ := os.ReadFile(path)
	for _, k := range []string{`"index":`, `"f":"schedule"`, `"invoke_ns":`, `"complete_ns":`, `"type":"ok"`, `"ack_due_ns":`, `"kind":"kill"`, `"skew_ns":`} {
		if !strings.Contains(string(raw), k) {
			t.Errorf("history.jsonl has no %s", k)
		}
	}

	rpath := filepath.Join(dir, "records.jsonl")
	if err := WriteJSONL(rpath, g.recs); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadJSONL[Record](rpath)
	if err != nil || !reflect.DeepEqual(recs, g.recs) {
		t.Errorf("records do not round-trip: %v", err)
	}

	// Blank lines are skipped; a broken line is an error naming the line.
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"id\":\"a\"}\n\n{\"id\":\"b\"}\n{\"id\":\"c\""), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadJSONL[Record](bad); err == nil || !strings.Contains(err.Error(), "bad.jsonl:4:") {
		t.Errorf("truncated last line: err = %v, want one naming line 4", err)
	}
	if err := os.WriteFile(bad, []byte("{\"id\":\"a\"}\n\n{\"id\":\"b\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadJSONL[Record](bad); err != nil || len(got) != 2 || got[1].ID != "b" {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := ReadJSONL[Record](filepath.Join(dir, "missing.jsonl")); err == nil {
		t.Errorf("missing file: no error")
	}
}

// TestReportEscapesHostileStrings puts markup in every kind of string the
// page shows (a record's id and topic, a fault kind and target, an example's
// reason, a convergence problem) and checks none of it survives as markup.
func TestReportEscapesHostileStrings(t *testing.T) {
	const evil = `<script>alert(1)</script>`
	g := genClean(11, 650)
	g.recs = append(g.recs, Record{ID: "ghost" + evil, Topic: "t" + evil, Payload: "x", AppendMs: at(30*time.Second) / 1e6})
	res := g.check()
	if res.Phantom != 1 {
		t.Fatalf("setup: phantom %d, want the hostile record counted", res.Phantom)
	}
	res.ConvergenceProblems = append(res.ConvergenceProblems, "shard 0: "+evil)
	res.DuplicatesByFault = map[string]int{"kill" + evil: 1}
	res.Recovery = append(res.Recovery, Recovery{Kind: "kill" + evil, Targets: []string{"n1" + evil}})
	res.Ops = map[string]map[string]int{"schedule" + evil: {"ok" + evil: 1}}
	page := renderReport(g.ops, g.recs, res)
	if strings.Contains(page, "<script") {
		i := strings.Index(page, "<script")
		t.Fatalf("report.html contains unescaped markup: …%s…", page[max(0, i-80):min(len(page), i+80)])
	}
	if !strings.Contains(page, "ghost&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("the hostile id is not shown escaped")
	}
	if n := strings.Count(page, "&lt;script&gt;"); n < 6 {
		t.Errorf("%d escaped copies of the hostile string, want one per place it was put (at least 6)", n)
	}
}
