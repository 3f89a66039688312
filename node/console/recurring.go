package console

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/chimehq/chime/client"
)

// occurrencePrefix is what the event ids of schedule id's occurrences start
// with: the client documents them as "<schedule id>@<occurrence Unix ms>".
func occurrencePrefix(id string) string { return id + "@" }

// maxRecurringRows is how many schedules the recurring page lists at once:
// a prefix narrows a longer list.
const maxRecurringRows = 500

// ruleText says a rule in one line, as chimectl recurring get does.
func ruleText(r client.Rule) string {
	var b strings.Builder
	if r.Cron != "" {
		b.WriteString("cron " + r.Cron)
		if r.TimeZone != "" {
			b.WriteString(" in " + r.TimeZone)
		} else {
			b.WriteString(" in UTC")
		}
	} else {
		b.WriteString("every " + r.Every.String())
	}
	if !r.Start.IsZero() {
		b.WriteString(", from " + r.Start.UTC().Format(time.RFC3339))
	}
	if !r.End.IsZero() {
		b.WriteString(", until " + r.End.UTC().Format(time.RFC3339))
	}
	if r.MaxOccurrences > 0 {
		b.WriteString(", at most " + strconv.FormatUint(r.MaxOccurrences, 10) + " times")
	}
	if r.Jitter > 0 {
		b.WriteString(", jitter " + r.Jitter.String())
	}
	return b.String()
}

// recurringRow is one schedule of the list.
type recurringRow struct {
	client.RecurringSchedule
	Rule, In string
}

func (c *Console) recurringPage(w http.ResponseWriter, r *http.Request, s *session) {
	prefix := strings.TrimSpace(r.URL.Query().Get("q"))
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	now := c.cfg.Now()
	var rows []recurringRow
	more := false
	for rs, err := range cl.Recurring().List(ctx, prefix) {
		if err != nil {
			c.fail(w, r, s, err)
			return
		}
		if len(rows) == maxRecurringRows {
			more = true
			break
		}
		rows = append(rows, recurringRow{RecurringSchedule: rs, Rule: ruleText(rs.Rule), In: relative(rs.NextDue, now)})
	}
	cmd := "chimectl recurring list"
	if prefix != "" {
		cmd += " --prefix " + shellQuote(prefix)
	}
	c.render(w, r, s, "recurring", http.StatusOK, map[string]any{"Q": prefix, "Done": r.URL.Query().Get("done"), "Rows": rows, "More": more, "Max": maxRecurringRows, "Cmd": cmd})
}

func (c *Console) recurringOnePage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.URL.Query().Get("id")
	if id == "" {
		c.fail(w, r, s, badInput("id: the schedule's id is required"))
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	rs, err := cl.Recurring().Get(ctx, id)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	now := c.cfg.Now()
	loc := time.UTC
	if rs.Rule.TimeZone != "" {
		if l, err := time.LoadLocation(rs.Rule.TimeZone); err == nil {
			loc = l
		}
	}
	type upcoming struct{ UTC, Zone, In string }
	var up []upcoming
	for _, t := range rs.Upcoming {
		up = append(up, upcoming{UTC: t.UTC().Format("2006-01-02 15:04:05 MST"), Zone: t.In(loc).Format("2006-01-02 15:04:05 MST"), In: relative(t, now)})
	}
	last := map[string]any{}
	if ev, found, more, err := lastFired(ctx, cl, rs, now); err != nil {
		last["Error"] = err.Error()
	} else if found {
		last["E"], last["In"], last["Late"], last["More"] = ev, relative(ev.FiredAt, now), ev.FiredAt.Sub(ev.Due).Round(time.Millisecond), more
	}
	q := shellQuote(id)
	c.render(w, r, s, "recurring-one", http.StatusOK, map[string]any{
		"S": rs, "Rule": ruleText(rs.Rule), "Upcoming": up, "ID": id, "Done": r.URL.Query().Get("done"), "Last": last, "LastMax": lastFiredPages * lastFiredPage,
		"LastCmd":     "chimectl list --prefix " + shellQuote(occurrencePrefix(id)) + " --state fired",
		"Occurrences": "/ui/events?q=" + url.QueryEscape(occurrencePrefix(id)),
		// The trigger form carries the moment the page was drawn: the
		// occurrence's time, so that the form sent twice (a double click, a
		// browser's resend) makes one occurrence.
		"TriggerAt": strconv.FormatInt(now.UnixMilli(), 10),
		"Cmd": map[string]string{"get": "chimectl recurring get " + q, "pause": "chimectl recurring pause " + q,
			"resume": "chimectl recurring resume " + q, "delete": "chimectl recurring delete " + q,
			"trigger": "chimectl recurring trigger " + q, "backfill": "chimectl recurring backfill " + q + " --from -2h --to -1h"},
	})
}

