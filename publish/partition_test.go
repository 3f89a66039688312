package publish_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
)

// keyNotOn returns a key the murmur2 partitioner (the Java client's, which
// the Publisher copies) does not put on partition p of a topic of n
// partitions, so that a record landing on p can only have been put there
// by its own request.
func keyNotOn(t *testing.T, topic string, p, n int) []byte {
	t.Helper()
	java := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	for i := range 100 {
		k := fmt.Appendf(nil, "key-%d", i)
		if java.Partition(&kgo.Record{Key: k}, n) != p {
			return k
		}
	}
	t.Fatalf("no key of 100 avoids partition %d", p)
	return nil
}

// TestRecordPartitionAndTombstone: a record that names its partition lands
// on it (0 included), whatever its key; one that names none lands where
// murmur2 puts its key, in the same call; one that names a partition its
// topic does not have is dead-lettered at once, on the first attempt,
// with an error naming the partition and the partition count; a tombstone
// arrives with a null value, and an empty value as an empty one.
func TestRecordPartitionAndTombstone(t *testing.T) {
	const topic, partitions = "parts", 4
	c := publishtest.NewBroker(t, kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions))
	p := newPublisher(t, c, fastRetries(publish.Config{MaxAttempts: 5}))

	recs := []publish.Record{
		{ID: "to-2", Key: keyNotOn(t, topic, 2, partitions), Value: []byte("v2"), Partition: 2, HasPartition: true},
		{ID: "to-0", Key: keyNotOn(t, topic, 0, partitions), Value: []byte("v0"), HasPartition: true},
		{ID: "murmur", Key: []byte("customer-7"), Value: []byte("m"), Partition: 3}, // no HasPartition: ignored
		{ID: "tomb", Key: []byte("user-7"), Value: []byte("not sent"), Tombstone: true, Partition: 1, HasPartition: true},
		{ID: "empty", Key: []byte("user-8"), Value: []byte{}},
		{ID: "nil", Key: []byte("user-9")},
		{ID: "nowhere", Key: []byte("k"), Value: []byte("lost"), Partition: partitions, HasPartition: true},
	}
	for i := range recs {
		recs[i].Seq, recs[i].Topic, recs[i].Due = uint64(i), topic, 1e18
	}
	out := p.Publish(t.Context(), recs)
	for i, o := range out {
		r := recs[i]
		if r.ID == "nowhere" {
			want := "partition 4 of topic parts was asked for, but the topic has 4 partitions (0 to 3)"
			if !o.Done || !o.DeadLettered || o.Attempts != 1 || !strings.Contains(o.Err, want) ||
				!strings.Contains(o.Err, publish.ErrNoPartition.Error()) {
				t.Fatalf("outcome of %s = %+v; want dead-lettered after its one attempt, with an error naming %q", r.ID, o, want)
			}
			continue
		}
		if !o.Done || o.DeadLettered || o.Attempts != 1 || o.Err != "" {
			t.Fatalf("outcome of %s = %+v, want produced on the first attempt", r.ID, o)
		}
	}
	if s := p.Stats(); s != (publish.Stats{Produced: uint64(len(recs) - 1), DeadLettered: 1}) {
		t.Fatalf("Stats = %+v, want no retry: a missing partition is permanent", s)
	}

	got := consume(t, c, len(recs)-1, topic)
	java := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	for _, tc := range []struct {
		id        string
		partition int32
		value     []byte // nil: a null value
	}{
		{"to-2", 2, []byte("v2")},
		{"to-0", 0, []byte("v0")},
		{"murmur", int32(java.Partition(&kgo.Record{Key: []byte("customer-7")}, partitions)), []byte("m")},
		{"tomb", 1, nil},
		{"empty", int32(java.Partition(&kgo.Record{Key: []byte("user-8")}, partitions)), []byte{}},
		{"nil", int32(java.Partition(&kgo.Record{Key: []byte("user-9")}, partitions)), []byte{}},
	} {
		kr, ok := got[tc.id]
		switch {
		case !ok:
			t.Errorf("%s was not consumed", tc.id)
		case kr.Kafka.Partition != tc.partition:
			t.Errorf("%s landed on partition %d, want %d", tc.id, kr.Kafka.Partition, tc.partition)
		case (kr.Kafka.Value == nil) != (tc.value == nil) || string(kr.Kafka.Value) != string(tc.value):
			t.Errorf("%s has value %q (null: %v), want %q (null: %v)", tc.id, kr.Kafka.Value, kr.Kafka.Value == nil, tc.value, tc.value == nil)
		}
	}

	dead := consume(t, c, 1, publish.DefaultDeadLetterTopic)["nowhere"]
	if dead.Kafka == nil || dead.Topic != topic || dead.Error != out[6].Err || dead.Value() != "lost" {
		t.Fatalf("dead letter of nowhere: %+v, want chime-topic %s, chime-error %q and its value", dead, topic, out[6].Err)
	}
}
