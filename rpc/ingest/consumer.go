package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/rpc"
)

// Defaults of Config.
const (
	DefaultGroup         = "chime-ingest"
	DefaultRejectedTopic = "chime.ingest.rejected"
	// maxPoll bounds the records one poll hands over: about a second of a
	// node's ingest, so that a rebalance, which waits for the records of
	// the last poll to be applied and committed, is not held up longer.
	maxPoll = 20000
	// sessionTimeout is how long the group waits for a silent member.
	sessionTimeout = 10 * time.Second
	// rebalanceTimeout is how long the group waits for its members to
	// rejoin once a rebalance is due, well inside sessionTimeout: a member
	// here rejoins as soon as the records of its poll are applied or given
	// up (hurry) and committed (commitTimeout). Kafka's default, 60 s, kept
	// the whole group from consuming for that long behind one member that
	// did not rejoin; and a broker that counts a member's session down
	// while it waits in the join (kfake does) dropped, unanswered, every
	// member that had rejoined, each of which then waited out its JoinGroup
	// (the rebalance timeout and 10 s) and rejoined, which started the
	// wait again: a fault run's group consumed nothing for its last 5
	// minutes.
	rebalanceTimeout = 5 * time.Second
	// commitTimeout bounds a commit, which a rebalance waits for.
	commitTimeout = 4 * time.Second
)

// Source is one topic the consumer reads and how.
type Source struct {
	Topic  string
	Format string // "chime" (the default), "etf1", "karafka" or "sky"
	DecodeOptions
}

// Config is a Consumer's.
type Config struct {
	Brokers  []string
	Security publish.Security
	// Group is the consumer group every node joins (DefaultGroup).
	Group string
	// ClientID names this node to the brokers.
	ClientID string
	Sources  []Source
	// RejectedTopic receives the records that cannot be applied
	// (DefaultRejectedTopic).
	RejectedTopic string
	// API is the node's Scheduler service, called in process: a record is
	// validated, authorized and scheduled exactly as a gRPC call is.
	API chimev1.SchedulerServer
	// Interceptor, when set, returns what every call for a source topic
	// passes through, as a gRPC call passes the node's authorizer: on a
	// secured cluster, acting for the credential the auth file names for
	// the topic.
	Interceptor func(topic string) (grpc.UnaryServerInterceptor, error)
	// DryRun decodes and validates every record (a record that fails goes
	// to the rejected topic, as always) and schedules and cancels nothing:
	// a check of a topic's records before Chime takes them over.
	DryRun bool
	// MaxBatch bounds the events of one BatchSchedule (rpc.Limits.MaxBatch).
	MaxBatch int
	Logger   *slog.Logger
	Metrics  *Metrics
}

// Consumer reads the source topics as a member of the ingest consumer group
// and applies their records through the Scheduler API.
type Consumer struct {
	cfg     Config
	cl      *kgo.Client
	sources map[string]*source
	log     *slog.Logger
	m       *Metrics
	stop    context.CancelFunc
	done    chan struct{}

	mu  sync.Mutex
	lag map[topicPartition]partitionState
	// hurry, while a poll's records are applied, stops that work at its
	// next wait (rebalanceDue). rebalanceWanted records a call of
	// rebalanceDue that came while no poll's work had its hurry yet (the
	// poll had returned, its work not begun): that poll's work is hurried
	// as it begins, or the group waits for it, stuck, a rebalance timeout.
	hurry           context.CancelFunc
	rebalanceWanted bool
}

type source struct {
	Source
	dec       Decoder
	intercept grpc.UnaryServerInterceptor
}

type topicPartition struct {
	topic     string
	partition int32
}

// partitionState is what the consumer knows of one assigned partition.
type partitionState struct {
	next int64 // the offset of the next record to apply
	high int64 // the partition's high watermark at the last fetch
}

