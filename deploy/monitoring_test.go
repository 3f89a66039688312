package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// specAlerts are the alert names issues 21 and 40 fix; docs/operations.md#alerts
// explains each under its name, and runbooks link there.
var specAlerts = []string{
	"ChimeNodeDown",
	"ChimeEventsFiringLate",
	"ChimeShardWithoutLeader",
	"ChimeReplicasBelowReplicationFactor",
	"ChimeDeadLetters",
	"ChimeProduceFailing",
	"ChimeDiskNearlyFull",
	"ChimeIngestSlow",
	"ChimeIngestTopicLagging",
	"ChimeIngestTopicRejecting",
}

const runbook = "docs/operations.md#alerts"

// ruleFile is the shape of a Prometheus rule file holding alerting rules
// only; decoded strictly, a misspelt or misplaced key is an error.
type ruleFile struct {
	Groups []struct {
		Name     string      `json:"name"`
		Interval string      `json:"interval,omitempty"`
		Rules    []alertRule `json:"rules"`
	} `json:"groups"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

var promDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)

// checkAlerts decodes a rule file strictly and checks each alert's shape,
// and that the alert names are exactly the spec's.
func checkAlerts(data []byte) ([]alertRule, error) {
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("not a strict Prometheus rule file: %w", err)
	}
	var rules []alertRule
	var errs []string
	seen := map[string]bool{}
	for _, g := range f.Groups {
		if g.Name == "" {
			errs = append(errs, "a group without a name")
		}
		for _, r := range g.Rules {
			rules = append(rules, r)
			where := fmt.Sprintf("group %q, alert %q", g.Name, r.Alert)
			if seen[r.Alert] {
				errs = append(errs, where+": twice")
			}
			seen[r.Alert] = true
			if strings.TrimSpace(r.Expr) == "" {
				errs = append(errs, where+": no expr")
			}
			if !promDuration.MatchString(r.For) {
				errs = append(errs, fmt.Sprintf("%s: for %q is not a Prometheus duration", where, r.For))
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				errs = append(errs, fmt.Sprintf("%s: severity label %q, want critical, warning or info", where, s))
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					errs = append(errs, fmt.Sprintf("%s: no %s annotation", where, a))
				}
			}
			if r.Annotations["runbook"] != runbook {
				errs = append(errs, fmt.Sprintf("%s: runbook annotation %q, want %q", where, r.Annotations["runbook"], runbook))
			}
		}
	}
	var names []string
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	want := append([]string(nil), specAlerts...)
	sort.Strings(want)
	if strings.Join(names, " ") != strings.Join(want, " ") {
		errs = append(errs, fmt.Sprintf("alert names %v, want exactly %v", names, want))
	}
	if len(errs) > 0 {
		return rules, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return rules, nil
}

func TestAlerts(t *testing.T) {
	rules, err := checkAlerts(readFile(t, "prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	for _, r := range rules {
		if unknown := unknownMetrics(r.Expr, exported); len(unknown) > 0 {
			t.Errorf("alert %s uses metrics chimed does not export: %v", r.Alert, unknown)
		}
		if len(metricsIn(r.Expr)) == 0 {
			t.Errorf("alert %s: no metric found in %q", r.Alert, r.Expr)
		}
	}
}

func TestCheckAlertsRejects(t *testing.T) {
	good := readFile(t, "prometheus/alerts.yml")
	for name, bad := range map[string][]byte{
		"an unknown field":   bytes.Replace(good, []byte("        for: 2m\n"), []byte("        for: 2m\n        keep_firing: 5m\n"), 1),
		"a misspelt key":     bytes.Replace(good, []byte("annotations:"), []byte("anotations:"), 1),
		"a missing alert":    bytes.Replace(good, []byte("alert: ChimeIngestSlow"), []byte("alert: ChimeIngestSlower"), 1),
		"no severity":        bytes.Replace(good, []byte("severity: critical"), []byte("priority: critical"), 1),
		"another runbook":    bytes.Replace(good, []byte(`runbook: "docs/operations.md#alerts"`), []byte(`runbook: "docs/ops.md"`), 1),
		"a bad for duration": bytes.Replace(good, []byte("for: 10m"), []byte("for: ten minutes"), 1),
	} {
		if bytes.Equal(bad, good) {
			t.Fatalf("%s: the planted change did not apply", name)
		}
		if _, err := checkAlerts(bad); err == nil {
			t.Errorf("%s: checkAlerts accepted it", name)
		}
	}
}

// TestAlertsDocumented: every alert's runbook is docs/operations.md#alerts,
// so that section must exist and name each alert.
func TestAlertsDocumented(t *testing.T) {
	ops := string(readFile(t, filepath.Join(repoRoot(t), "docs", "operations.md")))
	if !regexp.MustCompile(`(?m)^#+ Alerts\s*$`).MatchString(ops) {
		t.Errorf("docs/operations.md has no \"Alerts\" heading, which the alerts' runbook %s points at", runbook)
	}
	for _, name := range specAlerts {
		if !strings.Contains(ops, name) {
			t.Errorf("docs/operations.md does not explain %s", name)
		}
	}
}

