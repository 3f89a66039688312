package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/client"
	"github.com/chimehq/chime/cmd/internal/kafkaflag"
	"github.com/chimehq/chime/cmd/internal/latency"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

func benchCommand() *command {
	return &command{
		name:    "bench",
		summary: "load a cluster with events and measure ingest, firing, lateness and cost",
		about: `Bench schedules --events distinct events from --callers concurrent callers,
--batch events per ScheduleBatch call, and reads the records back from Kafka
with its own consumer. Each event is due --delay after it is sent (or a time
drawn from --delay to --delay-max), or, with --due-at, all at once: --due-at
after the bench starts, spread over --spread. --rate paces the callers (0: as
fast as the cluster acknowledges). Bench sends through the Go client
(package client): each batch is split by shard and each part goes straight
to its shard's leader, found in the cluster map (--route=false sends them to
--addr, which forwards), and a call that failed in a way that may pass is
retried with the same ids.

With --batcher, each caller instead adds one event at a time to one shared
client.Batcher (at most --batch events a call), its answer awaited apart, as a
service relaying a stream of events would: the throughput of many callers
adding single events, to compare with --batch. The ack latency is then each
event's, from Add to its answer. With --api grpc, events (and updates and
recurring schedules) go through the raw chime.v1 stubs on the same
connection instead (--addr's nodes in turn, no leader routing, one attempt
each), to compare the client's cost with: --batch 1 compares a single
Schedule's ack latency.

With --api topic, events go in as Kafka records instead, the way
docs/ingest.md describes: one franz-go producer (asynchronous, linger 5 ms,
--callers goroutines each taking --batch events at a time, paced by --rate)
produces each event to --ingest-topic at --brokers, the key its id (the
event's id in Chime is then <ingest-topic>/<key>), the value its payload,
with chime-topic (--topic) and chime-delay (--delay), or chime-deliver-at in
Unix milliseconds (--delay-max, --due-at), and with --priorities
chime-priority. An event counts as acknowledged once Chime applied it: once
the consumer group --ingest-group (chime-ingest, which commits an offset
only after Raft committed the records before it) has committed offsets past
its record, read every 100 ms with an OffsetFetch. Bench reports the rate
the broker acknowledged the records at, the applied rate (events over the
time from the first record produced to every one committed: the figure to
compare with a gRPC run's acknowledged events/s), each record's time from
the producer to its committed offset (100 ms resolution), and the consumer
lag, the records the broker holds that the group has not committed, sampled
every 100 ms (max and p99). Records the nodes reject (--ingest-rejected-topic)
count as failed, with the first one's chime-error. When no offset moves for
--wait after every record was produced, bench stops and counts the rest as
failed.

While it runs it prints one line a second: events acknowledged, fired (by
the chime-fired header, one second behind) and consumed in that second. At
the end it prints the totals, the acknowledgement latency of the calls
(p50/p99/max), fire lateness (chime-fired minus due, 1 ms resolution:
p50/p99/p99.9/max), the drain (from the earliest due time to the last
chime-fired, and the rate over it: with --due-at, how fast a backlog that
fell due at once went out), delivery lag (consumer receipt minus due), the
number of records fired before they were due, duplicates, and what the
chimed nodes spent: CPU seconds per 1,000 events and the peak resident
memory of one node, read from the process_* metrics of each node's /metrics
(--metrics, or every member's HTTP address in the cluster map; a single
chimed dev has no cluster map, so bench reads --addr's host at the gRPC
port + 10, where chimed dev puts its HTTP server). --json prints the
summary as JSON; --svg writes a plot of the rates and the lateness per
second.

Ids are <--id-prefix><n>, unique per run unless --id-prefix is given, so a
rerun with the same prefix measures idempotent re-sends instead.

With --update, once every event is scheduled, the callers update each
acknowledged event once (one Update call each, to the same delay or due
time, with a new payload) and bench reports how many updates a second were
acknowledged, that rate over the same run's ingest rate (update_to_ingest:
updates/s divided by acked events/s), and their latency; the records then
carry the second version. With --update-batch N the updates go N to a call,
as upserts: BatchSchedule with on_conflict REPLACE, which makes each pending
event's next version exactly as Update does. With --reschedule D each update
is a pure reschedule instead: it moves the event's due time by D (later; a
negative D earlier, by less than --delay, or --due-at, since the updates
start once every event is scheduled: give them time to reach each event
before its new due time) and keeps its payload (an Update with only the new
due time; upserts carry the payload and priority the event was scheduled
with), and the lateness of its record is measured against the new due time. That is the workload of BENCHMARKS.md's reschedule target:
batched reschedules (e.g. --update --update-batch 500 --reschedule 10m)
acknowledged at no less than 0.5x the same run's ingest rate, which
update_to_ingest reports directly; single Update calls (--update-batch 1)
are reported, not held to a target.

With --recurring N, bench creates N recurring schedules instead (Recurring.Create
through --addr), each occurring every second from --recurring-lead after it
starts, for --recurring-for, and measures every occurrence as it measures an
event: missing, duplicates, early, fire lateness and what the nodes spent.
Each schedule is an interval of 1s, their phases spread evenly over the
second; with --recurring-aligned all are the cron rule "* * * * * *", so N
occurrences fall due at once every second.

The consumer reaches a Kafka behind TLS or SASL with the --kafka-tls* and
--kafka-sasl-* flags chimed serve was given (the password from
--kafka-sasl-password-file or ` + kafkaflag.PasswordEnv + `).`,
		example: `  # ingest: as fast as possible, due in 10-20 s
  chimectl bench --events 6000000 --callers 16 --batch 500 --delay 10s --delay-max 20s --no-consume
  # drain: 1,000,000 events all due in the same second
  chimectl bench --events 1000000 --batch 1000 --due-at 30s --spread 1s
  # precision: 10,000 events/s for 60 s, each due 2 s after it is sent
  chimectl bench --events 600000 --rate 10000 --delay 2s --svg precision.svg`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			o := benchOptions{}
			fs.IntVar(&o.events, "events", 100000, "how many distinct `n` events to schedule")
			fs.IntVar(&o.callers, "callers", 8, "concurrent callers")
			fs.IntVar(&o.batch, "batch", 200, "events per call; 1 uses Schedule instead of ScheduleBatch (with --batcher: the most a call carries;\nwith --api topic: the events a producing caller takes at a time)")
			fs.Float64Var(&o.rate, "rate", 0, "target events per second over all callers; 0 means as fast as acknowledged")
			fs.DurationVar(&o.delay, "delay", 5*time.Second, "each event is due this long after it is sent")
			fs.DurationVar(&o.delayMax, "delay-max", 0, "if set, delays are drawn uniformly from --delay to this")
			fs.DurationVar(&o.dueAt, "due-at", 0, "if set, every event is due this long after the bench starts (see --spread), instead of --delay")
			fs.DurationVar(&o.spread, "spread", 0, "with --due-at, due times are spread uniformly over this window")
			fs.StringVar(&o.topic, "topic", "chime-bench", "Kafka `topic` the events are produced to")
			fs.StringVar(&o.brokers, "brokers", "127.0.0.1:9092", "comma-separated Kafka bootstrap `addresses` for the consumer (and --api topic's producer)")
			fs.BoolVar(&o.noConsume, "no-consume", false, "do not read the records back (ingest only)")
			fs.IntVar(&o.payload, "payload-size", 64, "payload `bytes` per event")
			fs.BoolVar(&o.route, "route", true, "send each event to its shard's leader (from the cluster map) rather than to --addr")
			fs.BoolVar(&o.batcher, "batcher", false, "each caller adds single events to one shared client.Batcher, answers awaited apart, instead of\nsending batches of --batch")
			fs.StringVar(&o.api, "api", "client", "what sends the events: `client` (the Go client's methods), grpc (raw chime.v1 stubs on the\nclient's connection: no routing, no retries), both, alternating call by call (with --batch 1\nand --route=false: the client's cost per call, measured at the same moments as the stubs'), or\ntopic (Kafka records produced to --ingest-topic, acknowledged once --ingest-group committed\nthem)")
			fs.StringVar(&o.ingestTopic, "ingest-topic", "chime.schedule", "with --api topic, the ingest `topic` the records are produced to (chimed --ingest-topics)")
			fs.StringVar(&o.ingestGroup, "ingest-group", "chime-ingest", "with --api topic, the consumer `group` of the nodes' ingest (chimed --ingest-group), whose\ncommitted offsets say which records Chime applied")
			fs.StringVar(&o.ingestRejected, "ingest-rejected-topic", "chime.ingest.rejected", "with --api topic, the `topic` the nodes produce the records they cannot apply to (chimed\n--ingest-rejected-topic); the consumer counts this run's as failed")
			fs.StringVar(&o.metrics, "metrics", "", "comma-separated HTTP `addresses` (host:port) of the chimed nodes whose /metrics to read for CPU and memory (default: every member's, from the cluster map)")
			fs.StringVar(&o.svg, "svg", "", "write a plot of rates and lateness per second to this `file`")
			fs.StringVar(&o.prefix, "id-prefix", "", "event id `prefix` (default bench-<start time>-)")
			fs.DurationVar(&o.wait, "wait", 30*time.Second, "how long to wait for records after the last one is due")
			fs.BoolVar(&o.update, "update", false, "after scheduling, update every acknowledged event once and measure the updates")
			kafka := kafkaflag.Register(fs, "the consumer (and --api topic's producer)")
			fs.IntVar(&o.recurring, "recurring", 0, "instead of events, create `n` recurring schedules, each occurring every second for\n--recurring-for, and measure their occurrences as events (each one a due time)")
			fs.DurationVar(&o.recurringFor, "recurring-for", time.Minute, "with --recurring, how long each schedule occurs")
			fs.BoolVar(&o.recurringAligned, "recurring-aligned", false, "with --recurring, every schedule occurs at the same instant, each whole second (cron\n\"* * * * * *\"); without it, each is an interval of 1s whose phase is spread over the second")
			fs.DurationVar(&o.recurringLead, "recurring-lead", 15*time.Second, "with --recurring, the first occurrence is this long after the bench starts (time enough to\ncreate every schedule)")
			fs.BoolVar(&o.priorities, "priorities", false, "give event n the priority n mod 10 and report the lateness of each priority")
			fs.IntVar(&o.updateBatch, "update-batch", 1, "with --update, update `n` events per call: 1 is one Update call each, more is BatchSchedule calls of upserts (on_conflict REPLACE)")
			fs.DurationVar(&o.reschedule, "reschedule", 0, "with --update, move each event's due time by this `duration` and keep its payload (a pure\nreschedule): positive is later, negative earlier by less than --delay (or --due-at); 0 keeps\nthe due time and changes the payload")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if err := o.validate(); err != nil {
					return err
				}
				var err error
				if o.kafka, err = kafkaOpts(kafka, c.getenv); err != nil {
					return err
				}
				return c.bench(ctx, o)
			}
		},
	}
}