// New checks cfg, builds the decoders and starts consuming.
func New(cfg Config) (*Consumer, error) {
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.RejectedTopic == "" {
		cfg.RejectedTopic = DefaultRejectedTopic
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	switch {
	case len(cfg.Brokers) == 0:
		return nil, errors.New("ingest: no brokers")
	case len(cfg.Sources) == 0:
		return nil, errors.New("ingest: no source topics")
	case cfg.API == nil:
		return nil, errors.New("ingest: no Scheduler API")
	}
	c := &Consumer{cfg: cfg, sources: map[string]*source{}, log: cfg.Logger, m: cfg.Metrics,
		done: make(chan struct{}), lag: map[topicPartition]partitionState{}}
	topics := make([]string, 0, len(cfg.Sources))
	for _, s := range cfg.Sources {
		if s.Format == "" {
			s.Format = "chime"
		}
		if _, dup := c.sources[s.Topic]; dup {
			return nil, fmt.Errorf("ingest: topic %q listed twice", s.Topic)
		}
		if s.Topic == cfg.RejectedTopic {
			return nil, fmt.Errorf("ingest: topic %q is the rejected topic; reading it would apply what was rejected", s.Topic)
		}
		dec, err := NewDecoder(s.Format, s.DecodeOptions)
		if err != nil {
			return nil, fmt.Errorf("ingest: topic %q: %w", s.Topic, err)
		}
		src := &source{Source: s, dec: dec}
		if cfg.Interceptor != nil {
			if src.intercept, err = cfg.Interceptor(s.Topic); err != nil {
				return nil, fmt.Errorf("ingest: topic %q: %w", s.Topic, err)
			}
		}
		c.sources[s.Topic] = src
		topics = append(topics, s.Topic)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(topics...),
		// Offsets are committed by the loop, only for records applied (or
		// rejected) already; a rebalance waits for the records of the last
		// poll to be, so no partition changes hands with records in flight.
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// A new group starts at the beginning: a schedule produced before
		// the first node joined is still a schedule.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Aborted transactions never become schedules.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// The rejected topic is created on first use where the brokers allow
		// it, as the dead-letter topic is.
		kgo.AllowAutoTopicCreation(),
		// A crashed node's partitions go to the others after this long
		// without its heartbeats (Kafka's default is 45 s; its brokers
		// accept 6 s and more).
		kgo.SessionTimeout(sessionTimeout),
		kgo.RebalanceTimeout(rebalanceTimeout),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsCallbackBlocked(c.rebalanceDue),
		kgo.OnPartitionsRevoked(c.forget),
		kgo.OnPartitionsLost(c.forget),
		kgo.WithLogger(kgoLogger{cfg.Logger}),
	}
	if cfg.ClientID != "" {
		opts = append(opts, kgo.ClientID(cfg.ClientID))
	}
	opts = append(opts, cfg.Security.KgoOpts()...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	c.cl = cl
	ctx, stop := context.WithCancel(rpc.IngestContext(context.Background(), cfg.DryRun))
	c.stop = stop
	go c.run(ctx)
	return c, nil
}

// Close stops consuming: the records being applied are finished or left
// uncommitted (to be read again, by this node or another), what was
// applied is committed, and the node leaves the group.
func (c *Consumer) Close() {
	c.stop()
	<-c.done
	c.cl.CloseAllowingRebalance()
}

// assigned records the partitions the group gave this node.
func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, got map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range got {
		for _, p := range ps {
			if _, ok := c.lag[topicPartition{t, p}]; !ok {
				c.lag[topicPartition{t, p}] = partitionState{next: -1}
			}
		}
		c.m.partitions.WithLabelValues(t).Add(float64(len(ps)))
	}
}

// forget drops the partitions the group took from this node.
func (c *Consumer) forget(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range lost {
		for _, p := range ps {
			delete(c.lag, topicPartition{t, p})
			c.m.lag.DeleteLabelValues(t, strconv.Itoa(int(p)))
		}
		c.m.partitions.WithLabelValues(t).Sub(float64(len(ps)))
	}
}

// PartitionStatus is one partition this node consumes.
type PartitionStatus struct {
	Topic     string
	Partition int32
	// Next is the offset of the next record to apply; Lag the records
	// behind the partition's end. Both are -1 until this node committed
	// one of the partition's records.
	Next, Lag int64
}

// Status lists the partitions this node consumes, by topic and partition.
func (c *Consumer) Status() []PartitionStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]PartitionStatus, 0, len(c.lag))
	for tp, st := range c.lag {
		lag := int64(-1)
		if st.next >= 0 {
			lag = max(st.high-st.next, 0)
		}
		out = append(out, PartitionStatus{Topic: tp.topic, Partition: tp.partition, Next: st.next, Lag: lag})
	}
	slices.SortFunc(out, func(a, b PartitionStatus) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return out
}

