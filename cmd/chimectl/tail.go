package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chimehq/chime/cmd/internal/kafkaflag"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
)

func tailCommand() *command {
	return &command{
		name:    "tail",
		summary: "print records as they arrive on a Kafka topic, with how late they were",
		about: `Tail consumes --topic directly from Kafka (not through Chime) and prints one
line per record: when it was received, its partition and offset, its chime-id,
key and value (cut in text output), late= and lag=.

  late=  Chime's own lateness: how long after its due time Chime produced the
         record (chime-fired-unix-ms minus chime-due-unix-ms, both stamped by
         the shard leader).
  lag=   how long after its due time the record reached this tail (received
         minus chime-due-unix-ms): late= plus Kafka's delivery and this
         machine's clock offset from Chime's. For records read from the
         backlog (--from-beginning, a group catching up) it is mostly how
         long ago they fired.

Records without Chime's headers show late=- and lag=- (null late_ms and lag_ms
in --json). Tail starts at the end of the topic (only new records) unless
--from-beginning is set, and stops on Ctrl-C (SIGINT) or SIGTERM, or after
--count records. A topic that does not exist yet (in dev, Chime's first record
to it creates it) is waited for, asking the brokers every 50 ms, and then read
from its first record, since all of it is new. With --group it joins that
consumer group and commits what it printed, so a later tail with the same
group continues from there; --from-beginning then only matters when the group
has no committed offset. --timeout does not apply to tail. For a Kafka behind
TLS or SASL, give the --kafka-tls* and --kafka-sasl-* flags chimed serve was
given (the password from --kafka-sasl-password-file or ` + kafkaflag.PasswordEnv + `).
Tail stops with the reason when no broker answers as it starts (a wrong
address, TLS or SASL setting, or refused credentials).`,
		example: `  chimectl tail --topic reminders
  chimectl tail --topic reminders --brokers kafka-0:9093,kafka-1:9093 --from-beginning --count 10 \
      --kafka-tls-ca ca.pem --kafka-sasl-mechanism SCRAM-SHA-512 --kafka-sasl-user chime --kafka-sasl-password-file ~/.kafka-pw
  chimectl tail --topic chime.dlq --group ops-dlq --json | jq -r '.headers[] | select(.key=="chime-error") | .value'`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			topic := fs.String("topic", "", "Kafka `topic` to consume (required)")
			brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated Kafka bootstrap `addresses` (host:port)")
			fromBeginning := fs.Bool("from-beginning", false, "start at the oldest record instead of the end of the topic")
			count := fs.Int("count", 0, "stop after `n` records; 0 means until interrupted")
			group := fs.String("group", "", "consume as a member of this consumer `group`, committing offsets (default: no group, nothing committed)")
			kafka := kafkaflag.Register(fs, "the consumer")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *topic == "" {
					return usagef("--topic is required")
				}
				if *count < 0 {
					return usagef("--count must not be negative")
				}
				seeds := strings.Fields(strings.ReplaceAll(*brokers, ",", " ")) // commas or spaces separate
				if len(seeds) == 0 {
					return usagef("--brokers: no address given")
				}
				sec, err := kafkaOpts(kafka, c.getenv)
				if err != nil {
					return err
				}
				return c.tail(ctx, seeds, sec, *topic, *group, *fromBeginning, *count)
			}
		},
	}
}

// kafkaOpts is what the --kafka-tls* and --kafka-sasl-* flags ask for, as
// franz-go options for a consumer: its TLS configuration and SASL
// mechanism. A flag that breaks a rule is a usage error naming it.
func kafkaOpts(f *kafkaflag.Flags, getenv func(string) string) ([]kgo.Opt, error) {
	sec, err := f.Security(getenv)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return sec.KgoOpts(), nil
}

// pingKafka asks the brokers for their metadata once, so that a consumer
// that cannot reach them (a wrong address, TLS or SASL setting, refused
// credentials) stops with the reason: franz-go otherwise retries such a
// connection forever and tells its caller nothing.
func pingKafka(ctx context.Context, cl *kgo.Client, seeds []string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("reaching the brokers %s: %w", strings.Join(seeds, ","), publish.ExplainClosed(err))
	}
	return nil
}