// lastFiredJSON is what /ui/recurring/last answers: the schedule's latest
// fired occurrence, none, or why not.
type lastFiredJSON struct {
	ID      string `json:"id,omitempty"`
	FiredAt string `json:"fired_at,omitempty"` // UTC, as the pages show times
	In      string `json:"in,omitempty"`       // "4m ago"
	Late    string `json:"late,omitempty"`     // after its due time
	None    bool   `json:"none,omitempty"`
	Error   string `json:"error,omitempty"`
}

// lastFiredEndpoint answers the latest fired occurrence of the schedule
// ?id= names, for the recurring list's script: the list shows up to
// maxRecurringRows schedules, and finding each one's last fire is a search
// of its occurrences, so the page is drawn first and each cell asks after.
func (c *Console) lastFiredEndpoint(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.URL.Query().Get("id")
	if id == "" {
		c.failJSON(w, badInput("id: the schedule's id is required"))
		return
	}
	cl, ctx, cancel, ok := c.jsonCallsFor(w, r, s)
	if !ok {
		return
	}
	defer cancel()
	rs, err := cl.Recurring().Get(ctx, id)
	if err != nil {
		c.failJSON(w, err)
		return
	}
	now := c.cfg.Now()
	ev, found, _, err := lastFired(ctx, cl, rs, now)
	switch {
	case err != nil:
		c.failJSON(w, err)
	case !found:
		writeJSON(w, http.StatusOK, lastFiredJSON{None: true})
	default:
		writeJSON(w, http.StatusOK, lastFiredJSON{ID: ev.ID, FiredAt: ev.FiredAt.UTC().Format("2006-01-02 15:04:05 MST"),
			In: relative(ev.FiredAt, now), Late: ev.FiredAt.Sub(ev.Due).Round(time.Millisecond).String()})
	}
}

// lastFiredSteps is how many ever wider windows of due times lastFired
// looks back through, each lastFiredGrowth times the one before, before it
// lists every fired occurrence of the schedule; lastFiredPages bounds the
// pages of lastFiredPage events it reads in the first window that has
// one.
const (
	lastFiredSteps  = 6
	lastFiredGrowth = 8
	lastFiredPages  = 5
	lastFiredPage   = 200
)

