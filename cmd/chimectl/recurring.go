package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm/recurrence"
)

// recurringActions are recurring's sub-commands, and the flags each takes.
var recurringActions = map[string][]string{
	"create":   {"id", "topic", "cron", "every", "tz", "start", "end", "max", "jitter", "catch-up", "key", "payload", "payload-file", "header", "priority"},
	"update":   {"topic", "cron", "every", "tz", "start", "end", "max", "jitter", "catch-up", "key", "payload", "payload-file", "header", "priority", "if-version"},
	"delete":   {"if-version"},
	"get":      {"stale"},
	"list":     {"prefix", "limit", "stale"},
	"pause":    {},
	"resume":   {},
	"trigger":  {},
	"backfill": {"from", "to"},
}

func recurringCommand() *command {
	return &command{
		name:    "recurring",
		summary: "create, change, pause, resume, trigger, backfill, show and delete recurring schedules",
		args:    "create|update|delete|get|list|pause|resume|trigger|backfill [ID]",
		about: `Recurring manages recurring schedules: a rule (--cron EXPR, five fields or six
with seconds first, or a descriptor such as @hourly or "@every 90s"; or
--every D, a fixed interval) read in the IANA zone --tz, and a target (--topic,
--key, --payload, --header). Each occurrence is produced as an ordinary event
with the id ID@<unix ms>, which get, list and cancel of events see. A
wall-clock time that a daylight-saving gap skips occurs once at the first
instant after the gap; one a fall-back repeats occurs once, the first time.
--catch-up says which occurrences missed during an outage or a pause happen:
last (the default: the latest one), skip (none) or all (each, up to chimed's
--max-catch-up in a row).

  create --id ID --topic T (--cron EXPR | --every D) [flags]
  update ID [--cron EXPR | --every D] [--topic T] [flags] replaces the rule when
         any rule flag is given, the target when any target flag is; the rest
         is kept (the rule or the target is replaced whole)
  get ID             shows the schedule and its next five occurrence times, in
                     its zone and in UTC
  list [--prefix P]  a table of schedules in id order
  pause ID           cancels the pending occurrence; none follows until resume
  resume ID
  trigger ID         produces one extra occurrence now, as the event
                     ID@<unix ms>, with the schedule's target; the schedule's
                     own sequence goes on untouched (the pending occurrence
                     stays, occurrences does not count it), and a paused
                     schedule may be triggered (it stays paused). Retried
                     with the same time, it makes one occurrence.
  backfill ID --from T [--to T]
                     creates, due now, the occurrences of the rule's times in
                     [from, to) that have no event yet: those missed while
                     paused, or that the catch-up skipped. T is an RFC 3339
                     time or a duration from now like -2h; --to defaults to
                     now. At most 1000 times a call; for an active schedule
                     the range ends at its pending occurrence at the latest;
                     for a paused one, resume then catches up only after it.
  delete ID          removes the schedule; its past occurrences stay readable

Once pause, update or delete returns, no record of the occurrence it cancelled
is produced; while that occurrence is being produced they fail with Aborted,
changing nothing (try again in a moment).`,
		example: `  chimectl recurring create --id nightly-report --topic reports --cron '30 2 * * *' --tz Europe/Paris --payload '{"report":"daily"}'
  chimectl recurring get nightly-report
  chimectl recurring update nightly-report --cron '0 3 * * MON-FRI' --tz Europe/Paris`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			id := fs.String("id", "", "the new schedule's `id`: no '@' (create)")
			topic := fs.String("topic", "", "the Kafka `topic` each occurrence is produced to")
			cron := fs.String("cron", "", "a cron `expression`: 'M H DoM Mon DoW', with an optional seconds field first, or @hourly, @daily, '@every 90s'")
			every := fs.Duration("every", 0, "a fixed interval, a `duration` of at least 1s, anchored at --start (or at creation)")
			tz := fs.String("tz", "", "the IANA `zone` the cron fields are read in, e.g. Europe/Paris; UTC when empty")
			start := fs.String("start", "", "no occurrence before this RFC 3339 `time`; an interval's anchor")
			end := fs.String("end", "", "no occurrence after this RFC 3339 `time`")
			maxN := fs.Uint64("max", 0, "at most this many occurrences; 0: no limit")
			jitter := fs.Duration("jitter", 0, "delay each occurrence by up to this `duration` (at most 24h), the same on every node")
			catchUp := fs.String("catch-up", "", "which missed occurrences happen: `last` (default), skip or all")
			key := fs.String("key", "", "the record `key` of each occurrence")
			payload := fs.String("payload", "", "the record value of each occurrence, as a `string`")
			payloadFile := fs.String("payload-file", "", "read the record value from `path`; - reads standard input")
			var hdrs multiFlag
			fs.Var(&hdrs, "header", "a record header `name=value`; repeatable, kept in order")
			priority := fs.Uint("priority", 5, "each occurrence's priority, 0 (lowest) to 9 (highest)")
			ifVersion := fs.Uint64("if-version", 0, "change or delete the schedule only while it is at this `version`")
			prefix := fs.String("prefix", "", "list the schedules whose id starts with this `prefix`")
			limit := fs.Int("limit", 100, "list at most this many schedules; 0 lists all")
			stale := fs.Bool("stale", false, "let any replica answer, possibly a little behind the leaders")
			from := fs.String("from", "", "backfill the rule's times from this `time` on, inclusive: RFC 3339, or a duration from now like -2h")
			to := fs.String("to", "", "backfill the rule's times before this `time`, exclusive: RFC 3339, or a duration from now like -30m; now when unset")
			return func(ctx context.Context, args []string) error {
				if len(args) == 0 {
					return usagef("give an action: create, update, delete, get, list, pause, resume, trigger or backfill")
				}
				action, args := args[0], args[1:]
				allowed, ok := recurringActions[action]
				if !ok {
					return usagef("unknown action %q: create, update, delete, get, list, pause, resume, trigger or backfill", action)
				}
				set := map[string]bool{}
				var stray []string
				fs.Visit(func(f *flag.Flag) {
					set[f.Name] = true
					if !slices.Contains(allowed, f.Name) && f.Name != "addr" && f.Name != "timeout" && f.Name != "json" && !strings.HasPrefix(f.Name, "tls") && f.Name != "token" {
						stray = append(stray, "--"+f.Name)
					}
				})
				if len(stray) > 0 {
					return usagef("recurring %s does not take %s", action, strings.Join(stray, ", "))
				}
				var schedID string
				switch action {
				case "create":
					if len(args) > 0 {
						return usagef("recurring create takes its id as --id, not %q", args)
					}
					schedID = *id
				case "list":
					if len(args) > 0 {
						return usagef("recurring list takes no arguments, got %q (filter with --prefix)", args)
					}
				default:
					if len(args) != 1 {
						return usagef("recurring %s wants exactly one schedule id, got %d arguments", action, len(args))
					}
					schedID = args[0]
				}

				ruleGiven := set["cron"] || set["every"] || set["tz"] || set["start"] || set["end"] || set["max"] || set["jitter"] || set["catch-up"]
				targetGiven := set["topic"] || set["key"] || set["payload"] || set["payload-file"] || set["header"] || set["priority"]
				var rule *chimev1.RecurringRule
				var target *chimev1.RecurringTarget
				if action == "create" || ruleGiven {
					r, err := c.ruleFlags(set, *cron, *every, *tz, *start, *end, *maxN, *jitter, *catchUp)
					if err != nil {
						return err
					}
					rule = r
				}
				if action == "create" || targetGiven {
					t := &chimev1.RecurringTarget{Topic: *topic}
					if set["key"] {
						t.Key = []byte(*key)
					}
					var err error
					if t.Payload, err = c.payloadFlags(set, *payload, *payloadFile); err != nil {
						return err
					}
					hs, err := headerFlags(hdrs)
					if err != nil {
						return err
					}
					for _, h := range hs {
						t.Headers = append(t.Headers, &chimev1.Header{Key: h.Key, Value: h.Value})
					}
					if set["priority"] {
						p := uint32(*priority)
						t.Priority = &p
					}
					target = t
				}
				if action == "update" && rule == nil && target == nil {
					return usagef("nothing to change: give a rule flag (--cron, --every, --tz, ...) or a target flag (--topic, --payload, ...)")
				}
				if action == "update" && target != nil && !set["topic"] {
					return usagef("--topic is required with any target flag: the target is replaced whole")
				}
				switch action {
				case "list":
					return c.listRecurring(ctx, *prefix, *limit, *stale)
				case "trigger":
					return c.triggerRecurring(ctx, schedID)
				case "backfill":
					return c.backfillRecurring(ctx, schedID, *from, *to)
				}

				var resp *chimev1.RecurringSchedule
				err := c.callRecurring(ctx, action == "get", func(ctx context.Context, rc chimev1.RecurringClient) (err error) {
					switch action {
					case "create":
						resp, err = rc.Create(ctx, &chimev1.CreateRecurringRequest{Id: schedID, Rule: rule, Target: target})
					case "update":
						resp, err = rc.Update(ctx, &chimev1.UpdateRecurringRequest{Id: schedID, Rule: rule, Target: target, ExpectedVersion: *ifVersion})
					case "delete":
						_, err = rc.Delete(ctx, &chimev1.DeleteRecurringRequest{Id: schedID, ExpectedVersion: *ifVersion})
					case "get":
						resp, err = rc.Get(ctx, &chimev1.GetRecurringRequest{Id: schedID, StaleOk: *stale})
					case "pause":
						resp, err = rc.Pause(ctx, &chimev1.PauseRecurringRequest{Id: schedID})
					case "resume":
						resp, err = rc.Resume(ctx, &chimev1.ResumeRecurringRequest{Id: schedID})
					}
					return err
				})
				if err != nil {
					return err
				}
				if action == "delete" {
					if c.json {
						return c.printJSON(struct {
							ID      string `json:"id"`
							Deleted bool   `json:"deleted"`
						}{schedID, true})
					}
					_, err := fmt.Fprintf(c.stdout, "deleted recurring schedule %s\n", schedID)
					return err
				}
				if c.json {
					return c.printProtoJSON(resp)
				}
				verb := map[string]string{"create": "created", "update": "updated", "pause": "paused", "resume": "resumed"}[action]
				if resp.Existing {
					verb = "exists already, the same:"
				}
				if verb != "" {
					fmt.Fprintf(c.stdout, "%s recurring schedule %s\n", verb, resp.Id)
				}
				return printBlock(c.stdout, c.scheduleBlock(resp))
			}
		},
	}
}