func (c *Consumer) run(ctx context.Context) {
	defer close(c.done)
	var bo *backoff.ExponentialBackOff
	for {
		fs := c.cl.PollRecords(ctx, maxPoll)
		if ctx.Err() != nil {
			c.cl.AllowRebalance()
			return
		}
		failed := false
		fs.EachError(func(topic string, p int32, err error) {
			failed = true
			c.log.Warn("fetching", "topic", topic, "partition", p, "err", publish.ExplainClosed(err))
		})
		if failed && fs.NumRecords() == 0 {
			// A poll that fails at once (a topic the brokers refuse to
			// this client) would fail again at once.
			c.cl.AllowRebalance()
			if bo == nil {
				bo = newBackoff()
			}
			if !c.wait(ctx, bo, "fetching", fs.Err()) {
				return
			}
			continue
		}
		bo = nil
		var parts []kgo.FetchTopicPartition
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				parts = append(parts, p)
			}
			c.setHigh(p.Topic, p.Partition, p.HighWatermark)
		})
		// A rebalance the group wants cannot wait for a partition stuck on
		// a shard that takes no writes: that would stall every member. The
		// poll's work stops at its next wait (hurry), what it applied is
		// committed, and the rest is read again, here or by the partition's
		// next owner.
		pollCtx, hurry := context.WithCancel(ctx)
		c.mu.Lock()
		c.hurry = hurry
		if c.rebalanceWanted {
			c.rebalanceWanted = false
			hurry()
		}
		c.mu.Unlock()
		applied := make([]*kgo.Record, len(parts))
		var wg sync.WaitGroup
		for i := range parts {
			wg.Go(func() { applied[i] = c.apply(pollCtx, parts[i].Records) })
		}
		wg.Wait()
		c.mu.Lock()
		c.hurry = nil
		c.mu.Unlock()
		hurry()
		c.commit(slices.Clone(applied))
		if ctx.Err() == nil {
			c.rewind(parts, applied)
		}
		c.cl.AllowRebalance()
	}
}

// rewind sets the consuming position of each partition of parts whose
// records were not all applied (last, by partition: the last applied, nil
// for none) back to the first record not applied, so that the next poll
// returns it again. It runs before rebalances are allowed again: no
// partition changes hands meanwhile.
func (c *Consumer) rewind(parts []kgo.FetchTopicPartition, last []*kgo.Record) {
	set := map[string]map[int32]kgo.EpochOffset{}
	for i, p := range parts {
		recs := p.Records
		if l := last[i]; l != nil && l == recs[len(recs)-1] {
			continue
		}
		next := recs[0]
		if l := last[i]; l != nil {
			next = recs[slices.Index(recs, l)+1]
		}
		if set[p.Topic] == nil {
			set[p.Topic] = map[int32]kgo.EpochOffset{}
		}
		set[p.Topic][p.Partition] = kgo.EpochOffset{Epoch: next.LeaderEpoch, Offset: next.Offset}
		c.log.Info("a rebalance is due: the partition's records from this offset are read again", "topic", p.Topic, "partition", p.Partition, "offset", next.Offset)
	}
	if len(set) > 0 {
		c.cl.SetOffsets(set)
	}
}

// rebalanceDue is called (in a goroutine of franz-go's) when the group
// wants a rebalance that the records of the current poll hold up.
func (c *Consumer) rebalanceDue(context.Context, *kgo.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hurry != nil {
		c.hurry()
		return
	}
	c.rebalanceWanted = true
}

