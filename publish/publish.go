package publish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/metadata"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one event to produce.
type Record struct {
	// Seq identifies the record to the caller; it is copied to Outcome.Seq.
	Seq uint64
	// ID is the event id, sent as the chime-id header and used as the key
	// when Key is empty.
	ID      string
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
	// Due is when the event was due, unix nanoseconds.
	Due int64
	// Attempts is how many attempts on Topic were made before this call
	// (0 for a first firing; Outcome.Attempts of an earlier call that
	// returned Done false).
	Attempts uint32
	// Version is the event's version, sent as the chime-version header
	// (none when 0).
	Version uint64
	// Partition, when HasPartition, is the partition of Topic the record is
	// produced to, instead of the one murmur2 picks from the key. A
	// partition Topic does not have can never take the record: it is
	// dead-lettered at once, with an error wrapping ErrNoPartition.
	Partition    int32
	HasPartition bool
	// Tombstone produces the record with a null value (a Kafka tombstone,
	// which a compacted topic reads as the deletion of its key); Value is
	// not sent. Without it the value is Value, and an empty (or nil) Value
	// is an empty value, never a null one.
	Tombstone bool
}

// Outcome is what happened to one Record.
type Outcome struct {
	Seq uint64
	// FiredAt is when Kafka acknowledged the record, unix nanoseconds by
	// Config.Now; zero unless Done.
	FiredAt int64
	// Attempts is the total number of attempts on the record's own topic,
	// including those made before this call. Attempts on the dead-letter
	// topic are not counted.
	Attempts uint32
	// DeadLettered is true when the record was produced to the dead-letter
	// topic after its last attempt on its own topic failed.
	DeadLettered bool
	// Err is the last produce error; set when DeadLettered, and when Done
	// is false to say why.
	Err string
	// Done is false only when the record was not acknowledged anywhere
	// (ctx ended, the Publisher was closed, or even the dead-letter topic
	// refused it). The caller must fire the record again later.
	Done bool
	// Sent is true once a request carrying the record (to its topic or
	// the dead-letter topic) was handed to the Kafka client in this call.
	// A record that is neither Done nor Sent cannot reach Kafka from this
	// call: it never left (ctx ended while it waited for its turn).
	Sent bool
}

// Stats are cumulative counters since New; Collector exports them.
type Stats struct {
	// Produced counts records Kafka acknowledged on their own topic.
	Produced uint64
	// Retried counts failed attempts that were followed by another attempt
	// on the record's own topic.
	Retried uint64
	// DeadLettered counts records Kafka acknowledged on the dead-letter topic.
	DeadLettered uint64
	// Failed counts outcomes with Done false.
	Failed uint64
}

// Header names this package adds to every record: the API's
// (chimev1.HeaderID and the rest, which also parses them), kept here under
// their old names for the code that produces and tests them.
const (
	HeaderID      = chimev1.HeaderID
	HeaderDue     = chimev1.HeaderDue
	HeaderFired   = chimev1.HeaderFired
	HeaderAttempt = chimev1.HeaderAttempt
	HeaderVersion = chimev1.HeaderVersion
	// Only on dead-letter records.
	HeaderTopic   = chimev1.HeaderTopic
	HeaderError   = chimev1.HeaderError
	HeaderDropped = chimev1.HeaderDropped
)

// Defaults for zero Config fields.
const (
	DefaultMaxInFlight        = 32
	DefaultMaxAttempts        = 5
	DefaultDeadLetterAttempts = 3
	DefaultBackoffBase        = 50 * time.Millisecond
	DefaultBackoffMax         = 5 * time.Second
	DefaultBackoffJitter      = 0.5
	DefaultDeadLetterTopic    = "chime.deadletter"
	DefaultBatchBytes         = 1 << 20 // 1 MiB, under Kafka's default message.max.bytes (1048588)
	DefaultBatchSize          = 1000
	DefaultWriteTimeout       = 10 * time.Second
	DefaultUnackedTimeout     = 2 * time.Second
	DefaultClientID           = "chime"
)

// ErrClosed is the Err of outcomes of a Publish called after Close.
var ErrClosed = errors.New("publish: publisher closed")

// ErrConfig is wrapped by the error New returns for an invalid Config.
var ErrConfig = errors.New("publish: invalid config")

