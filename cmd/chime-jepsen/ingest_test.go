package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	"github.com/chimehq/chime/rpc/auth"
	"github.com/chimehq/chime/rpc/ingest"
)

// TestProduceIngestRecords produces the three kinds of ingest record to a broker of the test's
// own and decodes what landed with Chime's own decoder: each op is ok with the partition and
// offset it landed at, one key's records share a partition, and Chime reads them as the
// history says (the id, the delay or deliver-at, the target topic, the payload, a cancel).
func TestProduceIngestRecords(t *testing.T) {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := newIngestProducer(ctx, broker.ListenAddrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	w := &workload{h: &history{}, opTimeout: 10 * time.Second, ingest: cl}
	at := time.Now().Truncate(time.Millisecond).Add(3 * time.Second)
	w.produceIngest(1, "k-1", "jepsen.a", "p-k-1-1", 1500*time.Millisecond, time.Time{}, time.Now().Add(1500*time.Millisecond))
	w.produceIngest(1, "k-1", "jepsen.b", "p-k-1-2", 0, at, at)
	w.produceIngest(1, "k-1", "", "", 0, time.Time{}, time.Time{})
	ops := w.h.snapshot()
	if len(ops) != 3 {
		t.Fatalf("%d ops", len(ops))
	}
	for i, op := range ops {
		if op.F != checker.FIngest || op.Type != checker.TypeOK || op.ID != ingestTopic+"/k-1" || op.Partition != ops[0].Partition || op.Offset != ops[0].Offset+int64(i) {
			t.Errorf("op %d: %+v", i, op)
		}
	}
	if ops[0].Action != checker.IngestSchedule || ops[0].DelayNs != int64(1500*time.Millisecond) || ops[1].DeliverAtNs != at.UnixNano() ||
		ops[2].Action != checker.IngestTombstone || ops[2].Payload != "" {
		t.Errorf("ops %+v", ops)
	}
	if !w.maxDue.Equal(at) {
		t.Errorf("maxDue %v, want the latest due %v", w.maxDue, at)
	}

	rd, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...), kgo.ConsumeTopics(ingestTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	dec, err := ingest.NewDecoder("chime", ingest.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []ingest.Op
	for len(got) < 3 && ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			rec := &ingest.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, ingest.Header{Key: h.Key, Value: h.Value})
			}
			op, err := dec.Decode(rec)
			if err != nil {
				t.Fatalf("Chime rejects record %d: %v", r.Offset, err)
			}
			got = append(got, op)
		})
	}
	if len(got) != 3 {
		t.Fatalf("read %d records back", len(got))
	}
	first, second := got[0].Events[0], got[1].Events[0]
	if first.GetId() != ops[0].ID || first.GetTopic() != "jepsen.a" || string(first.GetPayload()) != "p-k-1-1" ||
		first.GetDelay().AsDuration() != 1500*time.Millisecond || first.GetDeliverAt() != nil {
		t.Errorf("first record decodes as %v", first)
	}
	if second.GetId() != ops[0].ID || second.GetTopic() != "jepsen.b" || !second.GetDeliverAt().AsTime().Equal(at) || second.GetDelay() != nil {
		t.Errorf("second record decodes as %v", second)
	}
	if !got[2].Cancel || !slices.Equal(got[2].IDs, []string{ops[0].ID}) {
		t.Errorf("tombstone decodes as %+v", got[2])
	}
}

// TestServeArgsCarryTheIngestTopic: a node consumes the ingest topic when the run has one.
func TestServeArgsCarryTheIngestTopic(t *testing.T) {
	n := &node{id: "n1", ip: "10.77.0.11", shards: 8, ingestTopics: ingestTopic}
	args, err := n.serveArgs()
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(args, "--ingest-topics"); i < 0 || i+1 >= len(args) || args[i+1] != ingestTopic {
		t.Errorf("args %q", args)
	}
	n.ingestTopics = ""
	if args, _ := n.serveArgs(); slices.Contains(args, "--ingest-topics") {
		t.Errorf("args without ingest %q", args)
	}
}

// TestAuthFileNamesTheIngestCredential: with --secure, the auth file names the workload's
// credential for the ingest topic, and names none when the run has no ingest topic.
func TestAuthFileNamesTheIngestCredential(t *testing.T) {
	for _, topic := range []string{ingestTopic, ""} {
		out := t.TempDir()
		s, err := newSecurity(out, topic)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, "pki", "auth.json"))
		if err != nil || s.authFile != filepath.Join(out, "pki", "auth.json") {
			t.Fatal(err, s.authFile)
		}
		if _, err := auth.Parse(b); err != nil {
			t.Fatalf("topic %q: the auth file does not parse: %v\n%s", topic, err, b)
		}
		want := `"ingest": {"chime.schedule": "workload"}`
		if has := strings.Contains(string(b), want); has != (topic != "") {
			t.Errorf("topic %q: auth file:\n%s", topic, b)
		}
	}
}

// TestSummaryShowsIngest: the summary has a line for the ingest topic.
func TestSummaryShowsIngest(t *testing.T) {
	s := summary(checker.Results{Ingest: checker.IngestTotals{IDs: 5, Fired: 4, Schedules: 6, Tombstones: 1}, IngestLost: 1, IngestAfterTombstone: 2})
	if !strings.Contains(s, "\ningest: 5 ids (4 fired): 6 schedules and 1 tombstones acked, 0 failed, 0 unknown; ingest_lost=1 ingest_after_tombstone=2 ingest_after_replace=0 ingest_rejected=0\n") {
		t.Errorf("summary:\n%s", s)
	}
}