type benchOptions struct {
	events, callers, batch, payload int
	updateBatch                     int
	reschedule                      time.Duration // --update moves each due time by this; 0: payload only
	rate                            float64
	delay, delayMax, dueAt, spread  time.Duration
	topic, brokers, metrics, svg    string
	prefix                          string
	noConsume, route, update        bool
	priorities, batcher             bool
	api                             string // client, grpc, both or topic
	// --api topic: the ingest topic, its consumer group and rejected topic.
	ingestTopic, ingestGroup, ingestRejected string
	wait                                     time.Duration
	// --recurring: schedules to create, how long each occurs, and when the
	// first occurrence is.
	recurring                   int
	recurringFor, recurringLead time.Duration
	recurringAligned            bool
	kafka                       []kgo.Opt // how the consumer reaches the brokers (kafkaOpts)
}

func (o *benchOptions) validate() error {
	switch {
	case o.events < 1:
		return usagef("--events must be at least 1")
	case o.callers < 1:
		return usagef("--callers must be at least 1")
	case o.batch < 1:
		return usagef("--batch must be at least 1")
	case o.rate < 0:
		return usagef("--rate must not be negative")
	case o.delay < 0 || o.dueAt < 0 || o.spread < 0:
		return usagef("--delay, --due-at and --spread must not be negative")
	case o.delayMax != 0 && o.delayMax < o.delay:
		return usagef("--delay-max (%v) must not be below --delay (%v)", o.delayMax, o.delay)
	case o.payload < 0:
		return usagef("--payload-size must not be negative")
	case o.topic == "":
		return usagef("--topic must not be empty")
	case o.updateBatch < 1:
		return usagef("--update-batch must be at least 1")
	case o.reschedule != 0 && !o.update:
		return usagef("--reschedule moves the due time of the updates: it needs --update")
	case o.reschedule < 0 && -o.reschedule >= o.lead():
		lead := "--delay"
		if o.dueAt > 0 {
			lead = "--due-at"
		}
		return usagef("--reschedule %v: a negative --reschedule must be shorter than %s (%v): the updates start only once every "+
			"event is scheduled, and an event moved earlier by %s or more would be due before it was sent, firing before its update could reach it",
			o.reschedule, lead, o.lead(), lead)
	case o.recurring < 0:
		return usagef("--recurring must not be negative")
	case o.recurring > 0 && (o.recurringFor < time.Second || o.recurringLead < time.Second):
		return usagef("--recurring-for and --recurring-lead must be at least 1s")
	case o.recurring > 0 && (o.update || o.noConsume):
		return usagef("--recurring measures occurrences as they arrive: it takes neither --update nor --no-consume")
	case o.api != "client" && o.api != "grpc" && o.api != "both" && o.api != "topic":
		return usagef("--api %q: want client, grpc, both or topic", o.api)
	case o.api == "topic" && (o.update || o.recurring > 0 || o.batcher):
		return usagef("--api topic produces each event as a record to the ingest topic: it takes none of --update, --recurring and --batcher")
	case o.api == "topic" && (o.ingestTopic == "" || o.ingestGroup == ""):
		return usagef("--api topic needs --ingest-topic and --ingest-group")
	case o.api == "topic" && (o.ingestTopic == o.topic || o.ingestRejected == o.topic):
		return usagef("--topic %q is an ingest topic (--ingest-topic, --ingest-rejected-topic): the fired records would be read again", o.topic)
	case o.api == "both" && (o.batch != 1 || o.route || o.update || o.recurring > 0):
		return usagef("--api both compares single Schedule calls: it needs --batch 1 and --route=false, and takes neither --update nor --recurring")
	case o.batcher && (o.api == "grpc" || o.recurring > 0):
		return usagef("--batcher adds events through the client: it takes neither --api grpc nor --recurring")
	}
	return nil
}

// lead is how long after it is sent (at the least) an event is due:
// --delay, or with --due-at, --due-at (after the bench starts).
func (o *benchOptions) lead() time.Duration {
	if o.dueAt > 0 {
		return o.dueAt
	}
	return o.delay
}

// benchRun is the state of one bench: what was sent and what came back,
// bucketed per second since start.
type benchRun struct {
	o      benchOptions
	start  time.Time
	prefix string
	// dues is each event number's due time (unix ns), 0 until acknowledged;
	// with --reschedule, the new one once the update that moved it was
	// acknowledged, which moved (per event number) then says.
	dues  []int64
	moved []bool

	acked, failed atomic.Int64
	// --update: updates acknowledged and failed, the time the update phase
	// took, and each Update call's latency.
	updated, updateFailed atomic.Int64
	updateTime            time.Duration
	updateLat             []time.Duration
	mu                    sync.Mutex
	ackLat                []time.Duration // per call
	ackLatRaw             []time.Duration // per raw stub call, with --api both
	secs                  []benchSecond
	seen                  []bool // per event number: a record was consumed
	late, lag             []float64
	lateByPriority        [10][]float64 // --priorities
	early, dups           int
	consumed              int
	lastDue               int64
	firstErr              error
	// The earliest due time and the latest chime-fired of the records
	// whose lateness is known, unix ms: the span in which they all went out.
	firstDueMs, lastFiredMs int64
	// --recurring: the first occurrence, and how many each schedule has.
	// Schedule s's occurrence k is event number s*perSchedule+k.
	first       time.Time
	perSchedule int
	// Each node process's CPU seconds when the first occurrence fell due.
	cpuAtFirst map[string]float64
	// topic is --api topic's producing state; nil otherwise.
	topic *benchTopic
	// unacked holds the records consumed before their event's ack, by
	// event number, until the ack tells their due time.
	unacked map[int]unackedRecord
}

