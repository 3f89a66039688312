package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/credentials"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// The console's browser test drives the web console (package node/console)
// in a real headless Chromium, Debian's package, through the DevTools
// protocol (chromedp), against three chimed processes with TLS and an auth
// file: what a person does, clicking, typing and answering the confirm
// dialogs, and what they would see, as screenshots at a laptop's and a
// phone's width.

const (
	// consoleTopic is the topic the scheduler token may use.
	consoleTopic = "shop.reminders"
	// consoleEvents events are seeded under consolePrefix;
	// consoleBulkPrefix (shop-ev-090000 to shop-ev-099999) selects the
	// last consoleBulk of them.
	consolePrefix     = "shop-ev-"
	consoleEvents     = 100_000
	consoleBulkPrefix = "shop-ev-09"
	consoleBulk       = 10_000
	// consoleSchedule is the recurring schedule of the scheduler; its id is
	// under the scheduler's id prefix but not under consolePrefix, so its
	// occurrences do not change the counts the pages show.
	consoleSchedule = "shop-cron-hourly"
	// The widths the pages are shot at: a common laptop screen, and a
	// phone's (CSS pixels).
	laptopWidth, laptopHeight = 1366, 768
	phoneWidth, phoneHeight   = 390, 844
	// stepTimeout bounds each browser step: a page load, a click and the
	// page it leads to. The slowest is the bulk cancel's dry run over
	// 10,000 events, well under a second here.
	stepTimeout = 30 * time.Second
)

