package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chimehq/chime/node/nodetest"
	"github.com/chimehq/chime/publish/publishtest"
)

// ingestProducer produces to an ingest topic with franz-go, a client
// Chime does not produce with, each record to the partition it names, and
// waits for the broker's acks=all.
type ingestProducer struct {
	t  *testing.T
	cl *kgo.Client
}

func newIngestProducer(t *testing.T, brokers ...string) *ingestProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.AllowAutoTopicCreation(), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &ingestProducer{t: t, cl: cl}
}

// produce produces key (nil: none) and value (nil: a tombstone) with
// headers given as name, value pairs, to partition 0 of topic.
func (p *ingestProducer) produce(topic string, key, value []byte, headers ...string) *kgo.Record {
	p.t.Helper()
	r := &kgo.Record{Topic: topic, Partition: 0, Key: key, Value: value}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		p.t.Fatalf("producing to %s: %v", topic, err)
	}
	return r
}

func millis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// TestIngestTopicOfDev schedules through chimed dev's ingest topic with an
// independent producer: records fire on time and never early, a record
// produced again for its key reschedules it, a tombstone cancels it,
// chime-partition picks the target partition, and a malformed record goes
// to chime.ingest.rejected with its error while the records after it on
// its partition fire.
func TestIngestTopicOfDev(t *testing.T) {
	if testing.Short() {
		t.Skip("runs chimed dev; skipped with -short")
	}
	kafkaAddr := freeAddr(t)
	p := startDev(t, "--grpc-addr", freeAddr(t), "--kafka-addr", kafkaAddr, "--data-dir", t.TempDir(), "--shards", "4",
		"--ingest-topics", "chime.schedule,etf1.schedules=etf1,karafka.schedules=karafka,sky.schedules=sky")
	p.banner(t)
	prod := newIngestProducer(t, kafkaAddr)
	out := publishtest.Collect(t, []string{kafkaAddr}, "ingest.out")
	rejected := publishtest.Collect(t, []string{kafkaAddr}, "chime.ingest.rejected")

	start := time.Now()
	due := start.Add(3 * time.Second)
	const src = "chime.schedule"
	// A malformed record first: the ones after it on partition 0 still fire.
	prod.produce(src, []byte("bad-time"), []byte("x"), "chime-deliver-at", "tomorrow", "chime-topic", "ingest.out")
	prod.produce(src, []byte("at"), []byte("fired at"), "chime-deliver-at", due.UTC().Format(time.RFC3339Nano), "chime-topic", "ingest.out", "team", "billing")
	prod.produce(src, []byte("delay"), []byte("fired after"), "chime-delay", "3s", "chime-topic", "ingest.out")
	prod.produce(src, []byte("moved"), []byte("first"), "chime-deliver-at", millis(due), "chime-topic", "ingest.out")
	prod.produce(src, nil, []byte("no key"), "chime-delay", "1s", "chime-topic", "ingest.out")
	prod.produce(src, []byte("moved"), []byte("second"), "chime-deliver-at", millis(due.Add(2*time.Second)), "chime-topic", "ingest.out")
	prod.produce(src, []byte("cancelled"), []byte("never"), "chime-deliver-at", millis(due), "chime-topic", "ingest.out")
	prod.produce(src, []byte("reserved"), []byte("x"), "chime-delay", "1s", "chime-topic", "chime.ingest.rejected")
	prod.produce(src, []byte("cancelled"), nil)
	prod.produce(src, []byte("typo"), []byte("x"), "chime-delay", "1s", "chime-topic", "ingest.out", "chime-delai", "2s")
	prod.produce(src, []byte("part"), []byte("to partition 2"), "chime-delay", "2s", "chime-topic", "ingest.out", "chime-partition", "2")
	prod.produce(src, []byte("tomb"), []byte{}, "chime-delay", "2s", "chime-topic", "ingest.out", "chime-deliver-tombstone", "true")
	prod.produce(src, []byte("last"), []byte("after every bad one"), "chime-delay", "3s", "chime-topic", "ingest.out")

	// The schedulers Chime replaces, each with a malformed record before a
	// good one on the same partition. They take Unix seconds: the first
	// whole second after due.
	epoch := strconv.FormatInt(due.Truncate(time.Second).Unix()+1, 10)
	epochAt := time.Unix(due.Truncate(time.Second).Unix()+1, 0)
	prod.produce("etf1.schedules", []byte("etf1-bad"), []byte("x"), "scheduler-target-topic", "ingest.out")
	prod.produce("etf1.schedules", []byte("etf1"), []byte("from etf1"), "scheduler-epoch", epoch, "scheduler-target-topic", "ingest.out", "scheduler-target-key", "etf1-target")
	prod.produce("karafka.schedules", []byte("karafka-bad"), []byte("x"), "schedule_schema_version", "2.0.0", "schedule_source_type", "schedule",
		"schedule_target_epoch", epoch, "schedule_target_topic", "ingest.out")
	prod.produce("karafka.schedules", []byte("karafka"), []byte("from karafka"), "schedule_schema_version", "1.0.0", "schedule_source_type", "schedule",
		"schedule_target_epoch", epoch, "schedule_target_topic", "ingest.out", "schedule_target_key", "karafka-target")
	prod.produce("sky.schedules", []byte("sky-bad"), []byte("not avro"))
	prod.produce("sky.schedules", []byte("sky"), skySchedule(t, epochAt.UnixMilli(), "ingest.out", "sky-target", []byte("from sky"), map[string][]byte{"origin": []byte("sky")}))

	byID := out.WaitIDs(9, 60*time.Second).ByID
	var checkFrom func(src, id, value string, notBefore time.Time) publishtest.Record
	check := func(id, value string, notBefore time.Time) publishtest.Record {
		t.Helper()
		return checkFrom(src, id, value, notBefore)
	}
	checkFrom = func(src, id, value string, notBefore time.Time) publishtest.Record {
		t.Helper()
		r, ok := byID[src+"/"+id]
		if !ok {
			t.Fatalf("%s never fired; fired: %v", id, keys(byID))
		}
		if r.Value() != value {
			t.Errorf("%s fired %q, want %q", id, r.Value(), value)
		}
		if r.Kafka.Timestamp.Before(notBefore.Truncate(time.Millisecond)) { // a record's timestamp is in milliseconds
			t.Errorf("%s fired at %s, before %s: early", id, r.Kafka.Timestamp.Format(time.RFC3339Nano), notBefore.Format(time.RFC3339Nano))
		}
		if got := headerOf(r, "chime-source"); !strings.HasPrefix(got, src+"/0/") {
			t.Errorf("%s: chime-source %q, want %s/0/<offset>", id, got, src)
		}
		return r
	}
	if r := check("at", "fired at", due); string(r.Kafka.Key) != "at" {
		t.Errorf("at: key %q, want the record key", r.Kafka.Key)
	} else if team, _ := r.Header("team"); team != "billing" {
		t.Errorf("at: header team = %q, want the record's header copied", team)
	}
	check("delay", "fired after", start.Add(3*time.Second))
	check("last", "after every bad one", start.Add(3*time.Second))
	if r := check("part", "to partition 2", start.Add(2*time.Second)); r.Kafka.Partition != 2 {
		t.Errorf("part landed in partition %d, want 2 (chime-partition)", r.Kafka.Partition)
	}
	check("moved", "second", due.Add(2*time.Second))
	if r := check("tomb", "", start.Add(2*time.Second)); r.Kafka.Value != nil {
		t.Errorf("tomb fired with value %q, want a tombstone (chime-deliver-tombstone)", r.Kafka.Value)
	}
	for _, tc := range []struct {
		src, id, value, key string
		headers             map[string]string // each header the dialect's consumers expect
	}{
		{"etf1.schedules", "etf1", "from etf1", "etf1-target", map[string]string{"scheduler-key": "etf1", "scheduler-topic": "etf1.schedules", "scheduler-epoch": epoch}},
		{"karafka.schedules", "karafka", "from karafka", "karafka-target", map[string]string{"schedule_source_key": "karafka", "schedule_source_topic": "karafka.schedules",
			"schedule_source_partition": "0", "schedule_target_epoch": epoch}},
		{"sky.schedules", "sky", "from sky", "sky-target", map[string]string{"origin": "sky"}},
	} {
		r := checkFrom(tc.src, tc.id, tc.value, epochAt)
		if string(r.Kafka.Key) != tc.key {
			t.Errorf("%s: fired with key %q, want %q", tc.src, r.Kafka.Key, tc.key)
		}
		for k, v := range tc.headers {
			if got := headerOf(r, k); got != v {
				t.Errorf("%s: fired with header %s = %q, want %q", tc.src, k, got, v)
			}
		}
	}
	if ts := headerOf(byID["etf1.schedules/etf1"], "scheduler-timestamp"); ts == "" {
		t.Error("etf1: fired without scheduler-timestamp")
	}
	// The cancelled event was due with "at": it would have fired by now,
	// before "moved" (due 2 s later), had the tombstone not cancelled it.
	got := out.Consumed()
	for _, r := range got.Records {
		if id, _ := r.Header("chime-id"); id == src+"/cancelled" || (id == src+"/moved" && r.Value() == "first") {
			t.Errorf("%s fired %q after a later record replaced or cancelled it", id, r.Value())
		}
	}

	wantRejected := map[string]string{
		"bad-time":    `chime-deliver-at: "tomorrow"`,
		"":            "key: ",
		"reserved":    "topic: ",
		"typo":        "chime-delai: ",
		"etf1-bad":    "scheduler-epoch: required",
		"karafka-bad": "schedule_schema_version: ",
		"sky-bad":     "value: ",
	}
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		return len(rejected.Consumed().Records) >= len(wantRejected), fmt.Sprintf("%d rejected records, want %d", len(rejected.Consumed().Records), len(wantRejected))
	})
	for _, r := range rejected.Consumed().Records {
		key := string(r.Kafka.Key)
		want, ok := wantRejected[key]
		if !ok {
			t.Errorf("record %q rejected: %s", key, headerOf(r, "chime-error"))
			continue
		}
		delete(wantRejected, key)
		if e := headerOf(r, "chime-error"); !strings.HasPrefix(e, want) {
			t.Errorf("record %q rejected with chime-error %q, want it to start with %q", key, e, want)
		}
		if s := headerOf(r, "chime-source"); !strings.HasSuffix(strings.TrimRight(s, "0123456789"), "/0/") {
			t.Errorf("record %q rejected with chime-source %q, want <topic>/0/<offset>", key, s)
		}
	}
	for key := range wantRejected {
		t.Errorf("record %q was not rejected", key)
	}
}

