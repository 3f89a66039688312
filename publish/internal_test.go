package publish

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

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
		cfg.UnackedTimeout != DefaultUnackedTimeout || p.client.Timeout != DefaultWriteTimeout {
		t.Fatalf("defaults not filled: %+v", cfg)
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
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
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

// TestValueBytes: a nil value is null, an empty one empty (and free: an
// event without a payload allocated nothing for its value when it was
// produced as null, and allocates nothing now), anything else itself.
func TestValueBytes(t *testing.T) {
	if valueBytes(nil) != nil {
		t.Error("nil is not a null value")
	}
	if b := valueBytes(emptyValue); b == nil || b.Len() != 0 {
		t.Errorf("an empty value is %#v", b)
	}
	if n := testing.AllocsPerRun(100, func() { _ = valueBytes(emptyValue) }); n != 0 {
		t.Errorf("an empty value allocates %v times", n)
	}
	if b := valueBytes([]byte("abc")); b == nil || b.Len() != 3 {
		t.Errorf("a value of 3 bytes is %#v", b)
	}
}
