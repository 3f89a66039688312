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
		args:    "ID",
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
the event back to tell whether it was updated.`,
		example: `  chimectl update order-42-reminder --in 2h
  chimectl update order-42-reminder --at 2030-01-02T09:00:00Z --payload '{"order":42,"second":true}'
  chimectl update order-42-reminder --in 10m --if-version 3 --json`,
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
			return func(ctx context.Context, args []string) error {
				id, err := oneID(args)
				if err != nil {
					return err
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
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
