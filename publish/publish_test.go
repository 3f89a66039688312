package publish_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
)

// newPublisher points cfg at b; the Publisher is closed before b is.
func newPublisher(t testing.TB, b *publishtest.Broker, cfg publish.Config) *publish.Publisher {
	t.Helper()
	cfg.Brokers = b.Addrs()
	p, err := publish.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// fastRetries keeps retry tests quick and their schedule exact.
func fastRetries(cfg publish.Config) publish.Config {
	cfg.BackoffBase, cfg.BackoffMax, cfg.BackoffJitter = time.Millisecond, 4*time.Millisecond, -1
	return cfg
}

// consume reads exactly want records from topics (failing on fewer, on
// more, on a chime-id read twice and on a malformed chime-* header) and
// returns them by chime-id.
func consume(t testing.TB, b *publishtest.Broker, want int, topics ...string) map[string]publishtest.Record {
	t.Helper()
	got := publishtest.Consume(t, b.Addrs(), want, 30*time.Second, topics...)
	if len(got.Records) != want || got.Dups != 0 {
		t.Fatalf("consumed %d records (%d duplicates) from %v, want exactly %d", len(got.Records), got.Dups, topics, want)
	}
	for _, r := range got.Records {
		if r.HeaderErr != nil {
			t.Fatalf("record %s/%d@%d: %v", r.Kafka.Topic, r.Kafka.Partition, r.Kafka.Offset, r.HeaderErr)
		}
	}
	return got.ByID
}

// stepClock is an injected clock that moves 1ms per reading.
type stepClock struct {
	base time.Time
	n    atomic.Int64
}

func (c *stepClock) Now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * time.Millisecond) }

// produceTopics are the topics of a produce request (kafka-go sends one
// topic-partition per request).
func produceTopics(kreq kmsg.Request) []string {
	var ts []string
	for _, rt := range kreq.(*kmsg.ProduceRequest).Topics {
		ts = append(ts, rt.Topic)
	}
	return ts
}