type benchSecond struct {
	acked, fired, consumed int
	late                   []float64 // ms, by fired second
}

func (r *benchRun) second(t time.Time) *benchSecond {
	i := max(int(t.Sub(r.start)/time.Second), 0)
	for len(r.secs) <= i {
		r.secs = append(r.secs, benchSecond{})
	}
	return &r.secs[i]
}

func (c *cli) bench(ctx context.Context, o benchOptions) error {
	start := time.Now()
	var first time.Time // --recurring: the first occurrence, a whole second
	perSchedule := 0
	if o.recurring > 0 {
		first = start.Add(o.recurringLead).Truncate(time.Second).Add(time.Second)
		perSchedule = int(o.recurringFor/time.Second) + 1
		o.events = o.recurring * perSchedule
	}
	r := &benchRun{o: o, start: start, dues: make([]int64, o.events), first: first, perSchedule: perSchedule}
	r.prefix = o.prefix
	if r.prefix == "" {
		r.prefix = fmt.Sprintf("bench-%d-", r.start.UnixMilli())
	}
	if !o.noConsume {
		r.seen = make([]bool, o.events)
	}
	if o.reschedule != 0 {
		r.moved = make([]bool, o.events)
	}
	if o.api == "topic" {
		r.topic = &benchTopic{pending: newTopicPending()}
	}
	cl, err := c.dial(ctx, client.WithLeaderRouting(o.route), client.WithRetry(benchRetry))
	if err != nil {
		return err
	}
	defer func() { _ = cl.Close() }() // fails only for a client already closed
	s := &benchSender{cl: cl}
	if o.api == "grpc" || o.api == "both" {
		s.alternate = o.api == "both"
		s.raw, s.rawRecurring = chimev1.NewSchedulerClient(cl.Conn()), chimev1.NewRecurringClient(cl.Conn())
	}
	httpAddrs := strings.Fields(strings.ReplaceAll(o.metrics, ",", " "))
	if o.metrics == "" {
		httpAddrs = c.benchHTTPAddrs(ctx, cl)
	}
	cost, err := newNodeCost(httpAddrs, &c.tls)
	if err != nil {
		return err
	}
	cost.sample(ctx)

	var consumerDone chan error
	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	if !o.noConsume {
		consumerDone = make(chan error, 1)
		ready := make(chan struct{})
		go func() { consumerDone <- r.consume(cctx, ready) }()
		select {
		case <-ready:
		case err := <-consumerDone:
			return err
		}
	}

	tctx, stopTicker := context.WithCancel(ctx)
	tickerDone := make(chan struct{})
	go func() { defer close(tickerDone); r.report(tctx, c, cost) }()

	var next atomic.Int64
	var wg sync.WaitGroup
	switch {
	case o.api == "topic":
		if err := r.produceTopic(ctx); err != nil {
			stopTicker()
			<-tickerDone
			return err
		}
	case o.recurring > 0:
		for range o.callers {
			wg.Go(func() { r.createSchedules(ctx, &next, s) })
		}
	case o.batcher:
		b := client.NewBatcher(cl, client.BatcherConfig{MaxEvents: o.batch})
		for range o.callers {
			wg.Go(func() { r.add(ctx, &next, b) })
		}
		wg.Wait()
		_ = b.Close() // returns nil (its doc); each event's outcome came through its Pending
	default:
		for range o.callers {
			wg.Go(func() { r.call(ctx, &next, s) })
		}
	}
	wg.Wait()
	sendEnd := time.Now()
	if o.update && ctx.Err() == nil {
		r.updates(ctx, s)
	}

	if !o.noConsume && ctx.Err() == nil {
		// Wait until every acknowledged event came back, or --wait after
		// the last due time.
		deadline := time.Unix(0, r.lastDue).Add(o.wait)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			r.mu.Lock()
			done := r.consumed >= int(r.acked.Load())
			r.mu.Unlock()
			if done {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	stopTicker()
	<-tickerDone
	stopConsumer()
	if consumerDone != nil {
		if err := <-consumerDone; err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintf(c.stderr, "chimectl bench: consumer: %v\n", err)
		}
	}
	end := time.Now()
	cost.sample(ctx)
	sum := r.summary(sendEnd, end, cost)
	if o.svg != "" {
		if err := os.WriteFile(o.svg, []byte(r.plot()), 0o644); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
	}
	if c.json {
		if err := c.printJSON(sum); err != nil {
			return err
		}
	} else {
		sum.print(c)
	}
	if r.firstErr != nil && r.acked.Load() == 0 {
		return r.firstErr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// benchRetry is how the bench's calls are repeated: a failed call goes
// again with the same ids (which is idempotent) up to 20 more times, from
// 50 ms to at most 500 ms apart, each attempt allowed 30 s.
var benchRetry = client.RetryPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
	MaxAttempts: 21, AttemptTimeout: 30 * time.Second, Budget: 5 * time.Minute}

// benchSender is what the bench sends with: the client's methods, or with
// --api grpc the raw stubs on the client's connection.
type benchSender struct {
	cl           *client.Client
	raw          chimev1.SchedulerClient // --api grpc or both; nil otherwise
	rawRecurring chimev1.RecurringClient
	alternate    bool // --api both: odd calls on raw, even ones through cl
}

// benchHTTPAddrs are the HTTP addresses of the chimed nodes, for their
// /metrics: every live member's, from the cluster map, or, when --addr
// has no cluster map (a single chimed dev), the one chimed dev derives
// from --addr. Without a map (no access to it, no node answering) the
// nodes' cost is not measured, which bench says.
func (c *cli) benchHTTPAddrs(ctx context.Context, cl *client.Client) []string {
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var m *chimev1.ClusterMap
	err := cl.Do(mctx, func(ctx context.Context, cc grpc.ClientConnInterface) (err error) {
		m, err = chimev1.NewAdminClient(cc).GetClusterMap(ctx, &chimev1.GetClusterMapRequest{})
		return err
	})
	if status.Code(err) == codes.Unimplemented {
		// A single node without the cluster layer.
		if a, ok := devHTTPAddr(c.addr); ok {
			return []string{a}
		}
		return nil
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "chimectl bench: reading the cluster map from %s, for the nodes' /metrics: %s: %s (name them with --metrics)\n",
			c.addr, status.Code(err), status.Convert(err).Message())
		return nil
	}
	var httpAddrs []string
	for _, mem := range m.Members {
		if gone := mem.State == "dead" || mem.State == "left" || mem.State == "removed"; mem.HttpAddr != "" && !gone {
			httpAddrs = append(httpAddrs, mem.HttpAddr)
		}
	}
	return httpAddrs
}

// benchPayload is every event's payload: --payload-size letters.
func benchPayload(n int) []byte {
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	return payload
}

// pace waits until event number from is due to be sent at --rate; false
// when ctx ended first.
func (r *benchRun) pace(ctx context.Context, from int) bool {
	if r.o.rate <= 0 {
		return true
	}
	at := r.start.Add(time.Duration(float64(from) / r.o.rate * float64(time.Second)))
	d := time.Until(at)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// event is event number n for the client, with the options it is sent
// with: In(--delay), or its own due time (--delay-max, --due-at), and
// with --priorities its priority (Priority(0) for 0, which Event.Priority
// cannot say).
func (r *benchRun) event(n int, payload []byte, rnd *rand.Rand) (client.Event, []client.ScheduleOption) {
	o := r.o
	ev := client.Event{ID: r.prefix + strconv.Itoa(n), Topic: o.topic, Payload: payload}
	var opts []client.ScheduleOption
	switch {
	case o.dueAt > 0:
		ev.Due = r.start.Add(o.dueAt)
		if o.spread > 0 {
			ev.Due = ev.Due.Add(time.Duration(rnd.Int64N(int64(o.spread))))
		}
	case o.delayMax > o.delay:
		// Each its own delay: as a due time, since a batch's In is one
		// for all its events (the server resolves a delay from its own
		// clock; this one is the bench's).
		ev.Due = time.Now().Add(o.delay + time.Duration(rnd.Int64N(int64(o.delayMax-o.delay))))
	default:
		opts = append(opts, client.In(o.delay))
	}
	if o.priorities {
		if ev.Priority = n % 10; ev.Priority == 0 {
			opts = append(opts, client.Priority(0))
		}
	}
	return ev, opts
}

// rawEvent is event number n as the API's message, for --api grpc.
func (r *benchRun) rawEvent(n int, payload []byte, rnd *rand.Rand) *chimev1.Event {
	o := r.o
	ev := &chimev1.Event{Id: r.prefix + strconv.Itoa(n), Topic: o.topic, Payload: payload}
	if o.priorities {
		p := uint32(n % 10)
		ev.Priority = &p
	}
	if o.dueAt > 0 {
		at := r.start.Add(o.dueAt)
		if o.spread > 0 {
			at = at.Add(time.Duration(rnd.Int64N(int64(o.spread))))
		}
		ev.DeliverAt = timestamppb.New(at)
	} else {
		d := o.delay
		if o.delayMax > o.delay {
			d += time.Duration(rnd.Int64N(int64(o.delayMax - o.delay)))
		}
		ev.Delay = durationpb.New(d)
	}
	return ev
}

// call is one caller: it takes --batch event numbers at a time until all
// are taken and sends them in one call (the client splits it by shard
// leader), or, with --priorities, one call for priority 0 and one for the
// rest (an option of the call, not of the events).
func (r *benchRun) call(ctx context.Context, next *atomic.Int64, s *benchSender) {
	o := r.o
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	payload := benchPayload(o.payload)
	for ctx.Err() == nil {
		from, to, ok := r.claim(ctx, next)
		if !ok {
			return
		}
		if s.raw != nil && (!s.alternate || from%2 == 1) {
			evs, nums := make([]*chimev1.Event, 0, to-from), make([]int, 0, to-from)
			for n := from; n < to; n++ {
				evs, nums = append(evs, r.rawEvent(n, payload, rnd)), append(nums, n)
			}
			r.sendRaw(ctx, s.raw, evs, nums)
			continue
		}
		var parts [2]benchPart // priority 0 (with --priorities), the rest
		for n := from; n < to; n++ {
			ev, opts := r.event(n, payload, rnd)
			p := &parts[1]
			if o.priorities && n%10 == 0 {
				p = &parts[0]
			}
			if p.evs == nil {
				p.evs, p.nums, p.opts = make([]client.Event, 0, to-from), make([]int, 0, to-from), opts
			}
			p.evs, p.nums = append(p.evs, ev), append(p.nums, n)
		}
		var wg sync.WaitGroup
		for i := range parts {
			if p := &parts[i]; len(p.evs) > 0 {
				wg.Go(func() { r.send(ctx, s.cl, p) })
			}
		}
		wg.Wait()
	}
}

// add is one caller of --batcher: it takes one event number at a time and
// adds the event to b without waiting for its answer, as a service that
// hands events to a Batcher from its request path does; a goroutine of its
// own waits for the answers, in order. b's MaxPending bounds how far the
// adding runs ahead of the answers.
func (r *benchRun) add(ctx context.Context, next *atomic.Int64, b *client.Batcher) {
	type added struct {
		n  int
		t0 time.Time
		p  *client.Pending
	}
	answers := make(chan added, 1024)
	var wg sync.WaitGroup
	wg.Go(func() {
		// The answers are recorded a run at a time: one lock of r.mu for
		// many events, as a batch's are, so that the bench's own
		// bookkeeping weighs on the 64 callers no more than on --batch's.
		var nums []int
		var dues []int64
		var lats []time.Duration
		record := func() {
			r.acksEach(nums, dues, lats)
			nums, dues, lats = nums[:0], dues[:0], lats[:0]
		}
		for a := range answers {
			res, err := a.p.Wait(ctx)
			if err != nil {
				r.fail(err, 1)
				continue
			}
			nums, dues, lats = append(nums, a.n), append(dues, res.Due.UnixNano()), append(lats, time.Since(a.t0))
			if len(answers) == 0 || len(nums) == 256 {
				record()
			}
		}
		record()
	})
	defer func() { close(answers); wg.Wait() }()
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	payload := benchPayload(r.o.payload)
	for ctx.Err() == nil {
		n := int(next.Add(1)) - 1
		if n >= r.o.events || !r.pace(ctx, n) {
			return
		}
		ev, opts := r.event(n, payload, rnd)
		t0 := time.Now()
		answers <- added{n, t0, b.Add(ctx, ev, opts...)}
	}
}

// updates updates every acknowledged event once, from --callers callers,
// and records the count, the time taken and each call's latency. Without
// --reschedule each event keeps its due time and gets a new payload; with
// it, each keeps its payload and its due time moves by --reschedule (a pure
// reschedule), and r.dues takes the new due time of each one acknowledged.
// With --update-batch N each call is a ScheduleBatch of N upserts, split by
// shard as the ingest.
func (r *benchRun) updates(ctx context.Context, s *benchSender) {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	n := r.o.updateBatch
	payload := []byte("updated")
	if r.o.reschedule != 0 {
		payload = benchPayload(r.o.payload)
	}
	for range r.o.callers {
		wg.Go(func() {
			var lat []time.Duration
			for ctx.Err() == nil {
				from := int(next.Add(int64(n))) - n
				if from >= r.o.events {
					break
				}
				var evs []client.Event
				var nums []int
				r.mu.Lock()
				for i := from; i < min(from+n, r.o.events); i++ {
					if r.dues[i] == 0 { // not acknowledged
						continue
					}
					due := time.Unix(0, r.dues[i]+int64(r.o.reschedule))
					evs = append(evs, client.Event{ID: r.prefix + strconv.Itoa(i), Topic: r.o.topic, Due: due, Payload: payload})
					nums = append(nums, i)
				}
				r.mu.Unlock()
				if len(evs) == 0 {
					continue
				}
				t := time.Now()
				dues := r.update(ctx, s, evs, nums)
				lat = append(lat, time.Since(t))
				r.updatesDone(nums, dues)
			}
			r.mu.Lock()
			r.updateLat = append(r.updateLat, lat...)
			r.mu.Unlock()
		})
	}
	wg.Wait()
	r.updateTime = time.Since(start)
	if r.moved != nil {
		// The consumer waits until --wait after the last due time: the
		// latest one now.
		r.mu.Lock()
		r.lastDue = 0
		for _, due := range r.dues {
			r.lastDue = max(r.lastDue, due)
		}
		r.mu.Unlock()
	}
}

// updatesDone counts the updates of events nums, dues[i] being the due
// time nums[i] was acknowledged at (0 for one that failed), and, with
// --reschedule, records the new due times.
func (r *benchRun) updatesDone(nums []int, dues []int64) {
	ok := 0
	r.mu.Lock()
	for i, due := range dues {
		if due == 0 {
			continue
		}
		ok++
		if r.moved != nil {
			r.dues[nums[i]], r.moved[nums[i]] = due, true
		}
	}
	r.mu.Unlock()
	r.updated.Add(int64(ok))
	r.updateFailed.Add(int64(len(dues) - ok))
}

// update sends one call of updates of events nums: an Update for one
// event, a ScheduleBatch of upserts (Replace) for more, each pending
// event's next version. With --reschedule an Update sets the due time
// alone; otherwise it sets the payload too. The upserts carry the whole
// event: with --priorities its priority too, as scheduled (the events of
// priority 0 in a call of their own, as Priority(0) is an option of the
// call). It returns the due time (unix ns) each event was acknowledged at,
// 0 for one that failed.
func (r *benchRun) update(ctx context.Context, s *benchSender, evs []client.Event, nums []int) []int64 {
	dues := make([]int64, len(evs))
	if s.raw != nil {
		r.updateRaw(ctx, s.raw, evs, nums, dues)
		return dues
	}
	if r.o.updateBatch == 1 {
		ev := evs[0]
		opts := []client.UpdateOption{client.At(ev.Due)}
		if r.o.reschedule == 0 {
			opts = append(opts, client.SetPayload(ev.Payload))
		}
		if res, err := s.cl.Update(ctx, ev.ID, opts...); err == nil {
			dues[0] = res.Due.UnixNano()
		}
		return dues
	}
	var parts [2][]int // indexes into evs: priority 0 (with --priorities), the rest
	for i := range evs {
		p := 1
		if r.o.priorities {
			if evs[i].Priority = nums[i] % 10; evs[i].Priority == 0 {
				p = 0
			}
		}
		parts[p] = append(parts[p], i)
	}
	var wg sync.WaitGroup
	for p, idx := range parts {
		if len(idx) == 0 {
			continue
		}
		wg.Go(func() {
			part := make([]client.Event, len(idx))
			for j, i := range idx {
				part[j] = evs[i]
			}
			opts := []client.ScheduleOption{client.Replace()}
			if p == 0 {
				opts = append(opts, client.Priority(0))
			}
			res, _ := s.cl.ScheduleBatch(ctx, part, opts...)
			for j, res := range res {
				if res.Err == nil && res.Version > 1 {
					dues[idx[j]] = res.Due.UnixNano()
				}
			}
		})
	}
	wg.Wait()
	return dues
}

// updateRaw is update on the raw stub (--api grpc), one attempt; it sets
// dues[i] to the due time evs[i] was acknowledged at.
func (r *benchRun) updateRaw(ctx context.Context, sc chimev1.SchedulerClient, evs []client.Event, nums []int, dues []int64) {
	ctx, cancel := context.WithTimeout(ctx, benchRetry.AttemptTimeout)
	defer cancel()
	if r.o.updateBatch == 1 {
		ev := evs[0]
		req := &chimev1.UpdateRequest{Id: ev.ID, DeliverAt: timestamppb.New(ev.Due)}
		if r.o.reschedule == 0 {
			req.Payload = ev.Payload
		}
		if resp, err := sc.Update(ctx, req); err == nil {
			dues[0] = resp.GetDue().AsTime().UnixNano()
		}
		return
	}
	req := &chimev1.BatchScheduleRequest{}
	for i, ev := range evs {
		pe := &chimev1.Event{Id: ev.ID, Topic: ev.Topic, DeliverAt: timestamppb.New(ev.Due), Payload: ev.Payload,
			OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE}
		if r.o.priorities {
			p := uint32(nums[i] % 10)
			pe.Priority = &p
		}
		req.Events = append(req.Events, pe)
	}
	resp, err := sc.BatchSchedule(ctx, req)
	if err != nil {
		return
	}
	for i, res := range resp.Results {
		if i < len(dues) && res.Code == 0 && res.Version > 1 {
			dues[i] = res.GetDue().AsTime().UnixNano()
		}
	}
}

// benchPart is the events of one call, with their event numbers and the
// call's options.
type benchPart struct {
	evs  []client.Event
	nums []int
	opts []client.ScheduleOption
}

// send schedules p in one call of the client (Schedule when --batch is 1),
// which retries what failed in a way that may pass, with the same ids
// (benchRetry). The latency is the whole call's, retries included.
func (r *benchRun) send(ctx context.Context, cl *client.Client, p *benchPart) {
	dues := make([]int64, len(p.evs))
	t0 := time.Now()
	if len(p.evs) == 1 && r.o.batch == 1 {
		res, err := cl.Schedule(ctx, p.evs[0], p.opts...)
		if err != nil {
			r.fail(err, 1)
			return
		}
		dues[0] = res.Due.UnixNano()
	} else {
		res, _ := cl.ScheduleBatch(ctx, p.evs, p.opts...)
		for i, res := range res {
			if res.Err != nil {
				r.fail(res.Err, 1)
				continue
			}
			dues[i] = res.Due.UnixNano()
		}
	}
	r.acks(p.nums, dues, time.Since(t0))
}

// sendRaw schedules evs on the raw stub (--api grpc) in one call
// (Schedule when --batch is 1), one attempt of at most 30 s.
func (r *benchRun) sendRaw(ctx context.Context, sc chimev1.SchedulerClient, evs []*chimev1.Event, nums []int) {
	ctx, cancel := context.WithTimeout(ctx, benchRetry.AttemptTimeout)
	defer cancel()
	dues := make([]int64, len(evs))
	t0 := time.Now()
	if len(evs) == 1 && r.o.batch == 1 {
		resp, err := sc.Schedule(ctx, &chimev1.ScheduleRequest{Event: evs[0]})
		if err != nil {
			r.fail(err, 1)
			return
		}
		dues[0] = resp.Due.AsTime().UnixNano()
	} else {
		resp, err := sc.BatchSchedule(ctx, &chimev1.BatchScheduleRequest{Events: evs})
		if err != nil {
			r.fail(err, len(evs))
			return
		}
		for i, res := range resp.Results {
			if res.Code != 0 {
				r.fail(fmt.Errorf("event %s: code %d: %s", res.Id, res.Code, res.Message), 1)
				continue
			}
			dues[i] = res.Due.AsTime().UnixNano()
		}
	}
	if lat := time.Since(t0); r.o.api == "both" {
		r.mu.Lock()
		r.ackLatRaw = append(r.ackLatRaw, lat)
		r.mu.Unlock()
		r.acksEach(nums, dues[:len(nums)], nil)
	} else {
		r.acks(nums, dues, lat)
	}
}

// acks records the answer of one call: event nums[i] is due at dues[i]
// (unix ns; 0 for one that failed, counted already), and the call took lat.
func (r *benchRun) acks(nums []int, dues []int64, lat time.Duration) {
	now := time.Now()
	accepted := 0
	r.mu.Lock()
	r.ackLat = append(r.ackLat, lat)
	for i, due := range dues {
		if due != 0 {
			n := nums[i]
			r.dues[n] = due
			r.lastDue = max(r.lastDue, due)
			accepted++
			if e, ok := r.unacked[n]; ok {
				delete(r.unacked, n)
				r.fired(n, due, e.fired, e.consumed)
			}
		}
	}
	r.second(now).acked += accepted
	r.mu.Unlock()
	r.acked.Add(int64(accepted))
}

// acksEach is acks for events each with its own ack latency (--batcher's).
func (r *benchRun) acksEach(nums []int, dues []int64, lats []time.Duration) {
	if len(nums) == 0 {
		return
	}
	now := time.Now()
	r.mu.Lock()
	r.ackLat = append(r.ackLat, lats...)
	for i, due := range dues {
		n := nums[i]
		r.dues[n] = due
		r.lastDue = max(r.lastDue, due)
		if e, ok := r.unacked[n]; ok {
			delete(r.unacked, n)
			r.fired(n, due, e.fired, e.consumed)
		}
	}
	r.second(now).acked += len(nums)
	r.mu.Unlock()
	r.acked.Add(int64(len(nums)))
}

func (r *benchRun) fail(err error, n int) {
	r.failed.Add(int64(n))
	r.mu.Lock()
	if r.firstErr == nil {
		r.firstErr = err
	}
	r.mu.Unlock()
}

// consume reads the topic from the bench's start and accounts for every
// record of this run; ready is closed once partitions are assigned.
func (r *benchRun) consume(ctx context.Context, ready chan<- struct{}) error {
	seeds := strings.Fields(strings.ReplaceAll(r.o.brokers, ",", " "))
	topics := []string{r.o.topic}
	if r.topic != nil {
		// --api topic: what the nodes reject goes there, and is counted.
		topics = append(topics, r.o.ingestRejected)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(r.start.Add(-time.Second).UnixMilli())),
		kgo.AllowAutoTopicCreation(),
		kgo.FetchMaxWait(50 * time.Millisecond),
	}, r.o.kafka...)...)
	if err != nil {
		return fmt.Errorf("--brokers: %w", err)
	}
	defer cl.Close()
	if err := pingKafka(ctx, cl, seeds); err != nil {
		return err
	}
	// Make sure the topic exists before scheduling, so the consumer sees
	// it from its first record.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = cl.ProduceSync(pctx, &kgo.Record{Topic: r.o.topic, Value: []byte("chimectl bench start")}).FirstErr()
	cancel()
	if err != nil {
		return fmt.Errorf("creating topic %s at %s: %w", r.o.topic, r.o.brokers, err)
	}
	close(ready)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := time.Now()
		r.mu.Lock()
		fs.EachRecord(func(rec *kgo.Record) {
			if r.topic != nil && rec.Topic == r.o.ingestRejected {
				r.rejectedRecord(rec)
				return
			}
			r.record(rec, now)
		})
		r.mu.Unlock()
	}
}

