package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/chimehq/chime/client"
)

func updateCommand() *command {
	return &command{
		name:    "update",
		summary: "change a scheduled event's due time, payload, key or headers",
		args:    "ID | --prefix P [--topic T] [--priority N] [--due-before T] [--due-after T] --shift D [--dry-run]",
		about: `Update changes the scheduled event with id ID: its due time (--in from now, or
at --at), and the content given with --payload or --payload-file, --key and
--header (which replace all of the event's headers; --no-headers removes
them). What is not given is kept. The changed event is the event's next
version: get shows it, and the record produced carries it in the
chime-version header. When update succeeds, no record of an earlier version
will be produced. With --if-version N it changes the event only while it is
at version N, and fails with FailedPrecondition otherwise (a compare-and-set:
read the version with get, then update). It fails with NotFound for an
unknown id, and with FailedPrecondition when the event has already fired or
been cancelled or dead-lettered. An update answered Aborted (the event was
being produced, and nothing changed) or Unavailable is sent again, with
backoff until --timeout; when the last copy went unanswered, chimectl reads
the event back to tell whether it was updated.

With filters instead of an id, --shift D moves every scheduled event they
select by D (2h later, -30m earlier): it lists them (at most a million),
then updates each at the version it listed, so an event that fired, was
cancelled or was changed by someone else meanwhile is left alone and
counted as skipped. It shows its progress while it runs and the totals at
the end. --dry-run only counts the matches. Running it again moves the
events again. It is not bound by --timeout unless --timeout is given.
--priority narrows the other filters (alone it is refused as too broad).`,
		example: `  chimectl update order-42-reminder --in 2h
  chimectl update order-42-reminder --at 2030-01-02T09:00:00Z --payload '{"order":42,"second":true}'
  chimectl update --prefix order-42/ --priority 9 --due-before 2h --shift 1h --dry-run`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			in := fs.Duration("in", 0, "the event is due this long from now, a `duration` like 2s, 90m or 36h")
			at := fs.String("at", "", "the event is due at this RFC 3339 `time`, e.g. 2030-01-02T09:00:00Z")
			key := fs.String("key", "", "the new Kafka record `key`; empty removes it")
			payload := fs.String("payload", "", "the new record value as a `string`")
			payloadFile := fs.String("payload-file", "", "read the new record value from `path`; - reads standard input")
			var hdrs multiFlag
			fs.Var(&hdrs, "header", "a header `name=value` of the new headers, which replace the event's; repeatable, kept in order")
			noHeaders := fs.Bool("no-headers", false, "remove the event's headers")
			ifVersion := fs.Uint64("if-version", 0, "change the event only while it is at this `version`")
			var ff filterFlags
			ff.register(fs, false)
			shift := fs.Duration("shift", 0, "with filters: move every scheduled event they select by this `duration` (2h later, -30m earlier)")
			dryRun := fs.Bool("dry-run", false, "with filters and --shift: count the events that would move, move none")
			return func(ctx context.Context, args []string) error {
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				if ff.given() || set["shift"] || *dryRun {
					return c.bulkShift(ctx, ff, set, args, *shift, *dryRun)
				}
				id, err := oneID(args)
				if err != nil {
					return err
				}
				var opts []client.UpdateOption
				due, err := dueOption(set, *in, *at)
				if err != nil {
					return err
				}
				if due != nil {
					opts = append(opts, *due)
				}
				if set["key"] {
					opts = append(opts, client.SetKey([]byte(*key)))
				}
				if set["payload"] || set["payload-file"] {
					p, err := c.payloadFlags(set, *payload, *payloadFile)
					if err != nil {
						return err
					}
					opts = append(opts, client.SetPayload(p))
				}
				switch {
				case *noHeaders && len(hdrs) > 0:
					return usagef("set at most one of --header and --no-headers")
				case *noHeaders || len(hdrs) > 0:
					h, err := headerFlags(hdrs)
					if err != nil {
						return err
					}
					opts = append(opts, client.SetHeaders(h))
				}
				if len(opts) == 0 {
					return usagef("nothing to change: give --in or --at, --payload, --payload-file, --key, --header or --no-headers")
				}
				if *ifVersion != 0 {
					opts = append(opts, client.IfVersion(*ifVersion))
				}
				var res client.Result
				err = c.call(ctx, func(ctx context.Context, cl *client.Client) (err error) {
					res, err = cl.Update(ctx, id, opts...)
					return err
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(struct {
						ID      string `json:"id"`
						Due     string `json:"due"`
						Version uint64 `json:"version"`
					}{res.ID, res.Due.UTC().Format(time.RFC3339Nano), res.Version})
				}
				_, err = fmt.Fprintf(c.stdout, "updated %s to version %d, due %s (%s)\n", res.ID, res.Version, c.localTime(res.Due), relative(res.Due.Sub(c.now())))
				return err
			}
		},
	}
}

// bulkShift moves every scheduled event the filters select by shift, with
// the client's ShiftMatching, showing its progress on standard error.
func (c *cli) bulkShift(ctx context.Context, ff filterFlags, set map[string]bool, args []string, shift time.Duration, dryRun bool) error {
	switch {
	case len(args) > 0:
		return usagef("give an event id or filters (--prefix, --topic, --priority, --due-before, --due-after) with --shift, not both")
	case !ff.given():
		return usagef("--shift and --dry-run need filters (--prefix, --topic, --priority, --due-before, --due-after)")
	case !ff.narrows():
		return usagef("--priority alone selects too much to shift: add --prefix, --topic or a due range (--due-before, --due-after)")
	case shift == 0:
		return usagef("with filters, give --shift, a duration like 1h or -30m: how far each event moves")
	}
	for _, f := range []string{"in", "at", "key", "payload", "payload-file", "header", "no-headers", "if-version"} {
		if set[f] {
			return usagef("--%s changes one event: with filters, only --shift (and --dry-run) apply", f)
		}
	}
	filter, err := ff.filter(c.now())
	if err != nil {
		return err
	}
	if !set["timeout"] {
		c.timeout = 0
	}
	f := clientFilter(filter)
	if dryRun {
		var n int64
		err := c.call(ctx, func(ctx context.Context, cl *client.Client) (err error) {
			n, err = cl.Count(ctx, client.Filter{IDPrefix: f.IDPrefix, Topic: f.Topic, DueAfter: f.DueAfter, DueBefore: f.DueBefore,
				Priorities: f.Priorities, States: []client.State{client.StateScheduled}})
			return err
		})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(struct {
				DryRun  bool  `json:"dry_run"`
				Matched int64 `json:"matched"`
				Moved   int64 `json:"moved"`
			}{true, n, 0})
		}
		return printBlock(c.stdout, [][2]string{{"matched", fmt.Sprint(n)}, {"moved", "0 (dry run)"}})
	}
	progress := c.progressLine()
	var res client.ShiftResult
	err = c.call(ctx, func(ctx context.Context, cl *client.Client) (err error) {
		res, err = cl.ShiftMatching(ctx, f, shift, func(p client.ShiftResult) {
			if !p.Done {
				progress(fmt.Sprintf("matched %d, moved %d, skipped %d", p.Matched, p.Moved, p.Skipped))
			}
		})
		return err
	})
	progress("")
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(struct {
			Matched int64 `json:"matched"`
			Moved   int64 `json:"moved"`
			Skipped int64 `json:"skipped"`
		}{res.Matched, res.Moved, res.Skipped})
	}
	return printBlock(c.stdout, [][2]string{{"matched", fmt.Sprint(res.Matched)}, {"moved", fmt.Sprint(res.Moved)}, {"skipped", fmt.Sprint(res.Skipped)}})
}