// TestConsoleInABrowser walks the console of a secured 3-node cluster in
// headless Chromium: a scheduler signs in with its token, finds an event by
// prefix among 100,000, opens it, reschedules it and fires it now (and the
// record is read from Kafka), bulk-cancels 10,000 by prefix with the typed
// count and watches the job reach it, pauses and triggers its recurring
// schedule, and signs out; a reader signs in and is offered no action, and
// the actions it forges are refused. Each step's screenshot is written
// under the test's artifact directory (go test -artifacts keeps it), every
// page at a laptop's width and a phone's, and on the phone no page may be
// wider than the screen.
func TestConsoleInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-process cluster, seeds 100,000 events and drives a browser; skipped with -short")
	}
	chromium := chromiumPath(t)
	started := time.Now()

	p := newSecurePKI(t)
	authFile := filepath.Join(p.dir, "auth.json")
	const adminToken, shopToken, readerToken = "ops-token", "shop-token", "dashboard-token"
	if err := os.WriteFile(authFile, fmt.Appendf(nil, `{
  "tokens": [
    {"name": "ops", "sha256": %q, "role": "admin"},
    {"name": "shop", "sha256": %q, "role": "scheduler", "topics": [%q], "id_prefixes": ["shop-"]},
    {"name": "dashboard", "sha256": %q, "role": "reader"}
  ]
}`, sha256Hex(adminToken), sha256Hex(shopToken), consoleTopic, sha256Hex(readerToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	// No --tls-client-ca: a browser signs in with a token and presents no
	// client certificate, which a client CA would require on the HTTP port
	// too. The test's own gRPC calls carry tokens as well.
	var spkis []string // the nodes' public keys, which the browser accepts
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, id := range c.order {
				t.Logf("%s stderr:\n%s", id, tail(c.nodes[id].stderr.String(), 3000))
			}
		}
	})
	for _, id := range []string{"n1", "n2", "n3"} {
		c.addWith(id, func(d *daemon) {
			pair, err := p.nodes.Node(d.nodeID)
			if err != nil {
				t.Fatal(err)
			}
			spkis = append(spkis, spkiHash(t, pair.Cert))
			d.extra = append(d.extra, "--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", p.nodes.File,
				"--auth-file", authFile, "--console", "on")
			src := clientSource(t, certstest.Pair{}, p.nodes.File)
			d.creds = credentials.NewTLS(src.ClientConfig(""))
			d.httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig("")}}
			d.scheme = "https"
		})
	}
	var addrs []string
	for _, id := range c.order {
		addrs = append(addrs, c.nodes[id].grpcAddr)
	}
	dialAs := func(token string) *client.Client {
		cl, err := client.Dial(context.Background(), strings.Join(addrs, ","), client.WithTLSFiles(p.nodes.File, "", ""), client.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	admin, reader := dialAs(adminToken), dialAs(readerToken)
	nodetest.WaitFor(t, 60*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := chimev1.NewAdminClient(admin.Conn()).Status(ctx, &chimev1.StatusRequest{})
		return nodetest.Converged(st, clusterShards), fmt.Sprintf("cluster converged: %v %s", err, nodetest.Describe(st))
	})
	t.Logf("cluster up in %v", time.Since(started).Round(time.Millisecond))

	seedConsole(t, admin)
	// Bounds the test's own API calls, each of which takes milliseconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rs, err := admin.Recurring().Create(ctx, consoleSchedule, client.Every(time.Hour, client.StartAt(time.Now().Add(time.Hour).Truncate(time.Second))),
		client.Target{Topic: consoleTopic, Payload: []byte(`{"report":"hourly"}`)})
	if err != nil || rs.State != client.RecurringActive {
		t.Fatalf("creating %s: %+v %v", consoleSchedule, rs, err)
	}
	// Another tenant's event, which the scheduler's console must not show.
	const foreign = "ship-000001"
	if _, err := admin.Schedule(ctx, client.Event{ID: foreign, Topic: "ship.notices", Payload: []byte("x")}, client.In(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	col := collect(t, c.brokers, consoleTopic)

	n1 := c.nodes["n1"]
	b := newConsoleBrowser(t, chromium, "https://"+n1.httpAddr, spkis)

	// The scheduler signs in: every page asks for a sign-in first.
	b.navigate("/ui/events")
	b.waitJS("the sign-in form", `document.querySelector("input#token") !== null`)
	b.shootSection("sign-in")
	b.signIn(shopToken, "shop")

	// Find by prefix among 100,000: the count, and the first page.
	b.search(consolePrefix)
	b.expectCount(fmt.Sprint(consoleEvents))
	var timing string
	b.eval(`performance.getEntriesByType("navigation")[0]?.serverTiming?.map(m => m.name + "=" + m.duration + "ms" + (m.description ? " " + m.description : "")).join(", ") ?? ""`, &timing)
	t.Logf("the search among %d: Server-Timing %s", consoleEvents, timing)
	rows := b.rowIDs()
	if len(rows) != 50 || !allPrefixed(rows, consolePrefix) {
		t.Errorf("the first page of %s lists %d rows (want 50, each under the prefix): %v", consolePrefix, len(rows), rows)
	}
	b.shootSection("events")
	// Another tenant's event is refused, as the API refuses the token.
	b.navigate("/ui/event?id=" + foreign)
	b.waitJS("the refusal of "+foreign, `document.querySelector("#error")?.textContent.includes("not permitted")`)
	b.shoot("foreign-refused")
	// Narrow it, and open one.
	const id = "shop-ev-001234"
	b.search("shop-ev-00123")
	b.expectCount("10")
	if rows := b.rowIDs(); len(rows) != 10 || !slices.Contains(rows, id) {
		t.Fatalf("shop-ev-00123 lists %v", rows)
	}
	b.click(`td.id a[href="/ui/event?id=` + id + `"]`)
	b.waitJS("the event page of "+id, `document.querySelector("h1#event-id")?.textContent === `+jsString(id))
	b.expectText("#state", "scheduled")
	b.expectText("#version", "1")
	b.shootSection("event")

	// Reschedule it, answering the confirm dialog.
	at := time.Now().Add(5 * time.Hour).UTC().Truncate(time.Second)
	b.typeInto("input#new-due", at.Format(time.RFC3339))
	b.clickConfirmed("button#reschedule", "Move the due time of "+id)
	b.waitJS("the reschedule's result", `document.querySelector("#done")?.textContent.includes(`+jsString("rescheduled to "+at.Format(time.RFC3339))+`)`)
	if due := b.attr("#due", "data-due"); due != at.Format(time.RFC3339Nano) {
		t.Errorf("the page shows the due time %q, want %q", due, at.Format(time.RFC3339Nano))
	}
	b.expectText("#version", "2")
	b.shoot("rescheduled")
	if ev, err := admin.Get(ctx, id); err != nil || !ev.Due.Equal(at) || ev.Version != 2 || ev.State != client.StateScheduled {
		t.Fatalf("after the reschedule, the API reads %s as %+v %v; want due %v at version 2", id, ev, err, at)
	}

	// Fire it now: it reaches Kafka with its chime-id.
	b.clickConfirmed("button#fire", "Fire "+id+" now")
	b.waitJS("the fire's result", `document.querySelector("#done")?.textContent.includes("fire now")`)
	b.shoot("fire-now")
	var rec record
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		got, _ := col.byID()
		r, ok := got[id]
		rec = r
		return ok, id + " fired now, in Kafka"
	})
	if h, _ := rec.Header("chime-id"); h != id || rec.Version != 3 || rec.Kafka.Topic != consoleTopic || rec.Value() != `{"n":1234}` {
		t.Errorf("the record of %s: chime-id %q, version %d, topic %s, value %s", id, h, rec.Version, rec.Kafka.Topic, rec.Value())
	}
	b.waitPage("/ui/event?id="+id, id+" shown fired", `document.querySelector("#state")?.textContent === "fired"`)
	b.shoot("fired")

	// Bulk cancel 10,000 by prefix: the dry run's count, typed to go on,
	// and the job's page until it reaches the count.
	b.search(consoleBulkPrefix)
	b.expectCount(fmt.Sprint(consoleBulk))
	b.click("a#bulk")
	b.waitJS("the bulk cancel's dry run", `document.querySelector("strong#matched") !== null`)
	b.expectText("strong#matched", fmt.Sprint(consoleBulk))
	b.shootSection("bulk")
	b.typeInto("input#confirm", fmt.Sprint(consoleBulk))
	b.click("button#go")
	b.waitJS("the job's page", `location.pathname.startsWith("/ui/jobs/")`)
	b.shoot("job-started")
	seen := b.watchJob(consoleBulk)
	t.Logf("the job page showed cancelled = %v as it refreshed", seen)
	b.shootSection("job")
	for _, q := range []struct {
		prefix string
		state  client.State
		want   int64
	}{
		{consoleBulkPrefix, client.StateScheduled, 0},
		{consoleBulkPrefix, client.StateCancelled, consoleBulk},
		{consolePrefix, client.StateScheduled, consoleEvents - consoleBulk - 1},
	} {
		if n, err := admin.Count(ctx, client.Filter{IDPrefix: q.prefix, States: []client.State{q.state}}); err != nil || n != q.want {
			t.Errorf("after the bulk cancel, %s %s: %d %v, want %d", q.prefix, q.state, n, err, q.want)
		}
	}

	// The recurring schedule: find it, pause it, trigger it.
	b.click(`header nav a[href="/ui/recurring"]`)
	b.waitJS("the recurring page", `document.querySelector("input#rq") !== null`)
	b.typeInto("input#rq", "shop-cron")
	b.click("button#rfind")
	b.waitJS("the schedule in the list", `new URLSearchParams(location.search).get("q") === "shop-cron" && document.readyState === "complete" && `+
		`document.querySelector('td.id a[href="/ui/recurring/one?id=`+consoleSchedule+`"]') !== null`)
	b.shootSection("recurring")
	b.click(`td.id a[href="/ui/recurring/one?id=` + consoleSchedule + `"]`)
	b.waitJS("the schedule's page", `document.querySelector("#rstate")?.textContent === "active"`)
	b.shootSection("recurring-one")
	b.clickConfirmed("button#pause", "Pause "+consoleSchedule)
	b.waitJS("the schedule paused, saying where a resume starts", `document.querySelector("#rstate")?.textContent === "paused" && document.querySelector("#done") !== null && document.querySelector("#resumes-from") !== null`)
	b.shoot("paused")
	if rs, err := admin.Recurring().Get(ctx, consoleSchedule); err != nil || rs.State != client.RecurringPaused {
		t.Errorf("after the pause, the API reads %s as %v %v", consoleSchedule, rs.State, err)
	}
	// A paused schedule may be triggered (chime.v1.Recurring/Trigger): one
	// extra occurrence now, the schedule staying paused.
	var hasTrigger bool
	b.eval(`document.querySelector("button#trigger") !== null`, &hasTrigger)
	if !hasTrigger {
		t.Errorf("the recurring schedule's page offers no Trigger (button#trigger): the console's Trigger action is missing, so the issue's \"pause and trigger a recurring schedule\" is not done")
	} else {
		b.clickConfirmed("button#trigger", consoleSchedule)
		b.waitJS("the trigger's result", `document.querySelector("#done")?.textContent.includes("triggered")`)
		b.shoot("triggered")
		nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
			for _, r := range col.Consumed().Records {
				if r.RecurringID == consoleSchedule && strings.HasPrefix(r.ID, consoleSchedule+"@") {
					return true, ""
				}
			}
			return false, "the triggered occurrence of " + consoleSchedule + " in Kafka"
		})
		if rs, err := admin.Recurring().Get(ctx, consoleSchedule); err != nil || rs.State != client.RecurringPaused {
			t.Errorf("after the trigger, the API reads %s as %v %v; want it still paused", consoleSchedule, rs.State, err)
		}
	}

	// The cluster, as the scheduler sees it: the map, not the admin's
	// counts.
	b.click(`header nav a[href="/ui/cluster"]`)
	b.waitJS("the cluster page", `location.pathname === "/ui/cluster" && document.querySelectorAll("main table tbody tr").length >= 3`)
	b.shootSection("cluster")

	// Sign out; the reader signs in where a link to an event led.
	b.click(`form[action="/ui/logout"] button`)
	b.waitJS("the sign-in form after signing out", `document.querySelector("input#token") !== null`)
	b.shoot("signed-out")
	const other = "shop-ev-000777"
	b.navigate("/ui/event?id=" + other)
	b.waitJS("the sign-in form", `document.querySelector("input#token") !== null`)
	b.signIn(readerToken, "dashboard")
	b.waitJS("the event page for the reader", `document.querySelector("h1#event-id")?.textContent === `+jsString(other))
	b.shoot("reader-event")
	var offered []string
	b.eval(`Array.from(document.querySelectorAll("main button, main a.danger")).map(e => e.id || e.textContent)`, &offered)
	if len(offered) > 0 {
		t.Errorf("the reader's event page offers actions: %v", offered)
	}
	b.navigate("/ui/events?q=" + consolePrefix)
	b.waitJS("the reader's search", `document.querySelector("strong#count") !== null`)
	b.expectCount(fmt.Sprint(consoleEvents)) // every state: the cancelled and the fired too
	if b.exists("a#bulk") {
		t.Error("the reader's events page offers a bulk cancel")
	}
	b.shoot("reader-events")
	b.navigate("/ui/recurring/one?id=" + consoleSchedule)
	b.waitJS("the schedule's page for the reader", `document.querySelector("#rstate") !== null`)
	if hasTrigger {
		// The triggered occurrence fired: the page shows it as the last.
		b.waitPage("/ui/recurring/one?id="+consoleSchedule, "the triggered occurrence as the last fired",
			`document.querySelector("#last-fired a")?.textContent.startsWith(`+jsString(consoleSchedule+"@")+`)`)
	}
	b.eval(`Array.from(document.querySelectorAll("main button")).map(e => e.id || e.textContent)`, &offered)
	if len(offered) > 0 {
		t.Errorf("the reader's recurring page offers actions: %v", offered)
	}
	b.shoot("reader-recurring")
	// The pages of the time events take, where they exist: a reader sees
	// the whole cluster's (a scheduler limited to its own ids is refused
	// the forecast of everyone's).
	for _, section := range []string{"timeliness", "forecast"} {
		var code int
		b.eval(`fetch("/ui/`+section+`").then(r => r.status)`, &code)
		if code == http.StatusNotFound {
			t.Logf("/ui/%s: 404, no such page on this console yet; not shot", section)
			continue
		}
		b.navigate("/ui/" + section)
		b.waitJS("the "+section+" page", `document.readyState === "complete" && document.querySelector("main h1") !== null`)
		b.shootSection(section)
		if code != http.StatusOK {
			t.Errorf("/ui/%s answered %d to the reader", section, code)
		}
	}
	// Every action, forged with the reader session's own CSRF token (taken
	// from its sign-out form): the console refuses each.
	for _, f := range []struct {
		path string
		form map[string]string
	}{
		{"/ui/event/cancel", map[string]string{"id": other}},
		{"/ui/event/fire", map[string]string{"id": other, "version": "1"}},
		{"/ui/event/reschedule", map[string]string{"id": other, "version": "1", "due": "1h"}},
		{"/ui/event/edit", map[string]string{"id": other, "version": "1", "payload": "forged", "headers": ""}},
		{"/ui/bulk", map[string]string{"q": "shop-ev-0", "expect": "89999", "confirm": "89999"}},
		{"/ui/recurring/resume", map[string]string{"id": consoleSchedule}},
		{"/ui/recurring/trigger", map[string]string{"id": consoleSchedule}},
		{"/ui/recurring/delete", map[string]string{"id": consoleSchedule}},
	} {
		code, body := b.forge(f.path, f.form)
		if code != http.StatusForbidden || !strings.Contains(body, `"dashboard" is a reader`) {
			t.Errorf("the reader's forged POST %s: %d %s", f.path, code, body)
		}
	}
	if ev, err := admin.Get(ctx, other); err != nil || ev.State != client.StateScheduled || ev.Version != 1 {
		t.Errorf("after the reader's forged actions, %s is %+v %v", other, ev, err)
	}
	b.navigate("/ui/event?id=" + other)
	b.waitJS("the event page after the refusals", `document.querySelector("#state")?.textContent === "scheduled" && document.querySelector("#version")?.textContent === "1"`)
	b.shoot("reader-refused")
	if rs, err := admin.Recurring().Get(ctx, consoleSchedule); err != nil || rs.State != client.RecurringPaused {
		t.Errorf("after the reader's forged actions, %s is %v %v", consoleSchedule, rs.State, err)
	}
	// The API refuses the reader's token the same, without the console.
	if err := reader.Cancel(ctx, other); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("the reader's token cancelling through the API: %v, want permission denied", err)
	}
	b.finish()
	t.Logf("the console test took %v; screenshots in %s", time.Since(started).Round(time.Millisecond), b.dir)
}