// record accounts for one consumed record; r.mu is held.
func (r *benchRun) record(rec *kgo.Record, now time.Time) {
	h, _ := chimev1.ParseHeaders(rec.Headers)
	rest, ok := strings.CutPrefix(h.ID, r.prefix)
	if r.topic != nil {
		rest, ok = topicIDRest(h.ID, r.o.ingestTopic, r.prefix)
	}
	if !ok {
		return
	}
	n, err := r.eventNumber(rest)
	if err != nil || n < 0 || n >= len(r.seen) {
		return
	}
	if r.seen[n] {
		r.dups++
		return
	}
	r.seen[n] = true
	r.consumed++
	r.second(now).consumed++
	if h.Fired.IsZero() {
		return // no chime-fired: lateness unknown
	}
	if r.topic != nil {
		r.topicRecord(n, h, now)
		return
	}
	if r.dues[n] == 0 {
		// Consumed before its ack came back (a short delay on a busy
		// machine): its lateness is known once the ack tells its due time.
		if r.unacked == nil {
			r.unacked = map[int]unackedRecord{}
		}
		r.unacked[n] = unackedRecord{h.Fired, now}
		return
	}
	due := r.dues[n]
	if r.moved != nil {
		// --reschedule: the record's version says which due time it had,
		// whatever dues holds yet: a later version's is the one the update
		// moved it to (though its answer may not be counted yet), the
		// first version's the one it was scheduled with (it fired before
		// an upsert renewed it).
		switch {
		case h.Version > 1 && !r.moved[n]:
			due += int64(r.o.reschedule)
		case h.Version == 1 && r.moved[n]:
			due -= int64(r.o.reschedule)
		}
	}
	r.fired(n, due, h.Fired, now)
}

