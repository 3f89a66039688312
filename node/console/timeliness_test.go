package console_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/node"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// scrape returns the value of the metric line that starts with series
// (name and labels) on the node's /metrics, 0 when there is none.
func scrape(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// TestTimelinessShowsTheMetrics: events fired on two topics show on the
// timeliness page, per topic, in both windows, with the counts the node's
// own metrics give, none early; the JSON the other nodes read says the
// same.
func TestTimelinessShowsTheMetrics(t *testing.T) {
	d := startDev(t, nil)
	c := dial(t, d.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for topic, n := range map[string]int{"alpha": 3, "beta": 2} {
		evs := make([]client.Event, n)
		for i := range evs {
			evs[i] = client.Event{ID: fmt.Sprintf("%s-%d", topic, i), Topic: topic, Payload: []byte("x")}
		}
		if _, err := c.ScheduleBatch(ctx, evs, client.In(200*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + d.HTTPAddr()
	deadline := time.Now().Add(30 * time.Second)
	for scrape(t, base, `chime_fire_topic_lateness_seconds_count{topic="alpha"}`) < 3 || scrape(t, base, `chime_fire_topic_lateness_seconds_count{topic="beta"}`) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the events did not fire")
		}
		time.Sleep(50 * time.Millisecond) // polls the node's metrics: no notification exists
	}
	b := newBrowser(t, base, nil)
	for _, path := range []string{"/ui/timeliness", "/ui/timeliness?node=this"} {
		code, page := b.get(path)
		if code != 200 {
			t.Fatalf("%s: %d\n%s", path, code, page)
		}
		for topic, n := range map[string]int{"alpha": 3, "beta": 2} {
			row := fmt.Sprintf(`<tr data-topic="%s"><td>%s</td><td class="n">%d</td><td class="n">0</td>`, topic, topic, n)
			if got := strings.Count(page, row); got != 2 { // the last hour and the last day
				t.Errorf("%s: %d rows %q, want 2:\n%s", path, got, row, page)
			}
		}
		if strings.Count(page, `<td class="n">5</td><td class="n early">0</td>`) != 2 {
			t.Errorf("%s: no total of 5 fired, 0 early, in both windows", path)
		}
		for _, want := range []string{`href="/ui/timeliness" class="on"`, `<script type="application/json" id="chart-0">`, "chimectl tail"} {
			if !strings.Contains(page, want) {
				t.Errorf("%s lacks %q", path, want)
			}
		}
	}
	if late := scrape(t, base, `chime_fire_early_total{topic="alpha"}`); late != 0 {
		t.Errorf("%v early", late)
	}

	resp, err := http.Get(base + "/ui/timeliness.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var figures struct {
		Node    string `json:"node"`
		Windows []struct {
			Topics map[string]struct {
				Buckets []float64 `json:"buckets"`
			} `json:"topics"`
		} `json:"windows"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&figures); err != nil {
		t.Fatal(err)
	}
	if len(figures.Windows) != 2 {
		t.Fatalf("figures %+v", figures)
	}
	for _, w := range figures.Windows {
		if bs := w.Topics["alpha"].Buckets; len(bs) != 16 || bs[15] != 3 {
			t.Errorf("alpha's buckets %v", bs)
		}
	}
}

// TestForecastCountsByDueTime: the forecast page and Client.Forecast count
// the pending events by the minute, hour and day they are due in, exactly,
// with the earliest and latest due time; cancelling one takes it out.
func TestForecastCountsByDueTime(t *testing.T) {
	d := startDev(t, nil)
	c := dial(t, d.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now().UTC()
	minute := now.Truncate(time.Minute)
	dues := []time.Time{
		minute.Add(20*time.Minute + 5*time.Second), minute.Add(20*time.Minute + 59*time.Second), minute.Add(21 * time.Minute),
		minute.Add(3*time.Hour + 30*time.Minute), now.Add(5 * 24 * time.Hour), now.Add(400 * 24 * time.Hour),
	}
	for i, due := range dues {
		if _, err := c.Schedule(ctx, client.Event{ID: fmt.Sprintf("f-%d", i), Topic: "forecast", Payload: []byte("x")}, client.At(due)); err != nil {
			t.Fatal(err)
		}
	}
	q := client.ForecastAhead(now)
	fc, err := c.Forecast(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	want := func(s client.ForecastSeries) []int64 {
		out := make([]int64, s.Buckets)
		for _, due := range dues {
			if i := int(due.Sub(s.Start) / s.Step); !due.Before(s.Start) && i < s.Buckets {
				out[i]++
			}
		}
		return out
	}
	for i, s := range fc.Series {
		if w := want(q.Series[i]); fmt.Sprint(s.Counts) != fmt.Sprint(w) {
			t.Errorf("series %d: %v, want %v", i, s.Counts, w)
		}
	}
	if fc.Series[0].Counts[20] != 2 || fc.Series[0].Counts[21] != 1 {
		t.Errorf("per minute %v", fc.Series[0].Counts)
	}
	if fc.Pending != 6 || fc.DueBefore != 0 || !fc.EarliestDue.Equal(dues[0]) || !fc.LatestDue.Equal(dues[5]) {
		t.Errorf("pending %d, overdue %d, earliest %v, latest %v", fc.Pending, fc.DueBefore, fc.EarliestDue, fc.LatestDue)
	}

	b := newBrowser(t, "http://"+d.HTTPAddr(), nil)
	resp, err := b.hc.Get(b.base + "/ui/forecast")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.Header.Get("Refresh") != "10" {
		t.Errorf("Refresh header %q", resp.Header.Get("Refresh"))
	}
	code, page := b.get("/ui/forecast")
	if code != 200 {
		t.Fatalf("forecast page: %d\n%s", code, page)
	}
	for _, want := range []string{
		`<dd id="pending">6</dd>`, `<span id="overdue">0</span>`,
		fmt.Sprintf(`<tr><td class="t">%s</td><td class="n">2</td></tr>`, minute.Add(20*time.Minute).Format("15:04 MST")),
		fmt.Sprintf(`<tr><td class="t">%s</td><td class="n">1</td></tr>`, minute.Add(21*time.Minute).Format("15:04 MST")),
		fmt.Sprintf(`<tr><td class="t">%s</td><td class="n">1</td></tr>`, dues[3].Truncate(time.Hour).Format("Jan 02 15:04 MST")),
		dues[5].Format("2006-01-02 15:04:05.000 MST"),
		`href="/ui/forecast" class="on"`, "chimectl forecast", `<script type="application/json" id="fchart-2">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the forecast page lacks %q:\n%s", want, page)
		}
	}
	if err := c.Cancel(ctx, "f-1"); err != nil {
		t.Fatal(err)
	}
	if fc, err = c.Forecast(ctx, q); err != nil || fc.Series[0].Counts[20] != 1 || fc.Pending != 5 {
		t.Errorf("after a cancel: %+v %v", fc, err)
	}
}

// TestForecastRefusesALimitedCredential: a credential limited to some
// topics or id prefixes is refused a forecast, which counts every event; a
// reader of every topic is not.
func TestForecastRefusesALimitedCredential(t *testing.T) {
	dir := t.TempDir()
	ca, err := certstest.NewCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Node("dev")
	if err != nil {
		t.Fatal(err)
	}
	src, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(authFile, fmt.Appendf(nil, `{
  "tokens": [
    {"name": "billing", "sha256": %q, "role": "scheduler", "topics": ["console"], "id_prefixes": ["bill-"]},
    {"name": "dashboard", "sha256": %q, "role": "reader"}
  ]
}`, sha("billing-token"), sha("reader-token")), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDev(t, func(cfg *node.Config) { cfg.TLS, cfg.AuthFile = src, authFile })
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(ca.File)
	pool.AppendCertsFromPEM(pem)
	base := "https://localhost:" + port(d.HTTPAddr())
	for token, want := range map[string]int{"billing-token": http.StatusForbidden, "reader-token": http.StatusOK} {
		b := newBrowser(t, base, &tls.Config{RootCAs: pool})
		b.post("/ui/login", "/ui/login", url.Values{"token": {token}})
		if code, page := b.get("/ui/forecast"); code != want {
			t.Errorf("%s: forecast page %d, want %d\n%s", token, code, want, page)
		} else if want == http.StatusForbidden && !regexp.MustCompile(`sees only some topics or id prefixes`).MatchString(page) {
			t.Errorf("%s: the refusal does not say why:\n%s", token, page)
		}
	}
}