func TestPublishRoundTrip(t *testing.T) {
	const partitions = 6
	c := publishtest.NewBroker(t, kfake.NumBrokers(3), kfake.DefaultNumPartitions(partitions))
	clock := &stepClock{base: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	p := newPublisher(t, c, publish.Config{Now: clock.Now})

	topics := []string{"orders", "payments.v1", "reminders_due-x"}
	const n = 300
	recs := make([]publish.Record, n)
	for i := range recs {
		r := publish.Record{
			Seq:   uint64(1000 + i),
			ID:    fmt.Sprintf("evt-%04d", i),
			Topic: topics[i%len(topics)],
			Value: fmt.Appendf(nil, "payload %d %s", i, bytes.Repeat([]byte{'x'}, i%50)),
			Headers: []publish.Header{
				{Key: "trace", Value: fmt.Appendf(nil, "t-%d", i)},
				{Key: "tenant", Value: []byte("acme")},
			},
			Due: time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC).UnixNano() + int64(i)*int64(time.Millisecond) + 123456,
		}
		if i%5 != 0 { // every fifth record has no key: its id is the key
			r.Key = fmt.Appendf(nil, "customer-%d", i%17)
		}
		recs[i] = r
	}

	// Four callers at once share the one Writer.
	outs := make([][]publish.Outcome, 4)
	chunk := n / len(outs)
	var wg sync.WaitGroup
	for g := range outs {
		wg.Go(func() { outs[g] = p.Publish(t.Context(), recs[g*chunk:(g+1)*chunk]) })
	}
	wg.Wait()

	outByID := make(map[string]publish.Outcome, n)
	for g, out := range outs {
		if len(out) != chunk {
			t.Fatalf("caller %d got %d outcomes, want %d", g, len(out), chunk)
		}
		for k, o := range out {
			r := recs[g*chunk+k]
			if o.Seq != r.Seq || !o.Done || o.DeadLettered || o.Attempts != 1 || o.Err != "" {
				t.Fatalf("outcome for %s = %+v, want Seq %d, Done, 1 attempt, no error", r.ID, o, r.Seq)
			}
			if o.FiredAt <= clock.base.UnixNano() || o.FiredAt > clock.base.Add(time.Duration(clock.n.Load())*time.Millisecond).UnixNano() {
				t.Fatalf("FiredAt %d of %s is not a reading of the injected clock", o.FiredAt, r.ID)
			}
			outByID[r.ID] = o
		}
	}
	if s := p.Stats(); s != (publish.Stats{Produced: n}) {
		t.Fatalf("Stats = %+v, want %d produced and nothing else", s, n)
	}

	got := consume(t, c, n, topics...)
	partitionOf := make(map[string]int32) // topic + key -> partition
	javaPartitioner := kgo.StickyKeyPartitioner(nil)
	for _, r := range recs {
		kr, ok := got[r.ID]
		if !ok {
			t.Fatalf("record %s was not consumed", r.ID)
		}
		wantKey := r.Key
		if len(wantKey) == 0 {
			wantKey = []byte(r.ID)
		}
		if kr.Kafka.Topic != r.Topic || !bytes.Equal(kr.Kafka.Key, wantKey) || !bytes.Equal(kr.Kafka.Value, r.Value) {
			t.Fatalf("record %s: got topic %q key %q value %q, want %q %q %q", r.ID, kr.Kafka.Topic, kr.Kafka.Key, kr.Kafka.Value, r.Topic, wantKey, r.Value)
		}
		// The event's headers in order, then the four chime-* headers.
		wantHeaders := []string{"trace", "tenant", publish.HeaderID, publish.HeaderDue, publish.HeaderFired, publish.HeaderAttempt}
		if len(kr.Kafka.Headers) != len(wantHeaders) {
			t.Fatalf("record %s has headers %v, want keys %v", r.ID, kr.Kafka.Headers, wantHeaders)
		}
		for k, h := range kr.Kafka.Headers {
			if h.Key != wantHeaders[k] {
				t.Fatalf("record %s header %d is %q, want %q", r.ID, k, h.Key, wantHeaders[k])
			}
		}
		if hs := kr.Kafka.Headers; !bytes.Equal(hs[0].Value, r.Headers[0].Value) || string(hs[1].Value) != "acme" {
			t.Fatalf("record %s user headers = %v", r.ID, hs[:2])
		}
		if kr.ID != r.ID {
			t.Fatalf("chime-id = %q, want %q", kr.ID, r.ID)
		}
		if v := kr.Due.UnixMilli(); v != r.Due/int64(time.Millisecond) {
			t.Fatalf("record %s chime-due-unix-ms = %d, want %d", r.ID, v, r.Due/int64(time.Millisecond))
		}
		if kr.Attempt != 1 {
			t.Fatalf("record %s chime-attempt = %d, want 1", r.ID, kr.Attempt)
		}
		fired := kr.Fired.UnixMilli()
		if o := outByID[r.ID]; fired < clock.base.UnixMilli() || fired*int64(time.Millisecond) >= o.FiredAt {
			t.Fatalf("record %s chime-fired-unix-ms %d is not a clock reading before its ack at %d", r.ID, fired, o.FiredAt)
		}
		if kr.Kafka.Timestamp.UnixMilli() != fired {
			t.Fatalf("record %s timestamp %v, want the send time %d", r.ID, kr.Kafka.Timestamp, fired)
		}
		// Same key, same partition; and the very partition the Java
		// client's default partitioner (murmur2) picks.
		tk := r.Topic + "\x00" + string(wantKey)
		if prev, seen := partitionOf[tk]; seen && prev != kr.Kafka.Partition {
			t.Fatalf("key %q of topic %s landed on partitions %d and %d", wantKey, r.Topic, prev, kr.Kafka.Partition)
		}
		partitionOf[tk] = kr.Kafka.Partition
		if want := javaPartitioner.ForTopic(r.Topic).Partition(&kgo.Record{Key: wantKey}, partitions); int32(want) != kr.Kafka.Partition {
			t.Fatalf("key %q went to partition %d, the Java partitioner picks %d", wantKey, kr.Kafka.Partition, want)
		}
	}
}