// unackedRecord is a record consumed before the ack of its event.
type unackedRecord struct{ fired, consumed time.Time }

// fired accounts for the lateness of event n, due at due (unix ns), fired
// at firedAt (chime-fired) and consumed at now; r.mu is held.
func (r *benchRun) fired(n int, due int64, firedAt, now time.Time) {
	fired := firedAt.UnixMilli()
	// chime-fired has millisecond resolution: compare at that resolution.
	late := float64(fired - due/1e6)
	if fired < due/1e6 {
		r.early++
	}
	r.late = append(r.late, late)
	if r.o.priorities {
		r.lateByPriority[n%10] = append(r.lateByPriority[n%10], late)
	}
	if len(r.late) == 1 || due/1e6 < r.firstDueMs {
		r.firstDueMs = due / 1e6
	}
	r.lastFiredMs = max(r.lastFiredMs, fired)
	r.lag = append(r.lag, float64(now.UnixNano()-due)/1e6)
	sec := r.second(time.UnixMilli(fired))
	sec.fired++
	sec.late = append(sec.late, late)
}

// eventNumber is the number of the event whose id is r.prefix+rest: rest
// itself, or with --recurring, "<schedule>@<unix ms>", numbered by schedule
// and occurrence.
func (r *benchRun) eventNumber(rest string) (int, error) {
	if r.perSchedule == 0 {
		return strconv.Atoi(rest)
	}
	sched, ms, ok := strings.Cut(rest, "@")
	if !ok {
		return 0, fmt.Errorf("%q is no occurrence", rest)
	}
	s, err := strconv.Atoi(sched)
	if err != nil {
		return 0, err
	}
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0, err
	}
	if s < 0 || s >= r.o.recurring {
		return 0, fmt.Errorf("%q is no occurrence of this bench", rest)
	}
	from := r.phase(s).UnixMilli()
	k := (at - from) / 1000
	if k < 0 || k >= int64(r.perSchedule) || (at-from)%1000 != 0 {
		return 0, fmt.Errorf("%q is no occurrence of this bench", rest)
	}
	return s*r.perSchedule + int(k), nil
}

