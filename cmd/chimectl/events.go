package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/client"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// dial returns a client of --addr with the credentials of the --tls and
// --token flags, retrying as retryPolicy says, opts last. It connects
// lazily: a dead address shows as UNAVAILABLE on the first call, after the
// retries. Leader routing is off (opts may turn it on): a command's call
// or two are over before the cluster map would arrive, and --addr forwards
// them.
func (c *cli) dial(ctx context.Context, opts ...client.Option) (*client.Client, error) {
	base, err := c.tls.options()
	if err != nil {
		return nil, err
	}
	base = append(base, client.WithLeaderRouting(false), client.WithRetry(c.retryPolicy()))
	cl, err := client.Dial(ctx, c.addr, append(base, opts...)...)
	if err != nil {
		if c.tls.sendsToken() && !c.tls.on() {
			// The client refused to send the token in plaintext: say
			// where it came from and which flags add TLS.
			return nil, fmt.Errorf("%w (the token of --token, --token-file or %s; add --tls, or --tls-ca for a node whose CA the system does not trust)", err, tokenEnv)
		}
		return nil, fmt.Errorf("--addr %q: %w", c.addr, err)
	}
	return cl, nil
}

// noTimeout stands for "no bound" in a RetryPolicy, which has no such value.
const noTimeout = 100 * 365 * 24 * time.Hour

// retryPolicy is how calls are repeated when they may be (UNAVAILABLE: a
// node restarting, a shard between leaders; see client.RetryPolicy): from
// 100 ms apart, growing to 2 s, so that a leader election (about a second)
// costs a few tries, until --timeout runs out, each attempt allowed all of
// it (a count or a list over many events is slow, not stuck). Without
// --timeout attempts have no bound, and a dozen are made, over about 10 s.
func (c *cli) retryPolicy() client.RetryPolicy {
	p := client.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second,
		MaxAttempts: 12, AttemptTimeout: noTimeout, Budget: noTimeout}
	if c.timeout > 0 {
		p.MaxAttempts, p.AttemptTimeout, p.Budget = math.MaxInt32, c.timeout, c.timeout
	}
	return p
}

// call dials --addr and runs fn with the client and a context bounded by
// --timeout (no bound when it is 0).
func (c *cli) call(ctx context.Context, fn func(ctx context.Context, cl *client.Client) error) error {
	cl, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cl.Close() }() // fails only for a client already closed
	ctx, cancel := c.requestCtx(ctx)
	defer cancel()
	return fn(ctx, cl)
}