// chromiumPath finds Debian's chromium and fails the test without it: a
// browser test that skipped itself where no browser is would pass
// vacuously on every machine that lacks one.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the console's browser tests need Debian's chromium, and none is on the PATH: install it with `apt-get install chromium` (the README says so next to the test command)")
	return ""
}

// spkiHash is the base64 SHA-256 of the public key of the certificate in
// the PEM file, as Chromium's --ignore-certificate-errors-spki-list takes it.
func spkiHash(t *testing.T, certFile string) string {
	t.Helper()
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", certFile)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(h[:])
}

// seedConsole schedules consoleEvents events under consolePrefix, due 2 to
// 6 hours ahead (none fires during the test), in batches of 1000 from a
// few goroutines: each ScheduleBatch already sends one call per shard
// leader, and the nodes commit concurrent batches together.
func seedConsole(t *testing.T, cl *client.Client) {
	t.Helper()
	start := time.Now()
	base := start.Add(2 * time.Hour)
	step := 4 * time.Hour / consoleEvents
	batches := make(chan int)
	errs := make(chan error, consoleEvents/1000)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for from := range batches {
				evs := make([]client.Event, 0, 1000)
				for i := from; i < from+1000; i++ {
					evs = append(evs, client.Event{ID: fmt.Sprintf("%s%06d", consolePrefix, i), Topic: consoleTopic,
						Payload: fmt.Appendf(nil, `{"n":%d}`, i), Headers: []client.Header{{Key: "tenant", Value: []byte("shop")}},
						Due: base.Add(time.Duration(i) * step)})
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := cl.ScheduleBatch(ctx, evs)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("scheduling %s%06d and the 999 after: %w", consolePrefix, from, err)
				}
			}
		})
	}
	for from := 0; from < consoleEvents; from += 1000 {
		batches <- from
	}
	close(batches)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("seeded %d events in %v", consoleEvents, time.Since(start).Round(time.Millisecond))
}

