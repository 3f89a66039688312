package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/auth"
)

// callTimeout bounds each call a page makes to the cluster.
const callTimeout = 10 * time.Second

// pageSizes are the page sizes the events page offers; the first is the
// default.
var pageSizes = []int{50, 100, 500}

// parsePages parses each page template with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"utc":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 MST") },
		"rfc":   func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
		"local": func(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05 MST") },
		"shq":   shellQuote,
		"join":  strings.Join,
	}
	names, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", n)
		if err != nil {
			return nil, err
		}
		pages[base] = t
	}
	return pages, nil
}

// view is what every page's layout shows.
type view struct {
	Title   string
	Nav     string
	Node    string
	User    string
	Role    string
	Mode    string
	CanAct  bool
	CSRF    string
	Secured bool
	Data    any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, page string, code int, data any) {
	v := view{Title: page, Nav: page, Node: c.cfg.NodeID, Mode: c.cfg.Mode.String(), Secured: c.cfg.Auth != nil, Data: data}
	if s != nil {
		v.User, v.Role, v.CSRF = s.name, string(s.role), s.csrf
		v.CanAct = c.cfg.Mode == On && s.role != auth.RoleReader
	}
	var b bytes.Buffer
	t := c.pages[page]
	if t == nil {
		http.Error(w, "no page "+page, http.StatusInternalServerError)
		return
	}
	if err := t.ExecuteTemplate(&b, "layout.html", v); err != nil {
		c.cfg.Logger.Error("console: rendering a page", "page", page, "err", err)
		http.Error(w, "the page failed to render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes()) // the client may have gone; no one to tell
}

// fail shows err on page's layout with code, and the page's data.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, err error) {
	c.render(w, r, s, "error", errorCode(err), map[string]any{"Error": err.Error(), "Back": r.Referer()})
}

var errBadInput = errors.New("bad input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadInput, fmt.Sprintf(format, args...))
}

// filterForm is the events filter as the query string carries it, so that
// every list is a bookmarkable URL.
type filterForm struct {
	Q, Topic, State, From, To string
	Priority                  string // "" for any, or 0 to 9
	Size                      int
	Page                      string // List's page token
}

var stateNames = map[string]client.State{
	"scheduled": client.StateScheduled, "fired": client.StateFired,
	"cancelled": client.StateCancelled, "dead-lettered": client.StateDeadLettered,
}

// States are the state filter's choices, in order.
var States = []string{"scheduled", "fired", "cancelled", "dead-lettered"}

// Priorities are the priority filter's choices: an event's priority is 0
// (lowest) to 9 (highest), 5 when it was scheduled without one.
var Priorities = []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}

func readFilter(q url.Values, now time.Time) (filterForm, client.Filter, error) {
	ff := filterForm{Q: strings.TrimSpace(q.Get("q")), Topic: strings.TrimSpace(q.Get("topic")), State: q.Get("state"),
		From: strings.TrimSpace(q.Get("from")), To: strings.TrimSpace(q.Get("to")), Priority: q.Get("priority"), Page: q.Get("page"), Size: pageSizes[0]}
	f := client.Filter{IDPrefix: ff.Q, Topic: ff.Topic}
	if ff.State != "" {
		st, ok := stateNames[ff.State]
		if !ok {
			return ff, f, badInput("state: must be one of %s (got %q)", strings.Join(States, ", "), ff.State)
		}
		f.States = []client.State{st}
	}
	if ff.Priority != "" {
		if !slices.Contains(Priorities, ff.Priority) {
			return ff, f, badInput("priority: must be 0 (lowest) to 9 (highest), or empty for any (got %q)", ff.Priority)
		}
		p, _ := strconv.Atoi(ff.Priority) // one of Priorities
		f.Priorities = []int{p}
	}
	var err error
	if f.DueAfter, err = parseWhen("from", ff.From, now); err != nil {
		return ff, f, err
	}
	if f.DueBefore, err = parseWhen("to", ff.To, now); err != nil {
		return ff, f, err
	}
	if v := q.Get("size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || !slices.Contains(pageSizes, n) {
			return ff, f, badInput("size: must be one of 50, 100 or 500 (got %q)", v)
		}
		ff.Size = n
	}
	return ff, f, nil
}

// parseWhen reads a due-range bound: RFC 3339, a datetime-local input's
// "2006-01-02T15:04" (UTC), or a duration from now (2h, -30m).
func parseWhen(field, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02T15:04", v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(d), nil
	}
	return time.Time{}, badInput("%s: must be an RFC 3339 time (2030-01-02T09:00:00Z), a UTC time 2030-01-02T09:00, or a duration from now like 2h or -30m (got %q)", field, v)
}

// query is the filter's query string, without the page token.
func (ff filterForm) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"q": ff.Q, "topic": ff.Topic, "state": ff.State, "priority": ff.Priority, "from": ff.From, "to": ff.To} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if ff.Size != pageSizes[0] {
		q.Set("size", strconv.Itoa(ff.Size))
	}
	return q
}