func TestRetriesCountAttempts(t *testing.T) {
	c := publishtest.NewBroker(t, kfake.NumBrokers(1), kfake.DefaultNumPartitions(1))
	const failures = 3
	var produces atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if produces.Add(1) > failures {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		return publishtest.FailProduce(req, kerr.NotEnoughReplicas.Code), nil, true
	})
	p := newPublisher(t, c, fastRetries(publish.Config{MaxAttempts: 5}))

	// Half the records were attempted once before: they reach their fifth
	// and last attempt, the others their fourth.
	recs := make([]publish.Record, 10)
	for i := range recs {
		recs[i] = publish.Record{Seq: uint64(i), ID: fmt.Sprintf("r%d", i), Topic: "retry", Value: []byte{byte(i)}, Attempts: uint32(i % 2)}
	}
	out := p.Publish(t.Context(), recs)
	for i, o := range out {
		want := uint32(failures+1) + recs[i].Attempts
		if !o.Done || o.DeadLettered || o.Attempts != want || o.Err != "" {
			t.Fatalf("outcome %d = %+v, want Done with %d attempts", i, o, want)
		}
	}
	if got := produces.Load(); got != failures+1 {
		t.Fatalf("broker saw %d produce requests, want %d (%d failed, then one for all records)", got, failures+1, failures)
	}
	if s := p.Stats(); s != (publish.Stats{Produced: 10, Retried: 10 * failures}) {
		t.Fatalf("Stats = %+v", s)
	}
	// The counters reach /metrics.
	if err := testutil.CollectAndCompare(p.Collector(), strings.NewReader(`
# HELP chime_publish_retries_total Failed produce attempts that were followed by another attempt within the same Publish call.
# TYPE chime_publish_retries_total counter
chime_publish_retries_total 30
# HELP chime_publish_produced_total Records Kafka acknowledged on their own topic.
# TYPE chime_publish_produced_total counter
chime_publish_produced_total 10
`), "chime_publish_retries_total", "chime_publish_produced_total"); err != nil {
		t.Fatal(err)
	}
	got := consume(t, c, len(recs), "retry")
	for i, r := range recs {
		if v := got[r.ID].Attempt; v != int(out[i].Attempts) {
			t.Fatalf("record %s chime-attempt = %d, want %d", r.ID, v, out[i].Attempts)
		}
	}
}

