package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// filterFlags are the flags that select events, shared by list, count and
// cancel's bulk form.
type filterFlags struct {
	prefix, topic, dueBefore, dueAfter string
	states, priorities                 multiFlag
}

func (f *filterFlags) register(fs *flag.FlagSet, withState bool) {
	fs.StringVar(&f.prefix, "prefix", "", "only events whose id starts with this `prefix`")
	fs.StringVar(&f.topic, "topic", "", "only events of this `topic`")
	fs.Var(&f.priorities, "priority", "only events of this `priority`, 0 (lowest) to 9 (highest); an event scheduled without --priority has 5; repeatable, or comma-separated")
	if withState {
		fs.Var(&f.states, "state", "only events in this `state`: scheduled, fired, cancelled or dead_lettered; repeatable, or comma-separated")
	}
	fs.StringVar(&f.dueBefore, "due-before", "", "only events due before this `time`: RFC 3339, or a duration from now like 2h or -30m")
	fs.StringVar(&f.dueAfter, "due-after", "", "only events due at or after this `time`: RFC 3339, or a duration from now like 2h or -30m")
}

// given reports whether any filter flag was set.
func (f *filterFlags) given() bool {
	return f.prefix != "" || f.topic != "" || len(f.states) > 0 || len(f.priorities) > 0 || f.dueBefore != "" || f.dueAfter != ""
}

// narrows reports whether a flag other than --state and --priority was set: what a bulk
// cancel or shift needs, as either alone selects too many events to act on.
func (f *filterFlags) narrows() bool {
	return f.prefix != "" || f.topic != "" || f.dueBefore != "" || f.dueAfter != ""
}

func (f *filterFlags) filter(now time.Time) (*chimev1.EventFilter, error) {
	out := &chimev1.EventFilter{IdPrefix: f.prefix, Topic: f.topic}
	for _, v := range f.states {
		for _, s := range strings.Split(v, ",") {
			st, ok := chimev1.EventState_value["EVENT_STATE_"+strings.ToUpper(strings.TrimSpace(s))]
			if !ok || st == 0 {
				return nil, usagef("--state %q: want scheduled, fired, cancelled or dead_lettered", s)
			}
			out.States = append(out.States, chimev1.EventState(st))
		}
	}
	for _, v := range f.priorities {
		for _, s := range strings.Split(v, ",") {
			p, err := strconv.ParseUint(strings.TrimSpace(s), 10, 8)
			if err != nil || p > 9 {
				return nil, usagef("--priority %q: want 0 (lowest) to 9 (highest)", s)
			}
			out.Priorities = append(out.Priorities, uint32(p))
		}
	}
	var err error
	if out.DueBefore, err = flagTime("due-before", f.dueBefore, now); err != nil {
		return nil, err
	}
	if out.DueAfter, err = flagTime("due-after", f.dueAfter, now); err != nil {
		return nil, err
	}
	if out.DueBefore != nil && out.DueAfter != nil && !out.DueBefore.AsTime().After(out.DueAfter.AsTime()) {
		return nil, usagef("--due-before %s is not after --due-after %s", f.dueBefore, f.dueAfter)
	}
	return out, nil
}

// flagTime reads an RFC 3339 time or a duration from now; "" is unset.
func flagTime(name, v string, now time.Time) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return timestamppb.New(t), nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return timestamppb.New(now.Add(d)), nil
	}
	return nil, usagef("--%s %q is neither an RFC 3339 time like 2030-01-02T09:00:00Z nor a duration from now like 2h or -30m", name, v)
}