// topicPollInterval is how often tail asks the brokers whether the topic it
// waits for exists yet.
const topicPollInterval = 50 * time.Millisecond

// tail consumes topic from seeds, reached with kafka (kafkaOpts).
func (c *cli) tail(ctx context.Context, seeds []string, kafka []kgo.Opt, topic, group string, fromBeginning bool, count int) error {
	base := append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, kafka...)
	missingAtStart, err := c.awaitTopic(ctx, base, seeds, topic)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	if ctx.Err() != nil {
		return nil // interrupted while waiting for the topic
	}
	start := kgo.NewOffset().AtEnd()
	if fromBeginning || missingAtStart {
		// A topic created after tail started holds only records newer
		// than tail: print them all, not only those produced after the
		// consumer below has looked up the end.
		start = kgo.NewOffset().AtStart()
	}
	opts := []kgo.Opt{
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(start),
	}
	if group != "" {
		opts = append(opts, kgo.ConsumerGroup(group))
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	defer cl.Close()

	printed := 0
	reported := make(map[string]bool) // errors kgo retries come back on every poll; say each once
	for (count == 0 || printed < count) && ctx.Err() == nil {
		max := 0
		if count > 0 {
			max = count - printed
		}
		fetches := cl.PollRecords(ctx, max)
		if ctx.Err() != nil {
			break
		}
		for _, fe := range fetches.Errors() {
			if errors.Is(fe.Err, kgo.ErrClientClosed) || errors.Is(fe.Err, context.Canceled) {
				return nil
			}
			msg := fmt.Sprintf("topic %s partition %d: %v", fe.Topic, fe.Partition, fe.Err)
			if !reported[msg] {
				reported[msg] = true
				fmt.Fprintf(c.stderr, "chimectl tail: %s\n", msg)
			}
		}
		var werr error
		fetches.EachRecord(func(r *kgo.Record) {
			if werr == nil {
				werr = c.printRecord(r)
				printed++
			}
		})
		if werr != nil {
			return werr
		}
	}
	if group != "" {
		// Commit what was printed, whatever stopped the loop.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := cl.CommitUncommittedOffsets(cctx); err != nil {
			return fmt.Errorf("tail: committing offsets of group %q: %w", group, err)
		}
	}
	return nil
}

// awaitTopic reaches the brokers (pingKafka) and returns once topic exists,
// asking every topicPollInterval while it does not; missingAtStart says it
// did not exist at first. It returns early, without an error, when ctx is
// done.
//
// A consumer left to find the topic itself would not do it promptly:
// franz-go re-asks for a missing topic every 250 ms for about 2 s, then only
// every MetadataMinAge (5 s), so a tail started before Chime first produced
// to its topic (the quickstart) printed the first record seconds after it
// fired, with a lag= that was tail's delay, not Chime's. Lowering
// MetadataMinAge for the consumer would also make every later error
// (a leader moving) re-ask the brokers that often.
func (c *cli) awaitTopic(ctx context.Context, base []kgo.Opt, seeds []string, topic string) (missingAtStart bool, err error) {
	cl, err := kgo.NewClient(base...)
	if err != nil {
		return false, err
	}
	defer cl.Close()
	if err := pingKafka(ctx, cl, seeds); err != nil {
		return false, err
	}
	reported := make(map[string]bool)
	tick := time.NewTicker(topicPollInterval)
	defer tick.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return missingAtStart, nil
			case <-tick.C:
			}
		}
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		req.AllowAutoTopicCreation = false // tail reads topics; it never creates one
		resp, err := req.RequestWith(ctx, cl)
		if ctx.Err() != nil {
			return missingAtStart, nil
		}
		if err != nil {
			// kgo already retried; say so once and keep asking.
			if msg := publish.ExplainClosed(err).Error(); !reported[msg] {
				reported[msg] = true
				fmt.Fprintf(c.stderr, "chimectl tail: asking the brokers for topic %s: %s\n", topic, msg)
			}
			continue
		}
		missing := len(resp.Topics) == 0
		for _, t := range resp.Topics {
			if t.Topic != nil && *t.Topic == topic && t.ErrorCode == kerr.UnknownTopicOrPartition.Code {
				missing = true
			}
		}
		// Any other error (not authorized, no leader yet) is the
		// consumer's to retry and report.
		if !missing {
			return missingAtStart, nil
		}
		if !missingAtStart {
			missingAtStart = true
			fmt.Fprintf(c.stderr, "chimectl tail: topic %s does not exist yet; waiting for it (in dev, Chime's first record to it creates it)\n", topic)
		}
	}
}