// ErrNoPartition is wrapped by the error of a record that asks for a
// partition its topic does not have (Record.Partition). It is permanent:
// the record is dead-lettered at once, not retried, since Kafka never
// removes a partition and a record cannot wait for one to be added. The
// error names the partition and the topic's partition count.
var ErrNoPartition = errors.New("publish: no such partition")

// Config configures a Publisher. Zero fields take the defaults above.
type Config struct {
	// Brokers are the bootstrap addresses (host:port). Required.
	Brokers []string
	// MaxInFlight bounds the produce requests in flight across all
	// callers.
	MaxInFlight int
	// MaxAttempts is the total number of attempts on a record's own topic
	// before it goes to the dead-letter topic.
	MaxAttempts int
	// DeadLetterAttempts bounds the attempts on the dead-letter topic
	// within one Publish call; after that the outcome is Done false.
	DeadLetterAttempts int
	// BackoffBase, BackoffMax and BackoffJitter shape the wait between the
	// rounds of attempts within one Publish call (a backoff.ExponentialBackOff):
	// the n-th wait is min(BackoffMax, BackoffBase*2^(n-1)), spread uniformly
	// by ±BackoffJitter of itself, so at most (1+BackoffJitter)*BackoffMax.
	// BackoffJitter is in [0, 1]; zero means DefaultBackoffJitter and a
	// negative value means none (an exact schedule, for tests).
	BackoffBase, BackoffMax time.Duration
	BackoffJitter           float64
	// DeadLetterTopic receives records whose last attempt failed.
	DeadLetterTopic string
	// BatchBytes and BatchSize bound the records of one produce request
	// (one partition's record batch); a Publish call's records for one
	// partition go in as few requests as these allow. BatchBytes must not
	// exceed the brokers' message.max.bytes.
	// A record that alone exceeds BatchBytes can never be produced: it is
	// dead-lettered at once, without its value.
	BatchBytes int64
	BatchSize  int
	// WriteTimeout bounds one produce attempt.
	WriteTimeout time.Duration
	// UnackedTimeout is how long bytes sent to a broker may go
	// unacknowledged by its TCP stack before the connection is dropped and
	// the requests on it fail (TCP_USER_TIMEOUT; Linux only, elsewhere a
	// dead path costs WriteTimeout). A slow broker acknowledges a
	// request's bytes at once, so this only cuts short waits on a network
	// path that drops everything; such a request fails as not known to be
	// in Kafka, and the shard fires its events again.
	UnackedTimeout time.Duration
	// ExistingTopicsOnly produces only to topics that exist: a record for
	// one the brokers do not know fails (UNKNOWN_TOPIC_OR_PARTITION), is
	// retried and in the end dead-lettered, instead of the brokers creating
	// the topic as its metadata is asked for (when auto.create.topics.enable
	// lets them). The dead-letter topic is asked for with creation allowed
	// either way: it is Chime's own.
	ExistingTopicsOnly bool
	// ClientID is sent to the brokers.
	ClientID string
	// Security is TLS and SASL for every connection to the brokers (the
	// zero value: plaintext, unauthenticated).
	Security Security
	// Now is the clock for FiredAt and chime-fired-unix-ms; default time.Now.
	Now func() time.Time
	// Logger gets retries (debug), dead letters (warn) and failures
	// (error). Default: discard.
	Logger *slog.Logger
}