// consoleBrowser is one headless Chromium tab on one node's console. Each
// step shoots the page into dir as NN-step.png; the confirm dialogs the
// pages open are accepted, as a person would, and recorded; what the pages
// report as errors (exceptions, console errors, refused scripts or styles)
// fails the test.
type consoleBrowser struct {
	t    *testing.T
	ctx  context.Context
	base string
	dir  string
	step int

	mu       sync.Mutex
	dialogs  []string // the messages of the dialogs opened, in order
	problems []string
	stderr   *lockedBuffer
}

func newConsoleBrowser(t *testing.T, chromium, base string, spkis []string) *consoleBrowser {
	t.Helper()
	b := &consoleBrowser{t: t, base: base, dir: t.ArtifactDir(), stderr: &lockedBuffer{}}
	home := t.TempDir()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		// The machine's network is closed, and the test is about the
		// console alone: nothing but the nodes is dialled.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(filepath.Join(home, "profile")),
		// The nodes' certificates are signed by a CA the test made a moment
		// ago. Chromium on Linux trusts what the NSS database under $HOME
		// holds, which only certutil (libnss3-tools) writes; instead, the
		// browser accepts exactly the nodes' public keys, whatever signed
		// them (the flag is honoured only with --user-data-dir, set above).
		chromedp.Flag("ignore-certificate-errors-spki-list", strings.Join(spkis, ",")),
		chromedp.WindowSize(laptopWidth, laptopHeight),
		chromedp.Env("HOME="+home), // nothing written to the real home
		chromedp.CombinedOutput(b.stderr),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc) // after the tab's: kills Chromium and waits for it
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chromium's output:\n%s", tail(b.stderr.String(), 3000))
		}
		cancelTab()
	})
	b.ctx = ctx
	t.Logf("screenshots go to %s", b.dir)
	// The first Do starts the browser and opens the tab. It runs on the
	// tab's own context: a context with a timeout would stop the browser
	// when it ended.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v\n%s", chromium, err, tail(b.stderr.String(), 3000))
	}
	// Listen, rather than Events' iterators: a dialog is recorded before
	// the click that opened it returns.
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			b.mu.Lock()
			b.dialogs = append(b.dialogs, string(ev.Type)+": "+ev.Message)
			b.mu.Unlock()
			// The listener runs in the loop that reads the tab's messages,
			// which the answer needs: it is sent from another goroutine. The
			// click waits for it (the page is blocked until it comes).
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true}) // a failure shows as the click's step not completing
			}()
		case *runtime.EventExceptionThrown:
			b.problem("exception: " + ev.ExceptionDetails.Text + " " + describeRemote(ev.ExceptionDetails.Exception))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				var args []string
				for _, a := range ev.Args {
					args = append(args, describeRemote(a))
				}
				b.problem("console.error: " + strings.Join(args, " "))
			}
		case *cdplog.EventEntryAdded:
			// Network entries are the responses' statuses: the favicon's
			// 404 and the reader's refused POSTs are expected.
			if ev.Entry.Level == cdplog.EntryLevelError && ev.Entry.Source != cdplog.EntrySourceNetwork {
				b.problem(fmt.Sprintf("%s: %s (%s)", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	b.do("turning on the runtime's and the log's events, and the laptop's screen",
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if _, err := cdp.Call(ctx, tg, runtime.Enable, cdp.Empty{}); err != nil {
				return err
			}
			_, err := cdp.Call(ctx, tg, cdplog.Enable, cdp.Empty{})
			return err
		}), b.viewport(false))
	// The listener must hear what a page reports, or finish could never
	// fail: a console.error of the test's own is heard, then forgotten.
	const probe = "chime-console-test-probe"
	b.eval(`console.error("`+probe+`"), true`, new(bool))
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for i, p := range b.problems {
			if strings.Contains(p, probe) {
				b.problems = slices.Delete(b.problems, i, i+1)
				return true, ""
			}
		}
		return false, "the listener to hear a console.error"
	})
	return b
}

