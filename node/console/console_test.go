package console_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
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
	"github.com/chimehq/chime/node/console"
	"github.com/chimehq/chime/node/nodetest"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// browser is a cookie-keeping HTTP client of one console, as a person's
// browser is: it follows redirects and reads each form's CSRF token.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string, tlsCfg *tls.Config) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: tlsCfg}}}
}

// get returns the status and body of path.
func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.hc.Get(b.base + path)
	if err != nil {
		b.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// countOf is the count an events page shows: in the page when it was done
// in time, or else the one its script fetches from the page's count
// endpoint, as a browser's would. ok is false when the page shows neither.
func (b *browser) countOf(page string) (n int64, ok bool) {
	b.t.Helper()
	if m := countRE.FindStringSubmatch(page); m != nil {
		n, err := strconv.ParseInt(m[1], 10, 64)
		return n, err == nil
	}
	m := countLaterRE.FindStringSubmatch(page)
	if m == nil {
		return 0, false
	}
	code, body := b.get(html.UnescapeString(m[1]))
	var v struct {
		Count *int64 `json:"count"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || v.Count == nil {
		b.t.Errorf("the page's count endpoint %s: %d %s", m[1], code, body)
		return 0, false
	}
	return *v.Count, true
}

var (
	countRE      = regexp.MustCompile(`<strong id="count">(\d+)</strong>`)
	countLaterRE = regexp.MustCompile(`<span id="count-pending" data-count="([^"]+)"`)
)

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// post submits form to path with the CSRF token of the page at from.
func (b *browser) post(from, path string, form url.Values) (int, string, *url.URL) {
	b.t.Helper()
	if from != "" {
		_, page := b.get(from)
		m := csrfRE.FindStringSubmatch(page)
		if m == nil {
			b.t.Fatalf("no CSRF token on %s:\n%s", from, page)
		}
		form.Set("csrf", m[1])
	}
	resp, err := b.hc.PostForm(b.base+path, form)
	if err != nil {
		b.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Request.URL
}

func startDev(t *testing.T, edit func(*node.Config)) *node.Dev {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := node.StartDev(ctx, t.TempDir(), edit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			t.Errorf("closing the node: %v", err)
		}
	})
	return d
}