// read is call for one Scheduler call that changes nothing, on the raw stub
// (the commands print the API's answer): the client repeats it while it
// may (client.Client.Do).
func (c *cli) read(ctx context.Context, fn func(ctx context.Context, sc chimev1.SchedulerClient) error) error {
	return c.call(ctx, func(ctx context.Context, cl *client.Client) error {
		return cl.Do(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			return fn(ctx, chimev1.NewSchedulerClient(cc))
		})
	})
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func scheduleCommand() *command {
	return &command{
		name:    "schedule",
		summary: "schedule a record to be produced to a Kafka topic at a given time",
		about: `Schedule stores an event in Chime, which produces it as a Kafka record to
--topic when it falls due: --in from now, or at the absolute time --at. The
record gets --key, the payload from --payload or --payload-file, the given
--header values, and Chime's own chime-* headers (chime-id is the event id,
for deduplication). The id is the idempotency key: scheduling the same id
with the same content again changes nothing and reports "already
scheduled" with the original due time; the same id with different content
fails with AlreadyExists. With --replace the event takes the place of the
one its id is bound to instead (an upsert: a pending one is replaced, so
that only the latest is produced, a fired or cancelled one is scheduled
anew) and is its next version. --priority (0 to 9, 5 by default) orders
the events a shard's leader has due when it is behind (after an outage, in
a burst, under a topic rate limit): higher first, never before due.
--window lets the event fire anywhere in [due, due + window]: Chime spreads
a burst of such events over their window. --partition produces the record
to that partition of the topic rather than the one Kafka's partitioner
picks from the key (a topic without it dead-letters the record when it
fires). --tombstone produces the record with a null value, a Kafka
tombstone (a compacted topic deletes the key); it takes no payload.
Without --id chimectl picks a random id (26 characters of base32, like the
ids the server generates) and prints it, so that a call answered
Unavailable (a node restarting, a shard between leaders) is sent again,
with backoff until --timeout, without ever scheduling two events; a
resent call whose first copy had arrived reports "already scheduled".
When the last copy went unanswered, chimectl reads the event back to tell
whether it was scheduled; if even that fails it says the outcome is
unknown, and scheduling again with the same --id is safe.`,
		example: `  chimectl schedule --topic reminders --in 30m --id order-42-reminder --payload '{"order":42}'
  chimectl schedule --topic billing.retry --at 2030-01-02T09:00:00+01:00 --key customer-7 --header trace=abc --priority 9
  chimectl schedule --topic sessions --in 30m --id session-7-expiry --replace --window 1m --key session-7 --tombstone`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			topic := fs.String("topic", "", "Kafka `topic` to produce the record to (required)")
			in := fs.Duration("in", 0, "produce the record this long from now, a `duration` like 2s, 90m or 36h (set exactly one of --in and --at)")
			at := fs.String("at", "", "produce the record at this RFC 3339 `time`, e.g. 2030-01-02T09:00:00Z")
			key := fs.String("key", "", "Kafka record `key` (chooses the partition); empty means no key")
			payload := fs.String("payload", "", "record value as a `string`")
			payloadFile := fs.String("payload-file", "", "read the record value from `path`; - reads standard input")
			id := fs.String("id", "", "event `id`, the idempotency key (at most 256 bytes); empty: chimectl picks a random one")
			var hdrs multiFlag
			fs.Var(&hdrs, "header", "add a Kafka record header `name=value`; repeatable, kept in order")
			replace := fs.Bool("replace", false, "replace the event the id is bound to (pending: its next version; fired or cancelled: scheduled anew)")
			priority := fs.Uint("priority", 5, "0 (lowest) to 9 (highest): what fires first when more is due than the shard's leader can produce at once")
			window := fs.Duration("window", 0, "the record may be produced anywhere in [due, due + this `duration`] (at most 24h); Chime spreads a burst over it")
			partition := fs.Int("partition", 0, "produce the record to this `partition` of the topic (0 or more); unset: Kafka's partitioner picks it from the key")
			tombstone := fs.Bool("tombstone", false, "produce the record with a null value (a Kafka tombstone: a compacted topic deletes the key); no payload")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				if *topic == "" {
					return usagef("--topic is required")
				}
				if *id == "" {
					// 128 random bits, the form of the server's own ids.
					*id = strings.ToLower(rand.Text())
				}
				ev := client.Event{ID: *id, Topic: *topic, Key: []byte(*key)}
				due, err := dueOption(set, *in, *at)
				if err != nil {
					return err
				}
				if due == nil {
					return usagef("set one of --in (a delay) and --at (a time)")
				}
				opts := []client.ScheduleOption{*due}
				if ev.Payload, err = c.payloadFlags(set, *payload, *payloadFile); err != nil {
					return err
				}
				if ev.Headers, err = headerFlags(hdrs); err != nil {
					return err
				}
				if *replace {
					opts = append(opts, client.Replace())
				}
				if set["priority"] {
					opts = append(opts, client.Priority(int(min(*priority, math.MaxInt32))))
				}
				if set["window"] {
					opts = append(opts, client.Window(*window))
				}
				if set["partition"] {
					opts = append(opts, client.Partition(*partition))
				}
				if *tombstone {
					opts = append(opts, client.Tombstone())
				}
				var res client.Result
				err = c.call(ctx, func(ctx context.Context, cl *client.Client) (err error) {
					res, err = cl.Schedule(ctx, ev, opts...)
					return err
				})
				if errors.Is(err, client.ErrUnknownOutcome) {
					fmt.Fprintf(c.stderr, "chimectl schedule: whether %s was scheduled is unknown; scheduling it again with --id %s is safe\n", ev.ID, ev.ID)
				}
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(struct {
						ID       string `json:"id"`
						Due      string `json:"due"`
						Existing bool   `json:"existing"`
						Version  uint64 `json:"version"`
					}{res.ID, res.Due.UTC().Format(time.RFC3339Nano), res.Existing, res.Version})
				}
				verb, version := "scheduled", ""
				switch {
				case res.Existing:
					verb = "already scheduled"
				case res.Version > 1:
					verb, version = "replaced", fmt.Sprintf(", version %d", res.Version)
				}
				_, err = fmt.Fprintf(c.stdout, "%s %s due %s (%s)%s\n", verb, res.ID, c.localTime(res.Due), relative(res.Due.Sub(c.now())), version)
				return err
			}
		},
	}
}