// phase is schedule s's first occurrence: r.first, or with the phases
// spread, r.first plus s's share of the second, in whole milliseconds.
func (r *benchRun) phase(s int) time.Time {
	if r.o.recurringAligned {
		return r.first
	}
	return r.first.Add(time.Duration(s*1000/r.o.recurring) * time.Millisecond)
}

// createSchedules is one caller of a --recurring bench: it takes schedule
// numbers until all are taken and creates each, occurring every second
// from r.first for --recurring-for. Each one acknowledged counts its
// occurrences as acknowledged events, due at their times.
func (r *benchRun) createSchedules(ctx context.Context, next *atomic.Int64, s *benchSender) {
	o := r.o
	payload := benchPayload(o.payload)
	for ctx.Err() == nil {
		sn := int(next.Add(1)) - 1
		if sn >= o.recurring {
			return
		}
		first := r.phase(sn)
		end := first.Add(time.Duration(r.perSchedule-1) * time.Second)
		bounds := []client.RuleOption{client.StartAt(first), client.EndAt(end), client.WithCatchUp(client.CatchUpAll)}
		rule := client.Every(time.Second, bounds...)
		if o.recurringAligned {
			rule = client.Cron("* * * * * *", "", bounds...)
		}
		id, target := r.prefix+strconv.Itoa(sn), client.Target{Topic: o.topic, Payload: payload}
		sent := time.Now()
		var err error
		if s.rawRecurring != nil {
			pr := &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Second)},
				Start: timestamppb.New(first), End: timestamppb.New(end), CatchUp: chimev1.CatchUp_CATCH_UP_ALL}
			if o.recurringAligned {
				pr.Rule = &chimev1.RecurringRule_Cron{Cron: "* * * * * *"}
			}
			_, err = s.rawRecurring.Create(ctx, &chimev1.CreateRecurringRequest{Id: id, Rule: pr,
				Target: &chimev1.RecurringTarget{Topic: o.topic, Payload: payload}})
		} else {
			_, err = s.cl.Recurring().Create(ctx, id, rule, target)
		}
		lat := time.Since(sent)
		r.mu.Lock()
		if err != nil {
			r.failed.Add(int64(r.perSchedule))
			if r.firstErr == nil {
				r.firstErr = err
			}
		} else {
			r.acked.Add(int64(r.perSchedule))
			r.ackLat = append(r.ackLat, lat)
			r.second(time.Now()).acked += r.perSchedule
			for k := range r.perSchedule {
				r.dues[sn*r.perSchedule+k] = first.Add(time.Duration(k) * time.Second).UnixNano()
			}
			r.lastDue = max(r.lastDue, end.UnixNano())
		}
		r.mu.Unlock()
	}
}

