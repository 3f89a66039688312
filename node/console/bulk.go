package console

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chimehq/chime/client"
)

// maxJobs is how many bulk jobs the console remembers; the oldest finished
// one is forgotten first.
const maxJobs = 100

// job is one bulk change the console runs for a session's credential: a
// cancel (CancelMatching) or a shift of due times (ShiftMatching), whose
// totals its page shows as they stream in.
type job struct {
	ID      string
	Kind    string        // "cancel" or "shift"
	By      time.Duration // a shift's offset
	Owner   string        // the credential's name
	F       filterForm
	Started time.Time
	Cmd     string

	mu       sync.Mutex
	progress totals
	finished time.Time
	err      error
}

// totals are a job's counts: Done counts the events cancelled or moved.
type totals struct{ Matched, Done, Skipped, Held int64 }

// JobView is a job as its page shows it.
type JobView struct {
	ID, Kind, Owner, Cmd, Error  string
	Query                        template.URL // the filter's, for links (filterForm.Query)
	By                           time.Duration
	Started, Finished            time.Time
	Took                         time.Duration
	Matched, Done, Skipped, Held int64
	Running                      bool
	Percent                      int
}

func (j *job) view(now time.Time) JobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := JobView{ID: j.ID, Kind: j.Kind, By: j.By, Owner: j.Owner, Cmd: j.Cmd, Query: j.F.Query(), Started: j.Started, Finished: j.finished,
		Matched: j.progress.Matched, Done: j.progress.Done, Skipped: j.progress.Skipped, Held: j.progress.Held,
		Running: j.finished.IsZero()}
	if j.err != nil {
		v.Error = j.err.Error()
	}
	end := j.finished
	if v.Running {
		end = now
	}
	v.Took = end.Sub(j.Started).Round(100 * time.Millisecond)
	if v.Matched > 0 {
		v.Percent = int((v.Done + v.Skipped) * 100 / v.Matched)
	}
	if !v.Running && v.Error == "" {
		v.Percent = 100
	}
	return v
}

// jobs owns the running bulk jobs: each runs in a goroutine of its own
// until it finishes or close cancels it.
type jobs struct {
	mu     sync.Mutex
	byID   map[string]*job
	order  []string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newJobs() *jobs {
	ctx, cancel := context.WithCancel(context.Background())
	return &jobs{byID: map[string]*job{}, ctx: ctx, cancel: cancel}
}

func (js *jobs) close() {
	js.cancel()
	js.wg.Wait()
}

func (js *jobs) get(id string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.byID[id]
}

// start runs j with cl.
func (js *jobs) start(j *job, cl *client.Client, f client.Filter, now func() time.Time) {
	js.mu.Lock()
	js.byID[j.ID] = j
	js.order = append(js.order, j.ID)
	for len(js.order) > maxJobs {
		old := js.byID[js.order[0]]
		if old.view(now()).Running {
			break
		}
		delete(js.byID, js.order[0])
		js.order = js.order[1:]
	}
	js.wg.Add(1)
	js.mu.Unlock()
	go func() {
		defer js.wg.Done()
		set := func(t totals) {
			j.mu.Lock()
			j.progress = t
			j.mu.Unlock()
		}
		var t totals
		var err error
		if j.Kind == "shift" {
			var res client.ShiftResult
			res, err = cl.ShiftMatching(js.ctx, f, j.By, func(p client.ShiftResult) { set(totals{p.Matched, p.Moved, p.Skipped, 0}) })
			t = totals{res.Matched, res.Moved, res.Skipped, 0}
		} else {
			var res client.CancelMatchingResult
			res, err = cl.CancelMatching(js.ctx, f, client.OnProgress(func(p client.CancelMatchingResult) {
				set(totals{p.Matched, p.Cancelled, p.Skipped, p.Held})
			}))
			t = totals{res.Matched, res.Cancelled, res.Skipped, res.Held}
		}
		j.mu.Lock()
		defer j.mu.Unlock()
		j.progress, j.err, j.finished = t, err, now()
	}()
}

// bulkForm is what a bulk change's form and URL say: its kind, a shift's
// offset, and the filter.
type bulkForm struct {
	Kind string // "cancel" or "shift"
	By   string // a shift's offset as given
	by   time.Duration
}

// readBulk reads a bulk change and its filter, and refuses a filter that
// would select every event, or settled ones.
func readBulk(q url.Values, now time.Time) (bulkForm, filterForm, client.Filter, error) {
	b := bulkForm{Kind: q.Get("kind"), By: strings.TrimSpace(q.Get("by"))}
	ff, f, err := readFilter(q, now)
	if err != nil {
		return b, ff, f, err
	}
	switch b.Kind {
	case "", "cancel":
		b.Kind = "cancel"
	case "shift":
		if b.by, err = time.ParseDuration(b.By); err != nil || b.by == 0 {
			return b, ff, f, badInput("by: how far to move each event, a duration like 1h or -30m (got %q)", b.By)
		}
	default:
		return b, ff, f, badInput("kind: cancel or shift (got %q)", b.Kind)
	}
	if !ff.Narrows() {
		return b, ff, f, badInput("filter: a bulk change needs a filter (an id prefix, a topic or a due range); it will not change every event, nor every event of a state or a priority")
	}
	if ff.State != "" && ff.State != "scheduled" {
		return b, ff, f, badInput("state: only scheduled events can be changed (got %q)", ff.State)
	}
	f.States = []client.State{client.StateScheduled}
	return b, ff, f, nil
}

func (b bulkForm) cmd(ff filterForm) string {
	if b.Kind == "shift" {
		return "chimectl update" + ff.chimectl() + " --shift " + shellQuote(b.By)
	}
	return "chimectl cancel" + ff.chimectl()
}

// bulkPage shows what a bulk change would change (a dry run) and asks the
// operator to type the count to go on.
func (c *Console) bulkPage(w http.ResponseWriter, r *http.Request, s *session) {
	b, ff, f, err := readBulk(r.URL.Query(), c.cfg.Now())
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, time.Minute)
	if !ok {
		return
	}
	defer cancel()
	var matched int64
	if b.Kind == "shift" {
		matched, err = cl.Count(ctx, f)
	} else {
		var dry client.CancelMatchingResult
		dry, err = cl.CancelMatching(ctx, f, client.DryRun(true))
		matched = dry.Matched
	}
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	dryCmd := b.cmd(ff) + " --dry-run"
	c.render(w, r, s, "bulk", http.StatusOK, map[string]any{"B": b, "F": ff, "Matched": matched,
		"Cmd": b.cmd(ff), "DryCmd": dryCmd, "Max": client.MaxShift})
}