// dueOption reads --in and --at: client.In, client.At, or neither (nil).
func dueOption(set map[string]bool, in time.Duration, at string) (*client.DueOption, error) {
	switch {
	case set["in"] && set["at"]:
		return nil, usagef("set exactly one of --in and --at, not both")
	case set["in"]:
		o := client.In(in)
		return &o, nil
	case set["at"]:
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return nil, usagef("--at %q is not an RFC 3339 time like 2030-01-02T09:00:00Z or 2030-01-02T10:00:00+01:00", at)
		}
		o := client.At(t)
		return &o, nil
	}
	return nil, nil
}

// payloadFlags reads --payload or --payload-file; neither is an empty payload.
func (c *cli) payloadFlags(set map[string]bool, payload, file string) ([]byte, error) {
	switch {
	case set["payload"] && set["payload-file"]:
		return nil, usagef("set at most one of --payload and --payload-file")
	case set["payload-file"]:
		return c.readPayload(file)
	}
	return []byte(payload), nil
}

// headerFlags parses the --header values, name=value each.
func headerFlags(hdrs multiFlag) ([]client.Header, error) {
	var out []client.Header
	for _, h := range hdrs {
		k, v, ok := strings.Cut(h, "=")
		if !ok {
			return nil, usagef("--header %q: want name=value", h)
		}
		out = append(out, client.Header{Key: k, Value: []byte(v)})
	}
	return out, nil
}

func (c *cli) readPayload(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(c.stdin)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--payload-file: %w", err)
	}
	return b, nil
}

// oneID returns the single event id of cancel and get.
func oneID(args []string) (string, error) {
	if len(args) != 1 {
		return "", usagef("want exactly one event id, got %d arguments", len(args))
	}
	return args[0], nil
}

func cancelCommand() *command {
	return &command{
		name:    "cancel",
		summary: "cancel a scheduled event, or every one a filter selects",
		args:    "ID | --prefix P [--topic T] [--priority N] [--due-before T] [--due-after T] [--dry-run]",
		about: `Cancel stops the event with id ID from being produced. When it returns
successfully, the record will not be produced. Cancelling an event that is
already cancelled succeeds again. It fails with NotFound for an unknown id
and with FailedPrecondition when the event has already fired or been
dead-lettered.

With filters instead of an id (the flags list selects by, but for --state:
only scheduled events are cancelled), it cancels every scheduled event they
select, in batches through Raft on every shard, showing its progress while
it runs and the totals at the end: matched, cancelled, and skipped because
they fired first or were being produced (held). Each event counted as
cancelled will not be produced. --dry-run only counts the matches. It is
safe to run again: a run cut short by a node restarting or a leader change
is run again at once, which finds what is still pending, and one cut short
by Ctrl-C is finished by running it again. A bulk cancel is not bound by
--timeout unless --timeout is given. --priority narrows the other filters
(alone it is refused as too broad): cancel by priority only once every node
runs a release that knows it, as an earlier node refuses nothing and would
cancel every priority.`,
		example: `  chimectl cancel order-42-reminder
  chimectl cancel --prefix order-42/ --dry-run
  chimectl cancel --topic payments --priority 9 --due-before 24h --json`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			var ff filterFlags
			ff.register(fs, false)
			dryRun := fs.Bool("dry-run", false, "with filters: count the events that would be cancelled, cancel nothing")
			return func(ctx context.Context, args []string) error {
				if ff.given() {
					if len(args) > 0 {
						return usagef("give an event id or filters (--prefix, --topic, --priority, --due-before, --due-after), not both")
					}
					if !ff.narrows() {
						return usagef("--priority alone selects too much to cancel: add --prefix, --topic or a due range (--due-before, --due-after)")
					}
					filter, err := ff.filter(c.now())
					if err != nil {
						return err
					}
					set := map[string]bool{}
					fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
					if !set["timeout"] {
						c.timeout = 0
					}
					return c.bulkCancel(ctx, filter, *dryRun)
				}
				if *dryRun {
					return usagef("--dry-run needs filters (--prefix, --topic, --priority, --due-before, --due-after)")
				}
				id, err := oneID(args)
				if err != nil {
					return err
				}
				err = c.call(ctx, func(ctx context.Context, cl *client.Client) error {
					return cl.Cancel(ctx, id)
				})
				if err != nil {
					return err
				}
				// A cancel that succeeds leaves the event cancelled.
				state := stateName(chimev1.EventState_EVENT_STATE_CANCELLED)
				if c.json {
					return c.printJSON(struct {
						ID    string `json:"id"`
						State string `json:"state"`
					}{id, state})
				}
				return printBlock(c.stdout, [][2]string{{"id", id}, {"state", state}})
			}
		},
	}
}