// dashboard is the part of a Grafana dashboard the checks read; the rest of
// Grafana's model is left to Grafana.
type dashboard struct {
	SchemaVersion int    `json:"schemaVersion"`
	UID           string `json:"uid"`
	Title         string `json:"title"`
	Panels        []struct {
		ID         int               `json:"id"`
		Type       string            `json:"type"`
		Title      string            `json:"title"`
		Datasource map[string]string `json:"datasource"`
		Targets    []struct {
			Expr       string            `json:"expr"`
			RefID      string            `json:"refId"`
			Datasource map[string]string `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// dashboardPanels are the panels issue 21 asks for, by title.
var dashboardPanels = []string{"Fire lateness", "Fired/s", "Pending events", "Fire time by stage (p99)", "Raft leadership",
	"Produce errors", "Ingest lag", "Disk free", "Voters vs replication factor", "Ingest topic lag", "Ingest topic records/s"}

// dashboardMetrics are the series those panels are about: each must be
// queried somewhere on the dashboard.
var dashboardMetrics = []string{"chime_fire_lateness_seconds_bucket", "chime_fired_total", "chime_shard_pending_events",
	"chime_fire_stage_seconds_bucket", "chime_shard_is_leader", "chime_shard_leadership_gained_total",
	"chime_publish_retries_total", "chime_publish_failed_total", "chime_dead_lettered_total", "chime_ingest_seconds_bucket",
	"chime_data_dir_free_bytes", "chime_data_dir_size_bytes", "chime_shard_voters", "chime_replication_factor",
	"chime_ingest_topic_lag_records", "chime_ingest_topic_records_total"}

const dsVar = "${DS_PROMETHEUS}"

// checkDashboard parses a dashboard and checks its panels, variables and
// data sources; it returns every target's expression.
func checkDashboard(data []byte) ([]string, error) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var errs []string
	if d.SchemaVersion < 39 {
		errs = append(errs, fmt.Sprintf("schemaVersion %d, want 39 or later", d.SchemaVersion))
	}
	if d.UID == "" || d.Title == "" {
		errs = append(errs, "no uid or title")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["DS_PROMETHEUS"] != "datasource" {
		errs = append(errs, "no datasource variable DS_PROMETHEUS")
	}
	if vars["instance"] != "query" {
		errs = append(errs, "no query variable instance")
	}
	var exprs []string
	titles := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			errs = append(errs, fmt.Sprintf("panel id %d twice", p.ID))
		}
		ids[p.ID] = true
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource["uid"] != dsVar {
			errs = append(errs, fmt.Sprintf("panel %q: data source %v, want uid %s", p.Title, p.Datasource, dsVar))
		}
		if len(p.Targets) == 0 {
			errs = append(errs, fmt.Sprintf("panel %q has no targets", p.Title))
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				errs = append(errs, fmt.Sprintf("panel %q, target %s: no expr", p.Title, tg.RefID))
			}
			if uid := tg.Datasource["uid"]; uid != "" && uid != dsVar {
				errs = append(errs, fmt.Sprintf("panel %q, target %s: data source uid %s, want %s", p.Title, tg.RefID, uid, dsVar))
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, title := range dashboardPanels {
		if !titles[title] {
			errs = append(errs, fmt.Sprintf("no panel %q", title))
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricsIn(e) {
			used[m] = true
		}
	}
	for _, m := range dashboardMetrics {
		if !used[m] {
			errs = append(errs, fmt.Sprintf("no panel queries %s", m))
		}
	}
	if len(errs) > 0 {
		return exprs, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return exprs, nil
}

func TestDashboard(t *testing.T) {
	exprs, err := checkDashboard(readFile(t, "grafana/chime.json"))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	for _, e := range exprs {
		if unknown := unknownMetrics(e, exported); len(unknown) > 0 {
			t.Errorf("dashboard query %q uses metrics chimed does not export: %v", e, unknown)
		}
	}
}

func TestCheckDashboardRejects(t *testing.T) {
	good := readFile(t, "grafana/chime.json")
	for name, bad := range map[string][]byte{
		"not JSON":             good[:len(good)/2],
		"an old schema":        bytes.Replace(good, []byte(`"schemaVersion": 39`), []byte(`"schemaVersion": 16`), 1),
		"a panel missing":      bytes.Replace(good, []byte(`"title": "Ingest lag"`), []byte(`"title": "Ingest"`), 1),
		"a fixed data source":  bytes.Replace(good, []byte(`"uid": "${DS_PROMETHEUS}"`), []byte(`"uid": "abc123"`), 1),
		"no instance variable": bytes.Replace(good, []byte(`"name": "instance"`), []byte(`"name": "node"`), 1),
		"a series not shown":   bytes.ReplaceAll(good, []byte(`chime_shard_voters`), []byte(`chime_shard_events`)),
	} {
		if bytes.Equal(bad, good) {
			t.Fatalf("%s: the planted change did not apply", name)
		}
		if _, err := checkDashboard(bad); err == nil {
			t.Errorf("%s: checkDashboard accepted it", name)
		}
	}
}