func TestDeadLetter(t *testing.T) {
	c := publishtest.NewBroker(t, kfake.NumBrokers(3), kfake.DefaultNumPartitions(3))
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, topic := range produceTopics(req) {
			if topic == "broken" {
				return publishtest.FailProduce(req, kerr.NotEnoughReplicas.Code), nil, true
			}
		}
		return nil, nil, false
	})
	p := newPublisher(t, c, fastRetries(publish.Config{MaxAttempts: 3, BatchBytes: 64 << 10}))

	var recs []publish.Record
	add := func(topic string, value []byte) {
		recs = append(recs, publish.Record{Seq: uint64(len(recs)), ID: fmt.Sprintf("e%d", len(recs)), Topic: topic, Key: []byte("k"), Value: value,
			Headers: []publish.Header{{Key: "h", Value: []byte("v")}}, Due: 1e18})
	}
	for i := 0; i < 20; i++ {
		add("fine", fmt.Appendf(nil, "fine %d", i))
	}
	for i := 0; i < 10; i++ {
		add("broken", fmt.Appendf(nil, "broken %d", i))
	}
	add("not a topic", []byte("bad name"))
	add("fine", bytes.Repeat([]byte{'z'}, 100<<10)) // over BatchBytes: can never be produced

	out := p.Publish(t.Context(), recs)
	var dead []publish.Record
	for i, o := range out {
		r := recs[i]
		if !o.Done {
			t.Fatalf("outcome %d (%s) = %+v, want Done", i, r.Topic, o)
		}
		switch {
		case r.Topic == "fine" && len(r.Value) < 1000:
			if o.DeadLettered || o.Attempts != 1 || o.Err != "" {
				t.Fatalf("outcome %d = %+v, want produced on the first attempt", i, o)
			}
			continue
		case r.Topic == "broken":
			if o.Attempts != 3 || !strings.Contains(o.Err, "Not Enough Replicas") {
				t.Fatalf("outcome %d = %+v, want 3 attempts and the broker's error", i, o)
			}
		case r.Topic == "not a topic":
			if o.Attempts != 0 || !strings.Contains(o.Err, publish.ErrInvalidTopic.Error()) {
				t.Fatalf("outcome %d = %+v, want no attempt and the topic rule", i, o)
			}
		default: // oversized
			if o.Attempts != 0 || !strings.Contains(o.Err, "exceeds BatchBytes") {
				t.Fatalf("outcome %d = %+v, want no attempt and the size error", i, o)
			}
		}
		if !o.DeadLettered || o.FiredAt == 0 {
			t.Fatalf("outcome %d = %+v, want dead-lettered", i, o)
		}
		dead = append(dead, r)
	}
	if s := p.Stats(); s != (publish.Stats{Produced: 20, DeadLettered: 12, Retried: 10 * 2}) {
		t.Fatalf("Stats = %+v", s)
	}

	consume(t, c, 20, "fine")
	got := consume(t, c, len(dead), publish.DefaultDeadLetterTopic)
	for _, r := range dead {
		kr, ok := got[r.ID]
		if !ok {
			t.Fatalf("dead letter %s missing", r.ID)
		}
		o := out[r.Seq]
		if kr.Topic != r.Topic {
			t.Fatalf("dead letter %s chime-topic = %q, want %q", r.ID, kr.Topic, r.Topic)
		}
		if kr.Error != o.Err {
			t.Fatalf("dead letter %s chime-error = %q, want %q", r.ID, kr.Error, o.Err)
		}
		if kr.Attempt != int(o.Attempts) {
			t.Fatalf("dead letter %s chime-attempt = %d, want %d", r.ID, kr.Attempt, o.Attempts)
		}
		if h, ok := kr.Header("h"); string(kr.Kafka.Key) != "k" || !ok || h != "v" {
			t.Fatalf("dead letter %s lost its key or headers: %q %v", r.ID, kr.Kafka.Key, kr.Kafka.Headers)
		}
		dropped, hasDropped := kr.Header(publish.HeaderDropped)
		if len(r.Value) > 1000 {
			if dropped != "value" || len(kr.Kafka.Value) != 0 {
				t.Fatalf("oversized dead letter kept %d value bytes, chime-dropped %q", len(kr.Kafka.Value), dropped)
			}
		} else if hasDropped || !bytes.Equal(kr.Kafka.Value, r.Value) {
			t.Fatalf("dead letter %s value %q (dropped %q), want %q", r.ID, kr.Kafka.Value, dropped, r.Value)
		}
	}
}