func getCommand() *command {
	return &command{
		name:    "get",
		summary: "show an event, its content and its state",
		args:    "ID",
		about: `Get shows the event with id ID as Chime stores it: its state (scheduled,
fired, cancelled or dead_lettered), when it is or was due, its topic, key,
payload and headers, when it was produced, how many produce attempts were
made and the last produce error. Key, payload and header values are shown
as text when they are printable UTF-8 and as base64: otherwise; long
payloads are cut in text output (--json shows them whole). It fails with
NotFound for an unknown id.`,
		example: `  chimectl get order-42-reminder
  chimectl get --json order-42-reminder | jq -r .state
  chimectl --addr chime-1:7070 --timeout 2s get order-42-reminder`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				id, err := oneID(args)
				if err != nil {
					return err
				}
				var resp *chimev1.GetResponse
				err = c.read(ctx, func(ctx context.Context, sc chimev1.SchedulerClient) error {
					resp, err = sc.Get(ctx, &chimev1.GetRequest{Id: id})
					return err
				})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(eventJSON(resp))
				}
				return printBlock(c.stdout, c.eventBlock(resp))
			}
		},
	}
}

// stateName is the lower-case state: scheduled, fired, cancelled,
// dead_lettered (unspecified for a value this chimectl does not know).
func stateName(s chimev1.EventState) string {
	n := strings.ToLower(strings.TrimPrefix(s.String(), "EVENT_STATE_"))
	if _, known := chimev1.EventState_name[int32(s)]; !known {
		return "unspecified"
	}
	return n
}

// getJSON is get --json's object. Every field is always present (times are
// null when unset) so scripts can rely on the shape. Byte fields are text
// when they are valid UTF-8 and base64 otherwise, as their *_encoding says.
type getJSON struct {
	ID              string       `json:"id"`
	State           string       `json:"state"`
	Due             *string      `json:"due"`
	CreatedAt       *string      `json:"created_at"`
	Topic           string       `json:"topic"`
	Key             string       `json:"key"`
	KeyEncoding     string       `json:"key_encoding"`
	Payload         string       `json:"payload"`
	PayloadEncoding string       `json:"payload_encoding"`
	Headers         []headerJSON `json:"headers"`
	FiredAt         *string      `json:"fired_at"`
	CancelledAt     *string      `json:"cancelled_at"`
	Attempts        uint32       `json:"attempts"`
	LastError       string       `json:"last_error"`
	DeadLetterTopic string       `json:"dead_letter_topic"`
	Version         uint64       `json:"version"`
	Priority        uint32       `json:"priority"`
	Window          string       `json:"window,omitempty"`
	Partition       *int32       `json:"partition,omitempty"`
	Tombstone       bool         `json:"tombstone,omitempty"`
}

type headerJSON struct {
	Key           string `json:"key"`
	Value         string `json:"value"`
	ValueEncoding string `json:"value_encoding"`
}

