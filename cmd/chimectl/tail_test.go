package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/chimehq/chime/publish"
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
	return runTailEnv(ctx, now, nil, stdout, args...)
}

// runTailEnv is runTail with env as the environment.
func runTailEnv(ctx context.Context, now time.Time, env map[string]string, stdout *lockedBuffer, args ...string) (int, string) {
	var stderr lockedBuffer
	c := &cli{
		stdin:  strings.NewReader(""),
		stdout: stdout,
		stderr: &stderr,
		getenv: func(k string) string { return env[k] },
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

// TestTailOverTLSAndSASL: tail reads a broker that takes only TLS with a
// client certificate its CA signed and only SASL users, given the
// --kafka-tls* and --kafka-sasl-* flags, with either mechanism and the
// password from the environment or a file. A wrong password prints
// nothing and says why on stderr.
func TestTailOverTLSAndSASL(t *testing.T) {
	ca := publishtest.NewCA(t, "kafka-ca")
	b := publishtest.NewBroker(t, kfake.TLS(ca.ServerTLS(t, true)), kfake.EnableSASL(),
		kfake.Superuser(publish.SASLScramSHA512, "scram-user", "scram-secret"),
		kfake.Superuser(publish.SASLPlain, "plain-user", "plain-secret"))
	if err := b.CreateTopic("secured", 1, nil); err != nil {
		t.Fatal(err)
	}
	client := ca.Issue(t, "producer")
	p, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic("secured"),
		kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}}),
		kgo.SASL(scram.Auth{User: "scram-user", Pass: "scram-secret"}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	produce(t, p, fired("sec-1", []byte("k"), []byte("over TLS"), t0, 10*time.Millisecond))

	caFile, certFile, keyFile := ca.WriteFiles(t)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("plain-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsArgs := []string{"tail", "--topic", "secured", "--brokers", strings.Join(b.Addrs(), ","), "--from-beginning",
		"--kafka-tls-ca", caFile, "--kafka-tls-cert", certFile, "--kafka-tls-key", keyFile}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"SCRAM-SHA-512, password from the environment", map[string]string{"CHIME_KAFKA_SASL_PASSWORD": "scram-secret"},
			[]string{"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "scram-user"}},
		{"PLAIN, password from a file", map[string]string{"CHIME_KAFKA_SASL_PASSWORD": "not this one"},
			[]string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "plain-user", "--kafka-sasl-password-file", pwFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var out lockedBuffer
			code, stderr := runTailEnv(ctx, t0, tc.env, &out, append(append(tlsArgs, tc.args...), "--count", "1")...)
			if want := "2026-03-01T13:00:00+01:00 partition=0 offset=0 id=sec-1 key=k late=10ms lag=0s value=over TLS\n"; code != 0 || out.String() != want {
				t.Fatalf("exit %d, stderr %q, stdout %q; want %q", code, stderr, out.String(), want)
			}
		})
	}

	t.Run("wrong password", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var out lockedBuffer
		code, stderr := runTailEnv(ctx, t0, map[string]string{"CHIME_KAFKA_SASL_PASSWORD": "wrong"}, &out,
			append(tlsArgs, "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "scram-user", "--count", "1")...)
		if out.String() != "" || !strings.Contains(stderr, "the broker closed the connection") || strings.Contains(stderr, "wrong") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want nothing read, an error, and not the password", code, out.String(), stderr)
		}
		t.Logf("exit %d, stderr: %s", code, stderr)
	})
}