func (b *consoleBrowser) problem(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, s)
}

func describeRemote(o *runtime.RemoteObject) string {
	if o == nil {
		return ""
	}
	if o.Description != "" {
		return o.Description
	}
	return string(o.Value)
}

// finish fails the test on what the pages reported as errors.
func (b *consoleBrowser) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		b.t.Errorf("the browser reported: %s", p)
	}
}

// viewport sets the laptop's screen, or the phone's: a mobile device whose
// pages lay out by their viewport meta tag.
func (b *consoleBrowser) viewport(phone bool) chromedp.Action[chromedp.Void] {
	if phone {
		return chromedp.EmulateViewport(phoneWidth, phoneHeight, chromedp.EmulateMobile, chromedp.EmulatePortrait)
	}
	return chromedp.EmulateViewport(laptopWidth, laptopHeight)
}

// do runs actions within a step's time, failing the test with the page
// as it is if they fail.
func (b *consoleBrowser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\n%s", what, err, b.describe())
	}
}

// eval evaluates expr in the page, awaiting it if it is a promise, into out.
func (b *consoleBrowser) eval(expr string, out any) {
	b.t.Helper()
	if err := b.tryEval(expr, out); err != nil {
		b.t.Fatalf("evaluating %s: %v\n%s", expr, err, b.describe())
	}
}