func TestDeadLetterFailsThenRefire(t *testing.T) {
	c := publishtest.NewBroker(t, kfake.NumBrokers(3), kfake.DefaultNumPartitions(2))
	c.RefuseProduce(kerr.NotEnoughReplicas.Code)
	p := newPublisher(t, c, fastRetries(publish.Config{MaxAttempts: 2, DeadLetterAttempts: 2}))

	recs := []publish.Record{
		{Seq: 7, ID: "a", Topic: "t1", Value: []byte("a")},
		{Seq: 8, ID: "b", Topic: "t2", Value: []byte("b")},
	}
	out := p.Publish(t.Context(), recs)
	for i, o := range out {
		if o.Done || o.DeadLettered || o.Attempts != 2 || o.FiredAt != 0 ||
			!strings.Contains(o.Err, "dead-letter topic "+publish.DefaultDeadLetterTopic) || !strings.Contains(o.Err, "Not Enough Replicas") {
			t.Fatalf("outcome %d = %+v, want not done after 2 attempts and a failed dead letter", i, o)
		}
	}
	if s := p.Stats(); s != (publish.Stats{Retried: 2, Failed: 2}) {
		t.Fatalf("Stats = %+v", s)
	}

	// The caller fires them again later with the attempts so far: they go
	// straight to the dead-letter topic.
	c.AcceptProduce()
	for i := range recs {
		recs[i].Attempts = out[i].Attempts
	}
	out = p.Publish(t.Context(), recs)
	for i, o := range out {
		if !o.Done || !o.DeadLettered || o.Attempts != 2 || !strings.Contains(o.Err, "attempts already made") {
			t.Fatalf("refired outcome %d = %+v, want dead-lettered without a new attempt", i, o)
		}
	}
	got := consume(t, c, 2, publish.DefaultDeadLetterTopic)
	if v := got["b"].Topic; v != "t2" {
		t.Fatalf("chime-topic = %q", v)
	}
}

func TestCancelWhileBrokerFails(t *testing.T) {
	c := publishtest.NewBroker(t)
	c.RefuseProduce(kerr.NotEnoughReplicas.Code)
	p := newPublisher(t, c, publish.Config{MaxAttempts: 1000, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})

	recs := make([]publish.Record, 50)
	for i := range recs {
		recs[i] = publish.Record{Seq: uint64(i), ID: fmt.Sprint(i), Topic: []string{"x", "y"}[i%2], Value: []byte("v")}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	out := p.Publish(ctx, recs)
	// 1000 attempts would take over a minute; 3 s leaves a loaded machine room.
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Publish took %v after a 300ms deadline", took)
	}
	for i, o := range out {
		if o.Done || o.DeadLettered || o.Attempts < 2 || !strings.Contains(o.Err, context.DeadlineExceeded.Error()) {
			t.Fatalf("outcome %d = %+v, want not done after some attempts, with the deadline as error", i, o)
		}
	}
	if s := p.Stats(); s.Failed != 50 || s.Produced != 0 || s.DeadLettered != 0 {
		t.Fatalf("Stats = %+v", s)
	}
}

// A broker that never answers. ctx's deadline only stops new attempts: the
// attempt under way is waited for up to WriteTimeout (its records may well
// land). Cancelling ctx ends the call at once.
func TestBrokerHangs(t *testing.T) {
	c := publishtest.NewBroker(t)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			if tp.Topic == "hang" {
				return nil, nil, true // swallow the request: no response, no close
			}
		}
		return nil, nil, false
	})
	// WriteTimeout also bounds how long Close waits for the hung batch.
	// 2 s, so that the bounds below leave a loaded machine room and still
	// tell the deadline, the WriteTimeout and a retry apart. The broker's
	// TCP stack acknowledges the request, so the far shorter
	// UnackedTimeout must not cut the wait short: it is for dead paths,
	// not slow brokers.
	p := newPublisher(t, c, publish.Config{WriteTimeout: 2 * time.Second, UnackedTimeout: 300 * time.Millisecond})
	// Connected first, so that the deadline below falls inside the hung
	// attempt: on a starved machine the first dial and metadata took longer
	// than the deadline, and no attempt had started when it passed.
	if out := p.Publish(t.Context(), []publish.Record{{Seq: 9, ID: "w", Topic: "warm", Value: []byte("v")}}); !out[0].Done {
		t.Fatalf("warming up: %+v", out[0])
	}

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	out := p.Publish(ctx, []publish.Record{{Seq: 1, ID: "h", Topic: "hang", Value: []byte("v")}})
	if took := time.Since(start); took < 1900*time.Millisecond || took > 3900*time.Millisecond {
		t.Fatalf("Publish took %v with a 200ms deadline and a 2s WriteTimeout; want about 2s", took)
	}
	if o := out[0]; o.Done || o.Attempts != 1 {
		t.Fatalf("outcome = %+v, want not done after one attempt (no retry after the deadline)", o)
	}

	ctx, cancel = context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	start = time.Now()
	out = p.Publish(ctx, []publish.Record{{Seq: 2, ID: "h2", Topic: "hang", Value: []byte("v")}})
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("Publish took %v after a cancel at 200ms (the WriteTimeout is 2s)", took)
	}
	if o := out[0]; o.Done || !strings.Contains(o.Err, context.Canceled.Error()) {
		t.Fatalf("outcome = %+v, want not done, cancelled", o)
	}
}