func dial(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func schedule(t *testing.T, c *client.Client, prefix string, n int, in time.Duration) {
	t.Helper()
	evs := make([]client.Event, n)
	for i := range evs {
		evs[i] = client.Event{ID: fmt.Sprintf("%s%04d", prefix, i), Topic: "console", Payload: []byte(`{"n":` + strconv.Itoa(i) + `}`)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.ScheduleBatch(ctx, evs, client.In(in)); err != nil {
		t.Fatal(err)
	}
}

// TestFindActAndBulkCancel walks the console of a dev node (no auth file):
// find by prefix and by exact id, reschedule and fire one with the version
// check, and a bulk cancel that wants its count typed.
func TestFindActAndBulkCancel(t *testing.T) {
	d := startDev(t, nil)
	c := dial(t, d.GRPCAddr())
	schedule(t, c, "order-", 120, time.Hour)
	schedule(t, c, "other-", 5, time.Hour)
	b := newBrowser(t, "http://"+d.HTTPAddr(), nil)

	code, page := b.get("/ui/events?q=order-&size=50")
	if n, ok := b.countOf(page); code != 200 || !ok || n != 120 || strings.Contains(page, "other-0000") {
		t.Fatalf("search by prefix: %d, count %d %v\n%s", code, n, ok, page)
	}
	if n := strings.Count(page, `<td class="id">`); n != 50 {
		t.Errorf("first page rows = %d, want 50", n)
	}
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(page)
	if next == nil {
		t.Fatal("no next page link")
	}
	_, page2 := b.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	ids := regexp.MustCompile(`id=(order-\d+)"`)
	seen := map[string]bool{}
	for _, m := range ids.FindAllStringSubmatch(page, -1) {
		seen[m[1]] = true
	}
	second := ids.FindAllStringSubmatch(page2, -1)
	for _, m := range second {
		if seen[m[1]] {
			t.Errorf("%s is on the first page and the second", m[1])
		}
	}
	if len(seen) != 50 || len(second) != 50 {
		t.Errorf("pages of %d and %d events, want 50 and 50", len(seen), len(second))
	}
	if code, page := b.get("/ui/events?state=nonsense"); code != 400 || !strings.Contains(page, "state: must be one of") {
		t.Errorf("bad state filter: %d %s", code, page)
	}

	// An exact id opens the event.
	resp, err := b.hc.Get(b.base + "/ui/events?q=order-0007")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.Request.URL.Path != "/ui/event" || resp.Request.URL.Query().Get("id") != "order-0007" {
		t.Fatalf("exact id landed on %s", resp.Request.URL)
	}

	// Reschedule with the version seen; a second change with the old
	// version is refused and changes nothing.
	at := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Second)
	code, page, _ = b.post("/ui/event?id=order-0007", "/ui/event/reschedule", url.Values{"id": {"order-0007"}, "version": {"1"}, "due": {at.Format(time.RFC3339)}})
	if code != 200 || !strings.Contains(page, "Done: rescheduled") {
		t.Fatalf("reschedule: %d\n%s", code, page)
	}
	ev, err := c.Get(context.Background(), "order-0007")
	if err != nil || !ev.Due.Equal(at) || ev.Version != 2 {
		t.Fatalf("after reschedule: %+v %v", ev, err)
	}
	code, page, _ = b.post("/ui/event?id=order-0007", "/ui/event/fire", url.Values{"id": {"order-0007"}, "version": {"1"}})
	if code != http.StatusConflict {
		t.Errorf("fire now at a stale version: %d\n%s", code, page)
	}
	code, _, _ = b.post("/ui/event?id=order-0007", "/ui/event/fire", url.Values{"id": {"order-0007"}, "version": {"2"}})
	if code != 200 {
		t.Fatalf("fire now: %d", code)
	}
	waitState(t, c, "order-0007", client.StateFired)

	// A change without the session's CSRF token is refused.
	if code, _, _ := b.post("", "/ui/event/cancel", url.Values{"id": {"order-0008"}, "csrf": {"forged"}}); code != http.StatusForbidden {
		t.Errorf("cancel with a forged CSRF token: %d", code)
	}

	// Bulk cancel: the dry run's count, a wrong count typed, the right one.
	code, page = b.get("/ui/bulk?q=order-")
	if code != 200 || !strings.Contains(page, `<strong id="matched">119</strong>`) {
		t.Fatalf("bulk dry run: %d\n%s", code, page)
	}
	form := url.Values{"q": {"order-"}, "expect": {"119"}, "confirm": {"118"}}
	if code, page, _ := b.post("/ui/bulk?q=order-", "/ui/bulk", form); code != 400 || !strings.Contains(page, "type the number") {
		t.Errorf("bulk cancel with the wrong count typed: %d %s", code, page)
	}
	if n, _ := c.Count(context.Background(), client.Filter{IDPrefix: "order-", States: []client.State{client.StateScheduled}}); n != 119 {
		t.Fatalf("a refused bulk cancel cancelled something: %d pending", n)
	}
	form.Set("confirm", "119")
	code, _, jobURL := b.post("/ui/bulk?q=order-", "/ui/bulk", form)
	if code != 200 || !strings.HasPrefix(jobURL.Path, "/ui/jobs/") {
		t.Fatalf("bulk cancel: %d at %s", code, jobURL)
	}
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		_, page = b.get(jobURL.Path)
		return strings.Contains(page, "Bulk cancel done"), "the bulk cancel finishes:\n" + page
	})
	if !strings.Contains(page, `<dd id="job-cancelled">119</dd>`) {
		t.Errorf("job page:\n%s", page)
	}
	if n, _ := c.Count(context.Background(), client.Filter{IDPrefix: "other-", States: []client.State{client.StateScheduled}}); n != 5 {
		t.Errorf("the bulk cancel reached beyond its prefix: other- pending %d", n)
	}
	// Move all matching by an hour: the count typed, every event moved.
	schedule(t, c, "shift-", 20, time.Hour)
	before, _ := c.Get(context.Background(), "shift-0003")
	code, page = b.get("/ui/bulk?kind=shift&by=1h&q=shift-")
	if code != 200 || !strings.Contains(page, `<strong id="matched">20</strong>`) {
		t.Fatalf("shift dry run: %d\n%s", code, page)
	}
	code, _, jobURL = b.post("/ui/bulk?kind=shift&by=1h&q=shift-", "/ui/bulk", url.Values{"kind": {"shift"}, "by": {"1h"}, "q": {"shift-"}, "expect": {"20"}, "confirm": {"20"}})
	if code != 200 || !strings.HasPrefix(jobURL.Path, "/ui/jobs/") {
		t.Fatalf("shift: %d at %s", code, jobURL)
	}
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		_, page = b.get(jobURL.Path)
		return !strings.Contains(page, "running") && strings.Contains(page, `<dd id="job-moved">20</dd>`), "the shift finishes:\n" + page
	})
	if after, err := c.Get(context.Background(), "shift-0003"); err != nil || !after.Due.Equal(before.Due.Add(time.Hour)) || after.Version != 2 {
		t.Errorf("shift-0003 after the shift: %+v %v (was due %s)", after, err, before.Due)
	}
	if code, page := b.get("/ui/bulk?kind=shift&by=soon&q=shift-"); code != 400 || !strings.Contains(page, "by: how far") {
		t.Errorf("a shift by nonsense: %d %s", code, page)
	}

	// The cluster page's rate limits, set from the form as chimectl
	// rate-limit set takes them, one rule a line.
	code, page, _ = b.post("/ui/cluster", "/ui/cluster/rate-limits", url.Values{"rules": {"reports=5000/s\nbilling.*=10/m"}})
	if code != 200 || !strings.Contains(page, "2 topic rate limits set") || !strings.Contains(page, "billing.*=0.16666666666666666/s") {
		t.Fatalf("setting rate limits: %d\n%s", code, page)
	}
	if code, page, _ := b.post("/ui/cluster", "/ui/cluster/rate-limits", url.Values{"rules": {"reports=fast"}}); code != 400 || !strings.Contains(page, "rules:") {
		t.Errorf("bad rules: %d\n%s", code, page)
	}

	if code, page := b.get("/ui/bulk"); code != 400 || !strings.Contains(page, "needs a filter") {
		t.Errorf("bulk cancel of everything: %d %s", code, page)
	}
}