// withDefaults returns c with its zero fields set to the defaults, or an
// error wrapping ErrConfig that names the first field, in the order below,
// that breaks its rule.
func (c Config) withDefaults() (Config, error) {
	for _, fill := range []func(*Config) error{
		(*Config).checkBrokers,
		(*Config).fillBackoff,
		(*Config).fillLimits,
		(*Config).fillDeadLetterTopic,
		(*Config).checkSASL,
	} {
		if err := fill(&c); err != nil {
			return c, err
		}
	}
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// configError is the error for a Config field that breaks its rule.
func configError(field string, format string, args ...any) error {
	return fmt.Errorf("%w: %s %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

func (c *Config) checkBrokers() error {
	if len(c.Brokers) == 0 {
		return configError("Brokers", "must name at least one broker")
	}
	for i, b := range c.Brokers {
		if b == "" {
			return configError("Brokers", "[%d] is empty", i)
		}
	}
	return nil
}

// fillBackoff checks and fills the durations: BackoffBase, BackoffMax,
// WriteTimeout, UnackedTimeout and BackoffJitter.
func (c *Config) fillBackoff() error {
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"BackoffBase", &c.BackoffBase, DefaultBackoffBase},
		{"BackoffMax", &c.BackoffMax, DefaultBackoffMax},
		{"WriteTimeout", &c.WriteTimeout, DefaultWriteTimeout},
		{"UnackedTimeout", &c.UnackedTimeout, DefaultUnackedTimeout},
	} {
		if *f.v < 0 {
			return configError(f.name, "must not be negative (got %v)", *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.BackoffBase > c.BackoffMax {
		return configError("BackoffBase", "(%v) must not exceed BackoffMax (%v)", c.BackoffBase, c.BackoffMax)
	}
	switch {
	case c.BackoffJitter > 1:
		return configError("BackoffJitter", "must be at most 1 (got %v)", c.BackoffJitter)
	case c.BackoffJitter == 0:
		c.BackoffJitter = DefaultBackoffJitter
	case c.BackoffJitter < 0:
		c.BackoffJitter = 0
	}
	return nil
}

// fillLimits checks and fills the counts and sizes: MaxInFlight,
// MaxAttempts, DeadLetterAttempts, BatchSize and BatchBytes.
func (c *Config) fillLimits() error {
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxInFlight", &c.MaxInFlight, DefaultMaxInFlight},
		{"MaxAttempts", &c.MaxAttempts, DefaultMaxAttempts},
		{"DeadLetterAttempts", &c.DeadLetterAttempts, DefaultDeadLetterAttempts},
		{"BatchSize", &c.BatchSize, DefaultBatchSize},
	} {
		if *f.v < 0 {
			return configError(f.name, "must not be negative (got %d)", *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.BatchBytes < 0 {
		return configError("BatchBytes", "must not be negative (got %d)", c.BatchBytes)
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	return nil
}

func (c *Config) fillDeadLetterTopic() error {
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = DefaultDeadLetterTopic
	}
	if err := ValidTopic(c.DeadLetterTopic); err != nil {
		return configError("DeadLetterTopic", "%v", err)
	}
	return nil
}

// Publisher produces records to Kafka with kafka-go's Client: each Publish
// call sends one produce request per partition its records fall on, all at
// once, and waits for their answers. It does not use kafka-go's Writer, for
// two reasons the benchmarks and the fault tests showed. The Writer sends
// one request at a time per partition, so under load concurrent fire
// batches queued behind each other's round trips (10,000 events/s had
// produce calls of 40-60 ms, and the firing loop waited for them). And a
// Writer batch whose caller gave up stays queued and is written when the
// broker answers again, after the shard has put its events back to fire
// later: duplicates, and a slow recovery after a Kafka outage. A request
// made here is either answered, or abandoned with its call.
//
// A record that names its partition (Record.HasPartition) is produced to
// that one; the others are partitioned with kafka.Murmur2Balancer (see
// balancer): for keyed records it is the Java
// client's default partitioner (murmur2(key) & 0x7fffffff % partitions,
// also librdkafka's "murmur2_random" and franz-go's default), so a Chime
// event lands on the same partition as the same key produced by the
// services that consume it — most of which use the Java client or a
// client that copies it. kafka.Hash (FNV-1a, Sarama's default) would put
// the same key elsewhere. Every record has a key (the id when Key is
// empty), so the balancer's nil-key path is never taken.
type Publisher struct {
	cfg           Config
	log           *slog.Logger
	client        *kafka.Client
	transport     *kafka.Transport
	stopTransport context.CancelFunc
	balancer      balancer
	// sem holds one token per produce request in flight (MaxInFlight).
	sem chan struct{}

	produced, retried, deadLettered, failed atomic.Uint64

	// closing ends when Close starts; every Publish call's context is
	// cancelled with it.
	closing context.Context
	cancel  context.CancelFunc

	mu       sync.Mutex // guards closed, and inflight.Add against Close's Wait
	closed   bool
	inflight sync.WaitGroup // Publish calls running
}

// New validates cfg, fills its defaults and returns a Publisher. It does
// not contact the brokers: the first Publish does.
func New(cfg Config) (*Publisher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	mechanism, err := cfg.saslMechanism()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "publish")
	// The transport's background metadata goroutine runs until this
	// context ends (Close), not until the process exits. It makes every
	// connection of the Publisher (metadata and topic creation included):
	// Dial opens the TCP connection, then the transport wraps it in TLS and
	// authenticates it with SASL.
	tctx, tcancel := context.WithCancel(context.Background())
	tr := &kafka.Transport{
		ClientID: cfg.ClientID,
		Context:  tctx,
		Dial:     dialer(cfg.UnackedTimeout),
		TLS:      cfg.Security.TLS,
		SASL:     mechanism,
	}
	client := &kafka.Client{
		Addr:      kafka.TCP(cfg.Brokers...),
		Transport: tr,
		Timeout:   cfg.WriteTimeout,
	}
	closing, cancel := context.WithCancel(context.Background())
	return &Publisher{
		cfg:           cfg,
		log:           log,
		client:        client,
		transport:     tr,
		stopTransport: tcancel,
		sem:           make(chan struct{}, cfg.MaxInFlight),
		closing:       closing,
		cancel:        cancel,
	}, nil
}

// DeadLetterTopic returns the topic records go to after their last attempt.
func (p *Publisher) DeadLetterTopic() string { return p.cfg.DeadLetterTopic }

// Stats returns the counters so far.
func (p *Publisher) Stats() Stats {
	return Stats{
		Produced:     p.produced.Load(),
		Retried:      p.retried.Load(),
		DeadLettered: p.deadLettered.Load(),
		Failed:       p.failed.Load(),
	}
}

// Close stops the Publisher: Publish calls in flight stop waiting and
// report Done false for what was not yet acknowledged (their requests are
// abandoned), and every goroutine of the Publisher has exited when Close
// returns. Later Publish calls report
// Done false with ErrClosed. Close is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	p.cancel()
	p.inflight.Wait()
	p.transport.CloseIdleConnections()
	p.stopTransport()
	return nil
}

// Publish produces recs and returns outcome i for recs[i]. It blocks until
// every record is acknowledged (on its topic or the dead-letter topic), has
// failed for good, or ctx ends; see Outcome. It is safe for concurrent use.
//
// ctx's deadline bounds when records may be handed to the broker (a leader
// lease): no attempt starts after it. An attempt under way when it passes
// is still waited for, up to WriteTimeout: its records are on their way and
// giving up on the answer would only make the caller send them again (under
// load, when answers take longer than the lease, nearly every record was
// produced twice). Cancelling ctx, or Close, stops waiting at once.
func (p *Publisher) Publish(ctx context.Context, recs []Record) []Outcome {
	out := make([]Outcome, len(recs))
	for i := range recs {
		out[i] = Outcome{Seq: recs[i].Seq, Attempts: recs[i].Attempts}
	}
	if len(recs) == 0 {
		return out
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for i := range out {
			out[i].Err = ErrClosed.Error()
		}
		p.failed.Add(uint64(len(out)))
		return out
	}
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.closing, cancel)()

	p.run(ctx, recs, out)
	return out
}

// pending is a record not yet settled within one Publish call.
type pending struct {
	i            int   // index into recs and out
	dead         bool  // bound for the dead-letter topic
	deadAttempts int   // attempts on the dead-letter topic in this call
	dropValue    bool  // the dead-letter record goes without the value
	lastErr      error // last error on the record's own topic
	deadErr      error // last error on the dead-letter topic
}

// run is one Publish call: rounds of attempts, each sending every record
// not yet settled at once, until all are settled or ctx ends.
func (p *Publisher) run(ctx context.Context, recs []Record, out []Outcome) {
	todo := p.triage(recs, make([]pending, 0, len(recs)))
	msgs := make([]kafka.Message, 0, len(todo))
	bo := p.newBackOff()
	for len(todo) > 0 && ctx.Err() == nil {
		sentAt := p.cfg.Now()
		msgs = p.messages(recs, out, todo, msgs[:0], sentAt)
		errs, ackedAt, sent := p.send(ctx, msgs)
		var wait bool
		todo, wait = p.settle(ctx, recs, out, todo, errs, ackedAt, sent)
		if len(todo) > 0 && wait && !sleep(ctx, bo.NextBackOff()) {
			break
		}
	}
	p.abandon(ctx, out, todo)
}

// triage appends to todo one pending per record, bound for the
// dead-letter topic from the start when its own topic can never take it:
// an invalid topic name, MaxAttempts already used up by earlier calls, or
// a record too large for any produce request (it then goes without its
// value).
func (p *Publisher) triage(recs []Record, todo []pending) []pending {
	for i := range recs {
		st := pending{i: i}
		r := &recs[i]
		topicErr := ValidTopic(r.Topic)
		switch {
		case topicErr != nil:
			st.dead, st.lastErr = true, topicErr
		case int(r.Attempts) >= p.cfg.MaxAttempts:
			st.dead = true
			st.lastErr = fmt.Errorf("publish: %d attempts already made (MaxAttempts %d)", r.Attempts, p.cfg.MaxAttempts)
		case sizeBound(r.key(), r.Value, r.Headers, 0) > p.cfg.BatchBytes:
			st.dead, st.dropValue = true, true
			st.lastErr = fmt.Errorf("publish: record of about %d bytes exceeds BatchBytes (%d): %w",
				sizeBound(r.key(), r.Value, r.Headers, 0), p.cfg.BatchBytes, kafka.MessageSizeTooLarge)
		}
		todo = append(todo, st)
	}
	return todo
}

// messages counts one more attempt for each record in todo (on its own
// topic or on the dead-letter topic) and appends its Kafka record for that
// attempt to msgs, at the same index as in todo.
func (p *Publisher) messages(recs []Record, out []Outcome, todo []pending, msgs []kafka.Message, sentAt time.Time) []kafka.Message {
	for j := range todo {
		st := &todo[j]
		if st.dead {
			st.deadAttempts++
		} else {
			out[st.i].Attempts++
		}
		msgs = append(msgs, p.message(&recs[st.i], st, out[st.i].Attempts, sentAt))
	}
	return msgs
}

// settle records in out what one round of attempts did to the records in
// todo (errs, ackedAt and sent are send's answers, at the same index) and
// returns, in todo's own backing array, those still to attempt; wait
// reports whether one of them failed in a way worth a backoff before the
// next round.
func (p *Publisher) settle(ctx context.Context, recs []Record, out []Outcome, todo []pending,
	errs []error, ackedAt []time.Time, sent []bool) (next []pending, wait bool) {
	for j, st := range todo {
		if sent[j] {
			out[st.i].Sent = true
		}
	}
	next = todo[:0]
	for j, st := range todo {
		o := &out[st.i]
		switch {
		case errs[j] == nil:
			p.acked(o, &recs[st.i], st, ackedAt[j])
		case ctx.Err() != nil:
			// The caller gave up; what this attempt did is unknown.
			next = append(next, st)
		case !st.dead:
			st.lastErr = errs[j]
			if permanent(errs[j]) || int(o.Attempts) >= p.cfg.MaxAttempts {
				st.dead = true // no wait: the dead-letter topic is another topic
			} else {
				p.retried.Add(1)
				wait = true
				p.log.Debug("retrying", "seq", o.Seq, "id", recs[st.i].ID, "topic", recs[st.i].Topic,
					"attempt", o.Attempts, "err", errs[j])
			}
			next = append(next, st)
		default:
			st.deadErr = errs[j]
			if errors.Is(errs[j], kafka.MessageSizeTooLarge) {
				st.dropValue = true
			}
			if st.deadAttempts >= p.cfg.DeadLetterAttempts {
				p.deadLetterFailed(o, &recs[st.i], st)
				continue
			}
			wait = true
			next = append(next, st)
		}
	}
	return next, wait
}

// acked settles o as Done: Kafka acknowledged its record at ackedAt, on
// its own topic or, when st.dead, on the dead-letter topic.
func (p *Publisher) acked(o *Outcome, r *Record, st pending, ackedAt time.Time) {
	o.Done, o.FiredAt = true, ackedAt.UnixNano()
	if !st.dead {
		p.produced.Add(1)
		return
	}
	o.DeadLettered, o.Err = true, st.lastErr.Error()
	p.deadLettered.Add(1)
	p.log.Warn("dead-lettered", "seq", o.Seq, "id", r.ID, "topic", r.Topic,
		"attempts", o.Attempts, "err", st.lastErr)
}

// deadLetterFailed settles o as not Done: the dead-letter topic refused
// its record DeadLetterAttempts times in this call.
func (p *Publisher) deadLetterFailed(o *Outcome, r *Record, st pending) {
	o.Err = fmt.Sprintf("dead-letter topic %s: %v; last produce error: %v", p.cfg.DeadLetterTopic, st.deadErr, st.lastErr)
	p.failed.Add(1)
	p.log.Error("dead-letter produce failed", "seq", o.Seq, "id", r.ID, "topic", r.Topic,
		"attempts", o.Attempts, "err", st.deadErr, "produce_err", st.lastErr)
}

// abandon settles the records still in todo when the call ends (ctx ended
// or the Publisher closed) as not Done, saying why and what failed last.
func (p *Publisher) abandon(ctx context.Context, out []Outcome, todo []pending) {
	for _, st := range todo {
		o := &out[st.i]
		cause := context.Cause(ctx)
		if p.closing.Err() != nil {
			cause = ErrClosed
		}
		switch {
		case st.deadErr != nil:
			o.Err = fmt.Sprintf("%v; last dead-letter error: %v; last produce error: %v", cause, st.deadErr, st.lastErr)
		case st.lastErr != nil:
			o.Err = fmt.Sprintf("%v; last produce error: %v", cause, st.lastErr)
		default:
			o.Err = cause.Error()
		}
		p.failed.Add(1)
	}
	if len(todo) > 0 {
		p.log.Debug("publish stopped before every record was acknowledged", "unacked", len(todo), "err", context.Cause(ctx))
	}
}

// key is the Kafka record key: Key, or the id when Key is empty.
func (r *Record) key() []byte {
	if len(r.Key) > 0 {
		return r.Key
	}
	return []byte(r.ID)
}

// message builds the Kafka record for one attempt; attempt is the number of
// the attempt on the record's own topic (the last one, for dead letters).
func (p *Publisher) message(r *Record, st *pending, attempt uint32, sentAt time.Time) kafka.Message {
	key, value, userHeaders := r.key(), r.Value, r.Headers
	switch {
	case r.Tombstone:
		value = nil // kafka.NewBytes(nil) is written as a null value (length -1)
	case value == nil:
		// An empty payload comes back from storage as nil, which kafka-go
		// would write as a null value too: only a tombstone is null.
		value = emptyValue
	}
	var dropped string
	if st.dead {
		if st.dropValue || sizeBound(key, value, userHeaders, len(st.lastErr.Error())+len(r.Topic)) > p.cfg.BatchBytes {
			value, dropped = nil, "value"
			if sizeBound(key, nil, userHeaders, len(st.lastErr.Error())+len(r.Topic)) > p.cfg.BatchBytes {
				userHeaders, dropped = nil, "value,headers"
			}
		}
	}
	hs := make([]kafka.Header, 0, len(userHeaders)+8)
	for _, h := range userHeaders {
		hs = append(hs, kafka.Header{Key: h.Key, Value: h.Value})
	}
	hs = append(hs,
		kafka.Header{Key: HeaderID, Value: []byte(r.ID)},
		kafka.Header{Key: HeaderDue, Value: strconv.AppendInt(nil, time.Unix(0, r.Due).UnixMilli(), 10)},
		kafka.Header{Key: HeaderFired, Value: strconv.AppendInt(nil, sentAt.UnixMilli(), 10)},
		kafka.Header{Key: HeaderAttempt, Value: strconv.AppendUint(nil, uint64(attempt), 10)},
	)
	if r.Version > 0 {
		hs = append(hs, kafka.Header{Key: HeaderVersion, Value: strconv.AppendUint(nil, r.Version, 10)})
	}
	topic := r.Topic
	if st.dead {
		topic = p.cfg.DeadLetterTopic
		hs = append(hs,
			kafka.Header{Key: HeaderTopic, Value: []byte(r.Topic)},
			kafka.Header{Key: HeaderError, Value: []byte(st.lastErr.Error())},
		)
		if dropped != "" {
			hs = append(hs, kafka.Header{Key: HeaderDropped, Value: []byte(dropped)})
		}
	}
	partition := anyPartition
	if r.HasPartition && !st.dead {
		partition = int(r.Partition)
	}
	return kafka.Message{Topic: topic, Partition: partition, Key: key, Value: value, Headers: hs, Time: sentAt}
}

// emptyValue is the value of a record whose payload is empty: not nil, so
// that it is produced as an empty value (length 0), not a null one. Never
// written to.
var emptyValue = []byte{}

// anyPartition is the kafka.Message.Partition of a record that names no
// partition: the balancer picks one.
const anyPartition = -1

// balancer picks the partition of each record: the one its Record names,
// which message puts in kafka.Message.Partition (kafka-go reads that field
// only from fetched messages, never when producing), or, for anyPartition,
// the one kafka.Murmur2Balancer picks from the key. It is a kafka.Balancer
// (a kafka-go Writer could take it as it is); send checks first that a
// named partition exists.
type balancer struct{ murmur2 kafka.Murmur2Balancer }

var _ kafka.Balancer = balancer{}

// Balance implements kafka.Balancer.
func (b balancer) Balance(m kafka.Message, partitions ...int) int {
	if m.Partition != anyPartition {
		return m.Partition
	}
	return b.murmur2.Balance(m, partitions...)
}

// noPartition is the error of a record for partition part of topic, which
// has n partitions.
func noPartition(topic string, part, n int) error {
	return fmt.Errorf("%w: partition %d of topic %s was asked for, but the topic has %d partitions (0 to %d)",
		ErrNoPartition, part, topic, n, n-1)
}

// sizeBound is an upper bound of the bytes a record takes in a v2 record
// batch (and of kafka-go's own estimate, Message.totalSize), so that the
// records of a request stay within BatchBytes. extra is the size of header
// bytes still to be added by this package.
func sizeBound(key, value []byte, headers []Header, extra int) int64 {
	const (
		fixed     = 4 + 1 + 1 + 8 + 4 + 4 // crc, magic, attributes, timestamp, key and value lengths
		varint    = 5                     // the longest varint of an int32
		ownHeader = 8 * (2*varint + 24)   // chime-* headers: names up to 19 bytes, decimal values up to 20
	)
	n := int64(fixed + varint + ownHeader + len(key) + len(value) + extra)
	for _, h := range headers {
		n += int64(2*varint + len(h.Key) + len(h.Value))
	}
	return n
}

// permanent reports whether err will recur for the same record however
// often it is retried, so retrying only delays the dead letter.
func permanent(err error) bool {
	if errors.Is(err, ErrNoPartition) {
		return true
	}
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return false
	}
	switch ke {
	case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidTopic, kafka.InvalidRecord:
		return true
	}
	return false
}

// request is one produce request: the records msgs[idx] for one partition.
type request struct {
	topic     string
	partition int
	idx       []int
	bytes     int64
}

// send produces msgs and reports, at the same index, nil in errs and the
// time in ackedAt for each record Kafka acknowledged, and in sent whether
// the record went out. It makes one request per partition the records fall
// on (more if a partition's share exceeds BatchSize or BatchBytes), sends
// them all at once under the MaxInFlight semaphore, and returns when each
// is answered or given up. A topic whose partitions cannot be looked up
// fails only its own records.
func (p *Publisher) send(ctx context.Context, msgs []kafka.Message) (errs []error, ackedAt []time.Time, sent []bool) {
	errs = make([]error, len(msgs))
	ackedAt = make([]time.Time, len(msgs))
	sent = make([]bool, len(msgs))
	byTopic := make(map[string][]int)
	var topics []string
	for j := range msgs {
		t := msgs[j].Topic
		if _, ok := byTopic[t]; !ok {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], j)
	}
	var reqs []*request
	for _, t := range topics {
		n, err := p.partitions(ctx, t)
		if err != nil {
			for _, j := range byTopic[t] {
				errs[j] = err
			}
			continue
		}
		parts := make([]int, n)
		for i := range parts {
			parts[i] = i
		}
		open := make(map[int]*request)
		for _, j := range byTopic[t] {
			if want := msgs[j].Partition; want >= n || want < anyPartition {
				errs[j] = noPartition(t, want, n)
				continue
			}
			part := p.balancer.Balance(msgs[j], parts...)
			size := messageSize(&msgs[j])
			r := open[part]
			if r == nil || len(r.idx) >= p.cfg.BatchSize || (len(r.idx) > 0 && r.bytes+size > p.cfg.BatchBytes) {
				r = &request{topic: t, partition: part}
				open[part] = r
				reqs = append(reqs, r)
			}
			r.idx = append(r.idx, j)
			r.bytes += size
		}
	}
	if len(reqs) == 1 {
		p.produce(ctx, msgs, reqs[0], errs, ackedAt, sent)
		return errs, ackedAt, sent
	}
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() { p.produce(ctx, msgs, r, errs, ackedAt, sent) })
	}
	wg.Wait()
	return errs, ackedAt, sent
}