// report prints a line a second until ctx ends.
func (r *benchRun) report(ctx context.Context, c *cli, cost *nodeCost) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	if !c.json {
		if r.topic != nil {
			fmt.Fprintf(c.stderr, "%6s %12s %12s %10s %12s %12s %8s %10s\n", "t", "produced/s", "applied/s", "lag", "fired/s", "consumed/s", "cpu%", "rss")
		} else {
			fmt.Fprintf(c.stderr, "%6s %12s %12s %12s %8s %10s\n", "t", "acked/s", "fired/s", "consumed/s", "cpu%", "rss")
		}
	}
	var prevProduced int64
	prevCPU, _ := cost.sample(ctx)
	prevT := time.Now()
	// With --recurring, the nodes' CPU is read again when the first
	// occurrence falls due, so that the cost per occurrence leaves out the
	// creation of the schedules and the idle lead before it.
	var firstC <-chan time.Time
	if !r.first.IsZero() {
		ft := time.NewTimer(time.Until(r.first))
		defer ft.Stop()
		firstC = ft.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-firstC:
			cost.sample(ctx)
			m := cost.mark()
			r.mu.Lock()
			r.cpuAtFirst = m
			r.mu.Unlock()
		case now := <-t.C:
			i := int(now.Sub(r.start)/time.Second) - 1
			r.mu.Lock()
			var cur, prev benchSecond
			if i >= 0 && i < len(r.secs) {
				cur = r.secs[i]
			}
			if i >= 1 && i-1 < len(r.secs) {
				prev = r.secs[i-1]
			}
			r.mu.Unlock()
			cpu, rss := cost.sample(ctx)
			pct := 100 * (cpu - prevCPU) / now.Sub(prevT).Seconds()
			prevCPU, prevT = cpu, now
			switch {
			case c.json:
			case r.topic != nil:
				produced, lag := r.topic.progress()
				fmt.Fprintf(c.stderr, "%5ds %12d %12d %10d %12d %12d %7.0f%% %10s\n", i+1, produced-prevProduced, cur.acked, lag, prev.fired, cur.consumed, pct, mib(rss))
				prevProduced = produced
			default:
				fmt.Fprintf(c.stderr, "%5ds %12d %12d %12d %7.0f%% %10s\n", i+1, cur.acked, prev.fired, cur.consumed, pct, mib(rss))
			}
		}
	}
}

func mib(b int64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}

// benchSummary is what bench prints at the end (and --json emits).
type benchSummary struct {
	Events       int     `json:"events"`
	Acked        int64   `json:"acked"`
	Failed       int64   `json:"failed"`
	FirstError   string  `json:"first_error,omitempty"`
	SendSeconds  float64 `json:"send_seconds"`
	AckedPerSec  float64 `json:"acked_per_second"`
	PeakAckedSec int     `json:"peak_acked_in_a_second"`
	Calls        int     `json:"calls"`
	AckP50Ms     float64 `json:"ack_p50_ms"`
	AckP99Ms     float64 `json:"ack_p99_ms"`
	AckMaxMs     float64 `json:"ack_max_ms"`
	// With --api both, the ack figures above are the client's calls and
	// these the raw stubs' (the same number of calls, alternating).
	GRPCAckP50Ms float64 `json:"grpc_ack_p50_ms,omitempty"`
	GRPCAckP99Ms float64 `json:"grpc_ack_p99_ms,omitempty"`
	Consumed     int     `json:"consumed"`
	Missing      int     `json:"missing"`
	Duplicates   int     `json:"duplicates"`
	Early        int     `json:"early"`
	FiredPerSec  float64 `json:"fired_per_second"` // over the span from first to last fired second
	PeakFiredSec int     `json:"peak_fired_in_a_second"`
	// DrainSeconds is from the earliest due time to the latest chime-fired
	// of the records whose lateness is known (DrainFired of them), and
	// DrainPerSec their rate over it: with --due-at, how fast a backlog
	// that fell due at once went out, at millisecond resolution.
	DrainFired   int      `json:"drain_fired"`
	DrainSeconds float64  `json:"drain_seconds"`
	DrainPerSec  float64  `json:"drain_per_second"`
	LateP50Ms    float64  `json:"late_p50_ms"`
	LateP99Ms    float64  `json:"late_p99_ms"`
	LateP999Ms   float64  `json:"late_p999_ms"`
	LateMaxMs    float64  `json:"late_max_ms"`
	LagP50Ms     float64  `json:"lag_p50_ms"`
	LagP99Ms     float64  `json:"lag_p99_ms"`
	LagMaxMs     float64  `json:"lag_max_ms"`
	Processes    []string `json:"processes"` // HTTP addresses of the chimed nodes measured
	CPUSeconds   float64  `json:"cpu_seconds"`
	CPUPer1000   float64  `json:"cpu_seconds_per_1000_events"`
	PeakRSSBytes int64    `json:"peak_rss_bytes"` // the largest resident memory of one node, sampled every second
	// OccurrenceCPUPer1000 is, with --recurring, the nodes' CPU seconds
	// from the first occurrence's due time to the end, per 1000
	// occurrences: CPUPer1000 without the schedules' creation and the lead.
	OccurrenceCPUPer1000 float64 `json:"occurrence_cpu_seconds_per_1000,omitempty"`
	Updated              int64   `json:"updated,omitempty"` // --update: updates acknowledged
	UpdateFailed         int64   `json:"update_failed,omitempty"`
	UpdateSeconds        float64 `json:"update_seconds,omitempty"`
	UpdatesPerSec        float64 `json:"updates_per_second,omitempty"`
	// UpdateToIngest is UpdatesPerSec over AckedPerSec, of the same run:
	// BENCHMARKS.md's reschedule target is 0.5 or more.
	UpdateToIngest float64 `json:"update_to_ingest,omitempty"`
	UpdateP50Ms    float64 `json:"update_p50_ms,omitempty"`
	UpdateP99Ms    float64 `json:"update_p99_ms,omitempty"`
	// ByPriority is, with --priorities, the lateness of each priority,
	// highest first.
	ByPriority []priorityLateness `json:"by_priority,omitempty"`
	// With --api topic: Acked and AckedPerSec are the events Chime applied
	// (their records' offsets committed by the ingest group) and their
	// rate from the first record produced to the last committed
	// (SendSeconds); the ack figures are each record's time from the
	// producer to its committed offset (100 ms resolution). BrokerAcked
	// records were acknowledged by the broker, the last BrokerSeconds after
	// the first was produced. The consumer lag is the records the broker
	// acknowledged that the group had not committed, sampled every 100 ms.
	// Rejected records (the nodes' rejected topic) count as failed.
	API               string  `json:"api,omitempty"`
	IngestTopic       string  `json:"ingest_topic,omitempty"`
	BrokerAcked       int64   `json:"broker_acked,omitempty"`
	BrokerSeconds     float64 `json:"broker_seconds,omitempty"`
	BrokerAckedPerSec float64 `json:"broker_acked_per_second,omitempty"`
	Rejected          int     `json:"rejected,omitempty"`
	LagSamples        int     `json:"consumer_lag_samples,omitempty"`
	// Pointers: a lag of 0 is a figure, shown; other modes have none.
	LagMaxRecords *float64 `json:"consumer_lag_max_records,omitempty"`
	LagP99Records *float64 `json:"consumer_lag_p99_records,omitempty"`
	consumeActive bool
	reschedule    time.Duration // --reschedule, for the text
}

type priorityLateness struct {
	Priority  int     `json:"priority"`
	Records   int     `json:"records"`
	LateP50Ms float64 `json:"late_p50_ms"`
	LateP99Ms float64 `json:"late_p99_ms"`
	LateMaxMs float64 `json:"late_max_ms"`
}