// Query is the filter's query string (for links), without the page token.
// It is a template.URL, which html/template keeps as it is after a link's
// "?": a string there is escaped as one query value, '=' and '&' included,
// and the link then carried no filter (a bulk cancel's link opened "needs a
// filter").
func (ff filterForm) Query() template.URL { return template.URL(ff.query().Encode()) } // url.Values.Encode escaped each key and value

// Empty reports a filter that selects every event.
func (ff filterForm) Empty() bool {
	return ff.Q == "" && ff.Topic == "" && ff.State == "" && ff.Priority == "" && ff.From == "" && ff.To == ""
}

// Narrows reports a filter narrower than a state and a priority: what a
// bulk change needs, as either alone selects about every event (the API
// refuses a bulk cancel by priorities alone).
func (ff filterForm) Narrows() bool {
	return ff.Q != "" || ff.Topic != "" || ff.From != "" || ff.To != ""
}

// chimectl returns the chimectl flags that select what ff selects.
func (ff filterForm) chimectl() string {
	var b strings.Builder
	for _, kv := range [][2]string{{"--prefix", ff.Q}, {"--topic", ff.Topic}, {"--priority", ff.Priority}, {"--due-after", ff.From}, {"--due-before", ff.To}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s %s", kv[0], shellQuote(kv[1]))
		}
	}
	return b.String()
}

// row is one event of a list.
type row struct {
	client.Event
	In string // "in 3h 12m" or "4m ago"
}

func (c *Console) eventsPage(w http.ResponseWriter, r *http.Request, s *session) {
	began := time.Now()
	now := c.cfg.Now()
	ff, f, err := readFilter(r.URL.Query(), now)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	data := map[string]any{"F": ff, "States": States, "Priorities": Priorities, "Sizes": pageSizes}
	// An exact id opens its event: the search box's first job.
	if ff.Q != "" && ff.Page == "" && r.URL.Query().Get("prefix") == "" {
		if _, err := cl.Get(ctx, ff.Q); err == nil {
			http.Redirect(w, r, "/ui/event?id="+url.QueryEscape(ff.Q), http.StatusSeeOther)
			return
		} else if !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrPermissionDenied) {
			c.fail(w, r, s, err)
			return
		}
	}
	// The count runs beside the list and is waited for only until
	// countBudget is spent: counting a broad selection reads every match,
	// and a first page that waited for it would take as long.
	start := time.Now()
	answer, stopCount := startCount(ctx, cl, f)
	defer stopCount()
	page, err := cl.ListPage(ctx, f, ff.Size, ff.Page)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	listTook := time.Since(start)
	rows := make([]row, len(page.Events))
	for i, ev := range page.Events {
		rows[i] = row{Event: ev, In: relative(ev.Due, now)}
	}
	data["Rows"], data["Took"] = rows, listTook.Round(time.Millisecond)
	if page.Next != "" {
		q := ff.query()
		q.Set("page", page.Next)
		data["Next"] = template.URL(q.Encode()) // as Query: url.Values encoded it
	}
	if ff.Page != "" {
		data["First"] = ff.Query()
	}
	var res counted
	done := false
	if r.URL.Query().Get("count") == "wait" {
		// The link a page without scripts offers: this page waits for
		// its count as long as any call.
		res, done = <-answer, true
	} else {
		res, done = awaitCount(answer, start)
	}
	timing := serverTiming{}
	timing.add("list", listTook)
	switch {
	case !done:
		timing.note("count", "pending")
		wait := ff.query()
		wait.Set("count", "wait")
		data["CountLater"], data["CountWait"] = ff.Query(), template.URL(wait.Encode()) // as Query: url.Values encoded it
	case res.err != nil:
		// A list that answered is worth showing even when counting a
		// large selection failed or ran out of time.
		timing.add("count", res.took)
		data["CountError"] = res.err.Error()
	default:
		timing.add("count", res.took)
		data["Count"] = res.n
	}
	timing.add("total", time.Since(began))
	timing.set(w)
	data["Cmd"] = "chimectl list" + ff.chimectl() + stateFlag(ff.State)
	c.render(w, r, s, "events", http.StatusOK, data)
}

func stateFlag(st string) string {
	if st == "" {
		return ""
	}
	return " --state " + st
}