// lastFired returns the latest fired occurrence of schedule rs, by due
// time: the schedule keeps no record of it, and its occurrences are events
// with ids under "<id>@". List has them in due order from the earliest, so
// it reads a window of due times before now, from about two periods of the
// rule (the pending occurrence is the next) widened until it holds one:
// a few calls, each reading the schedule's own occurrences in the id
// index, and none for a schedule that fires as it should. The filter names
// the target's topic, the topic the occurrences are produced to, so that a
// credential limited to topics may ask. more reports that the window held
// more than lastFiredPages pages: ev is then the latest of those read.
func lastFired(ctx context.Context, cl *client.Client, rs client.RecurringSchedule, now time.Time) (ev client.Event, found, more bool, err error) {
	period := rs.Rule.Every
	if period <= 0 && len(rs.Upcoming) >= 2 {
		period = rs.Upcoming[1].Sub(rs.Upcoming[0])
	}
	if period <= 0 {
		period = time.Hour
	}
	window := 2*period + rs.Rule.Jitter + time.Minute
	f := client.Filter{IDPrefix: occurrencePrefix(rs.ID), Topic: rs.Target.Topic, States: []client.State{client.StateFired}}
	for step := 0; ; step++ {
		f.DueAfter = time.Time{}
		if step < lastFiredSteps {
			f.DueAfter = now.Add(-window)
		}
		token := ""
		for range lastFiredPages {
			p, err := cl.ListPage(ctx, f, lastFiredPage, token)
			if err != nil {
				return client.Event{}, false, false, err
			}
			if n := len(p.Events); n > 0 {
				ev, found = p.Events[n-1], true
			}
			if token, more = p.Next, p.Next != ""; !more {
				break
			}
		}
		if found || step >= lastFiredSteps {
			return ev, found, more, nil
		}
		window *= lastFiredGrowth
	}
}

// triggerFormAge is how long the time a trigger form was drawn at stays the
// occurrence's time. A form sent later is a new request, made at the time
// it arrives; a resend of it within the age is recognised as the same.
const triggerFormAge = time.Hour

// triggerAt is the occurrence time a trigger form names: the moment its page
// was drawn, while that is recent, and now otherwise.
func triggerAt(v string, now time.Time) time.Time {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return now
	}
	at := time.UnixMilli(ms)
	if at.After(now) || now.Sub(at) > triggerFormAge {
		return now
	}
	return at
}

// recurringAction pauses, resumes, deletes, triggers or backfills a
// schedule.
func (c *Console) recurringAction(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PostForm.Get("id")
	if id == "" {
		c.fail(w, r, s, badInput("id: the schedule's id is required"))
		return
	}
	cl, ctx, cancel, ok := c.callsFor(w, r, s, callTimeout)
	if !ok {
		return
	}
	defer cancel()
	var done string
	var err error
	switch r.PathValue("action") {
	case "pause":
		_, err = cl.Recurring().Pause(ctx, id)
		done = "paused"
	case "resume":
		_, err = cl.Recurring().Resume(ctx, id)
		done = "resumed"
	case "delete":
		if err = cl.Recurring().Delete(ctx, id); err == nil {
			http.Redirect(w, r, "/ui/recurring?done="+url.QueryEscape("deleted "+id), http.StatusSeeOther)
			return
		}
	case "trigger":
		var o client.Occurrence
		if o, err = cl.Recurring().TriggerAt(ctx, id, triggerAt(r.PostForm.Get("at"), c.cfg.Now())); err == nil {
			done = "triggered " + o.EventID
			if o.Existing {
				done = o.EventID + " exists already, not triggered again"
			}
		}
	case "backfill":
		now := c.cfg.Now()
		from, ferr := parseWhen("from", strings.TrimSpace(r.PostForm.Get("from")), now)
		to, terr := parseWhen("to", strings.TrimSpace(r.PostForm.Get("to")), now)
		switch {
		case ferr != nil:
			err = ferr
		case terr != nil:
			err = terr
		case from.IsZero():
			err = badInput("from: required, the start of the range of the rule's times to backfill (like -2h)")
		default:
			if to.IsZero() {
				to = now
			}
			var res client.BackfillResult
			if res, err = cl.Recurring().Backfill(ctx, id, from, to); err == nil {
				done = "backfilled " + strconv.Itoa(len(res.Created)) + " occurrences, " + strconv.Itoa(res.Existing) + " existed already"
			}
		}
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	http.Redirect(w, r, "/ui/recurring/one?id="+url.QueryEscape(id)+"&done="+url.QueryEscape(done), http.StatusSeeOther)
}