func TestCloseStopsPublish(t *testing.T) {
	c := publishtest.NewBroker(t)
	c.RefuseProduce(kerr.NotEnoughReplicas.Code)
	p, err := publish.New(publish.Config{Brokers: c.Addrs(), MaxAttempts: 1000, BackoffBase: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	recs := []publish.Record{{Seq: 1, ID: "c", Topic: "closing", Value: []byte("v")}}
	done := make(chan []publish.Outcome)
	go func() { done <- p.Publish(context.Background(), recs) }()

	// Close once the broker has refused at least one attempt.
	publishtest.WaitFor(t, 30*time.Second, "an attempt failed", func() bool { return p.Stats().Retried > 0 })
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case out := <-done:
		if o := out[0]; o.Done || !strings.Contains(o.Err, publish.ErrClosed.Error()) || o.Attempts < 1 {
			t.Fatalf("outcome = %+v, want not done because the publisher closed", o)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Publish did not return within 20 s of Close")
	}
	out := p.Publish(context.Background(), recs)
	if o := out[0]; o.Done || o.Err != publish.ErrClosed.Error() || o.Attempts != 0 {
		t.Fatalf("Publish after Close = %+v", o)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// After Close, no goroutine the Publisher started is left (nor kfake's,
// once its broker closed).
func TestNoGoroutineLeak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Run("publish", func(t *testing.T) {
		c := publishtest.NewBroker(t, kfake.NumBrokers(3))
		p, err := publish.New(publish.Config{Brokers: c.Addrs()})
		if err != nil {
			t.Fatal(err)
		}
		recs := make([]publish.Record, 200)
		for i := range recs {
			recs[i] = publish.Record{Seq: uint64(i), ID: fmt.Sprint(i), Topic: fmt.Sprintf("leak%d", i%4), Value: []byte("v")}
		}
		for _, o := range p.Publish(t.Context(), recs) {
			if !o.Done {
				t.Fatalf("outcome %+v", o)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewRejects(t *testing.T) {
	ok := publish.Config{Brokers: []string{"127.0.0.1:9092"}}
	for _, tc := range []struct {
		field string
		edit  func(*publish.Config)
	}{
		{"Brokers", func(c *publish.Config) { c.Brokers = nil }},
		{"Brokers", func(c *publish.Config) { c.Brokers = []string{""} }},
		{"MaxInFlight", func(c *publish.Config) { c.MaxInFlight = -1 }},
		{"MaxAttempts", func(c *publish.Config) { c.MaxAttempts = -2 }},
		{"BackoffBase", func(c *publish.Config) { c.BackoffBase, c.BackoffMax = time.Second, time.Millisecond }},
		{"BackoffJitter", func(c *publish.Config) { c.BackoffJitter = 1.5 }},
		{"DeadLetterTopic", func(c *publish.Config) { c.DeadLetterTopic = "dead letters" }},
		{"BatchBytes", func(c *publish.Config) { c.BatchBytes = -1 }},
		{"WriteTimeout", func(c *publish.Config) { c.WriteTimeout = -time.Second }},
		{"UnackedTimeout", func(c *publish.Config) { c.UnackedTimeout = -time.Second }},
		{"Security.SASL.Mechanism", func(c *publish.Config) {
			c.Security.SASL = &publish.SASL{Mechanism: "SCRAM-SHA-1", User: "u", Password: "p"}
		}},
		{"Security.SASL.User", func(c *publish.Config) { c.Security.SASL = &publish.SASL{Mechanism: publish.SASLPlain, Password: "p"} }},
		{"Security.SASL.Password", func(c *publish.Config) {
			c.Security.SASL = &publish.SASL{Mechanism: publish.SASLScramSHA512, User: "u"}
		}},
		// SASLprep refuses control characters in a SCRAM user or password
		// (TestSCRAMErrorKeepsThePassword).
		{"Security.SASL.User", func(c *publish.Config) {
			c.Security.SASL = &publish.SASL{Mechanism: publish.SASLScramSHA512, User: "u\x07", Password: "p"}
		}},
		{"Security.SASL.Password", func(c *publish.Config) {
			c.Security.SASL = &publish.SASL{Mechanism: publish.SASLScramSHA512, User: "u", Password: "p\x00"}
		}},
	} {
		cfg := ok
		tc.edit(&cfg)
		p, err := publish.New(cfg)
		if err == nil {
			_ = p.Close() // the New should have failed; that it did not is the error
			t.Fatalf("New accepted a bad %s", tc.field)
		}
		if !errors.Is(err, publish.ErrConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Fatalf("error %q does not wrap ErrConfig or name %s", err, tc.field)
		}
	}
}

func TestValidTopic(t *testing.T) {
	for _, name := range []string{"a", "orders", "Orders.v1", "a_b-c.d", "...", strings.Repeat("x", 249), "0"} {
		if err := publish.ValidTopic(name); err != nil {
			t.Errorf("ValidTopic(%q) = %v, want nil", name, err)
		}
	}
	for name, rule := range map[string]string{
		"":                       "empty",
		".":                      `"."`,
		"..":                     `".."`,
		strings.Repeat("x", 250): "limit is 249",
		"with space":             "' '",
		"slash/topic":            "'/'",
		"ümlaut":                 "byte 0",
		"tab\t":                  `'\t'`,
	} {
		err := publish.ValidTopic(name)
		if !errors.Is(err, publish.ErrInvalidTopic) || !strings.Contains(err.Error(), rule) {
			t.Errorf("ValidTopic(%q) = %v, want ErrInvalidTopic naming %s", name, err, rule)
		}
	}
}

// TestExistingTopicsOnly: with ExistingTopicsOnly, a record for a topic
// the brokers do not have is not the occasion to create it, although the
// brokers would: it fails its attempts and goes to the dead-letter topic,
// which is created. A topic that exists is produced to as ever.
func TestExistingTopicsOnly(t *testing.T) {
	c := publishtest.NewBroker(t)
	existing := newPublisher(t, c, publish.Config{})
	if out := existing.Publish(t.Context(), []publish.Record{{Seq: 1, ID: "first", Topic: "known", Value: []byte("x")}}); !out[0].Done || out[0].DeadLettered {
		t.Fatalf("creating the topic with auto-creation on: %+v", out[0])
	}
	p := newPublisher(t, c, fastRetries(publish.Config{MaxAttempts: 2, ExistingTopicsOnly: true}))
	out := p.Publish(t.Context(), []publish.Record{
		{Seq: 2, ID: "typo", Topic: "knwon", Value: []byte("y")},
		{Seq: 3, ID: "ok", Topic: "known", Value: []byte("z")},
	})
	if o := out[0]; !o.Done || !o.DeadLettered || !strings.Contains(o.Err, "Unknown Topic") {
		t.Errorf("a record for a topic that does not exist: %+v, want dead-lettered as an unknown topic", o)
	}
	if o := out[1]; !o.Done || o.DeadLettered {
		t.Errorf("a record for a topic that exists: %+v", o)
	}
	if got := consume(t, c, 1, publish.DefaultDeadLetterTopic); got["typo"].Topic != "knwon" {
		t.Errorf("dead letters: %+v", got)
	}
	if got := consume(t, c, 2, "known"); len(got) != 2 {
		t.Errorf("known: %+v", got)
	}
}