// tailJSON is one line of tail --json. Every field is always present; the
// chime-* derived ones are null when the record lacks the header.
type tailJSON struct {
	Received      string       `json:"received"`
	Topic         string       `json:"topic"`
	Partition     int32        `json:"partition"`
	Offset        int64        `json:"offset"`
	Timestamp     string       `json:"timestamp"` // the record's own timestamp
	ChimeID       *string      `json:"chime_id"`
	Key           string       `json:"key"`
	KeyEncoding   string       `json:"key_encoding"`
	Value         string       `json:"value"`
	ValueEncoding string       `json:"value_encoding"`
	Headers       []headerJSON `json:"headers"`
	Due           *string      `json:"due"`
	Fired         *string      `json:"fired"`
	Attempt       *int64       `json:"attempt"`
	LateMs        *int64       `json:"late_ms"`
	LagMs         *int64       `json:"lag_ms"`
}

func (c *cli) printRecord(r *kgo.Record) error {
	received := c.now()
	// A header that is absent or malformed shows as null (JSON) or - (text).
	h, _ := chimev1.ParseHeaders(r.Headers)
	var id *string
	var dueMs, firedMs, attempt, lateMs, lagMs *int64
	if h.ID != "" {
		id = &h.ID
	}
	if h.Attempt != 0 {
		attempt = ptr(int64(h.Attempt))
	}
	if !h.Due.IsZero() {
		dueMs = ptr(h.Due.UnixMilli())
		lagMs = ptr(received.Sub(h.Due).Milliseconds())
	}
	if !h.Fired.IsZero() {
		firedMs = ptr(h.Fired.UnixMilli())
	}
	if late, ok := h.Late(); ok {
		lateMs = ptr(late.Milliseconds())
	}

	if c.json {
		j := tailJSON{
			Received:  received.UTC().Format(time.RFC3339Nano),
			Topic:     r.Topic,
			Partition: r.Partition,
			Offset:    r.Offset,
			Timestamp: r.Timestamp.UTC().Format(time.RFC3339Nano),
			ChimeID:   id,
			Headers:   []headerJSON{},
			Due:       msTime(dueMs),
			Fired:     msTime(firedMs),
			Attempt:   attempt,
			LateMs:    lateMs,
			LagMs:     lagMs,
		}
		j.Key, j.KeyEncoding = jsonBytes(r.Key)
		j.Value, j.ValueEncoding = jsonBytes(r.Value)
		for _, h := range r.Headers {
			v, enc := jsonBytes(h.Value)
			j.Headers = append(j.Headers, headerJSON{Key: h.Key, Value: v, ValueEncoding: enc})
		}
		return c.printJSON(j)
	}

	idText := "-"
	if id != nil {
		idText = *id
	}
	_, err := fmt.Fprintf(c.stdout, "%s partition=%d offset=%d id=%s key=%s late=%s lag=%s value=%s\n",
		c.localTime(received), r.Partition, r.Offset, idText, orNone(showBytes(r.Key, 64), "-"),
		msText(lateMs), msText(lagMs), showBytes(r.Value, 120))
	return err
}

func ptr[T any](v T) *T { return &v }

func msTime(ms *int64) *string {
	if ms == nil {
		return nil
	}
	s := time.UnixMilli(*ms).UTC().Format(time.RFC3339Nano)
	return &s
}

// msText prints milliseconds exactly (a late record is worth knowing about
// to the millisecond), or "-".
func msText(ms *int64) string {
	if ms == nil {
		return "-"
	}
	return (time.Duration(*ms) * time.Millisecond).String()
}