// triggerRecurring runs recurring trigger. The occurrence's time is chosen
// once, here, and every retry sends it again: the server recognises a retry
// by it, so a retried trigger makes one occurrence.
func (c *cli) triggerRecurring(ctx context.Context, id string) error {
	req := &chimev1.TriggerRecurringRequest{Id: id, At: timestamppb.New(c.now())}
	var resp *chimev1.TriggerRecurringResponse
	err := c.callRecurring(ctx, true, func(ctx context.Context, rc chimev1.RecurringClient) (err error) {
		resp, err = rc.Trigger(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.printProtoJSON(resp)
	}
	verb := "triggered"
	if resp.Existing {
		verb = "exists already, not triggered again:"
	}
	fmt.Fprintf(c.stdout, "%s occurrence %s of recurring schedule %s\n", verb, resp.EventId, id)
	return printBlock(c.stdout, [][2]string{
		{"event", resp.EventId},
		{"occurrence", c.localTime(resp.Occurrence.AsTime())},
		{"due", c.localTime(resp.Due.AsTime())},
	})
}

// backfillShown is how many created occurrence times backfill lists in
// text; --json lists all.
const backfillShown = 10

// backfillRecurring runs recurring backfill. A retry is safe: what an
// earlier attempt created counts as existing.
func (c *cli) backfillRecurring(ctx context.Context, id, fromFlag, toFlag string) error {
	now := c.now()
	if fromFlag == "" {
		return usagef("recurring backfill wants --from: the start of the range of the rule's times to backfill, like -2h or 2030-01-02T09:00:00Z")
	}
	from, err := flagTime("from", fromFlag, now)
	if err != nil {
		return err
	}
	to := timestamppb.New(now)
	if toFlag != "" {
		if to, err = flagTime("to", toFlag, now); err != nil {
			return err
		}
	}
	if !from.AsTime().Before(to.AsTime()) {
		return usagef("--from %s is not before --to %s: the range [from, to) is empty", from.AsTime().UTC().Format(time.RFC3339), to.AsTime().UTC().Format(time.RFC3339))
	}
	req := &chimev1.BackfillRecurringRequest{Id: id, From: from, To: to}
	var resp *chimev1.BackfillRecurringResponse
	err = c.callRecurring(ctx, true, func(ctx context.Context, rc chimev1.RecurringClient) (err error) {
		resp, err = rc.Backfill(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.printProtoJSON(resp)
	}
	fmt.Fprintf(c.stdout, "backfilled recurring schedule %s from %s to %s: %d created, %d existed already\n",
		id, from.AsTime().UTC().Format(time.RFC3339), to.AsTime().UTC().Format(time.RFC3339), resp.Created, resp.Existing)
	var rows [][2]string
	for i, t := range resp.CreatedOccurrences {
		if i == backfillShown {
			rows = append(rows, [2]string{"", fmt.Sprintf("and %d more (--json lists them all)", len(resp.CreatedOccurrences)-backfillShown)})
			break
		}
		label := ""
		if i == 0 {
			label = "created"
		}
		rows = append(rows, [2]string{label, t.AsTime().UTC().Format(time.RFC3339Nano) + "  " + occurrenceID(id, t.AsTime())})
	}
	return printBlock(c.stdout, rows)
}

// occurrenceID is the event id of schedule id's occurrence at at: id@<unix ms>.
func occurrenceID(id string, at time.Time) string {
	return fmt.Sprintf("%s@%d", id, at.UnixMilli())
}

// ruleFlags builds a rule from the rule flags.
func (c *cli) ruleFlags(set map[string]bool, cron string, every time.Duration, tz, start, end string, maxN uint64, jitter time.Duration, catchUp string) (*chimev1.RecurringRule, error) {
	r := &chimev1.RecurringRule{TimeZone: tz, MaxOccurrences: maxN}
	switch {
	case set["cron"] && set["every"]:
		return nil, usagef("set exactly one of --cron and --every, not both")
	case set["cron"]:
		r.Rule = &chimev1.RecurringRule_Cron{Cron: cron}
	case set["every"]:
		r.Rule = &chimev1.RecurringRule_Every{Every: durationpb.New(every)}
	default:
		return nil, usagef("set --cron or --every: the rule is replaced whole")
	}
	for _, f := range []struct {
		name, v string
		dst     **timestamppb.Timestamp
	}{{"start", start, &r.Start}, {"end", end, &r.End}} {
		if !set[f.name] {
			continue
		}
		t, err := time.Parse(time.RFC3339, f.v)
		if err != nil {
			return nil, usagef("--%s %q is not an RFC 3339 time like 2030-01-02T09:00:00Z", f.name, f.v)
		}
		*f.dst = timestamppb.New(t)
	}
	if set["jitter"] {
		r.Jitter = durationpb.New(jitter)
	}
	switch catchUp {
	case "", "last":
		r.CatchUp = chimev1.CatchUp_CATCH_UP_LAST
	case "skip":
		r.CatchUp = chimev1.CatchUp_CATCH_UP_SKIP
	case "all":
		r.CatchUp = chimev1.CatchUp_CATCH_UP_ALL
	default:
		return nil, usagef("--catch-up %q: want last, skip or all", catchUp)
	}
	return r, nil
}

// callRecurring dials --addr and runs fn on the raw Recurring stub (the
// commands print the API's answer) with a context bounded by --timeout. A
// read is repeated while it may be (client.Client.Do); a change is sent
// once.
func (c *cli) callRecurring(ctx context.Context, read bool, fn func(ctx context.Context, rc chimev1.RecurringClient) error) error {
	return c.call(ctx, func(ctx context.Context, cl *client.Client) error {
		if !read {
			return fn(ctx, chimev1.NewRecurringClient(cl.Conn()))
		}
		return cl.Do(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			return fn(ctx, chimev1.NewRecurringClient(cc))
		})
	})
}

func (c *cli) printProtoJSON(m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}

var recurringStates = map[chimev1.RecurringState]string{
	chimev1.RecurringState_RECURRING_STATE_ACTIVE:    "active",
	chimev1.RecurringState_RECURRING_STATE_PAUSED:    "paused",
	chimev1.RecurringState_RECURRING_STATE_COMPLETED: "completed",
}

// ruleText says a rule in one line: `cron "30 2 * * *" in Europe/Paris`.
func ruleText(r *chimev1.RecurringRule) string {
	var b strings.Builder
	if r.GetEvery() != nil {
		fmt.Fprintf(&b, "every %v", r.GetEvery().AsDuration())
	} else {
		fmt.Fprintf(&b, "cron %q", r.GetCron())
	}
	fmt.Fprintf(&b, " in %s", orNone(r.GetTimeZone(), "UTC"))
	return b.String()
}

// zoneAndUTC writes t in the schedule's zone and in UTC.
func zoneAndUTC(t time.Time, zone string) string {
	loc, err := recurrence.LoadZone(zone)
	if err != nil {
		loc = time.UTC
	}
	return fmt.Sprintf("%s  (%s)", t.In(loc).Format("2006-01-02 15:04:05 MST"), t.UTC().Format(time.RFC3339))
}

func (c *cli) scheduleBlock(s *chimev1.RecurringSchedule) [][2]string {
	r, t := s.GetRule(), s.GetTarget()
	rows := [][2]string{
		{"id", s.Id},
		{"state", fmt.Sprintf("%s, version %d", recurringStates[s.State], s.Version)},
		{"rule", ruleText(r)},
	}
	var bounds []string
	if r.GetStart() != nil {
		bounds = append(bounds, "from "+r.GetStart().AsTime().UTC().Format(time.RFC3339))
	}
	if r.GetEnd() != nil {
		bounds = append(bounds, "until "+r.GetEnd().AsTime().UTC().Format(time.RFC3339))
	}
	if r.GetMaxOccurrences() != 0 {
		bounds = append(bounds, fmt.Sprintf("at most %d occurrences", r.GetMaxOccurrences()))
	}
	if r.GetJitter() != nil {
		bounds = append(bounds, fmt.Sprintf("jitter %v", r.GetJitter().AsDuration()))
	}
	bounds = append(bounds, "catch-up "+strings.ToLower(strings.TrimPrefix(r.GetCatchUp().String(), "CATCH_UP_")))
	rows = append(rows, [2]string{"", strings.Join(bounds, ", ")})
	rows = append(rows,
		[2]string{"target", fmt.Sprintf("topic %s, key %s, payload %s, %d headers, priority %d", t.GetTopic(), orNone(showBytes(t.GetKey(), 40), "(none)"), orNone(showBytes(t.GetPayload(), 40), "(empty)"), len(t.GetHeaders()), t.GetPriority())},
		[2]string{"occurrences", fmt.Sprintf("%d settled", s.Occurrences)})
	if s.NextOccurrence != nil {
		next := s.NextOccurrence.AsTime()
		rows = append(rows, [2]string{"next", fmt.Sprintf("%s, %s, event %s", zoneAndUTC(next, r.GetTimeZone()), relative(next.Sub(c.now())), s.NextEventId)})
	}
	if s.PausedAt != nil {
		rows = append(rows, [2]string{"paused", c.localTime(s.PausedAt.AsTime())})
	}
	if s.ResumesFrom != nil {
		from := s.ResumesFrom.AsTime()
		rows = append(rows, [2]string{"resumes from", fmt.Sprintf("%s, %s (backfill from here to skip nothing)", zoneAndUTC(from, r.GetTimeZone()), relative(from.Sub(c.now())))})
	}
	for i, u := range s.Upcoming {
		label := ""
		if i == 0 {
			label = "upcoming"
		}
		rows = append(rows, [2]string{label, zoneAndUTC(u.AsTime(), r.GetTimeZone())})
	}
	return rows
}

func (c *cli) listRecurring(ctx context.Context, prefix string, limit int, stale bool) error {
	if limit < 0 {
		return usagef("--limit %d: must be 0 (all) or more", limit)
	}
	var tw *tabwriter.Writer
	if !c.json {
		tw = tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tRULE\tNEXT (UTC)\tTOPIC\tVERSION")
	}
	req := &chimev1.ListRecurringRequest{IdPrefix: prefix, StaleOk: stale}
	printed := 0
	for {
		req.Limit = 1000
		if limit > 0 {
			req.Limit = uint32(min(1000, limit-printed))
		}
		var resp *chimev1.ListRecurringResponse
		err := c.callRecurring(ctx, true, func(ctx context.Context, rc chimev1.RecurringClient) (err error) {
			resp, err = rc.List(ctx, req)
			return err
		})
		if err != nil {
			if tw != nil {
				// What was listed before the error, to the terminal as the
				// Fprint calls write; err is the one to report.
				_ = tw.Flush()
			}
			return err
		}
		for _, s := range resp.Schedules {
			if c.json {
				if err := c.printProtoJSON(s); err != nil {
					return err
				}
				continue
			}
			next := "-"
			if s.NextOccurrence != nil {
				next = s.NextOccurrence.AsTime().UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", s.Id, recurringStates[s.State], ruleText(s.Rule), next, s.GetTarget().GetTopic(), s.Version)
		}
		printed += len(resp.Schedules)
		req.PageToken = resp.NextPageToken
		if req.PageToken == "" || limit > 0 && printed >= limit {
			break
		}
	}
	if tw != nil {
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if req.PageToken != "" {
		fmt.Fprintf(c.stderr, "more schedules follow: list with a --limit above %d\n", printed)
	}
	return nil
}