// partitions returns how many partitions topic has, creating it if the
// broker allows. kafka-go's Transport answers from its metadata cache when
// it can.
func (p *Publisher) partitions(ctx context.Context, topic string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	r, err := p.transport.RoundTrip(ctx, p.client.Addr, &metadata.Request{
		TopicNames:             []string{topic},
		AllowAutoTopicCreation: !p.cfg.ExistingTopicsOnly || topic == p.cfg.DeadLetterTopic,
	})
	if err != nil {
		return 0, fmt.Errorf("publish: partitions of %s: %w", topic, ExplainClosed(err))
	}
	for _, t := range r.(*metadata.Response).Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return 0, kafka.Error(t.ErrorCode)
		}
		if len(t.Partitions) == 0 {
			return 0, kafka.LeaderNotAvailable // created, not yet assigned
		}
		return len(t.Partitions), nil
	}
	return 0, kafka.UnknownTopicOrPartition
}

// produce sends one request under the in-flight semaphore and fills errs,
// ackedAt and sent at r.idx (and nowhere else, so requests for disjoint idx
// may run concurrently).
func (p *Publisher) produce(ctx context.Context, msgs []kafka.Message, r *request, errs []error, ackedAt []time.Time, sent []bool) {
	setAll := func(err error) {
		for _, j := range r.idx {
			errs[j] = err
		}
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		setAll(context.Cause(ctx))
		return
	}
	defer func() { <-p.sem }()

	// The caller's deadline can be a leadership lease: nothing is sent
	// once it has passed (waiting for the semaphore, or a pause of the
	// whole process, may have used it up).
	if ctx.Err() != nil {
		setAll(context.Cause(ctx))
		return
	}
	records := make([]kafka.Record, len(r.idx))
	for k, j := range r.idx {
		m := &msgs[j]
		records[k] = kafka.Record{Time: m.Time, Key: kafka.NewBytes(m.Key), Value: valueBytes(m.Value), Headers: m.Headers}
		sent[j] = true
	}
	// Wait for the answer past ctx's deadline (see Publish), but not past
	// its cancellation.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.WriteTimeout)
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	res, err := p.client.Produce(wctx, &kafka.ProduceRequest{
		Topic:        r.topic,
		Partition:    r.partition,
		RequiredAcks: kafka.RequireAll,
		Records:      kafka.NewRecordReader(records...),
	})
	stop()
	cancel()
	now := p.cfg.Now()
	switch {
	case err != nil:
		setAll(ExplainClosed(err))
		return
	case res.Error != nil:
		setAll(res.Error)
		return
	}
	for k, j := range r.idx {
		if rerr, ok := res.RecordErrors[k]; ok {
			errs[j] = rerr
			continue
		}
		ackedAt[j] = now
	}
}

