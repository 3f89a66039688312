package publish

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// newCluster starts an in-process Kafka-protocol broker on loopback that
// creates topics on first use; it stops when the test ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.AllowAutoTopicCreation()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newPublisher points cfg at c; the Publisher is closed before c is.
func newPublisher(t testing.TB, c *kfake.Cluster, cfg Config) *Publisher {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	p, err := New(cfg)
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
func fastRetries(cfg Config) Config {
	cfg.BackoffBase, cfg.BackoffMax, cfg.BackoffJitter = time.Millisecond, 4*time.Millisecond, -1
	return cfg
}

// consume reads want records from topics with an independent client
// (franz-go), then polls briefly once more so that extra copies show.
func consume(t testing.TB, c *kfake.Cluster, want int, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
		kgo.MetadataMinAge(50*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records from %v before the deadline", len(got), want, topics)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	extra, cancelExtra := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelExtra()
	cl.PollFetches(extra).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	if len(got) != want {
		t.Fatalf("consumed %d records from %v, want exactly %d", len(got), topics, want)
	}
	return got
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func mustHeader(t testing.TB, r *kgo.Record, key string) string {
	t.Helper()
	v, ok := header(r, key)
	if !ok {
		t.Fatalf("record %s/%d@%d has no %s header: %v", r.Topic, r.Partition, r.Offset, key, r.Headers)
	}
	return v
}

func mustInt(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// byID indexes consumed records by their chime-id header and fails on
// duplicates.
func byID(t testing.TB, recs []*kgo.Record) map[string]*kgo.Record {
	t.Helper()
	m := make(map[string]*kgo.Record, len(recs))
	for _, r := range recs {
		id := mustHeader(t, r, HeaderID)
		if _, dup := m[id]; dup {
			t.Fatalf("record %s consumed twice", id)
		}
		m[id] = r
	}
	return m
}

// stepClock is an injected clock that moves 1ms per reading.
type stepClock struct {
	base time.Time
	n    atomic.Int64
}

func (c *stepClock) Now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * time.Millisecond) }

// failProduce answers every partition of a produce request with code.
func failProduce(kreq kmsg.Request, code int16) kmsg.Response {
	req := kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

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
	c := newCluster(t, kfake.NumBrokers(3), kfake.DefaultNumPartitions(partitions))
	clock := &stepClock{base: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	p := newPublisher(t, c, Config{Now: clock.Now})

	topics := []string{"orders", "payments.v1", "reminders_due-x"}
	const n = 300
	recs := make([]Record, n)
	for i := range recs {
		r := Record{
			Seq:   uint64(1000 + i),
			ID:    fmt.Sprintf("evt-%04d", i),
			Topic: topics[i%len(topics)],
			Value: fmt.Appendf(nil, "payload %d %s", i, bytes.Repeat([]byte{'x'}, i%50)),
			Headers: []Header{
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
	outs := make([][]Outcome, 4)
	chunk := n / len(outs)
	var wg sync.WaitGroup
	for g := range outs {
		wg.Go(func() { outs[g] = p.Publish(t.Context(), recs[g*chunk:(g+1)*chunk]) })
	}
	wg.Wait()

	outByID := make(map[string]Outcome, n)
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
	if s := p.Stats(); s != (Stats{Produced: n}) {
		t.Fatalf("Stats = %+v, want %d produced and nothing else", s, n)
	}

	got := byID(t, consume(t, c, n, topics...))
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
		if kr.Topic != r.Topic || !bytes.Equal(kr.Key, wantKey) || !bytes.Equal(kr.Value, r.Value) {
			t.Fatalf("record %s: got topic %q key %q value %q, want %q %q %q", r.ID, kr.Topic, kr.Key, kr.Value, r.Topic, wantKey, r.Value)
		}
		// The event's headers in order, then the four chime-* headers.
		wantHeaders := []string{"trace", "tenant", HeaderID, HeaderDue, HeaderFired, HeaderAttempt}
		if len(kr.Headers) != len(wantHeaders) {
			t.Fatalf("record %s has headers %v, want keys %v", r.ID, kr.Headers, wantHeaders)
		}
		for k, h := range kr.Headers {
			if h.Key != wantHeaders[k] {
				t.Fatalf("record %s header %d is %q, want %q", r.ID, k, h.Key, wantHeaders[k])
			}
		}
		if !bytes.Equal(kr.Headers[0].Value, r.Headers[0].Value) || string(kr.Headers[1].Value) != "acme" {
			t.Fatalf("record %s user headers = %v", r.ID, kr.Headers[:2])
		}
		if v := mustHeader(t, kr, HeaderID); v != r.ID {
			t.Fatalf("chime-id = %q, want %q", v, r.ID)
		}
		if v := mustInt(t, mustHeader(t, kr, HeaderDue)); v != r.Due/int64(time.Millisecond) {
			t.Fatalf("record %s chime-due-unix-ms = %d, want %d", r.ID, v, r.Due/int64(time.Millisecond))
		}
		if v := mustHeader(t, kr, HeaderAttempt); v != "1" {
			t.Fatalf("record %s chime-attempt = %q, want 1", r.ID, v)
		}
		fired := mustInt(t, mustHeader(t, kr, HeaderFired))
		if o := outByID[r.ID]; fired < clock.base.UnixMilli() || fired*int64(time.Millisecond) >= o.FiredAt {
			t.Fatalf("record %s chime-fired-unix-ms %d is not a clock reading before its ack at %d", r.ID, fired, o.FiredAt)
		}
		if kr.Timestamp.UnixMilli() != fired {
			t.Fatalf("record %s timestamp %v, want the send time %d", r.ID, kr.Timestamp, fired)
		}
		// Same key, same partition; and the very partition the Java
		// client's default partitioner (murmur2) picks.
		tk := r.Topic + "\x00" + string(wantKey)
		if prev, seen := partitionOf[tk]; seen && prev != kr.Partition {
			t.Fatalf("key %q of topic %s landed on partitions %d and %d", wantKey, r.Topic, prev, kr.Partition)
		}
		partitionOf[tk] = kr.Partition
		if want := javaPartitioner.ForTopic(r.Topic).Partition(&kgo.Record{Key: wantKey}, partitions); int32(want) != kr.Partition {
			t.Fatalf("key %q went to partition %d, the Java partitioner picks %d", wantKey, kr.Partition, want)
		}
	}
}

func TestRetriesCountAttempts(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(1), kfake.DefaultNumPartitions(1))
	const failures = 3
	var produces atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if produces.Add(1) > failures {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		return failProduce(req, kerr.NotEnoughReplicas.Code), nil, true
	})
	p := newPublisher(t, c, fastRetries(Config{MaxAttempts: 5}))

	// Half the records were attempted once before: they reach their fifth
	// and last attempt, the others their fourth.
	recs := make([]Record, 10)
	for i := range recs {
		recs[i] = Record{Seq: uint64(i), ID: fmt.Sprintf("r%d", i), Topic: "retry", Value: []byte{byte(i)}, Attempts: uint32(i % 2)}
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
	if s := p.Stats(); s != (Stats{Produced: 10, Retried: 10 * failures}) {
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
	got := byID(t, consume(t, c, len(recs), "retry"))
	for i, r := range recs {
		if v := mustHeader(t, got[r.ID], HeaderAttempt); v != strconv.Itoa(int(out[i].Attempts)) {
			t.Fatalf("record %s chime-attempt = %s, want %d", r.ID, v, out[i].Attempts)
		}
	}
}

func TestDeadLetter(t *testing.T) {
	c := newCluster(t, kfake.DefaultNumPartitions(3))
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, topic := range produceTopics(req) {
			if topic == "broken" {
				return failProduce(req, kerr.NotEnoughReplicas.Code), nil, true
			}
		}
		return nil, nil, false
	})
	p := newPublisher(t, c, fastRetries(Config{MaxAttempts: 3, BatchBytes: 64 << 10}))

	var recs []Record
	add := func(topic string, value []byte) {
		recs = append(recs, Record{Seq: uint64(len(recs)), ID: fmt.Sprintf("e%d", len(recs)), Topic: topic, Key: []byte("k"), Value: value,
			Headers: []Header{{Key: "h", Value: []byte("v")}}, Due: 1e18})
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
	var dead []Record
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
			if o.Attempts != 0 || !strings.Contains(o.Err, ErrInvalidTopic.Error()) {
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
	if s := p.Stats(); s != (Stats{Produced: 20, DeadLettered: 12, Retried: 10 * 2}) {
		t.Fatalf("Stats = %+v", s)
	}

	consume(t, c, 20, "fine")
	got := byID(t, consume(t, c, len(dead), DefaultDeadLetterTopic))
	for _, r := range dead {
		kr := got[r.ID]
		if kr == nil {
			t.Fatalf("dead letter %s missing", r.ID)
		}
		o := out[r.Seq]
		if v := mustHeader(t, kr, HeaderTopic); v != r.Topic {
			t.Fatalf("dead letter %s chime-topic = %q, want %q", r.ID, v, r.Topic)
		}
		if v := mustHeader(t, kr, HeaderError); v != o.Err {
			t.Fatalf("dead letter %s chime-error = %q, want %q", r.ID, v, o.Err)
		}
		if v := mustHeader(t, kr, HeaderAttempt); v != strconv.Itoa(int(o.Attempts)) {
			t.Fatalf("dead letter %s chime-attempt = %q, want %d", r.ID, v, o.Attempts)
		}
		if string(kr.Key) != "k" || mustHeader(t, kr, "h") != "v" {
			t.Fatalf("dead letter %s lost its key or headers: %q %v", r.ID, kr.Key, kr.Headers)
		}
		dropped, hasDropped := header(kr, HeaderDropped)
		if len(r.Value) > 1000 {
			if dropped != "value" || len(kr.Value) != 0 {
				t.Fatalf("oversized dead letter kept %d value bytes, chime-dropped %q", len(kr.Value), dropped)
			}
		} else if hasDropped || !bytes.Equal(kr.Value, r.Value) {
			t.Fatalf("dead letter %s value %q (dropped %q), want %q", r.ID, kr.Value, dropped, r.Value)
		}
	}
}

func TestDeadLetterFailsThenRefire(t *testing.T) {
	c := newCluster(t, kfake.DefaultNumPartitions(2))
	var down atomic.Bool
	down.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		return failProduce(req, kerr.NotEnoughReplicas.Code), nil, true
	})
	p := newPublisher(t, c, fastRetries(Config{MaxAttempts: 2, DeadLetterAttempts: 2}))

	recs := []Record{
		{Seq: 7, ID: "a", Topic: "t1", Value: []byte("a")},
		{Seq: 8, ID: "b", Topic: "t2", Value: []byte("b")},
	}
	out := p.Publish(t.Context(), recs)
	for i, o := range out {
		if o.Done || o.DeadLettered || o.Attempts != 2 || o.FiredAt != 0 ||
			!strings.Contains(o.Err, "dead-letter topic "+DefaultDeadLetterTopic) || !strings.Contains(o.Err, "Not Enough Replicas") {
			t.Fatalf("outcome %d = %+v, want not done after 2 attempts and a failed dead letter", i, o)
		}
	}
	if s := p.Stats(); s != (Stats{Retried: 2, Failed: 2}) {
		t.Fatalf("Stats = %+v", s)
	}

	// The caller fires them again later with the attempts so far: they go
	// straight to the dead-letter topic.
	down.Store(false)
	for i := range recs {
		recs[i].Attempts = out[i].Attempts
	}
	out = p.Publish(t.Context(), recs)
	for i, o := range out {
		if !o.Done || !o.DeadLettered || o.Attempts != 2 || !strings.Contains(o.Err, "attempts already made") {
			t.Fatalf("refired outcome %d = %+v, want dead-lettered without a new attempt", i, o)
		}
	}
	got := byID(t, consume(t, c, 2, DefaultDeadLetterTopic))
	if v := mustHeader(t, got["b"], HeaderTopic); v != "t2" {
		t.Fatalf("chime-topic = %q", v)
	}
}

func TestCancelWhileBrokerFails(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(1))
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return failProduce(req, kerr.NotEnoughReplicas.Code), nil, true
	})
	p := newPublisher(t, c, Config{MaxAttempts: 1000, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})

	recs := make([]Record, 50)
	for i := range recs {
		recs[i] = Record{Seq: uint64(i), ID: fmt.Sprint(i), Topic: []string{"x", "y"}[i%2], Value: []byte("v")}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	out := p.Publish(ctx, recs)
	if took := time.Since(start); took > 300*time.Millisecond+500*time.Millisecond {
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
	c := newCluster(t, kfake.NumBrokers(1))
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true // swallow the request: no response, no close
	})
	// WriteTimeout also bounds how long Close waits for the hung batch.
	p := newPublisher(t, c, Config{WriteTimeout: time.Second})

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	out := p.Publish(ctx, []Record{{Seq: 1, ID: "h", Topic: "hang", Value: []byte("v")}})
	if took := time.Since(start); took < 900*time.Millisecond || took > 1700*time.Millisecond {
		t.Fatalf("Publish took %v with a 200ms deadline and a 1s WriteTimeout; want about 1s", took)
	}
	if o := out[0]; o.Done || o.Attempts != 1 {
		t.Fatalf("outcome = %+v, want not done after one attempt (no retry after the deadline)", o)
	}

	ctx, cancel = context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	start = time.Now()
	out = p.Publish(ctx, []Record{{Seq: 2, ID: "h2", Topic: "hang", Value: []byte("v")}})
	if took := time.Since(start); took > 700*time.Millisecond {
		t.Fatalf("Publish took %v after a cancel at 200ms", took)
	}
	if o := out[0]; o.Done || !strings.Contains(o.Err, context.Canceled.Error()) {
		t.Fatalf("outcome = %+v, want not done, cancelled", o)
	}
}