// TestCountAfterThePage: an events page that did not wait for its count
// shows the first page with a placeholder, which the count endpoint (its
// script's) fills with the right number, and a link for a browser without
// scripts to the page that waits for it; its Server-Timing header times
// the list and says the count is pending.
func TestCountAfterThePage(t *testing.T) {
	d := startDev(t, nil)
	c := dial(t, d.GRPCAddr())
	schedule(t, c, "later-", 30, time.Hour)
	schedule(t, c, "else-", 4, time.Hour)
	b := newBrowser(t, "http://"+d.HTTPAddr(), nil)
	restore := console.DeferCount()
	defer restore()

	resp, err := b.hc.Get(b.base + "/ui/events?q=later-&state=scheduled")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	page := string(body)
	if resp.StatusCode != 200 || strings.Contains(page, `id="count"`) || strings.Count(page, `<td class="id">`) != 30 {
		t.Fatalf("the page without its count: %d\n%s", resp.StatusCode, page)
	}
	if st := resp.Header.Get("Server-Timing"); !regexp.MustCompile(`^list;dur=[0-9.]+, count;desc="pending", total;dur=[0-9.]+$`).MatchString(st) {
		t.Errorf("Server-Timing: %q", st)
	}
	m := countLaterRE.FindStringSubmatch(page)
	if m == nil || html.UnescapeString(m[1]) != "/ui/events/count?q=later-&state=scheduled" || !strings.Contains(page, `<script src="/ui/static/count.js">`) {
		t.Fatalf("no count placeholder asking for the page's filter, or no script to fill it:\n%s", page)
	}
	if n, ok := b.countOf(page); !ok || n != 30 {
		t.Errorf("the count endpoint says %d (%v), want 30", n, ok)
	}
	wait := regexp.MustCompile(`id="count-wait" href="([^"]+)"`).FindStringSubmatch(page)
	if wait == nil {
		t.Fatalf("no link that waits for the count:\n%s", page)
	}
	if _, page := b.get(html.UnescapeString(wait[1])); !strings.Contains(page, `<strong id="count">30</strong>`) {
		t.Errorf("the page that waits for its count:\n%s", page)
	}
	if code, body := b.get("/ui/events/count?state=nonsense"); code != http.StatusBadRequest || !strings.Contains(body, `"error":"bad input: state: must be one of`) {
		t.Errorf("a count of a bad filter: %d %s", code, body)
	}
	restore()
	// In time, the count is in the page, and the header times it.
	resp, err = b.hc.Get(b.base + "/ui/events?q=else-")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if st := resp.Header.Get("Server-Timing"); !strings.HasPrefix(st, "list;dur=") || !strings.Contains(st, "count;") {
		t.Errorf("Server-Timing: %q", st)
	}
}