// commit commits the offset after each record in last (nil entries: none
// applied), retrying for a while even once the consumer is stopping: an
// applied record whose offset is not committed is applied again after a
// restart, which is harmless but wasted.
func (c *Consumer) commit(last []*kgo.Record) {
	rs := slices.DeleteFunc(last, func(r *kgo.Record) bool { return r == nil })
	if len(rs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	if err := c.cl.CommitRecords(ctx, rs...); err != nil {
		c.log.Warn("committing offsets; the records after the last commit will be applied again", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		tp := topicPartition{r.Topic, r.Partition}
		st := c.lag[tp]
		st.next = r.Offset + 1
		c.lag[tp] = st
		c.m.lag.WithLabelValues(r.Topic, strconv.Itoa(int(r.Partition))).Set(float64(max(st.high-st.next, 0)))
	}
}

func (c *Consumer) setHigh(topic string, p int32, high int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tp := topicPartition{topic, p}
	st, ok := c.lag[tp]
	if !ok {
		st.next = -1
	}
	st.high = high
	c.lag[tp] = st
	if st.next >= 0 {
		c.m.lag.WithLabelValues(topic, strconv.Itoa(int(p))).Set(float64(max(st.high-st.next, 0)))
	}
}

// item is one record on its way: decoded, then applied or rejected.
type item struct {
	rec *kgo.Record
	op  Op
	// reject, when set, is why the record is rejected.
	reject error
	// result is what the record did, for the metrics: "scheduled",
	// "cancelled", "skipped", "stale" or "superseded".
	result string
}

// apply applies the records of one partition in order and returns the
// last one applied or rejected: every record before it was too. It stops
// early only when ctx ends.
func (c *Consumer) apply(ctx context.Context, recs []*kgo.Record) (last *kgo.Record) {
	src := c.sources[recs[0].Topic]
	items := make([]item, len(recs))
	// cancelledAt is, by id, the last record of recs that cancels it.
	cancelledAt := map[string]int{}
	// One Record, refilled for each: decoders keep the key, value and
	// header values it aliases, never the Record or its header slice.
	var rec Record
	for i, kr := range recs {
		it := &items[i]
		it.rec = kr
		it.op, it.reject = c.decode(ctx, src, kr, &rec)
		if ctx.Err() != nil {
			return nil
		}
		if it.reject == nil && it.op.Cancel {
			for _, id := range it.op.IDs {
				cancelledAt[id] = i
			}
		}
	}
	r := runs{c: c, src: src, cur: &run{}, ids: make(map[string]int, len(recs))}
	for i := range items {
		it := &items[i]
		switch op := it.op; {
		case it.reject != nil:
			r.add(it)
		case op.Skip:
			it.result = "skipped"
			r.add(it)
		case op.Cancel && c.cfg.DryRun:
			it.result = "dry_run"
			r.add(it)
		case op.Cancel:
			// After everything before it, alone: a cancel of an id a run in
			// flight schedules must come after that run.
			if !r.drain(ctx) || !c.cancel(ctx, src, it) {
				return r.last
			}
			r.add(it)
		case len(cancelledAt) > 0 && cancelledAt[op.Events[0].GetId()] > i:
			// A later record of this fetch cancels it: scheduling it first
			// could fire it meanwhile (one due already, as a schedule the old
			// scheduler fired and tombstoned is, read from the topic's start).
			it.result = "superseded"
			r.add(it)
		default:
			if !r.place(ctx, op) {
				return r.last
			}
			r.add(it)
		}
	}
	r.drain(ctx)
	return r.last
}

// decode decodes kr, read into rec. A failure that is not the record's (a schema
// registry that does not answer) is retried until it passes or ctx ends:
// the record is not rejected for it.
func (c *Consumer) decode(ctx context.Context, src *source, kr *kgo.Record, rec *Record) (Op, error) {
	var bo *backoff.ExponentialBackOff
	for {
		fillRecord(rec, kr)
		op, err := src.dec.Decode(rec)
		if err == nil {
			return op, nil
		}
		if re := (*RecordError)(nil); errors.As(err, &re) {
			return op, err
		}
		if bo == nil {
			bo = newBackoff()
		}
		if !c.wait(ctx, bo, "decoding a record of "+kr.Topic, err) {
			return Op{}, err
		}
	}
}

// Runs of a partition's records: a run's schedules go in one
// BatchSchedule, and up to maxRuns runs are in flight at once, so that a
// partition keeps several shards' group commits busy rather than waiting
// for one call's slowest shard before it sends the next.
const (
	runEvents = 2000
	maxRuns   = 4
)

// runs are a partition's records on their way, in order: the run being
// gathered, and the runs in flight, oldest first. No two runs gathered or
// in flight share an id, so the order of their calls does not matter; a
// cancel waits for every run before it.
type runs struct {
	c      *Consumer
	src    *source
	cur    *run
	flying []*run
	// ids holds, for each id scheduled by a run, the number of the last
	// such run: the id is in a run gathered or in flight when that number
	// is at least the oldest run's not landed (one map for every run of
	// the poll, rather than one each, which every event would look up).
	ids map[string]int
	// last is the last record of the runs done in order: every record up
	// to it was applied or rejected.
	last   *kgo.Record
	failed bool
}

// run is one call's worth of a partition's records.
type run struct {
	n      int // runs are numbered from 0 in the order they are gathered
	items  []*item
	events int
	start  time.Time
	done   chan struct{}
	ok     bool
}

// add adds it to the current run.
func (r *runs) add(it *item) {
	cur := r.cur
	if len(cur.items) == 0 {
		cur.start = time.Now()
	}
	cur.items = append(cur.items, it)
	if it.reject == nil && !it.op.Cancel && it.result == "" {
		for _, e := range it.op.Events {
			r.ids[e.GetId()] = cur.n
		}
		cur.events += len(it.op.Events)
	}
}

// unlanded is the number of the oldest run gathered or in flight.
func (r *runs) unlanded() int {
	if len(r.flying) > 0 {
		return r.flying[0].n
	}
	return r.cur.n
}

// place makes room in the current run for op's events: when a run
// gathered or in flight has one of op's ids, it waits for all of them
// (op's event must come after that one); when the current run is full, it
// starts it. False: ctx ended first.
func (r *runs) place(ctx context.Context, op Op) bool {
	for _, e := range op.Events {
		if n, ok := r.ids[e.GetId()]; ok && n >= r.unlanded() {
			return r.drain(ctx)
		}
	}
	if r.cur.events+len(op.Events) > min(runEvents, r.c.cfg.MaxBatch) {
		return r.launch(ctx)
	}
	return true
}

// launch starts the current run, after the oldest run in flight is done
// when maxRuns are. False: ctx ended first.
func (r *runs) launch(ctx context.Context) bool {
	if len(r.cur.items) == 0 {
		return true
	}
	if len(r.flying) == maxRuns && !r.land() {
		return false
	}
	f := r.cur
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		f.ok = r.c.schedule(ctx, r.src, f.items) && r.c.rejectAll(ctx, f.items)
	}()
	r.flying = append(r.flying, f)
	r.cur = &run{n: f.n + 1}
	return true
}

// land waits for the oldest run in flight and reports whether it, and
// every run before it, was done.
func (r *runs) land() bool {
	f := r.flying[0]
	<-f.done
	r.flying = r.flying[1:]
	if !f.ok || r.failed {
		r.failed = true
		return false
	}
	r.c.count(r.src.Topic, f.items)
	r.c.m.apply.Observe(time.Since(f.start).Seconds())
	r.last = f.items[len(f.items)-1].rec
	return true
}

// drain starts the current run and waits for every run in flight; false
// when one was not done (ctx ended first).
func (r *runs) drain(ctx context.Context) bool {
	if !r.launch(ctx) {
		for len(r.flying) > 0 {
			r.land()
		}
		return false
	}
	for len(r.flying) > 0 {
		r.land()
	}
	return !r.failed
}

// count counts what the records of items did, a counter update for each
// stretch of one result rather than one for each record.
func (c *Consumer) count(topic string, items []*item) {
	result, n := "", 0
	flush := func() {
		if n > 0 {
			c.m.records.WithLabelValues(topic, result).Add(float64(n))
		}
	}
	for _, it := range items {
		if it.reject != nil {
			c.m.rejected.WithLabelValues(topic, reason(it.reject)).Inc()
			if result != "rejected" {
				flush()
				result, n = "rejected", 0
			}
			n++
			continue
		}
		if it.result != result {
			flush()
			result, n = it.result, 0
		}
		n++
	}
	flush()
}

// eventPrefix is the path BatchSchedule puts before an event's field.
var eventPrefix = regexp.MustCompile(`^events\[\d+\]\.`)

// pending is an event on its way to its shard.
type pending struct {
	it *item
	ev *chimev1.Event
	// replace: a conflict with a stored event replaces it when the record
	// is newer (ON_CONFLICT_REPLACE); otherwise it rejects the record.
	replace bool
}

// schedule schedules the events of items (those not rejected or skipped
// already) in one BatchSchedule, then resolves each event the call could
// not take: a conflict that is a newer record is replaced, one that is not
// (a record read again) stays; a refusal rejects the record; anything else
// (no leader, a shard that takes no writes, a rate limit) is retried until
// it goes through or ctx ends, which it reports with false.
func (c *Consumer) schedule(ctx context.Context, src *source, items []*item) bool {
	var todo []pending
	for _, it := range items {
		if it.reject != nil || it.result != "" {
			continue
		}
		it.result = "scheduled"
		if c.cfg.DryRun {
			it.result = "dry_run"
		}
		for _, ev := range it.op.Events {
			// Sent first as REJECT, whatever the record asked: a conflict is
			// answered, not acted on, so that replaceIfNewer can tell a
			// record read again from a newer one.
			todo = append(todo, pending{it, ev, ev.GetOnConflict() != chimev1.OnConflict_ON_CONFLICT_REJECT})
			ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REJECT
		}
	}
	return c.scheduleEvents(ctx, src, todo)
}

func (c *Consumer) scheduleEvents(ctx context.Context, src *source, todo []pending) bool {
	bo := newBackoff()
	for len(todo) > 0 {
		evs := make([]*chimev1.Event, len(todo))
		for i, p := range todo {
			evs[i] = p.ev
		}
		resp, err := c.call(ctx, src, chimev1.Scheduler_BatchSchedule_FullMethodName, &chimev1.BatchScheduleRequest{Events: evs},
			func(ctx context.Context, req any) (any, error) {
				return c.cfg.API.BatchSchedule(ctx, req.(*chimev1.BatchScheduleRequest))
			})
		switch {
		case err != nil && refused(status.Code(err)) && len(todo) > 1:
			// The authorizer refuses a whole call for one event's topic or
			// id: one at a time, the refusal rejects only that record.
			for _, p := range todo {
				if !c.scheduleEvents(ctx, src, []pending{p}) {
					return false
				}
			}
			return true
		case err != nil && refused(status.Code(err)):
			todo[0].it.reject = errors.New(status.Convert(err).Message())
			return true
		case err != nil:
			if !c.wait(ctx, bo, "scheduling", err) {
				return false
			}
			continue
		}
		var again []pending
		var lastErr error
		for i, r := range resp.(*chimev1.BatchScheduleResponse).GetResults() {
			p := todo[i]
			switch code := codes.Code(r.GetCode()); {
			case code == codes.OK:
			case code == codes.AlreadyExists && p.replace:
				stale, err := c.replaceIfNewer(ctx, src, p.ev)
				switch {
				case ctx.Err() != nil:
					return false
				case err != nil && refused(status.Code(err)):
					p.it.reject = errors.New(status.Convert(err).Message())
				case err != nil:
					again, lastErr = append(again, p), err
				case stale && p.it.result == "scheduled":
					p.it.result = "stale"
				}
			case refused(code):
				if p.it.reject == nil {
					p.it.reject = errors.New(eventPrefix.ReplaceAllString(r.GetMessage(), ""))
				}
			default:
				again, lastErr = append(again, p), status.Error(code, r.GetMessage())
			}
		}
		todo = again
		if len(todo) > 0 && !c.wait(ctx, bo, "scheduling", lastErr) {
			return false
		}
	}
	return true
}

// replaceIfNewer replaces the event ev's id is bound to with ev, unless the
// stored event came from the same partition at the same or a later offset
// (stale: ev's record was read again, after a newer one applied).
func (c *Consumer) replaceIfNewer(ctx context.Context, src *source, ev *chimev1.Event) (stale bool, err error) {
	got, err := c.call(ctx, src, chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: ev.GetId()},
		func(ctx context.Context, req any) (any, error) { return c.cfg.API.Get(ctx, req.(*chimev1.GetRequest)) })
	switch {
	case status.Code(err) == codes.NotFound: // expired meanwhile: schedule it anew
	case err != nil:
		return false, err
	default:
		if notNewer(sourceOf(got.(*chimev1.GetResponse).GetEvent().GetHeaders()), sourceOf(ev.GetHeaders())) {
			return true, nil
		}
	}
	ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REPLACE
	defer func() { ev.OnConflict = chimev1.OnConflict_ON_CONFLICT_REJECT }()
	_, err = c.call(ctx, src, chimev1.Scheduler_Schedule_FullMethodName, &chimev1.ScheduleRequest{Event: ev},
		func(ctx context.Context, req any) (any, error) {
			return c.cfg.API.Schedule(ctx, req.(*chimev1.ScheduleRequest))
		})
	return false, err
}

// sourceOf is the chime-source header among hs, "" when there is none.
func sourceOf(hs []*chimev1.Header) string {
	for _, h := range hs {
		if h.GetKey() == chimev1.HeaderSource {
			return string(h.GetValue())
		}
	}
	return ""
}

// notNewer reports whether the record at source next is not newer than
// the one at stored: both from one partition, next at the same or an
// earlier offset. A record from elsewhere (another partition or topic, or
// an event scheduled through the API) is the latest word on its id.
func notNewer(stored, next string) bool {
	si, ni := strings.LastIndexByte(stored, '/'), strings.LastIndexByte(next, '/')
	if si < 0 || ni < 0 || stored[:si] != next[:ni] {
		return false
	}
	so, err1 := strconv.ParseInt(stored[si+1:], 10, 64)
	no, err2 := strconv.ParseInt(next[ni+1:], 10, 64)
	return err1 == nil && err2 == nil && no <= so
}

// cancel cancels the ids of it's operation, in order: an id with no event,
// or one that fired already, is done with, and so is one whose event came
// from a later record of the same partition (the cancel was read again,
// after a newer schedule of its key). It reports false when ctx ended
// first.
func (c *Consumer) cancel(ctx context.Context, src *source, it *item) bool {
	it.result = "cancelled"
	at := sourceText(it.rec.Topic, it.rec.Partition, it.rec.Offset)
	bo := newBackoff()
	for _, id := range it.op.IDs {
		for {
			stale, err := c.cancelIfNewer(ctx, src, id, at)
			code := status.Code(err)
			if code == codes.Aborted && c.cancelled(ctx, src, id) {
				// Recorded, but a record of an earlier produce attempt may
				// still reach Kafka: a doubt no retry can lift, since a
				// cancelled event is never produced again.
				code = codes.OK
			}
			if code == codes.OK || code == codes.NotFound || code == codes.FailedPrecondition {
				if stale && it.result == "cancelled" {
					it.result = "stale"
				}
				break
			}
			if refused(code) {
				it.reject = errors.New(status.Convert(err).Message())
				return true
			}
			if !c.wait(ctx, bo, "cancelling", err) {
				return false
			}
		}
	}
	return true
}

// cancelled reports whether the event id names is cancelled.
func (c *Consumer) cancelled(ctx context.Context, src *source, id string) bool {
	got, err := c.call(ctx, src, chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: id},
		func(ctx context.Context, req any) (any, error) { return c.cfg.API.Get(ctx, req.(*chimev1.GetRequest)) })
	return err == nil && got.(*chimev1.GetResponse).GetState() == chimev1.EventState_EVENT_STATE_CANCELLED
}

// cancelIfNewer cancels id unless its event came from a record of the
// cancel's partition at a later offset than at.
func (c *Consumer) cancelIfNewer(ctx context.Context, src *source, id, at string) (stale bool, err error) {
	got, err := c.call(ctx, src, chimev1.Scheduler_Get_FullMethodName, &chimev1.GetRequest{Id: id},
		func(ctx context.Context, req any) (any, error) { return c.cfg.API.Get(ctx, req.(*chimev1.GetRequest)) })
	if err != nil {
		return false, err
	}
	stored := sourceOf(got.(*chimev1.GetResponse).GetEvent().GetHeaders())
	if stored != at && notNewer(stored, at) {
		return true, nil
	}
	_, err = c.call(ctx, src, chimev1.Scheduler_Cancel_FullMethodName, &chimev1.CancelRequest{Id: id},
		func(ctx context.Context, req any) (any, error) {
			return c.cfg.API.Cancel(ctx, req.(*chimev1.CancelRequest))
		})
	return false, err
}

// refused reports whether code says the request itself is wrong, so that
// sending it again cannot help: the record is rejected.
func refused(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.PermissionDenied, codes.AlreadyExists, codes.OutOfRange:
		return true
	}
	return false
}

// call runs one Scheduler call for src, through its interceptor when it has one.
func (c *Consumer) call(ctx context.Context, src *source, method string, req any, h grpc.UnaryHandler) (any, error) {
	if src.intercept == nil {
		return h(ctx, req)
	}
	return src.intercept(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, h)
}

func newBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 50*time.Millisecond, 5*time.Second
	return bo
}

// wait waits out the next backoff step after err, and reports false when
// ctx ended first.
func (c *Consumer) wait(ctx context.Context, bo *backoff.ExponentialBackOff, doing string, err error) bool {
	c.m.retries.Inc()
	d := bo.NextBackOff()
	if d >= bo.MaxInterval {
		c.log.Warn(doing+" keeps failing; the partition waits", "err", err, "retry_in", d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// rejectAll produces a copy of each rejected record among items to the
// rejected topic, with why and where it came from, retrying until the
// broker has them all; false when ctx ended first.
func (c *Consumer) rejectAll(ctx context.Context, items []*item) bool {
	var out []*kgo.Record
	for _, it := range items {
		if it.reject == nil {
			continue
		}
		r := it.rec
		hs := append(slices.Clip(r.Headers),
			kgo.RecordHeader{Key: chimev1.HeaderError, Value: []byte(it.reject.Error())},
			kgo.RecordHeader{Key: chimev1.HeaderSource, Value: sourceBytes(r.Topic, r.Partition, r.Offset)})
		out = append(out, &kgo.Record{Topic: c.cfg.RejectedTopic, Key: r.Key, Value: r.Value, Headers: hs})
		c.log.Debug("rejected a record", "source", sourceText(r.Topic, r.Partition, r.Offset), "err", it.reject)
	}
	if len(out) == 0 {
		return true
	}
	bo := newBackoff()
	for {
		err := c.cl.ProduceSync(ctx, out...).FirstErr()
		if err == nil {
			return true
		}
		if !c.wait(ctx, bo, "producing rejected records to "+c.cfg.RejectedTopic, publish.ExplainClosed(err)) {
			return false
		}
	}
}

func sourceText(topic string, p int32, offset int64) string {
	return string(sourceBytes(topic, p, offset))
}

// sourceBytes is sourceText as bytes, in one allocation: every scheduled
// event carries it as its chime-source header.
func sourceBytes(topic string, p int32, offset int64) []byte {
	b := make([]byte, 0, len(topic)+2+10+20)
	b = append(b, topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(p), 10)
	b = append(b, '/')
	return strconv.AppendInt(b, offset, 10)
}

// reason is the label a rejection is counted under: the field it names.
func reason(err error) string {
	var re *RecordError
	if errors.As(err, &re) {
		return re.Field
	}
	field, _, ok := strings.Cut(err.Error(), ":")
	if !ok || strings.ContainsAny(field, " \"") {
		return "other"
	}
	return field
}

// fillRecord sets r to kr as a decoder reads it, reusing r's header slice.
func fillRecord(r *Record, kr *kgo.Record) {
	hs := r.Headers[:0]
	for _, h := range kr.Headers {
		hs = append(hs, Header{Key: h.Key, Value: h.Value})
	}
	*r = Record{Topic: kr.Topic, Partition: kr.Partition, Offset: kr.Offset, Key: kr.Key, Value: kr.Value, Headers: hs, Timestamp: kr.Timestamp}
}

// kgoLogger passes franz-go's warnings and errors to the node's log.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	args := append([]any{"component", "ingest"}, keyvals...)
	if level == kgo.LogLevelError {
		k.l.Error(msg, args...)
		return
	}
	k.l.Warn(msg, args...)
}
