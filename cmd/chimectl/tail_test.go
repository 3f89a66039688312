package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/publish/publishtest"
)

// startKafka runs a broker on a loopback port with topic (one partition)
// and returns its address and a producer for it.
func startKafka(t *testing.T, topic string) (brokers string, producer *kgo.Client) {
	t.Helper()
	b := publishtest.NewBroker(t)
	if err := b.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	return strings.Join(b.Addrs(), ","), producer
}

func produce(t *testing.T, p *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// fired is a record as publish produces it: the event's headers, then
// Chime's.
func fired(id string, key, value []byte, due time.Time, late time.Duration) *kgo.Record {
	ms := func(t time.Time) []byte { return []byte(strconv.FormatInt(t.UnixMilli(), 10)) }
	return &kgo.Record{Key: key, Value: value, Headers: []kgo.RecordHeader{
		{Key: "trace", Value: []byte("abc")},
		{Key: "chime-id", Value: []byte(id)},
		{Key: "chime-due-unix-ms", Value: ms(due)},
		{Key: "chime-fired-unix-ms", Value: ms(due.Add(late))},
		{Key: "chime-attempt", Value: []byte("1")},
	}}
}

// lockedBuffer is written by a running tail and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runTail runs chimectl with ctx, its clock at now, and returns its exit
// status and output.
func runTail(ctx context.Context, now time.Time, stdout *lockedBuffer, args ...string) (int, string) {
	var stderr lockedBuffer
	c := &cli{
		stdin:  strings.NewReader(""),
		stdout: stdout,
		stderr: &stderr,
		getenv: func(string) string { return "" },
		now:    func() time.Time { return now },
		loc:    cet,
	}
	return c.run(ctx, args), stderr.String()
}

func TestTailPrintsLatenessFromChimeHeaders(t *testing.T) {
	brokers, p := startKafka(t, "fired")
	produce(t, p,
		fired("order-42", []byte("customer-7"), []byte(`{"remind":true}`), t0, 25*time.Millisecond),
		fired("bin", []byte("k2"), []byte{0xff, 0x00}, t0.Add(-time.Second), 1500*time.Millisecond),
		&kgo.Record{Value: []byte(strings.Repeat("v", 200))},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out lockedBuffer
	code, stderr := runTail(ctx, t0, &out, "tail", "--topic", "fired", "--brokers", brokers, "--from-beginning", "--count", "3")
	want := `2026-03-01T13:00:00+01:00 partition=0 offset=0 id=order-42 key=customer-7 late=25ms lag=0s value={"remind":true}
2026-03-01T13:00:00+01:00 partition=0 offset=1 id=bin key=k2 late=1.5s lag=1s value=base64:/wA=
2026-03-01T13:00:00+01:00 partition=0 offset=2 id=- key=- late=- lag=- value=` + strings.Repeat("v", 120) + `... (200 bytes)
`
	if code != 0 || out.String() != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", code, stderr, out.String(), want)
	}
}

func TestTailJSON(t *testing.T) {
	brokers, p := startKafka(t, "fired")
	produce(t, p,
		fired("order-42", []byte("customer-7"), []byte(`{"remind":true}`), t0, 25*time.Millisecond),
		&kgo.Record{Value: []byte{0xff}},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out lockedBuffer
	now := t0.Add(2 * time.Second)
	code, stderr := runTail(ctx, now, &out, "--json", "tail", "--topic", "fired", "--brokers", brokers, "--from-beginning", "--count", "2")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if code != 0 || len(lines) != 2 {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, stderr, out.String())
	}
	var first, second map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{
		"received": "2026-03-01T12:00:02Z", "topic": "fired", "partition": 0.0, "offset": 0.0,
		"chime_id": "order-42", "key": "customer-7", "key_encoding": "utf8", "value": `{"remind":true}`,
		"due": "2026-03-01T12:00:00Z", "fired": "2026-03-01T12:00:00.025Z", "attempt": 1.0, "late_ms": 25.0, "lag_ms": 2000.0,
	} {
		if first[k] != v {
			t.Errorf("first record: %s = %#v, want %#v", k, first[k], v)
		}
	}
	if hs, _ := first["headers"].([]any); len(hs) != 5 {
		t.Errorf("first record headers %v, want all 5", first["headers"])
	}
	for k, v := range map[string]any{"offset": 1.0, "chime_id": nil, "value": "/w==", "value_encoding": "base64", "late_ms": nil, "lag_ms": nil, "due": nil} {
		if second[k] != v {
			t.Errorf("second record: %s = %#v, want %#v", k, second[k], v)
		}
	}
}

func TestTailStartsAtTheEndByDefault(t *testing.T) {
	brokers, p := startKafka(t, "fired")
	produce(t, p, &kgo.Record{Value: []byte("old")})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out lockedBuffer
	done := make(chan int, 1)
	go func() {
		code, _ := runTail(ctx, t0, &out, "tail", "--topic", "fired", "--brokers", brokers, "--count", "1")
		done <- code
	}()
	// Tail resolves "the end" when it starts, which the test cannot see, so
	// keep producing new records until it has printed one.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case code := <-done:
			if code != 0 || !strings.Contains(out.String(), " value=new-") || strings.Contains(out.String(), "old") ||
				strings.Count(out.String(), "\n") != 1 {
				t.Fatalf("exit %d, printed:\n%s\nwant exactly one new record", code, out.String())
			}
			return
		case <-tick.C:
			produce(t, p, &kgo.Record{Value: []byte("new-" + strconv.Itoa(i))})
		case <-ctx.Done():
			t.Fatalf("tail printed %q and did not stop", out.String())
		}
	}
}

func TestTailStopsWhenInterrupted(t *testing.T) {
	brokers, _ := startKafka(t, "quiet")
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	done := make(chan int, 1)
	go func() {
		code, _ := runTail(ctx, t0, &out, "tail", "--topic", "quiet", "--brokers", brokers)
		done <- code
	}()
	time.AfterFunc(200*time.Millisecond, cancel) // what SIGINT does through main's NotifyContext
	select {
	case code := <-done:
		if code != 0 || out.String() != "" {
			t.Fatalf("exit %d, printed %q", code, out.String())
		}
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("tail did not stop after its context was cancelled")
	}
}

func TestTailGroupContinuesWhereItStopped(t *testing.T) {
	brokers, p := startKafka(t, "fired")
	produce(t, p, &kgo.Record{Value: []byte("r0")}, &kgo.Record{Value: []byte("r1")}, &kgo.Record{Value: []byte("r2")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first, second lockedBuffer
	args := []string{"tail", "--topic", "fired", "--brokers", brokers, "--group", "ops", "--from-beginning"}
	if code, stderr := runTail(ctx, t0, &first, append(args, "--count", "2")...); code != 0 {
		t.Fatalf("first tail: exit %d, %s", code, stderr)
	}
	if code, stderr := runTail(ctx, t0, &second, append(args, "--count", "1")...); code != 0 {
		t.Fatalf("second tail: exit %d, %s", code, stderr)
	}
	if !strings.Contains(first.String(), "value=r0\n") || !strings.Contains(first.String(), "value=r1\n") || !strings.HasSuffix(second.String(), "offset=2 id=- key=- late=- lag=- value=r2\n") {
		t.Fatalf("first tail:\n%ssecond tail:\n%s", first.String(), second.String())
	}
}