// skySchedule is a sky-uk/kafka-message-scheduler schedule, encoded in
// Avro by hamba/avro with the schema sky publishes.
func skySchedule(t *testing.T, atMillis int64, topic, key string, value []byte, headers map[string][]byte) []byte {
	t.Helper()
	b, err := os.ReadFile("../../rpc/ingest/sky-schemas/schedule.avsc")
	if err != nil {
		t.Fatal(err)
	}
	schema, err := avro.Parse(string(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := avro.Marshal(schema, map[string]any{"time": atMillis, "topic": topic, "key": []byte(key), "value": value, "headers": headers})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func headerOf(r publishtest.Record, key string) string {
	v, _ := r.Header(key)
	return v
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// ingestPartitions is how many partitions of topic each member consumes,
// as the Admin API's Status (chimectl status) tells it.
func (c *cluster) ingestPartitions(topic string) map[string]int {
	out := map[string]int{}
	for _, m := range c.status(c.order[0]).GetMembers() {
		for _, p := range m.GetIngest() {
			if p.GetTopic() == topic {
				out[m.GetId()]++
			}
		}
	}
	return out
}

// TestIngestSurvivesKillingItsBusiestConsumer streams records into the
// ingest topic of a 3-node cluster and kills -9 the node that consumes
// the most of its partitions: every record the broker acknowledged fires
// (its partition is read again from the last committed offset by a node
// that lives), and none fires before its delay has passed since it was
// produced.
func TestIngestSurvivesKillingItsBusiestConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster for a minute; skipped with -short")
	}
	t.Parallel()
	const src, target = "chime.schedule", "ingest.out"
	c := newCluster(t, 3, "--ingest-topics", src)
	prod := newIngestProducer(t, c.brokers...)
	for _, topic := range []string{src, target} {
		createTopic(t, prod.cl, topic, 4)
	}
	var busiest *daemon
	var most int
	nodetest.WaitFor(t, 60*time.Second, func() (bool, string) {
		counts := c.ingestPartitions(src)
		total := 0
		most = -1
		for _, id := range c.order {
			total += counts[id]
			if counts[id] > most {
				most, busiest = counts[id], c.nodes[id]
			}
		}
		return total == 4 && len(counts) == 3, fmt.Sprintf("status shows the 4 partitions of %s over the 3 nodes: %v", src, counts)
	})
	out := publishtest.Collect(t, c.brokers, target)

	type sent struct {
		at    time.Time
		delay time.Duration
	}
	acked := map[string]sent{}
	killAt := time.Now().Add(5 * time.Second)
	end := time.Now().Add(15 * time.Second)
	killed := false
	// A record every 20 ms: ~50 a second, a stream the kill lands in.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for i := 0; time.Now().Before(end); i++ {
		if !killed && time.Now().After(killAt) {
			t.Logf("killing %s, which consumes %d partitions of %s", busiest.nodeID, most, src)
			busiest.kill()
			killed = true
		}
		key := fmt.Sprintf("r-%d", i)
		delay := time.Duration(1+i%4) * time.Second
		r := &kgo.Record{Topic: src, Partition: int32(i % 4), Key: []byte(key), Value: []byte(key), Headers: []kgo.RecordHeader{
			{Key: "chime-delay", Value: []byte(delay.String())}, {Key: "chime-topic", Value: []byte(target)}}}
		at := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := prod.cl.ProduceSync(ctx, r).FirstErr()
		cancel()
		if err == nil {
			acked[src+"/"+key] = sent{at, delay}
		}
		<-pace.C
	}
	if len(acked) < 300 {
		t.Fatalf("only %d records acknowledged by the broker", len(acked))
	}
	want := map[string]time.Time{}
	for id, s := range acked {
		want[id] = s.at.Add(s.delay)
	}
	got := collector{out}.waitIDs(t, want, 90*time.Second)
	for id, s := range acked {
		// A record's timestamp is in milliseconds.
		if r := got[id]; r.Kafka.Timestamp.Before(s.at.Add(s.delay).Truncate(time.Millisecond)) {
			t.Errorf("%s fired at %s, %v after it was produced, before its delay of %v: early", id,
				r.Kafka.Timestamp.Format(time.RFC3339Nano), r.Kafka.Timestamp.Sub(s.at), s.delay)
		}
	}
	t.Logf("%d records acknowledged, all fired, none early", len(acked))
}

// createTopic creates topic with partitions on the broker cl talks to.
func createTopic(t *testing.T, cl *kgo.Client, topic string, partitions int32) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Topics {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			t.Fatalf("creating %s: %v", topic, err)
		}
	}
}