func TestCloseStopsPublish(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(1))
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return failProduce(req, kerr.NotEnoughReplicas.Code), nil, true
	})
	p, err := New(Config{Brokers: c.ListenAddrs(), MaxAttempts: 1000, BackoffBase: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	recs := []Record{{Seq: 1, ID: "c", Topic: "closing", Value: []byte("v")}}
	done := make(chan []Outcome)
	go func() { done <- p.Publish(context.Background(), recs) }()

	// Close once the broker has refused at least one attempt.
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Retried == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no attempt failed within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case out := <-done:
		if o := out[0]; o.Done || !strings.Contains(o.Err, ErrClosed.Error()) || o.Attempts < 1 {
			t.Fatalf("outcome = %+v, want not done because the publisher closed", o)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Publish did not return after Close")
	}
	out := p.Publish(context.Background(), recs)
	if o := out[0]; o.Done || o.Err != ErrClosed.Error() || o.Attempts != 0 {
		t.Fatalf("Publish after Close = %+v", o)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		c, err := kfake.NewCluster(kfake.AllowAutoTopicCreation(), kfake.NumBrokers(3))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		p, err := New(Config{Brokers: c.ListenAddrs()})
		if err != nil {
			t.Fatal(err)
		}
		recs := make([]Record, 200)
		for i := range recs {
			recs[i] = Record{Seq: uint64(i), ID: fmt.Sprint(i), Topic: fmt.Sprintf("leak%d", i%4), Value: []byte("v")}
		}
		for _, o := range p.Publish(t.Context(), recs) {
			if !o.Done {
				t.Fatalf("outcome %+v", o)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConfigDefaults(t *testing.T) {
	p, err := New(Config{Brokers: []string{"127.0.0.1:9"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := p.cfg
	if cfg.MaxInFlight != 32 || cap(p.sem) != 32 || cfg.MaxAttempts != 5 || cfg.BackoffBase != 50*time.Millisecond ||
		cfg.BackoffMax != 5*time.Second || cfg.DeadLetterTopic != "chime.deadletter" ||
		cfg.BatchSize != DefaultBatchSize || cfg.BatchBytes != DefaultBatchBytes || cfg.WriteTimeout != DefaultWriteTimeout ||
		p.client.Timeout != DefaultWriteTimeout {
		t.Fatalf("defaults not filled: %+v", cfg)
	}
}

func TestNewRejects(t *testing.T) {
	ok := Config{Brokers: []string{"127.0.0.1:9092"}}
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Brokers", func(c *Config) { c.Brokers = nil }},
		{"Brokers", func(c *Config) { c.Brokers = []string{""} }},
		{"MaxInFlight", func(c *Config) { c.MaxInFlight = -1 }},
		{"MaxAttempts", func(c *Config) { c.MaxAttempts = -2 }},
		{"BackoffBase", func(c *Config) { c.BackoffBase, c.BackoffMax = time.Second, time.Millisecond }},
		{"BackoffJitter", func(c *Config) { c.BackoffJitter = 1.5 }},
		{"DeadLetterTopic", func(c *Config) { c.DeadLetterTopic = "dead letters" }},
		{"BatchBytes", func(c *Config) { c.BatchBytes = -1 }},
		{"WriteTimeout", func(c *Config) { c.WriteTimeout = -time.Second }},
	} {
		cfg := ok
		tc.edit(&cfg)
		p, err := New(cfg)
		if err == nil {
			p.Close()
			t.Fatalf("New accepted a bad %s", tc.field)
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Fatalf("error %q does not wrap ErrConfig or name %s", err, tc.field)
		}
	}
}

func TestValidTopic(t *testing.T) {
	for _, name := range []string{"a", "orders", "Orders.v1", "a_b-c.d", "...", strings.Repeat("x", 249), "0"} {
		if err := ValidTopic(name); err != nil {
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
		err := ValidTopic(name)
		if !errors.Is(err, ErrInvalidTopic) || !strings.Contains(err.Error(), rule) {
			t.Errorf("ValidTopic(%q) = %v, want ErrInvalidTopic naming %s", name, err, rule)
		}
	}
}

// TestBackoffSchedule pins the waits between rounds of attempts: doubling
// from BackoffBase up to BackoffMax, exact without jitter, and within
// ±BackoffJitter of that schedule with it.
func TestBackoffSchedule(t *testing.T) {
	want := []time.Duration{10, 20, 40, 80, 160, 300, 300, 300}
	for _, jitter := range []float64{-1, 0, 1} {
		p, err := New(Config{Brokers: []string{"127.0.0.1:9"}, BackoffBase: 10 * time.Millisecond,
			BackoffMax: 300 * time.Millisecond, BackoffJitter: jitter})
		if err != nil {
			t.Fatal(err)
		}
		spread := p.cfg.BackoffJitter
		if jitter == 0 && spread != DefaultBackoffJitter || jitter < 0 && spread != 0 {
			t.Fatalf("BackoffJitter %v became %v", jitter, spread)
		}
		for run := range 200 {
			bo := p.newBackOff()
			for n, w := range want {
				w *= time.Millisecond
				d := bo.NextBackOff()
				lo, hi := time.Duration(float64(w)*(1-spread)), time.Duration(float64(w)*(1+spread))+1
				if d < lo || d > hi {
					t.Fatalf("jitter %v, run %d: wait %d = %v, want within [%v, %v]", jitter, run, n+1, d, lo, hi)
				}
			}
		}
		p.Close()
	}
}

func TestMessageSizeBoundsTheEncoding(t *testing.T) {
	// Requests are cut at BatchBytes by messageSize; a record batch must
	// never come out larger than the sum of its records' bounds plus the
	// batch header, or a request could pass message.max.bytes.
	p, err := New(Config{Brokers: []string{"127.0.0.1:9"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r := Record{ID: "evt-1", Topic: "t", Key: []byte("some key"), Value: bytes.Repeat([]byte{'v'}, 300), Due: 1 << 62, Attempts: 4,
		Headers: []Header{{Key: "a", Value: []byte("b")}, {Key: "trace-id", Value: bytes.Repeat([]byte{'t'}, 200)}}}
	for _, st := range []*pending{{}, {dead: true, lastErr: errors.New(strings.Repeat("e", 500))}} {
		var (
			recs  []kafka.Record
			bound int64
		)
		for i := range 50 {
			m := p.message(&r, st, uint32(i+1), time.Unix(0, 1<<62))
			recs = append(recs, kafka.Record{Time: m.Time, Key: kafka.NewBytes(m.Key), Value: kafka.NewBytes(m.Value), Headers: m.Headers})
			bound += messageSize(&m)
			var buf bytes.Buffer
			rs := protocol.RecordSet{Version: 2, Records: kafka.NewRecordReader(recs...)}
			if _, err := rs.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			const batchHeader = 61
			if int64(buf.Len()) > bound+batchHeader {
				t.Fatalf("dead=%v: %d records encode to %d bytes, above their bound %d + %d", st.dead, i+1, buf.Len(), bound, batchHeader)
			}
		}
	}
}
