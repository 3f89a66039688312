package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
)

// A share of the workload's new events (--ingest-share) is scheduled the
// Kafka way (docs/ingest.md): the driver produces a record to the ingest
// topic, and the nodes, each a member of the ingest consumer group,
// apply it. The producer is the driver's own franz-go client, on the host
// side of the bridge: the kafka-cut nemesis cuts the nodes (their
// producers and their ingest consumers alike) from the broker, never it.
// Check 15 of the checker judges these events (checker/doc.go).
const (
	ingestTopic      = "chime.schedule"
	ingestPartitions = 4
	// ingestTombstoneDelay is the shortest delay of a record that a
	// tombstone follows 0.5-3 s after its ack: longer than the checker's
	// bound (15 s) plus that, so that a tombstone Chime failed to apply
	// shows as a record fired after the tombstone's deadline.
	ingestTombstoneDelay = 20 * time.Second
)

// newIngestProducer is the driver's producer to the ingest topic: acks=all,
// idempotent (franz-go's default), records of a key to one partition (the
// default partitioner hashes the key), no linger. It creates the ingest
// topic with ingestPartitions partitions, so that the group spreads them
// over the nodes from the start.
func newIngestProducer(ctx context.Context, brokers ...string) (*kgo.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation())
	if err != nil {
		return nil, err
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = ingestTopic, ingestPartitions, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		for _, t := range resp.Topics {
			if e := kerr.ErrorForCode(t.ErrorCode); e != nil && !errors.Is(e, kerr.TopicAlreadyExists) {
				err = e
			}
		}
	}
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("creating %s: %w", ingestTopic, err)
	}
	return cl, nil
}

// ingestNew schedules a new event through the ingest topic, and sometimes
// follows it, from a goroutine of its own, with one more record of its key:
// 60% of keys get nothing more; 15% a tombstone 0.5-3 s after the ack, the
// record having a delay of ingestTombstoneDelay plus up to 10 s; 10% a
// tombstone within ±50 ms of the due time; 15% a second schedule (another
// payload and due time) 0.2-3 s after the ack, before or after the first
// fell due. A key whose produce went unanswered gets nothing more, so that
// every unknown record of a key is its last.
func (w *workload) ingestNew(ctx context.Context, p int, r *rand.Rand) {
	w.mu.Lock()
	w.seq++
	key := "k-" + strconv.Itoa(w.seq)
	w.mu.Unlock()
	topic := topics[r.IntN(len(topics))]
	now := time.Now()
	delay, deliverAt, due := w.dueTime(r, now)
	follow := r.IntN(20)
	if follow >= 12 && follow < 15 {
		delay = ingestTombstoneDelay + time.Duration(r.Int64N(int64(10*time.Second)))
		deliverAt, due = time.Time{}, now.Add(delay)
	}
	if op := w.produceIngest(p, key, topic, "p-"+key+"-1", delay, deliverAt, due); op.Type != checker.TypeOK || follow < 12 {
		return
	}
	var at time.Time
	second := false
	switch {
	case follow < 15:
		at = time.Now().Add(500*time.Millisecond + time.Duration(r.Int64N(int64(2500*time.Millisecond))))
	case follow < 17:
		at = due.Add(time.Duration(r.Int64N(int64(100*time.Millisecond))) - 50*time.Millisecond)
	default:
		at, second = time.Now().Add(200*time.Millisecond+time.Duration(r.Int64N(int64(2800*time.Millisecond)))), true
	}
	seed := r.Uint64()
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		if !second {
			w.produceIngest(p, key, "", "", 0, time.Time{}, time.Time{})
			return
		}
		r := rand.New(rand.NewPCG(seed, 2))
		now := time.Now()
		delay, deliverAt, due := w.dueTime(r, now)
		w.produceIngest(p, key, topic, "p-"+key+"-2", delay, deliverAt, due)
	}()
}

// produceIngest produces one record of key to the ingest topic and records
// it: a schedule of payload to topic with chime-delay (deliverAt zero) or
// chime-deliver-at (Unix ms), or, when payload is "", a tombstone. It is ok
// when the broker acknowledged it (its partition and offset are then in the
// op), info otherwise: the record may have landed all the same.
func (w *workload) produceIngest(p int, key, topic, payload string, delay time.Duration, deliverAt, due time.Time) checker.Op {
	op := checker.Op{Process: p, F: checker.FIngest, Node: "kafka", ID: ingestTopic + "/" + key, Action: checker.IngestTombstone}
	rec := &kgo.Record{Topic: ingestTopic, Key: []byte(key)}
	if payload != "" {
		op.Action, op.Topic, op.Payload = checker.IngestSchedule, topic, payload
		rec.Value = []byte(payload)
		if deliverAt.IsZero() {
			op.DelayNs = int64(delay)
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "chime-delay", Value: []byte(delay.String())})
		} else {
			op.DeliverAtNs = deliverAt.UnixNano()
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "chime-deliver-at", Value: []byte(strconv.FormatInt(deliverAt.UnixMilli(), 10))})
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "chime-topic", Value: []byte(topic)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op.InvokeNs = time.Now().UnixNano()
	err := w.ingest.ProduceSync(ctx, rec).FirstErr()
	op.CompleteNs = time.Now().UnixNano()
	if err != nil {
		op.Type, op.Error = checker.TypeInfo, err.Error()
	} else {
		op.Type, op.Partition, op.Offset = checker.TypeOK, rec.Partition, rec.Offset
	}
	w.record(op)
	if payload != "" {
		w.mu.Lock()
		if due.After(w.maxDue) {
			w.maxDue = due
		}
		w.mu.Unlock()
	}
	return op
}