// TestIngestActsForTheTopicsCredential: on a secured node, an ingest
// topic's records act for the credential the auth file names for the
// topic: one within its topics and id prefixes fires, one outside them is
// rejected with the authorizer's words, and the records after go on.
func TestIngestActsForTheTopicsCredential(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a secured chimed; skipped with -short")
	}
	t.Parallel()
	p := newSecurePKI(t)
	app, err := p.clients.Client("app")
	if err != nil {
		t.Fatal(err)
	}
	authFile := p.dir + "/auth.json"
	copyFileContent(t, authFile, fmt.Sprintf(`{
  "tokens": [{"name": "billing", "sha256": "%s", "role": "scheduler", "topics": ["billing.*"], "id_prefixes": ["chime.schedule/inv-"]}],
  "certificates": [{"name": "test-admin", "common_name": "app", "role": "admin"}],
  "ingest": {"chime.schedule": "billing"}
}`, sha256Hex("billing-token")))
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	c.addWith("n1", func(d *daemon) { p.secure(t, d, p.clients.File, authFile, app) },
		"--ingest-topics", "chime.schedule", "--kafka-insecure", "--kafka-auto-create-topics")
	prod := newIngestProducer(t, c.brokers...)
	out := publishtest.Collect(t, c.brokers, "billing.due")
	rejected := publishtest.Collect(t, c.brokers, "chime.ingest.rejected")
	const src = "chime.schedule"
	prod.produce(src, []byte("inv-1"), []byte("ok"), "chime-delay", "1s", "chime-topic", "billing.due")
	prod.produce(src, []byte("inv-2"), []byte("x"), "chime-delay", "1s", "chime-topic", "reminders")
	prod.produce(src, []byte("other-3"), []byte("x"), "chime-delay", "1s", "chime-topic", "billing.due")
	prod.produce(src, []byte("inv-4"), []byte("ok"), "chime-delay", "1s", "chime-topic", "billing.due")

	byID := out.WaitIDs(2, 60*time.Second).ByID
	for _, id := range []string{"inv-1", "inv-4"} {
		if _, ok := byID[src+"/"+id]; !ok {
			t.Errorf("%s never fired; fired %v", id, keys(byID))
		}
	}
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		return len(rejected.Consumed().Records) >= 2, fmt.Sprintf("%d rejected records, want 2", len(rejected.Consumed().Records))
	})
	want := map[string]string{
		"inv-2":   `"reminders" is outside "billing"'s topics`,
		"other-3": `not permitted for credential "billing"`,
	}
	for _, r := range rejected.Consumed().Records {
		if e := headerOf(r, "chime-error"); !strings.Contains(e, want[string(r.Kafka.Key)]) || want[string(r.Kafka.Key)] == "" {
			t.Errorf("record %q rejected with %q, want it to say %q", r.Kafka.Key, e, want[string(r.Kafka.Key)])
		}
	}
}