func (b *consoleBrowser) tryEval(expr string, out any) error {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// describe is the page's address and text, for a failure message; the
// page is shot too, as NN-failure.png.
func (b *consoleBrowser) describe() string {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		b.step++
		_ = os.WriteFile(filepath.Join(b.dir, fmt.Sprintf("%02d-failure.png", b.step)), png, 0o644) // best effort: the failure is reported either way
	}
	var s string
	if err := b.tryEval(`location.href + "\n" + (document.body ? document.body.innerText.slice(0, 3000) : "")`, &s); err != nil {
		return "(the page could not be read: " + err.Error() + ")"
	}
	return "the page at " + s
}

// waitJS waits until cond, a JavaScript expression, holds in the page.
// Evaluating it fails while a page is being replaced; that is waited out.
func (b *consoleBrowser) waitJS(what, cond string) {
	b.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		var ok bool
		err := b.tryEval("!!("+cond+")", &ok)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("waited %v for %s (%s): %v\n%s", stepTimeout, what, cond, err, b.describe())
		}
		// Polls the page: a condition across a navigation or a refresh
		// has no single event to wait on.
		time.Sleep(100 * time.Millisecond)
	}
}

// waitPage loads path again until cond holds in it: for what the page
// shows only on its next load.
func (b *consoleBrowser) waitPage(path, what, cond string) {
	b.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		b.navigate(path)
		var ok bool
		if err := b.tryEval("!!("+cond+")", &ok); err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("waited %v for %s (%s)\n%s", stepTimeout, what, cond, b.describe())
		}
		time.Sleep(200 * time.Millisecond) // the event's state changes in the cluster, which the page cannot announce
	}
}

func (b *consoleBrowser) navigate(path string) {
	b.t.Helper()
	b.do("opening "+path, chromedp.Navigate(b.base+path))
}