func listCommand() *command {
	return &command{
		name:    "list",
		summary: "list events by id prefix, topic, state, priority and due time",
		about: `List shows the events the filters select, scheduled ones and settled ones
(fired, cancelled and dead-lettered events are kept for the cluster's
retention), ordered by due time, then id, across every shard: a table by
default, one JSON object per event (as get --json prints it) with --json.
It prints at most --limit events (0: all of them, a page at a time); when
more follow, it says so on standard error with the --page-token that
continues the list, on any node. The answer is linearizable (it reflects
every change acknowledged before it began) unless --stale lets any replica
answer. An id prefix is the fast filter: it is answered from the id index,
however many events the cluster holds. --priority selects by the priority
the events were scheduled with (5 for one scheduled without --priority);
every node must run a release that knows it: an earlier node answers for
every priority.`,
		example: `  chimectl list --prefix order-42/
  chimectl list --state scheduled --priority 9 --due-before 1h --limit 20
  chimectl list --topic reminders --state fired --due-after -24h --limit 0 --json | jq -r .id`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			var ff filterFlags
			ff.register(fs, true)
			limit := fs.Int("limit", 100, "print at most this many events; 0 prints every match")
			token := fs.String("page-token", "", "continue a list from the `token` an earlier list printed")
			stale := fs.Bool("stale", false, "let any replica answer, possibly a little behind the leaders")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("list takes no arguments, got %q (filter with --prefix)", args)
				}
				if *limit < 0 {
					return usagef("--limit %d: must be 0 (all) or more", *limit)
				}
				filter, err := ff.filter(c.now())
				if err != nil {
					return err
				}
				var tw *tabwriter.Writer
				if !c.json {
					tw = tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
					fmt.Fprintln(tw, "ID\tSTATE\tDUE\tWHEN\tVERSION\tTOPIC\tPAYLOAD")
				}
				cl, err := c.dial(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = cl.Close() }() // fails only for a client already closed
				printed := 0
				req := &chimev1.ListRequest{Filter: filter, PageToken: *token, StaleOk: *stale}
				for {
					req.Limit = 1000
					if *limit > 0 {
						req.Limit = uint32(min(1000, *limit-printed))
					}
					// Each page is a request of its own, bounded by
					// --timeout, and repeated while it may be: a page
					// token continues on any node.
					var resp *chimev1.ListResponse
					rctx, cancel := c.requestCtx(ctx)
					err := cl.Do(rctx, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
						resp, err = chimev1.NewSchedulerClient(cc).List(ctx, req)
						return err
					})
					cancel()
					if err != nil {
						if tw != nil {
							// What was listed before the error, to the terminal as the
							// Fprint calls write; err is the one to report.
							_ = tw.Flush()
						}
						return err
					}
					for _, g := range resp.Events {
						if c.json {
							if err := c.printJSON(eventJSON(g)); err != nil {
								return err
							}
						} else {
							due := g.GetDue().AsTime()
							fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", g.GetEvent().GetId(), stateName(g.GetState()),
								c.localTime(due), relative(due.Sub(c.now())), g.GetVersion(), g.GetEvent().GetTopic(),
								orNone(showBytes(g.GetEvent().GetPayload(), 40), "(empty)"))
						}
					}
					printed += len(resp.Events)
					req.PageToken = resp.NextPageToken
					if req.PageToken == "" || *limit > 0 && printed >= *limit {
						break
					}
				}
				if tw != nil {
					if err := tw.Flush(); err != nil {
						return err
					}
				}
				if req.PageToken != "" {
					fmt.Fprintf(c.stderr, "more events follow: continue with --page-token %s\n", req.PageToken)
				}
				return nil
			}
		},
	}
}

func countCommand() *command {
	return &command{
		name:    "count",
		summary: "count events by id prefix, topic, state, priority and due time",
		about: `Count prints how many events the filters select, as list would list them,
across every shard. Counting by state alone is read from counters; by id
prefix, from the id index (about a second for ten million events);
scheduled events by due time and priority, from the due index; anything
else reads the events themselves.`,
		example: `  chimectl count --state scheduled
  chimectl count --prefix order-42/
  chimectl count --topic reminders --priority 8,9 --due-before 1h --json`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			var ff filterFlags
			ff.register(fs, true)
			stale := fs.Bool("stale", false, "let any replica answer, possibly a little behind the leaders")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("count takes no arguments, got %q (filter with --prefix)", args)
				}
				filter, err := ff.filter(c.now())
				if err != nil {
					return err
				}
				var resp *chimev1.CountResponse
				err = c.read(ctx, func(ctx context.Context, sc chimev1.SchedulerClient) error {
					resp, err = sc.Count(ctx, &chimev1.CountRequest{Filter: filter, StaleOk: *stale})
					return err
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(struct {
						Count uint64 `json:"count"`
					}{resp.GetCount()})
				}
				_, err = fmt.Fprintln(c.stdout, resp.GetCount())
				return err
			}
		},
	}
}