func (r *benchRun) summary(sendEnd, end time.Time, cost *nodeCost) benchSummary {
	answered, cpu, peakRSS := cost.totals()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := benchSummary{
		Events: r.o.events, Acked: r.acked.Load(), Failed: r.failed.Load(),
		SendSeconds: sendEnd.Sub(r.start).Seconds(), Calls: len(r.ackLat),
		Consumed: r.consumed, Duplicates: r.dups, Early: r.early,
		Processes: answered, CPUSeconds: cpu, PeakRSSBytes: peakRSS, consumeActive: !r.o.noConsume, reschedule: r.o.reschedule,
	}
	if r.firstErr != nil {
		s.FirstError = r.firstErr.Error()
	}
	s.AckedPerSec = float64(s.Acked) / s.SendSeconds
	if !r.o.noConsume {
		s.Missing = int(s.Acked) - r.consumed
	}
	if r.topic != nil {
		r.topicSummary(&s)
	}
	lat := make([]float64, len(r.ackLat))
	for i, d := range r.ackLat {
		lat[i] = float64(d) / 1e6
	}
	s.AckP50Ms, s.AckP99Ms, s.AckMaxMs = latency.Quantile(lat, 0.5), latency.Quantile(lat, 0.99), latency.Quantile(lat, 1)
	if len(r.ackLatRaw) > 0 {
		raw := make([]float64, len(r.ackLatRaw))
		for i, d := range r.ackLatRaw {
			raw[i] = float64(d) / 1e6
		}
		s.GRPCAckP50Ms, s.GRPCAckP99Ms = latency.Quantile(raw, 0.5), latency.Quantile(raw, 0.99)
	}
	s.LateP50Ms, s.LateP99Ms, s.LateP999Ms, s.LateMaxMs = latency.Quantile(r.late, 0.5), latency.Quantile(r.late, 0.99), latency.Quantile(r.late, 0.999), latency.Quantile(r.late, 1)
	s.LagP50Ms, s.LagP99Ms, s.LagMaxMs = latency.Quantile(r.lag, 0.5), latency.Quantile(r.lag, 0.99), latency.Quantile(r.lag, 1)
	if r.o.update {
		s.Updated, s.UpdateFailed, s.UpdateSeconds = r.updated.Load(), r.updateFailed.Load(), r.updateTime.Seconds()
		s.UpdatesPerSec = float64(s.Updated) / max(s.UpdateSeconds, 1e-9)
		if s.AckedPerSec > 0 {
			s.UpdateToIngest = s.UpdatesPerSec / s.AckedPerSec
		}
		ul := make([]float64, len(r.updateLat))
		for i, d := range r.updateLat {
			ul[i] = float64(d) / 1e6
		}
		s.UpdateP50Ms, s.UpdateP99Ms = latency.Quantile(ul, 0.5), latency.Quantile(ul, 0.99)
	}
	first, last := -1, -1
	for i, sec := range r.secs {
		s.PeakAckedSec = max(s.PeakAckedSec, sec.acked)
		s.PeakFiredSec = max(s.PeakFiredSec, sec.fired)
		if sec.fired > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first >= 0 {
		fired := 0
		for _, sec := range r.secs[first : last+1] {
			fired += sec.fired
		}
		s.FiredPerSec = float64(fired) / float64(last-first+1)
	}
	if s.DrainFired = len(r.late); s.DrainFired > 0 {
		// At least a millisecond: the span of one record fired in the
		// millisecond it fell due.
		s.DrainSeconds = float64(max(r.lastFiredMs-r.firstDueMs, 1)) / 1000
		s.DrainPerSec = float64(s.DrainFired) / s.DrainSeconds
	}
	if s.Acked > 0 {
		s.CPUPer1000 = cpu / float64(s.Acked) * 1000
	}
	if r.cpuAtFirst != nil && s.Acked > 0 {
		s.OccurrenceCPUPer1000 = cost.since(r.cpuAtFirst) / float64(s.Acked) * 1000
	}
	if r.o.priorities {
		for p := 9; p >= 0; p-- {
			l := r.lateByPriority[p]
			s.ByPriority = append(s.ByPriority, priorityLateness{Priority: p, Records: len(l),
				LateP50Ms: latency.Quantile(l, 0.5), LateP99Ms: latency.Quantile(l, 0.99), LateMaxMs: latency.Quantile(l, 1)})
		}
	}
	return s
}

func (s benchSummary) print(c *cli) {
	w := c.stdout
	if s.API == "topic" {
		s.printTopic(w)
	} else {
		fmt.Fprintf(w, "scheduled  %d of %d acknowledged in %.1f s: %.0f events/s (peak second %d)", s.Acked, s.Events, s.SendSeconds, s.AckedPerSec, s.PeakAckedSec)
		if s.Failed > 0 {
			fmt.Fprintf(w, "; %d failed, first: %s", s.Failed, s.FirstError)
		}
		fmt.Fprintf(w, "\nack        %d calls: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", s.Calls, s.AckP50Ms, s.AckP99Ms, s.AckMaxMs)
	}
	if s.GRPCAckP50Ms > 0 {
		fmt.Fprintf(w, "           the raw stubs' calls: p50 %.2f ms, p99 %.2f ms (client/raw p50 %.3f)\n", s.GRPCAckP50Ms, s.GRPCAckP99Ms, s.AckP50Ms/s.GRPCAckP50Ms)
	}
	if s.Updated+s.UpdateFailed > 0 {
		what := "payload changed"
		switch {
		case s.reschedule > 0:
			what = fmt.Sprintf("due moved %v later", s.reschedule)
		case s.reschedule < 0:
			what = fmt.Sprintf("due moved %v earlier", -s.reschedule)
		}
		fmt.Fprintf(w, "updated    %d acknowledged (%d failed, %s) in %.1f s: %.0f updates/s, %.3f of the ingest rate; p50 %.2f ms, p99 %.2f ms\n",
			s.Updated, s.UpdateFailed, what, s.UpdateSeconds, s.UpdatesPerSec, s.UpdateToIngest, s.UpdateP50Ms, s.UpdateP99Ms)
	}
	if s.consumeActive {
		fmt.Fprintf(w, "consumed   %d records, %d missing, %d duplicates, %d early\n", s.Consumed, s.Missing, s.Duplicates, s.Early)
		fmt.Fprintf(w, "fired      %.0f events/s from first to last firing second (peak second %d)\n", s.FiredPerSec, s.PeakFiredSec)
		fmt.Fprintf(w, "drain      %d records out %.3f s after the first fell due: %.0f events/s (first due to last chime-fired)\n", s.DrainFired, s.DrainSeconds, s.DrainPerSec)
		fmt.Fprintf(w, "lateness   p50 %.0f ms, p99 %.0f ms, p99.9 %.0f ms, max %.0f ms (chime-fired − due, 1 ms resolution)\n", s.LateP50Ms, s.LateP99Ms, s.LateP999Ms, s.LateMaxMs)
		fmt.Fprintf(w, "lag        p50 %.1f ms, p99 %.1f ms, max %.1f ms (received by this consumer − due)\n", s.LagP50Ms, s.LagP99Ms, s.LagMaxMs)
		for _, p := range s.ByPriority {
			fmt.Fprintf(w, "priority %d %d records: lateness p50 %.0f ms, p99 %.0f ms, max %.0f ms\n", p.Priority, p.Records, p.LateP50Ms, p.LateP99Ms, p.LateMaxMs)
		}
	}
	if len(s.Processes) > 0 {
		fmt.Fprintf(w, "cost       %d chimed processes: %.1f CPU s, %.3f CPU s per 1000 events, peak RSS %s\n", len(s.Processes), s.CPUSeconds, s.CPUPer1000, mib(s.PeakRSSBytes))
		if s.OccurrenceCPUPer1000 > 0 {
			fmt.Fprintf(w, "           from the first occurrence on: %.3f CPU s per 1000 occurrences\n", s.OccurrenceCPUPer1000)
		}
	} else {
		fmt.Fprintf(w, "cost       no chimed /metrics to read (see --metrics)\n")
	}
}

// claim takes the next --batch events to send from next, [from, to), once
// --rate lets them go; ok is false when every event is taken or ctx ended.
func (r *benchRun) claim(ctx context.Context, next *atomic.Int64) (from, to int, ok bool) {
	o := r.o
	from = int(next.Add(int64(o.batch))) - o.batch
	if from >= o.events {
		return 0, 0, false
	}
	return from, min(from+o.batch, o.events), r.pace(ctx, from)
}