// relative says when t is from now: "in 3h 12m", "4m 10s ago".
func relative(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := t.Sub(now)
	ago := d < 0
	if ago {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		s = d.Round(time.Millisecond).String()
	case d < time.Hour:
		s = fmt.Sprintf("%dm %ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh %dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		s = fmt.Sprintf("%dd %dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
	if ago {
		return s + " ago"
	}
	return "in " + s
}

// payloadView shows a payload as pretty JSON, text or hex, as it reads.
type payloadView struct {
	Kind, Text string
}

func viewPayload(b []byte, want string) payloadView {
	if len(b) == 0 {
		return payloadView{Kind: "empty"}
	}
	if want == "" || want == "json" {
		var out bytes.Buffer
		if json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
			return payloadView{Kind: "json", Text: out.String()}
		}
	}
	if (want == "" || want == "text") && utf8.Valid(b) {
		return payloadView{Kind: "text", Text: string(b)}
	}
	return payloadView{Kind: "hex", Text: hex.Dump(b)}
}

func (c *Console) eventPage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.URL.Query().Get("id")
	if id == "" {
		c.fail(w, r, s, badInput("id: the event's id is required"))
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	ev, err := cl.Get(ctx, id)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	now := c.cfg.Now()
	data := map[string]any{
		"E": ev, "In": relative(ev.Due, now), "ID": id, "Q": url.QueryEscape(id),
		"Payload": viewPayload(ev.Payload, r.URL.Query().Get("as")), "As": r.URL.Query().Get("as"),
		"PayloadText": string(ev.Payload), "PayloadEditable": utf8.Valid(ev.Payload),
		"Pending": ev.State == client.StateScheduled, "Done": r.URL.Query().Get("done"),
		"Cmd": map[string]string{
			"get":        "chimectl get " + shellQuote(id),
			"cancel":     "chimectl cancel " + shellQuote(id),
			"reschedule": fmt.Sprintf("chimectl update --if-version %d --at <time> %s", ev.Version, shellQuote(id)),
			"fire":       fmt.Sprintf("chimectl update --if-version %d --in 0s %s", ev.Version, shellQuote(id)),
			"edit":       fmt.Sprintf("chimectl update --if-version %d --payload <payload> %s", ev.Version, shellQuote(id)),
		},
	}
	if ev.State == client.StateFired && !ev.FiredAt.IsZero() {
		data["Late"] = ev.FiredAt.Sub(ev.Due).Round(time.Millisecond)
	}
	var hs []string
	for _, h := range ev.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	data["HeaderLines"] = strings.Join(hs, "\n")
	c.render(w, r, s, "event", http.StatusOK, data)
}

// eventAction is one change to one event: cancel, reschedule, fire (now)
// or edit. All but cancel carry the version the operator saw, so that the
// change is refused if someone changed the event since.
func (c *Console) eventAction(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PostForm.Get("id")
	if id == "" {
		c.fail(w, r, s, badInput("id: the event's id is required"))
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	action := r.PathValue("action")
	var done string
	var err error
	var opts []client.UpdateOption
	if action != "cancel" {
		v, err := strconv.ParseUint(r.PostForm.Get("version"), 10, 64)
		if err != nil || v == 0 {
			c.fail(w, r, s, badInput("version: the version the change is for is required (got %q)", r.PostForm.Get("version")))
			return
		}
		opts = append(opts, client.IfVersion(v))
	}
	switch action {
	case "cancel":
		err = cl.Cancel(ctx, id)
		done = "cancelled"
	case "fire":
		opts = append(opts, client.In(0))
		done = "fire now: due now"
	case "reschedule":
		at, perr := parseWhen("due", strings.TrimSpace(r.PostForm.Get("due")), c.cfg.Now())
		if perr == nil && at.IsZero() {
			perr = badInput("due: the new due time is required")
		}
		if perr != nil {
			c.fail(w, r, s, perr)
			return
		}
		opts = append(opts, client.At(at))
		done = "rescheduled to " + at.UTC().Format(time.RFC3339)
	case "edit":
		opts = append(opts, client.SetPayload([]byte(r.PostForm.Get("payload"))))
		hs, herr := parseHeaders(r.PostForm.Get("headers"))
		if herr != nil {
			c.fail(w, r, s, herr)
			return
		}
		opts = append(opts, client.SetHeaders(hs))
		done = "payload and headers changed"
	default:
		http.NotFound(w, r)
		return
	}
	if action != "cancel" {
		_, err = cl.Update(ctx, id, opts...)
	}
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	http.Redirect(w, r, "/ui/event?id="+url.QueryEscape(id)+"&done="+url.QueryEscape(done), http.StatusSeeOther)
}

// parseHeaders reads the edit form's headers, one name=value a line.
func parseHeaders(text string) ([]client.Header, error) {
	hs := []client.Header{}
	for i, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, badInput("headers: line %d must be name=value (got %q)", i+1, line)
		}
		hs = append(hs, client.Header{Key: strings.TrimSpace(k), Value: []byte(v)})
	}
	return hs, nil
}

func (c *Console) clusterPage(w http.ResponseWriter, r *http.Request, s *session) {
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	admin := chimev1.NewAdminClient(cl.Conn())
	data := map[string]any{}
	if st, err := admin.Status(ctx, &chimev1.StatusRequest{}); err == nil {
		data["Status"] = st
	} else if m, merr := admin.GetClusterMap(ctx, &chimev1.GetClusterMapRequest{}); merr == nil {
		// Status is the admin's; every role may read the map.
		data["Map"], data["StatusError"] = m, err.Error()
	} else {
		c.fail(w, r, s, err)
		return
	}
	if lim, err := admin.GetTopicRateLimits(ctx, &chimev1.GetTopicRateLimitsRequest{}); err == nil {
		data["Limits"] = lim
		if len(lim.GetNodes()) > 0 {
			data["Rules"] = rulesText(lim.GetNodes()[0].GetLimits())
		}
	}
	data["Admin"], data["Done"] = isAdmin(s), r.URL.Query().Get("done")
	c.render(w, r, s, "cluster", http.StatusOK, data)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("-_./:@=+,", r)
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }
