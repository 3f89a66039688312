package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chimehq/chime/cmd/internal/latency"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// --api topic: the events go in as records produced to the ingest topic
// (docs/ingest.md), and an event counts as acknowledged once Chime applied
// its record: once the ingest consumer group committed an offset past it,
// which it does only after Raft committed the record's event.

// The headers of Chime's ingest format (rpc/ingest's, written here as the
// contract docs/ingest.md states, as any producer would).
const (
	ingestHeaderDeliverAt = "chime-deliver-at"
	ingestHeaderDelay     = "chime-delay"
	ingestHeaderTopic     = "chime-topic"
	ingestHeaderPriority  = "chime-priority"
	ingestHeaderError     = "chime-error"
)

// offsetPollInterval is how often bench reads the committed offsets: the resolution of the
// applied time and of the lag samples.
const offsetPollInterval = 100 * time.Millisecond

// topicEventID is the id Chime gives the event of a record with key key
// produced to ingestTopic: <topic>/<key> (chimed's default; with
// --ingest-id-from-key the key alone, which topicEventNumber accepts too).
func topicEventID(ingestTopic, key string) string { return ingestTopic + "/" + key }

// topicIDRest is what follows prefix in a fired record's chime-id for an
// event that came from ingestTopic: the id is <ingestTopic>/<prefix><rest>,
// or, from a node run with --ingest-id-from-key, <prefix><rest>.
func topicIDRest(id, ingestTopic, prefix string) (string, bool) {
	if rest, ok := strings.CutPrefix(id, topicEventID(ingestTopic, prefix)); ok {
		return rest, true
	}
	if rest, ok := strings.CutPrefix(id, prefix); ok {
		return rest, true
	}
	return "", false
}

// pendingRecord is a record the broker acknowledged whose offset the group
// has not committed past yet.
type pendingRecord struct {
	offset int64
	n      int   // event number
	sent   int64 // unix ns, when it was handed to the producer
}

// topicPending is the records of each partition not yet applied, for the
// lag and the applied times.
type topicPending struct {
	parts map[int32][]pendingRecord
	// sorted says a partition's slice is in offset order (the promises of a
	// partition come in order, but this does not rely on it).
	sorted map[int32]bool
}

func newTopicPending() *topicPending {
	return &topicPending{parts: map[int32][]pendingRecord{}, sorted: map[int32]bool{}}
}

func (p *topicPending) add(partition int32, rec pendingRecord) {
	s := p.parts[partition]
	if _, ok := p.sorted[partition]; !ok || (len(s) > 0 && s[len(s)-1].offset > rec.offset) {
		p.sorted[partition] = len(s) == 0
	}
	p.parts[partition] = append(s, rec)
}

// partitions lists the partitions that have had records, in order.
func (p *topicPending) partitions() []int32 {
	out := make([]int32, 0, len(p.parts))
	for k := range p.parts {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// advance takes out of p every record below its partition's committed
// offset (the next offset the group will read; a partition missing from
// committed, or at -1, has none committed) and returns them, with the lag:
// the records the broker acknowledged that are still not committed.
func (p *topicPending) advance(committed map[int32]int64) (applied []pendingRecord, lag int64) {
	for part, s := range p.parts {
		if !p.sorted[part] {
			slices.SortFunc(s, func(a, b pendingRecord) int { return int(a.offset - b.offset) })
			p.sorted[part] = true
		}
		c, ok := committed[part]
		if !ok {
			c = -1
		}
		i := 0
		for i < len(s) && s[i].offset < c {
			i++
		}
		applied = append(applied, s[:i]...)
		// Keep the rest in a slice of its own so the applied prefix's
		// memory goes once the slice regrows.
		s = s[i:]
		p.parts[part] = s
		lag += int64(len(s))
	}
	return applied, lag
}

// benchTopic is the state of --api topic's producing.
type benchTopic struct {
	firstProduce atomic.Int64 // unix ns of the first record handed to the producer
	brokerAcked  atomic.Int64
	produceFail  atomic.Int64
	mu           sync.Mutex
	pending      *topicPending
	lastBroker   time.Time // the last broker acknowledgement
	applied      time.Time // when every record was found committed
	lag          []float64 // records, sampled every offsetPollInterval
	lastLag      int64
	rejected     int // records the nodes produced to the rejected topic; under the run's mu
}

// produceTopic is --api topic's sending: --callers goroutines hand the
// records to one franz-go producer (asynchronous, linger 5 ms, at most
// --rate), and a watcher reads the group's committed offsets every 100 ms
// until every record the broker acknowledged is covered (or no offset moved
// for --wait). It returns when that watcher is done.
func (r *benchRun) produceTopic(ctx context.Context) error {
	o := r.o
	seeds := strings.Fields(strings.ReplaceAll(o.brokers, ",", " "))
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.DefaultProduceTopic(o.ingestTopic),
		kgo.AllowAutoTopicCreation(),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.MaxBufferedRecords(50000),
		kgo.RecordDeliveryTimeout(time.Minute),
	}, o.kafka...)...)
	if err != nil {
		return fmt.Errorf("--brokers: %w", err)
	}
	defer cl.Close()
	if err := pingKafka(ctx, cl, seeds); err != nil {
		return err
	}

	var next atomic.Int64
	var wg sync.WaitGroup
	produced := make(chan struct{})
	for range o.callers {
		wg.Go(func() { r.produceRecords(ctx, cl, &next) })
	}
	go func() {
		wg.Wait()
		_ = cl.Flush(ctx) // fails only when ctx ends; each record's outcome comes through its promise
		close(produced)
	}()
	r.watchOffsets(ctx, cl, produced)
	return nil
}

// produceRecords is one producing caller: it takes --batch event numbers at
// a time, records their due times, and hands each one's record to cl.
func (r *benchRun) produceRecords(ctx context.Context, cl *kgo.Client, next *atomic.Int64) {
	o := r.o
	t := r.topic
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	payload := benchPayload(o.payload)
	delay := []byte(o.delay.String())
	topic := []byte(o.topic)
	dues := make([]int64, o.batch)
	for ctx.Err() == nil {
		from, to, ok := r.claim(ctx, next)
		if !ok {
			return
		}
		t.firstProduce.CompareAndSwap(0, time.Now().UnixNano())
		// The due times the bench chose (chime-deliver-at); with --delay
		// alone the node resolves it (chime-delay) and the fired record's
		// chime-due-unix-ms tells it.
		r.mu.Lock()
		for n := from; n < to; n++ {
			dues[n-from] = r.topicDue(rnd)
			r.dues[n] = dues[n-from]
			r.lastDue = max(r.lastDue, dues[n-from])
		}
		r.mu.Unlock()
		for n := from; n < to; n++ {
			rec := &kgo.Record{Key: []byte(r.prefix + strconv.Itoa(n)), Value: payload,
				Headers: make([]kgo.RecordHeader, 0, 3)}
			if due := dues[n-from]; due != 0 {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ingestHeaderDeliverAt, Value: strconv.AppendInt(nil, due/1e6, 10)})
			} else {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ingestHeaderDelay, Value: delay})
			}
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ingestHeaderTopic, Value: topic})
			if o.priorities {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ingestHeaderPriority, Value: []byte{byte('0' + n%10)}})
			}
			sent := time.Now().UnixNano()
			cl.Produce(ctx, rec, func(rec *kgo.Record, err error) { r.brokerAck(rec, n, sent, err) })
		}
	}
}

// topicDue is the due time (unix ns, whole milliseconds) of the next
// record, as the gRPC path sets it: --due-at (and --spread) or --delay-max
// give a time (chime-deliver-at); --delay alone gives 0, a delay
// (chime-delay), which the node resolves when it applies the record.
func (r *benchRun) topicDue(rnd *rand.Rand) int64 {
	o := r.o
	var at time.Time
	switch {
	case o.dueAt > 0:
		at = r.start.Add(o.dueAt)
		if o.spread > 0 {
			at = at.Add(time.Duration(rnd.Int64N(int64(o.spread))))
		}
	case o.delayMax > o.delay:
		at = time.Now().Add(o.delay + time.Duration(rnd.Int64N(int64(o.delayMax-o.delay))))
	default:
		return 0
	}
	return at.UnixMilli() * 1e6
}

// brokerAck is a record's promise.
func (r *benchRun) brokerAck(rec *kgo.Record, n int, sent int64, err error) {
	t := r.topic
	if err != nil {
		t.produceFail.Add(1)
		r.fail(fmt.Errorf("producing to %s: %w", rec.Topic, err), 1)
		return
	}
	t.mu.Lock()
	t.pending.add(rec.Partition, pendingRecord{offset: rec.Offset, n: n, sent: sent})
	t.lastBroker = time.Now()
	t.mu.Unlock()
	t.brokerAcked.Add(1)
}

// watchOffsets reads the committed offsets of --ingest-group every
// offsetPollInterval and counts the records they cover as acknowledged,
// until produced is closed and every record the broker acknowledged is
// covered, or no offset moved for --wait.
func (r *benchRun) watchOffsets(ctx context.Context, cl *kgo.Client, produced <-chan struct{}) {
	o := r.o
	t := r.topic
	tick := time.NewTicker(offsetPollInterval)
	defer tick.Stop()
	progress := time.Now()
	var lastErr error
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		done := false
		select {
		case <-produced:
			done = true
		default:
		}
		t.mu.Lock()
		parts := t.pending.partitions()
		t.mu.Unlock()
		var committed map[int32]int64
		if len(parts) > 0 {
			var err error
			if committed, err = fetchCommitted(ctx, cl, o.ingestGroup, o.ingestTopic, parts); err != nil {
				lastErr = err
			}
		}
		now := time.Now()
		t.mu.Lock()
		applied, lag := t.pending.advance(committed)
		if t.firstProduce.Load() != 0 {
			t.lag = append(t.lag, float64(lag))
		}
		t.lastLag = lag
		if len(applied) > 0 || t.lastBroker.After(progress) {
			progress = now
		}
		t.mu.Unlock()
		r.topicApplied(applied, now)
		if done && lag == 0 {
			t.mu.Lock()
			t.applied = now
			t.mu.Unlock()
			return
		}
		if done && now.Sub(progress) > o.wait {
			why := fmt.Sprintf("%d records not committed by consumer group %s after %v without progress: is chimed consuming %s "+
				"(chimed --ingest-topics, on by default in chimed dev) with --ingest-group %s?", lag, o.ingestGroup, o.wait, o.ingestTopic, o.ingestGroup)
			if lastErr != nil {
				why += fmt.Sprintf(" (reading its offsets: %v)", lastErr)
			}
			t.mu.Lock()
			t.applied = now
			t.mu.Unlock()
			r.fail(errors.New(why), int(lag))
			return
		}
	}
}

// topicApplied counts the records applied as acknowledged at now, each
// with its latency from the producer to the committed offset.
func (r *benchRun) topicApplied(applied []pendingRecord, now time.Time) {
	if len(applied) == 0 {
		return
	}
	r.mu.Lock()
	for _, p := range applied {
		r.ackLat = append(r.ackLat, time.Duration(now.UnixNano()-p.sent))
	}
	if r.o.dueAt == 0 && r.o.delayMax <= r.o.delay {
		// chime-delay: the node resolved it by now, so it is due by now
		// plus --delay.
		r.lastDue = max(r.lastDue, now.Add(r.o.delay).UnixNano())
	}
	r.second(now).acked += len(applied)
	r.mu.Unlock()
	r.acked.Add(int64(len(applied)))
}

// fetchCommitted asks the group's coordinator for the group's committed
// offsets of topic's partitions: the next offset the group reads, -1 for a
// partition without one.
func fetchCommitted(ctx context.Context, cl *kgo.Client, group, topic string, parts []int32) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = topic, parts
	req.Topics = append(req.Topics, rt)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(rctx, cl)
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, rt := range resp.Topics {
		if rt.Topic != topic {
			continue
		}
		for _, p := range rt.Partitions {
			if kerr.ErrorForCode(p.ErrorCode) == nil {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out, nil
}

// rejectedRecord accounts for a record the nodes produced to the rejected
// topic; r.mu is held.
func (r *benchRun) rejectedRecord(rec *kgo.Record) {
	if !strings.HasPrefix(string(rec.Key), r.prefix) {
		return
	}
	r.topic.rejected++
	if r.firstErr == nil {
		why := "?"
		for _, h := range rec.Headers {
			if h.Key == ingestHeaderError {
				why = string(h.Value)
			}
		}
		r.firstErr = fmt.Errorf("record %s rejected by chimed: %s", rec.Key, why)
	}
}

// topicRecord accounts for the lateness of a consumed record of event n,
// fired from the ingest topic; r.mu is held. Its due time is the one the
// bench gave it, or with chime-delay, the record's chime-due-unix-ms.
func (r *benchRun) topicRecord(n int, h chimev1.Headers, now time.Time) {
	due := r.dues[n]
	if due == 0 {
		if h.Due.IsZero() {
			return
		}
		due = h.Due.UnixNano()
	}
	r.fired(n, due, h.Fired, now)
}

// topicSummary adds --api topic's figures to s; r.mu is held.
func (r *benchRun) topicSummary(s *benchSummary) {
	t := r.topic
	t.mu.Lock()
	defer t.mu.Unlock()
	s.API, s.IngestTopic = "topic", r.o.ingestTopic
	first := time.Unix(0, t.firstProduce.Load())
	s.BrokerAcked = t.brokerAcked.Load()
	if !t.lastBroker.IsZero() {
		s.BrokerSeconds = t.lastBroker.Sub(first).Seconds()
		s.BrokerAckedPerSec = float64(s.BrokerAcked) / max(s.BrokerSeconds, 1e-9)
	}
	if !t.applied.IsZero() && t.firstProduce.Load() != 0 {
		s.SendSeconds = t.applied.Sub(first).Seconds()
	}
	// Rejected records were committed too, but are no schedules.
	s.Rejected = t.rejected
	s.Acked -= int64(t.rejected)
	s.Failed += int64(t.rejected)
	s.AckedPerSec = float64(s.Acked) / max(s.SendSeconds, 1e-9)
	if !r.o.noConsume {
		s.Missing = int(s.Acked) - r.consumed
	}
	s.LagSamples = len(t.lag)
	lagMax, lagP99 := latency.Quantile(t.lag, 1), latency.Quantile(t.lag, 0.99)
	s.LagMaxRecords, s.LagP99Records = &lagMax, &lagP99
}

// progress is the records the broker acknowledged so far and the latest
// lag sample.
func (t *benchTopic) progress() (produced, lag int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.brokerAcked.Load(), t.lastLag
}

// printTopic prints the ingest lines of an --api topic run.
func (s benchSummary) printTopic(w io.Writer) {
	fmt.Fprintf(w, "scheduled  %d of %d applied (offsets committed by the ingest group) in %.1f s from the first record produced: %.0f events/s (peak second %d)",
		s.Acked, s.Events, s.SendSeconds, s.AckedPerSec, s.PeakAckedSec)
	if s.Failed > 0 {
		fmt.Fprintf(w, "; %d failed (%d rejected), first: %s", s.Failed, s.Rejected, s.FirstError)
	}
	fmt.Fprintf(w, "\nproduced   %d records to %s acknowledged by the broker in %.1f s: %.0f records/s\n", s.BrokerAcked, s.IngestTopic, s.BrokerSeconds, s.BrokerAckedPerSec)
	fmt.Fprintf(w, "applied    %d records, produced to committed (100 ms resolution): p50 %.0f ms, p99 %.0f ms, max %.0f ms\n", s.Calls, s.AckP50Ms, s.AckP99Ms, s.AckMaxMs)
	fmt.Fprintf(w, "ingest lag max %.0f records, p99 %.0f (acknowledged by the broker, not committed by the group; %d samples 100 ms apart)\n", *s.LagMaxRecords, *s.LagP99Records, s.LagSamples)
}
