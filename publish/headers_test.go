package publish

import (
	"errors"
	"strings"
	"testing"
	"time"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestParseHeadersReadsWhatMessageWrites parses, with the API's
// chimev1.ParseHeaders, the headers message puts on a dead-letter record,
// from each client's header type.
func TestParseHeadersReadsWhatMessageWrites(t *testing.T) {
	due := time.UnixMilli(1_700_000_000_123)
	sent := due.Add(42 * time.Millisecond)
	p := &Publisher{cfg: Config{BatchBytes: 40, DeadLetterTopic: "dlq"}}
	r := &Record{ID: "order-42", Topic: "orders", Value: []byte(strings.Repeat("v", 100)), Due: due.UnixNano(),
		Headers: []Header{{Key: HeaderID, Value: []byte("forged by the event")}, {Key: "trace", Value: []byte("abc")}}}
	m := p.message(r, &pending{dead: true, lastErr: errors.New("broker said no")}, 5, sent)
	want := chimev1.Headers{ID: "order-42", Due: due, Fired: sent, Attempt: 5, Topic: "orders", Error: "broker said no", Dropped: "value,headers"}

	var franz []kgo.RecordHeader
	var wire []kmsg.Header
	var own []Header
	for _, h := range m.Headers {
		franz = append(franz, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		wire = append(wire, kmsg.Header{Key: h.Key, Value: h.Value})
		own = append(own, Header{Key: h.Key, Value: h.Value})
	}
	check := func(client string, got chimev1.Headers, err error) {
		t.Helper()
		if err != nil || got != want {
			t.Errorf("%s: ParseHeaders = %+v, %v; want %+v", client, got, err, want)
		}
	}
	got, err := chimev1.ParseHeaders(m.Headers) // []kafka.Header
	check("kafka-go", got, err)
	got, err = chimev1.ParseHeaders(franz)
	check("kgo", got, err)
	got, err = chimev1.ParseHeaders(wire)
	check("kmsg", got, err)
	got, err = chimev1.ParseHeaders(own)
	check("publish", got, err)
	if late, ok := got.Late(); !ok || late != 42*time.Millisecond {
		t.Errorf("Late() = %v, %v; want 42ms, true", late, ok)
	}
}
