package publish

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestParseHeadersReadsWhatMessageWrites parses the headers message puts on
// a dead-letter record, from each client's header type.
func TestParseHeadersReadsWhatMessageWrites(t *testing.T) {
	due := time.UnixMilli(1_700_000_000_123)
	sent := due.Add(42 * time.Millisecond)
	p := &Publisher{cfg: Config{BatchBytes: 40, DeadLetterTopic: "dlq"}}
	r := &Record{ID: "order-42", Topic: "orders", Value: []byte(strings.Repeat("v", 100)), Due: due.UnixNano(),
		Headers: []Header{{Key: HeaderID, Value: []byte("forged by the event")}, {Key: "trace", Value: []byte("abc")}}}
	m := p.message(r, &pending{dead: true, lastErr: errors.New("broker said no")}, 5, sent)
	want := Headers{ID: "order-42", Due: due, Fired: sent, Attempt: 5, Topic: "orders", Error: "broker said no", Dropped: "value,headers"}

	var franz []kgo.RecordHeader
	var wire []kmsg.Header
	var own []Header
	for _, h := range m.Headers {
		franz = append(franz, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		wire = append(wire, kmsg.Header{Key: h.Key, Value: h.Value})
		own = append(own, Header{Key: h.Key, Value: h.Value})
	}
	check := func(client string, got Headers, err error) {
		t.Helper()
		if err != nil || got != want {
			t.Errorf("%s: ParseHeaders = %+v, %v; want %+v", client, got, err, want)
		}
	}
	got, err := ParseHeaders(m.Headers) // []kafka.Header
	check("kafka-go", got, err)
	got, err = ParseHeaders(franz)
	check("kgo", got, err)
	got, err = ParseHeaders(wire)
	check("kmsg", got, err)
	got, err = ParseHeaders(own)
	check("publish", got, err)
	if late, ok := got.Late(); !ok || late != 42*time.Millisecond {
		t.Errorf("Late() = %v, %v; want 42ms, true", late, ok)
	}
}

func TestParseHeadersNamesAMalformedHeader(t *testing.T) {
	got, err := ParseHeaders([]kafka.Header{
		{Key: HeaderID, Value: []byte("x")},
		{Key: HeaderDue, Value: []byte("soon")},
		{Key: HeaderAttempt, Value: []byte("2")},
	})
	if err == nil || !strings.Contains(err.Error(), HeaderDue) || !strings.Contains(err.Error(), `"soon"`) {
		t.Errorf("error %v does not name %s and its value", err, HeaderDue)
	}
	if got.ID != "x" || got.Attempt != 2 || !got.Due.IsZero() {
		t.Errorf("the well-formed headers were not kept: %+v", got)
	}
	if _, ok := got.Late(); ok {
		t.Error("Late is known without a due time")
	}
	if got, err := ParseHeaders[kafka.Header](nil); err != nil || got != (Headers{}) {
		t.Errorf("no headers: %+v, %v", got, err)
	}
}