// click clicks the element sel selects once the page has loaded: its
// script (the confirm dialogs) runs at the end of the page.
func (b *consoleBrowser) click(sel string) {
	b.t.Helper()
	b.waitJS("the page loaded, to click "+sel, `document.readyState === "complete" && document.querySelector(`+jsString(sel)+`) !== null`)
	b.do("clicking "+sel, chromedp.Click(chromedp.CSS(sel)))
}

// clickConfirmed clicks sel and checks that a confirm dialog naming want
// opened, and was accepted.
func (b *consoleBrowser) clickConfirmed(sel, want string) {
	b.t.Helper()
	b.mu.Lock()
	before := len(b.dialogs)
	b.mu.Unlock()
	b.click(sel)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.dialogs) != before+1 || !strings.HasPrefix(b.dialogs[len(b.dialogs)-1], "confirm: ") || !strings.Contains(b.dialogs[len(b.dialogs)-1], want) {
		b.t.Errorf("clicking %s opened the dialogs %q, want one confirm naming %q", sel, b.dialogs[before:], want)
	}
}

// typeInto types text into the input sel selects, emptied first.
func (b *consoleBrowser) typeInto(sel, text string) {
	b.t.Helper()
	b.waitJS("the input "+sel, `document.readyState === "complete" && document.querySelector(`+jsString(sel)+`) !== null`)
	b.do("typing into "+sel, chromedp.Clear(chromedp.CSS(sel)), chromedp.SendKeys(chromedp.CSS(sel), text))
}

// signIn signs in with token on the sign-in page and waits for the page it
// leads to, signed in as name.
func (b *consoleBrowser) signIn(token, name string) {
	b.t.Helper()
	b.typeInto("input#token", token)
	b.click("button#signin")
	b.waitJS("signed in as "+name, `document.querySelector("header .user")?.textContent.trim().startsWith(`+jsString(name+" ")+`)`)
}

// search searches the events page for prefix with its search box.
func (b *consoleBrowser) search(prefix string) {
	b.t.Helper()
	var onEvents bool
	b.eval(`location.pathname === "/ui/events" && document.querySelector("input#q") !== null`, &onEvents)
	if !onEvents {
		b.click(`header nav a[href="/ui/events"]`)
	}
	b.typeInto("input#q", prefix)
	b.click("button#find")
	b.waitJS("the results for "+prefix, `new URLSearchParams(location.search).get("q") === `+jsString(prefix)+
		` && document.readyState === "complete" && document.querySelector("p.summary") !== null`)
}

// expectCount checks the count the events page shows, once it is there:
// a count not done within the page's budget is filled in by the page's
// script.
func (b *consoleBrowser) expectCount(want string) {
	b.t.Helper()
	b.waitJS("the count", `document.querySelector("strong#count") !== null || document.querySelector("p.summary .warn") !== null`)
	b.expectText("strong#count", want)
}

// rowIDs are the event ids the events page lists.
func (b *consoleBrowser) rowIDs() []string {
	var ids []string
	b.eval(`Array.from(document.querySelectorAll("td.id a")).map(a => a.textContent)`, &ids)
	return ids
}

func (b *consoleBrowser) exists(sel string) bool {
	var ok bool
	b.eval(`document.querySelector(`+jsString(sel)+`) !== null`, &ok)
	return ok
}

// expectText checks the text of the element sel selects.
func (b *consoleBrowser) expectText(sel, want string) {
	b.t.Helper()
	var got *string
	b.eval(`document.querySelector(`+jsString(sel)+`)?.textContent.trim() ?? null`, &got)
	if got == nil || *got != want {
		b.t.Errorf("%s reads %v, want %q\n%s", sel, deref(got), want, b.describe())
	}
}

func deref(s *string) string {
	if s == nil {
		return "<no such element>"
	}
	return fmt.Sprintf("%q", *s)
}

func (b *consoleBrowser) attr(sel, name string) string {
	var v string
	b.eval(`document.querySelector(`+jsString(sel)+`)?.getAttribute(`+jsString(name)+`) ?? ""`, &v)
	return v
}