// A SASL mechanism without a password stops tail at once, naming the flag
// and the environment variable.
func TestTailSASLNeedsAPassword(t *testing.T) {
	var out lockedBuffer
	code, stderr := runTail(context.Background(), t0, &out, "tail", "--topic", "t", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u")
	if want := "chimectl tail: --kafka-sasl-mechanism PLAIN needs a password: give --kafka-sasl-password-file FILE or set CHIME_KAFKA_SASL_PASSWORD\n"; code != 2 || !strings.HasPrefix(stderr, want) {
		t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}
}

// tail's and bench's help say what each --kafka-* flag does.
func TestKafkaFlagsInHelp(t *testing.T) {
	for cmd, who := range map[string]string{"tail": "the consumer", "bench": "the consumer (and --api topic's producer)"} {
		r := chimectl(t, nil, "", cmd, "--help")
		for _, want := range []string{"--kafka-tls\n      connect " + who + " to the Kafka brokers over TLS",
			"--kafka-tls-ca file\n      PEM file of the CA certificates", "--kafka-tls-cert file\n      PEM file of a client certificate",
			"--kafka-tls-key file\n      PEM file of the private key", "--kafka-sasl-mechanism mechanism\n      authenticate to the brokers with SASL",
			"--kafka-sasl-user name\n      SASL user name", "--kafka-sasl-password-file file\n      file holding the SASL password",
			"CHIME_KAFKA_SASL_PASSWORD"} {
			if r.code != 0 || !strings.Contains(r.stdout, want) {
				t.Errorf("chimectl %s --help: exit %d, lacks %q:\n%s", cmd, r.code, want, r.stdout)
			}
		}
	}
}

// topicAsks records when a broker answered metadata requests naming one
// topic.
type topicAsks struct {
	mu    sync.Mutex
	times []time.Time
	first chan struct{} // closed at the first
}

// after is the first time the topic was asked for after t.
func (a *topicAsks) after(t time.Time) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, at := range a.times {
		if at.After(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// newTopicBroker starts a broker without topic and records the metadata
// requests that name topic without allowing its creation, as tail's do (the
// test's producer allows it, to be told apart): one answered before the
// topic is created found it missing.
func newTopicBroker(t *testing.T, topic string) (*publishtest.Broker, *topicAsks) {
	t.Helper()
	b := publishtest.NewBroker(t)
	asks := &topicAsks{first: make(chan struct{})}
	b.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.KeepControl()
		mreq := req.(*kmsg.MetadataRequest)
		if mreq.AllowAutoTopicCreation {
			return nil, nil, false
		}
		for _, rt := range mreq.Topics {
			if rt.Topic != nil && *rt.Topic == topic {
				asks.mu.Lock()
				if len(asks.times) == 0 {
					close(asks.first)
				}
				asks.times = append(asks.times, time.Now())
				asks.mu.Unlock()
			}
		}
		return nil, nil, false // kfake answers it as usual
	})
	return b, asks
}

// newTopicTail is what tailNewTopic measured.
type newTopicTail struct {
	// pickup is from the topic's creation to tail's first request for it
	// after that; printed from the produce's acknowledgement to the
	// record's line in tail's output (to within 5 ms).
	pickup, printed time.Duration
	out             string
}

// tailNewTopic starts tail with args (and a real clock) on a topic that does
// not exist yet, waits until tail has asked the broker for it and been told
// it is missing, then 2.5 s later creates it and produces a record that
// Chime fired 3 ms late.
func tailNewTopic(t *testing.T, args ...string) newTopicTail {
	t.Helper()
	const topic = "demo"
	b, asks := newTopicBroker(t, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, stderr lockedBuffer
	c := &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &stderr,
		getenv: func(string) string { return "" }, now: time.Now, loc: cet}
	done := make(chan int, 1)
	go func() {
		done <- c.run(ctx, append([]string{"tail", "--topic", topic, "--brokers", strings.Join(b.Addrs(), ","), "--count", "1"}, args...))
	}()
	select {
	case <-asks.first:
	case code := <-done:
		t.Fatalf("tail stopped before asking for the topic: exit %d, stderr %q", code, stderr.String())
	case <-ctx.Done():
		t.Fatal("tail never asked the broker for the topic")
	}
	// Create the topic a while later, as the quickstart does (the first
	// record fires 2 s after a schedule typed after tail started): past the
	// 2 s in which franz-go re-asks every 250 ms for a topic it was told is
	// missing, after which it asks only every MetadataMinAge (5 s).
	time.Sleep(2500 * time.Millisecond) // the scenario's pacing: no event marks the end of franz-go's quick re-asks
	if err := b.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	p, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(topic),
		kgo.AllowAutoTopicCreation()) // only to tell its metadata requests from tail's
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	due := time.Now().Add(-3 * time.Millisecond)
	produce(t, p, fired("new-topic-1", []byte("k"), []byte("hello"), due, 3*time.Millisecond))
	produced := time.Now()
	// Watch the output rather than wait for tail to exit, which takes its
	// time to close its client.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), "\n") {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("tail did not print the record in 30 s; stdout %q, stderr %q", out.String(), stderr.String())
		}
	}
	r := newTopicTail{printed: time.Since(produced), out: out.String()}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("tail: exit %d, stderr %q, stdout %q", code, stderr.String(), out.String())
		}
	case <-ctx.Done():
		t.Fatalf("tail printed %q and did not stop", out.String())
	}
	at, ok := asks.after(created)
	if !ok {
		t.Fatal("tail printed the record without asking for its topic after it was created")
	}
	r.pickup = at.Sub(created)
	t.Logf("tail asked for the topic %v after its creation, printed the record %v after its produce: %s",
		r.pickup, r.printed, strings.TrimSpace(r.out))
	return r
}