func eventJSON(r *chimev1.GetResponse) getJSON {
	ev := r.GetEvent()
	g := getJSON{
		ID:              ev.GetId(),
		State:           stateName(r.GetState()),
		Due:             jsonTime(r.GetDue()),
		CreatedAt:       jsonTime(r.GetCreatedAt()),
		Topic:           ev.GetTopic(),
		Headers:         []headerJSON{},
		FiredAt:         jsonTime(r.GetFiredAt()),
		CancelledAt:     jsonTime(r.GetCancelledAt()),
		Attempts:        r.GetAttempts(),
		LastError:       r.GetLastError(),
		DeadLetterTopic: r.GetDeadLetterTopic(),
		Version:         r.GetVersion(),
		Priority:        ev.GetPriority(),
		Partition:       ev.Partition,
		Tombstone:       ev.GetTombstone(),
	}
	if ev.GetWindow() != nil {
		g.Window = ev.GetWindow().AsDuration().String()
	}
	g.Key, g.KeyEncoding = jsonBytes(ev.GetKey())
	g.Payload, g.PayloadEncoding = jsonBytes(ev.GetPayload())
	for _, h := range ev.GetHeaders() {
		v, enc := jsonBytes(h.GetValue())
		g.Headers = append(g.Headers, headerJSON{Key: h.GetKey(), Value: v, ValueEncoding: enc})
	}
	return g
}

func jsonTime(ts *timestamppb.Timestamp) *string {
	if ts == nil {
		return nil
	}
	s := ts.AsTime().UTC().Format(time.RFC3339Nano)
	return &s
}

// eventBlock is get's text output, one labelled line each.
func (c *cli) eventBlock(r *chimev1.GetResponse) [][2]string {
	ev := r.GetEvent()
	optTime := func(ts *timestamppb.Timestamp) string {
		if ts == nil {
			return "-"
		}
		return c.localTime(ts.AsTime())
	}
	due := r.GetDue().AsTime()
	rows := [][2]string{
		{"id", ev.GetId()},
		{"state", stateName(r.GetState())},
		{"due", fmt.Sprintf("%s (%s)", c.localTime(due), relative(due.Sub(c.now())))},
		{"created_at", optTime(r.GetCreatedAt())},
		{"version", fmt.Sprint(r.GetVersion())},
		{"priority", fmt.Sprint(ev.GetPriority())},
	}
	if ev.GetWindow() != nil {
		rows = append(rows, [2]string{"window", ev.GetWindow().AsDuration().String()})
	}
	rows = append(rows, [2]string{"topic", ev.GetTopic()})
	if ev.Partition != nil {
		rows = append(rows, [2]string{"partition", fmt.Sprint(ev.GetPartition())})
	}
	rows = append(rows, [2]string{"key", orNone(showBytes(ev.GetKey(), 0), "(none)")})
	if ev.GetTombstone() {
		rows = append(rows, [2]string{"payload", "(null: a tombstone)"})
	} else {
		rows = append(rows, [2]string{"payload", orNone(showBytes(ev.GetPayload(), 512), "(empty)")})
	}
	if len(ev.GetHeaders()) == 0 {
		rows = append(rows, [2]string{"headers", "(none)"})
	}
	for i, h := range ev.GetHeaders() {
		label := ""
		if i == 0 {
			label = "headers"
		}
		rows = append(rows, [2]string{label, h.GetKey() + "=" + showBytes(h.GetValue(), 256)})
	}
	rows = append(rows,
		[2]string{"fired_at", optTime(r.GetFiredAt())},
		[2]string{"attempts", fmt.Sprint(r.GetAttempts())},
		[2]string{"last_error", orNone(r.GetLastError(), "-")},
	)
	if r.GetCancelledAt() != nil {
		rows = append(rows, [2]string{"cancelled_at", optTime(r.GetCancelledAt())})
	}
	if r.GetDeadLetterTopic() != "" {
		rows = append(rows, [2]string{"dead_letter_topic", r.GetDeadLetterTopic()})
	}
	return rows
}

func orNone(s, none string) string {
	if s == "" {
		return none
	}
	return s
}