// valueBytes is v as a record's value: null for nil (a tombstone, or a
// dead letter without its value), empty for an empty v, else v. An empty
// value is the zero-size noBytes rather than kafka.NewBytes's reader, so
// that an event without a payload costs no allocation for it, as it did
// when it was produced as a null value.
func valueBytes(v []byte) kafka.Bytes {
	if v != nil && len(v) == 0 {
		return noBytes{}
	}
	return kafka.NewBytes(v)
}

// noBytes is an empty record value (length 0, not null).
type noBytes struct{}

func (noBytes) Len() int                 { return 0 }
func (noBytes) Read([]byte) (int, error) { return 0, io.EOF }
func (noBytes) Close() error             { return nil }

// messageSize bounds the bytes m takes in a record batch.
func messageSize(m *kafka.Message) int64 {
	var hs int
	for _, h := range m.Headers {
		hs += 2*5 + len(h.Key) + len(h.Value)
	}
	return sizeBound(m.Key, m.Value, nil, hs)
}

// newBackOff returns the schedule of one Publish call's waits between
// rounds of attempts. It is per call because the call's ctx bounds it: the
// caller (the shard) owns what happens to records a call did not settle,
// and its own, longer backoff decides when they come back.
func (p *Publisher) newBackOff() backoff.ExponentialBackOff {
	return backoff.ExponentialBackOff{
		InitialInterval:     p.cfg.BackoffBase,
		RandomizationFactor: p.cfg.BackoffJitter,
		Multiplier:          2,
		MaxInterval:         p.cfg.BackoffMax,
	}
}

// sleep waits d or until ctx ends; it reports whether the whole wait passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
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