// watchJob follows the job page, which reloads itself every second while
// the job runs, until it says done with want cancelled, and returns the
// cancelled counts it showed on the way.
func (b *consoleBrowser) watchJob(want int) []string {
	b.t.Helper()
	var seen []string
	deadline := time.Now().Add(stepTimeout)
	for {
		var st struct{ Title, Cancelled, Matched string }
		err := b.tryEval(`({title: document.querySelector("main h1")?.textContent ?? "",
			cancelled: document.querySelector("dd#job-cancelled")?.textContent ?? "",
			matched: document.querySelector("dd#job-matched")?.textContent ?? ""})`, &st)
		if err == nil && st.Cancelled != "" && (len(seen) == 0 || seen[len(seen)-1] != st.Cancelled) {
			seen = append(seen, st.Cancelled)
		}
		if err == nil && strings.Contains(st.Title, "done") {
			if st.Cancelled != fmt.Sprint(want) || st.Matched != fmt.Sprint(want) {
				b.t.Fatalf("the bulk cancel is done with %s matched, %s cancelled; want %d\n%s", st.Matched, st.Cancelled, want, b.describe())
			}
			return seen
		}
		if err == nil && strings.Contains(st.Title, "stopped") {
			b.t.Fatalf("the bulk cancel stopped\n%s", b.describe())
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the bulk cancel did not finish within %v (cancelled so far: %v)\n%s", stepTimeout, seen, b.describe())
		}
		time.Sleep(100 * time.Millisecond) // the page reloads itself every second; reading it faster sees each load
	}
}

// forge posts form to path from the page, with the session's CSRF token
// from its sign-out form, as a script on the page could, and returns the
// response's status and text.
func (b *consoleBrowser) forge(path string, form map[string]string) (int, string) {
	b.t.Helper()
	fj, err := json.Marshal(form)
	if err != nil {
		b.t.Fatal(err)
	}
	var res struct {
		Status int
		Text   string
	}
	b.eval(`(async () => {
		const body = new URLSearchParams(`+string(fj)+`);
		body.set("csrf", document.querySelector('form[action="/ui/logout"] input[name="csrf"]').value);
		const r = await fetch(`+jsString(path)+`, {method: "POST", body, credentials: "same-origin"});
		return {status: r.status, text: await r.text()};
	})()`, &res)
	return res.Status, res.Text
}

// shoot writes the page, whole, as the step's PNG.
func (b *consoleBrowser) shoot(name string) {
	b.t.Helper()
	// A page that has just replaced the last one may have no frame yet
	// ("Cannot take screenshot with 0 width"): the shot waits for the page
	// to load and to draw twice.
	b.waitJS("the page loaded, to shoot it", `document.readyState === "complete"`)
	deadline := time.Now().Add(stepTimeout)
	var png []byte
	for tries := 1; ; tries++ {
		var drawn bool
		err := b.tryEval(`new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))`, &drawn)
		if err == nil {
			ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
			cancel()
		}
		if err == nil {
			if tries > 1 {
				b.t.Logf("screenshot %s: taken at try %d", name, tries)
			}
			break
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("screenshot %s: %v\n%s", name, err, b.describe())
		}
		b.t.Logf("screenshot %s: %v; trying again", name, err)
		time.Sleep(100 * time.Millisecond) // the page draws on its own schedule
	}
	b.step++
	if err := os.WriteFile(filepath.Join(b.dir, fmt.Sprintf("%02d-%s.png", b.step, name)), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// shootSection shoots a section's page at the laptop's width and at the
// phone's, and fails the test if on the phone anything makes the page
// wider than the screen (a person would have to scroll sideways; a wide
// table scrolls inside its own box instead).
func (b *consoleBrowser) shootSection(name string) {
	b.t.Helper()
	b.shoot(name + "-laptop")
	b.do("the phone's screen", b.viewport(true))
	var m struct {
		InnerWidth, ClientWidth, ScrollWidth int
		Wide                                 []string
	}
	// scrollWidth against both innerWidth and the phone's width: on a
	// mobile screen Chromium may zoom out to fit a page wider than its
	// viewport, which widens innerWidth with it.
	b.eval(`(() => {
		const wide = [];
		for (const el of document.querySelectorAll("body *")) {
			const r = el.getBoundingClientRect();
			if (r.right > `+fmt.Sprint(phoneWidth)+` + 0.5 && !el.parentElement.closest(".scroll")) {
				wide.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + (el.className ? "." + String(el.className).trim().replace(/\s+/g, ".") : "") + " right=" + Math.round(r.right));
				if (wide.length === 8) break;
			}
		}
		return {innerWidth: window.innerWidth, clientWidth: document.documentElement.clientWidth,
			scrollWidth: document.documentElement.scrollWidth, wide};
	})()`, &m)
	b.shoot(name + "-phone")
	b.do("the laptop's screen", b.viewport(false))
	if m.ScrollWidth > m.InnerWidth || m.ScrollWidth > phoneWidth {
		b.t.Errorf("%s on a %dpx phone is %dpx wide (innerWidth %d, clientWidth %d): sideways scrolling; too wide: %v",
			name, phoneWidth, m.ScrollWidth, m.InnerWidth, m.ClientWidth, m.Wide)
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

func allPrefixed(ids []string, prefix string) bool {
	for _, id := range ids {
		if !strings.HasPrefix(id, prefix) {
			return false
		}
	}
	return true
}