// bulkCancel runs a CancelMatching, showing its progress on standard error,
// and prints the totals. A run cut short (a node going away, a leader
// change) is run again by the client, which finds what is still pending.
func (c *cli) bulkCancel(ctx context.Context, filter *chimev1.EventFilter, dryRun bool) error {
	progress := c.progressLine()
	var res client.CancelMatchingResult
	err := c.call(ctx, func(ctx context.Context, cl *client.Client) (err error) {
		res, err = cl.CancelMatching(ctx, clientFilter(filter), client.DryRun(dryRun), client.OnProgress(func(p client.CancelMatchingResult) {
			if !p.Done {
				progress(fmt.Sprintf("matched %d, cancelled %d, skipped %d fired, %d held", p.Matched, p.Cancelled, p.Skipped-p.Held, p.Held))
			}
		}))
		return err
	})
	progress("")
	if err != nil {
		return err
	}
	skippedFired := res.Skipped - res.Held
	if c.json {
		return c.printJSON(struct {
			DryRun       bool  `json:"dry_run"`
			Matched      int64 `json:"matched"`
			Cancelled    int64 `json:"cancelled"`
			SkippedFired int64 `json:"skipped_fired"`
			SkippedHeld  int64 `json:"skipped_held"`
		}{dryRun, res.Matched, res.Cancelled, skippedFired, res.Held})
	}
	rows := [][2]string{{"matched", fmt.Sprint(res.Matched)}}
	if dryRun {
		rows = append(rows, [2]string{"cancelled", "0 (dry run)"})
	} else {
		rows = append(rows, [2]string{"cancelled", fmt.Sprint(res.Cancelled)},
			[2]string{"skipped_fired", fmt.Sprint(skippedFired)},
			[2]string{"skipped_held", fmt.Sprint(res.Held)})
	}
	if err := printBlock(c.stdout, rows); err != nil {
		return err
	}
	if res.Held > 0 {
		fmt.Fprintf(c.stderr, "%d events were being produced or in doubt and were left alone: run the same cancel again in a moment\n", res.Held)
	}
	return nil
}

// clientFilter is the client's form of the filter the flags made.
func clientFilter(f *chimev1.EventFilter) client.Filter {
	cf := client.Filter{IDPrefix: f.GetIdPrefix(), Topic: f.GetTopic()}
	for _, s := range f.GetStates() {
		cf.States = append(cf.States, client.State(s))
	}
	for _, p := range f.GetPriorities() {
		cf.Priorities = append(cf.Priorities, int(p))
	}
	if f.GetDueAfter() != nil {
		cf.DueAfter = f.GetDueAfter().AsTime()
	}
	if f.GetDueBefore() != nil {
		cf.DueBefore = f.GetDueBefore().AsTime()
	}
	return cf
}

// progressLine returns a function that shows a line of progress on standard
// error: rewritten in place on a terminal, else a line every 5 s or more.
// "" clears it.
func (c *cli) progressLine() func(string) {
	f, ok := c.stderr.(*os.File)
	tty := false
	if ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	last := time.Now() // a run shorter than the interval prints no progress at all
	shown := 0
	return func(s string) {
		switch {
		case tty:
			fmt.Fprintf(c.stderr, "\r%-*s\r%s", shown, "", s)
			shown = len(s)
			if s == "" {
				shown = 0
			}
		case s != "" && time.Since(last) >= 5*time.Second:
			last = time.Now()
			fmt.Fprintln(c.stderr, s)
		}
	}
}