// bulkStart starts the bulk change the operator confirmed by typing the
// count its dry run showed.
func (c *Console) bulkStart(w http.ResponseWriter, r *http.Request, s *session) {
	b, ff, f, err := readBulk(r.PostForm, c.cfg.Now())
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	resume := r.PostForm.Get("resume") != ""
	if !resume {
		want, typed := r.PostForm.Get("expect"), strings.TrimSpace(strings.ReplaceAll(r.PostForm.Get("confirm"), ",", ""))
		if _, err := strconv.ParseInt(want, 10, 64); err != nil || typed != want {
			c.fail(w, r, s, badInput("confirm: type the number of events the dry run matched (%s) to go on (got %q)", want, r.PostForm.Get("confirm")))
			return
		}
	} else if j := c.jobs.get(r.PostForm.Get("resume")); j == nil || j.Owner != s.name || j.F.Query() != ff.Query() || j.Kind != "cancel" || b.Kind != "cancel" {
		// A shift is not run again from its page: it would move the
		// events it moved already once more.
		c.fail(w, r, s, badInput("resume: no bulk cancel %q of this filter and credential to resume", r.PostForm.Get("resume")))
		return
	}
	cl, err := c.clientFor(s)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	j := &job{ID: randomToken()[:12], Kind: b.Kind, By: b.by, Owner: s.name, F: ff, Started: c.cfg.Now(), Cmd: b.cmd(ff)}
	c.cfg.Logger.Info("console: bulk change started", "job", j.ID, "kind", j.Kind, "by", j.By, "credential", s.name, "filter", ff.Query())
	c.jobs.start(j, cl, f, c.cfg.Now)
	http.Redirect(w, r, "/ui/jobs/"+j.ID, http.StatusSeeOther)
}

func (c *Console) jobPage(w http.ResponseWriter, r *http.Request, s *session) {
	j := c.jobs.get(r.PathValue("id"))
	if j == nil || j.Owner != s.name {
		c.fail(w, r, s, fmt.Errorf("%w: no bulk job %q (the console forgets jobs when its node restarts)", client.ErrNotFound, r.PathValue("id")))
		return
	}
	v := j.view(c.cfg.Now())
	if v.Running {
		w.Header().Set("Refresh", "1")
	}
	c.render(w, r, s, "job", http.StatusOK, map[string]any{"J": v, "F": j.F})
}