// TestPriorityFilter: the events page's priority filter lists, counts,
// dry-runs and bulk-cancels only the events of that priority, stays in the
// links, and alone is refused for a bulk change.
func TestPriorityFilter(t *testing.T) {
	d := startDev(t, nil)
	c := dial(t, d.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 12 {
		ev := client.Event{ID: fmt.Sprintf("prio-%02d", i), Topic: "console", Payload: []byte("p")}
		opts := []client.ScheduleOption{client.In(time.Hour)}
		if i%3 == 0 {
			opts = append(opts, client.Priority(9)) // prio-00, 03, 06, 09
		}
		if _, err := c.Schedule(ctx, ev, opts...); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, "http://"+d.HTTPAddr(), nil)
	restore := console.DeferCount() // the count endpoint's filter too
	defer restore()
	code, page := b.get("/ui/events?q=prio-&priority=9")
	if n, ok := b.countOf(page); code != 200 || !ok || n != 4 || strings.Count(page, `<td class="id">`) != 4 || strings.Contains(page, "prio-01") {
		t.Fatalf("priority 9 under prio-: %d, count %d %v\n%s", code, n, ok, page)
	}
	if !strings.Contains(page, `<option selected>9</option>`) || !strings.Contains(page, "--priority 9") ||
		!strings.Contains(page, `href="/ui/bulk?priority=9&amp;q=prio-"`) {
		t.Errorf("the page does not keep the priority in its form, its command and its links:\n%s", page)
	}
	if code, page := b.get("/ui/events?priority=10"); code != 400 || !strings.Contains(page, "priority: must be 0") {
		t.Errorf("priority 10: %d %s", code, page)
	}
	if code, page := b.get("/ui/bulk?priority=9"); code != 400 || !strings.Contains(page, "needs a filter") {
		t.Errorf("a bulk cancel by priority alone: %d %s", code, page)
	}
	code, page = b.get("/ui/bulk?q=prio-&priority=9")
	if code != 200 || !strings.Contains(page, `<strong id="matched">4</strong>`) || !strings.Contains(page, `name="priority" value="9"`) {
		t.Fatalf("the dry run by priority: %d\n%s", code, page)
	}
	code, _, jobURL := b.post("/ui/bulk?q=prio-&priority=9", "/ui/bulk", url.Values{"q": {"prio-"}, "priority": {"9"}, "expect": {"4"}, "confirm": {"4"}})
	if code != 200 || !strings.HasPrefix(jobURL.Path, "/ui/jobs/") {
		t.Fatalf("the bulk cancel by priority: %d at %s", code, jobURL)
	}
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		_, page = b.get(jobURL.Path)
		return strings.Contains(page, "Bulk cancel done"), "the bulk cancel finishes:\n" + page
	})
	for _, q := range []struct {
		prio []int
		want int64
	}{{[]int{9}, 0}, {[]int{5}, 8}} {
		if n, err := c.Count(ctx, client.Filter{IDPrefix: "prio-", Priorities: q.prio, States: []client.State{client.StateScheduled}}); err != nil || n != q.want {
			t.Errorf("after the bulk cancel of priority 9, priority %v pending: %d %v, want %d", q.prio, n, err, q.want)
		}
	}
}

// TestRecurringLastFired: a schedule's page shows its latest fired
// occurrence, linked, with when it fired and how late; none before one
// fired.
func TestRecurringLastFired(t *testing.T) {
	d := startDev(t, nil)
	c := dial(t, d.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "report-hourly"
	if _, err := c.Recurring().Create(ctx, id, client.Every(time.Hour, client.StartAt(time.Now().Add(time.Hour).Truncate(time.Second))),
		client.Target{Topic: "console", Payload: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+d.HTTPAddr(), nil)
	lastRE := regexp.MustCompile(`<dd id="last-fired"><a href="/ui/event\?id=([^"]+)">`)
	code, page := b.get("/ui/recurring/one?id=" + id)
	if code != 200 || lastRE.MatchString(page) || !strings.Contains(page, "none among the events") {
		t.Fatalf("the page of a schedule that never fired: %d\n%s", code, page)
	}
	// The list draws a cell for each schedule that its script fills in
	// from /ui/recurring/last.
	code, page = b.get("/ui/recurring")
	if code != 200 || !strings.Contains(page, `data-last="/ui/recurring/last?id=`+id+`"`) || !strings.Contains(page, "/ui/static/lastfired.js") {
		t.Fatalf("the recurring list has no last fired cell for %s: %d\n%s", id, code, page)
	}
	if code, body := b.get("/ui/recurring/last?id=" + id); code != 200 || strings.TrimSpace(body) != `{"none":true}` {
		t.Fatalf("/ui/recurring/last of a schedule that never fired: %d %s", code, body)
	}
	if code, body := b.get("/ui/recurring/last?id=no-such-schedule"); code != http.StatusNotFound || !strings.Contains(body, `"error"`) {
		t.Errorf("/ui/recurring/last of no schedule: %d %s, want 404 with an error", code, body)
	}
	// Two extra occurrences, an hour apart in time, both fired: the later
	// is the last.
	var ids []string
	for _, ago := range []time.Duration{2 * time.Hour, time.Minute} {
		o, err := c.Recurring().TriggerAt(ctx, id, time.Now().Add(-ago))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.EventID)
	}
	for _, eid := range ids {
		waitState(t, c, eid, client.StateFired)
	}
	code, page = b.get("/ui/recurring/one?id=" + id)
	var linked string
	if m := lastRE.FindStringSubmatch(page); m != nil {
		linked, _ = url.QueryUnescape(m[1])
	}
	if code != 200 || linked != ids[1] || !strings.Contains(page, "after its due time") {
		t.Fatalf("the last fired occurrence, want %s:\n%s", ids[1], page)
	}
	code, body := b.get("/ui/recurring/last?id=" + id)
	var last struct{ ID, FiredAt, Late string }
	if err := json.Unmarshal([]byte(body), &struct {
		ID      *string `json:"id"`
		FiredAt *string `json:"fired_at"`
		Late    *string `json:"late"`
	}{&last.ID, &last.FiredAt, &last.Late}); code != 200 || err != nil || last.ID != ids[1] || last.FiredAt == "" || last.Late == "" {
		t.Fatalf("/ui/recurring/last: %d %s, want %s with when it fired and how late", code, body, ids[1])
	}
}

func waitState(t *testing.T, c *client.Client, id string, want client.State) {
	t.Helper()
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		ev, err := c.Get(context.Background(), id)
		return err == nil && ev.State == want, fmt.Sprintf("%s is %s (%v), want %s", id, ev.State, err, want)
	})
}

// TestReadOnlyOffersNoAction: a read-only console shows events and refuses
// every change, whatever the form says.
func TestReadOnlyOffersNoAction(t *testing.T) {
	d := startDev(t, func(cfg *node.Config) { cfg.Console = console.ReadOnly })
	c := dial(t, d.GRPCAddr())
	schedule(t, c, "ro-", 3, time.Hour)
	b := newBrowser(t, "http://"+d.HTTPAddr(), nil)
	code, page := b.get("/ui/event?id=ro-0001")
	if code != 200 || strings.Contains(page, `id="cancel"`) || !strings.Contains(page, "read-only") {
		t.Fatalf("read-only event page: %d\n%s", code, page)
	}
	code, page, _ = b.post("", "/ui/event/cancel", url.Values{"id": {"ro-0001"}})
	if code != http.StatusForbidden || !strings.Contains(page, "read-only") {
		t.Errorf("cancel on a read-only console: %d %s", code, page)
	}
	if ev, _ := c.Get(context.Background(), "ro-0001"); ev.State != client.StateScheduled {
		t.Errorf("ro-0001 is %s", ev.State)
	}
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestSignInActsAsTheCredential: on a node with TLS and an auth file, no
// page without a sign-in; a wrong token is refused; a scheduler limited to
// a prefix sees and changes only its own events; a reader is offered no
// action and the API refuses the one it forges; the cookie is Secure,
// HttpOnly and SameSite=Strict; signing out ends the session.
func TestSignInActsAsTheCredential(t *testing.T) {
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
    {"name": "ops", "sha256": %q, "role": "admin"},
    {"name": "billing", "sha256": %q, "role": "scheduler", "topics": ["console"], "id_prefixes": ["bill-"]},
    {"name": "dashboard", "sha256": %q, "role": "reader"}
  ]
}`, sha("ops-token"), sha("billing-token"), sha("reader-token")), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDev(t, func(cfg *node.Config) { cfg.TLS, cfg.AuthFile = src, authFile })
	c := dial(t, "localhost:"+port(d.GRPCAddr()), client.WithTLSFiles(ca.File, "", ""), client.WithToken("ops-token"))
	schedule(t, c, "bill-", 3, time.Hour)
	schedule(t, c, "ship-", 3, time.Hour)

	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(ca.File)
	pool.AppendCertsFromPEM(pem)
	base := "https://localhost:" + port(d.HTTPAddr())
	tlsCfg := &tls.Config{RootCAs: pool}

	b := newBrowser(t, base, tlsCfg)
	if _, page := b.get("/ui/events"); !strings.Contains(page, `id="signin"`) {
		t.Fatalf("an unsigned visitor sees:\n%s", page)
	}
	if code, page, _ := b.post("", "/ui/login", url.Values{"token": {"billing-token"}}); code != http.StatusForbidden || !strings.Contains(page, "CSRF") {
		t.Errorf("a sign-in without the form's CSRF token: %d\n%s", code, page)
	}
	if code, page, _ := b.post("/ui/login", "/ui/login", url.Values{"token": {"guess"}}); code != http.StatusUnauthorized || !strings.Contains(page, "is not in the node") {
		t.Errorf("a wrong token: %d\n%s", code, page)
	}
	_, login := b.get("/ui/login")
	resp, err := b.hc.PostForm(base+"/ui/login", url.Values{"token": {"billing-token"}, "next": {"/ui/events?q=bill-&topic=console"},
		"csrf": {csrfRE.FindStringSubmatch(login)[1]}})
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	var ck *http.Cookie
	for _, r := range resp.Request.Response.Cookies() {
		if r.Name == "chime_console" {
			ck = r
		}
	}
	if ck == nil || !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.MaxAge <= 0 {
		t.Errorf("session cookie %+v", ck)
	}
	if resp.Request.URL.RequestURI() != "/ui/events?q=bill-&topic=console" {
		t.Errorf("after sign-in at %s", resp.Request.URL)
	}

	// The scheduler's own events, and not another's.
	if _, page := b.get("/ui/events?q=bill-&topic=console"); !strings.Contains(page, "bill-0002") {
		t.Errorf("billing's search:\n%s", page)
	} else if n, ok := b.countOf(page); !ok || n != 3 {
		t.Errorf("billing's search counts %d (%v), want 3", n, ok)
	}
	// The count's endpoint, which the events page's script reads: the
	// credential's count, and its refusals as JSON.
	for _, q := range []struct {
		who   *browser
		query string
		code  int
		want  string
	}{
		{b, "q=bill-&topic=console", http.StatusOK, `{"count":3}`},
		{b, "q=ship-&topic=console", http.StatusForbidden, `"error":`},
		{newBrowser(t, base, tlsCfg), "q=bill-&topic=console", http.StatusUnauthorized, `{"error":"not signed in`},
	} {
		if code, body := q.who.get("/ui/events/count?" + q.query); code != q.code || !strings.Contains(body, q.want) {
			t.Errorf("GET /ui/events/count?%s: %d %s, want %d %s", q.query, code, body, q.code, q.want)
		}
	}
	if code, _ := b.get("/ui/event?id=ship-0001"); code != http.StatusForbidden {
		t.Errorf("billing opens ship-0001: %d", code)
	}
	code, page, _ := b.post("/ui/event?id=bill-0001", "/ui/event/cancel", url.Values{"id": {"bill-0001"}})
	if code != 200 || !strings.Contains(page, "Done: cancelled") {
		t.Fatalf("billing cancels bill-0001: %d\n%s", code, page)
	}

	// A reader: no action offered; a forged one is refused by the console,
	// and the API would refuse it too.
	r := newBrowser(t, base, tlsCfg)
	r.post("/ui/login", "/ui/login", url.Values{"token": {"reader-token"}})
	code, page = r.get("/ui/event?id=bill-0002")
	if code != 200 || strings.Contains(page, `id="cancel"`) {
		t.Fatalf("the reader's event page: %d\n%s", code, page)
	}
	if code, _, _ := r.post("/ui/event?id=bill-0002", "/ui/event/cancel", url.Values{"id": {"bill-0002"}}); code != http.StatusForbidden {
		t.Errorf("the reader cancels: %d", code)
	}
	if ev, _ := c.Get(context.Background(), "bill-0002"); ev.State != client.StateScheduled {
		t.Errorf("bill-0002 is %s after the reader's cancel", ev.State)
	}

	// The cluster's controls are an admin's.
	if code, _, _ := b.post("/ui/event?id=bill-0002", "/ui/cluster/rate-limits", url.Values{"rules": {""}}); code != http.StatusForbidden {
		t.Errorf("billing sets rate limits: %d", code)
	}

	// Signing out ends the session: the old cookie opens nothing.
	b.post("/ui/events", "/ui/logout", url.Values{})
	if _, page := b.get("/ui/events"); !strings.Contains(page, `id="signin"`) {
		t.Errorf("after sign-out:\n%s", page)
	}
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