// lagOf is the lag= tail printed on line.
func lagOf(t *testing.T, line string) time.Duration {
	t.Helper()
	_, after, ok := strings.Cut(line, " lag=")
	lag, err := time.ParseDuration(strings.Fields(after + " ")[0])
	if !ok || err != nil {
		t.Fatalf("no lag= in %q", line)
	}
	return lag
}

// The bounds of the tests of a new topic. Tail asks every 50 ms and usually
// prints the record 20 to 400 ms after its produce (under -race on 2
// cores); the bounds leave room for a loaded CI machine. The tail before
// asked again only at franz-go's next metadata refresh, 4 to 5 s after the
// creation, and printed lag=4.264s for a record fired 3 ms late.
const (
	maxPickup  = time.Second
	maxPrinted = 2 * time.Second
)

// TestTailPicksUpANewTopicQuickly: the quickstart starts tail --from-beginning
// before anything created its topic. Tail must find the topic as soon as it
// exists, not at franz-go's next metadata refresh (5 s later by default),
// and its lag= must not count its own delay in finding it.
func TestTailPicksUpANewTopicQuickly(t *testing.T) {
	r := tailNewTopic(t, "--from-beginning")
	if !strings.Contains(r.out, " id=new-topic-1 ") || !strings.Contains(r.out, " late=3ms ") {
		t.Fatalf("printed %q, want the record with late=3ms", r.out)
	}
	if r.pickup > maxPickup {
		t.Errorf("tail asked for the topic %v after it was created, want under %v", r.pickup, maxPickup)
	}
	if r.printed > maxPrinted {
		t.Errorf("tail printed the record %v after it was produced, want under %v", r.printed, maxPrinted)
	}
	if lag := lagOf(t, r.out); lag > maxPrinted {
		t.Errorf("lag=%v, want under %v: tail's own delay in finding the topic", lag, maxPrinted)
	}
}

// Started at the end of a topic that did not exist yet, tail prints the
// records of the topic once it appears: they are all newer than tail.
// (The tail before started at the end it found seconds later, and never
// printed this record.)
func TestTailAtTheEndOfANewTopicPrintsItsFirstRecord(t *testing.T) {
	r := tailNewTopic(t)
	if !strings.Contains(r.out, " id=new-topic-1 ") {
		t.Fatalf("printed %q, want the record", r.out)
	}
	if r.pickup > maxPickup || r.printed > maxPrinted {
		t.Errorf("tail asked for the topic %v after it was created and printed the record %v after it was produced, want under %v and %v",
			r.pickup, r.printed, maxPickup, maxPrinted)
	}
}

// tail --help says what late= and lag= measure, and that a missing topic is
// waited for.
func TestTailHelpExplainsLateAndLag(t *testing.T) {
	r := chimectl(t, nil, "", "tail", "--help")
	for _, want := range []string{"late=  Chime's own lateness", "chime-fired-unix-ms minus chime-due-unix-ms",
		"lag=   how long after its due time the record reached this tail", "A topic that does not exist yet"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("chimectl tail --help: exit %d, lacks %q:\n%s", r.code, want, r.stdout)
		}
	}
}

// Interrupted while it waits for its topic to be created, tail stops at
// once, having said what it was waiting for.
func TestTailStopsWhenInterruptedWaitingForTheTopic(t *testing.T) {
	b := publishtest.NewBroker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	done := make(chan struct {
		code   int
		stderr string
	}, 1)
	go func() {
		code, stderr := runTail(ctx, t0, &out, "tail", "--topic", "never", "--brokers", strings.Join(b.Addrs(), ","))
		done <- struct {
			code   int
			stderr string
		}{code, stderr}
	}()
	time.AfterFunc(300*time.Millisecond, cancel)
	select {
	case r := <-done:
		if r.code != 0 || out.String() != "" || !strings.Contains(r.stderr, "topic never does not exist yet; waiting for it") {
			t.Fatalf("exit %d, stdout %q, stderr %q", r.code, out.String(), r.stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tail did not stop after its context was cancelled")
	}
	if info := b.TopicInfo("never"); info != nil {
		t.Fatalf("tail created the topic (%+v); it must only read", info)
	}
}
