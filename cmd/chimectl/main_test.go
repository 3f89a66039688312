package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/rpc/rpctest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the time on every clock in these tests: the server's, the test
// backend's and chimectl's.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// cet is the local zone of chimectl in these tests, so that text output is
// the same on every machine.
var cet = time.FixedZone("CET", 3600)

// startChime serves the real rpc.Server over an in-memory backend on a
// loopback port.
func startChime(t *testing.T) (addr string, b *rpctest.Backend) {
	t.Helper()
	now := func() time.Time { return t0 }
	b = rpctest.New(now)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.Register(gs, rpc.NewServer(b, rpc.Limits{}, now, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	t.Cleanup(func() { gs.Stop(); <-done })
	return ln.Addr().String(), b
}

type result struct {
	code           int
	stdout, stderr string
}

// chimectl runs the command in-process with the given environment and stdin.
func chimectl(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	c := &cli{
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errOut,
		getenv: func(k string) string { return env[k] },
		now:    func() time.Time { return t0 },
		loc:    cet,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := c.run(ctx, args)
	return result{code, out.String(), errOut.String()}
}

func (r result) want(t *testing.T, code int, stdout, stderr string) {
	t.Helper()
	if r.code != code || r.stdout != stdout || r.stderr != stderr {
		t.Fatalf("got exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr, code, stdout, stderr)
	}
}

func TestHelpTeachesEveryCommandAndFlag(t *testing.T) {
	top := chimectl(t, nil, "", "--help")
	if top.code != 0 || top.stderr != "" {
		t.Fatalf("--help: exit %d, stderr %q", top.code, top.stderr)
	}
	for _, want := range []string{"Usage:", "Commands:", "Examples:", "--addr address", "--timeout duration", "--json", "CHIME_ADDR", "default 127.0.0.1:7070", "default 10s"} {
		if !strings.Contains(top.stdout, want) {
			t.Errorf("chimectl --help lacks %q:\n%s", want, top.stdout)
		}
	}
	if got := chimectl(t, nil, "", "help"); got.stdout != top.stdout || got.code != 0 {
		t.Errorf("chimectl help differs from chimectl --help")
	}
	if got := chimectl(t, map[string]string{"CHIME_ADDR": "chime-9:7070"}, "", "--help"); !strings.Contains(got.stdout, "(default chime-9:7070)") {
		t.Errorf("--help does not show the CHIME_ADDR default:\n%s", got.stdout)
	}

	for _, cmd := range commands() {
		if !strings.Contains(top.stdout, "  "+cmd.name+" ") {
			t.Errorf("chimectl --help does not list %s", cmd.name)
		}
		r := chimectl(t, nil, "", cmd.name, "--help")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("%s --help: exit %d, stderr %q", cmd.name, r.code, r.stderr)
		}
		if h := chimectl(t, nil, "", "help", cmd.name); h.stdout != r.stdout {
			t.Errorf("chimectl help %s differs from chimectl %s --help", cmd.name, cmd.name)
		}
		if !strings.Contains(r.stdout, cmd.about) {
			t.Errorf("%s --help lacks its description", cmd.name)
		}
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		cmd.flags(&cli{}, fs)
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(r.stdout, "  --"+f.Name+" ") && !strings.Contains(r.stdout, "  --"+f.Name+"\n") {
				t.Errorf("%s --help does not document --%s:\n%s", cmd.name, f.Name, r.stdout)
			}
		})
		for _, g := range []string{"--addr", "--timeout", "--json"} {
			if !strings.Contains(r.stdout, "  "+g) {
				t.Errorf("%s --help does not document global %s", cmd.name, g)
			}
		}
		_, examples, ok := strings.Cut(r.stdout, "\nExamples:\n")
		if n := strings.Count(examples, "chimectl "+cmd.name); !ok || n < 2 || n > 3 {
			t.Errorf("%s --help has %d examples, want 2-3:\n%s", cmd.name, n, examples)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	r := chimectl(t, nil, "", "bogus")
	if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "chimectl: unknown command \"bogus\"\n") || !strings.Contains(r.stderr, "Commands:") {
		t.Fatalf("unknown command: %+v", r)
	}
	r = chimectl(t, nil, "")
	if r.code != 2 || !strings.HasPrefix(r.stderr, "chimectl: no command given") {
		t.Fatalf("no command: %+v", r)
	}
	addr, b := startChime(t)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"schedule", "--in", "1s"}, "--topic is required"},
		{[]string{"schedule", "--topic", "t"}, "set one of --in (a delay) and --at (a time)"},
		{[]string{"schedule", "--topic", "t", "--in", "1s", "--at", "2030-01-01T00:00:00Z"}, "set exactly one of --in and --at, not both"},
		{[]string{"schedule", "--topic", "t", "--at", "tomorrow"}, `--at "tomorrow" is not an RFC 3339 time like 2030-01-02T09:00:00Z or 2030-01-02T10:00:00+01:00`},
		{[]string{"schedule", "--topic", "t", "--in", "1s", "--header", "novalue"}, `--header "novalue": want name=value`},
		{[]string{"schedule", "--topic", "t", "--in", "1s", "--payload", "x", "--payload-file", "-"}, "set at most one of --payload and --payload-file"},
		{[]string{"schedule", "--topic", "t", "--in", "soon"}, `invalid value "soon" for flag --in: parse error`},
		{[]string{"get"}, "want exactly one event id, got 0 arguments"},
		{[]string{"cancel", "a", "b"}, "want exactly one event id, got 2 arguments"},
		{[]string{"tail"}, "--topic is required"},
		{[]string{"get", "--nope", "x"}, "flag provided but not defined: --nope"},
		{[]string{"update", "x"}, "nothing to change: give --in or --at, --payload, --payload-file, --key, --header or --no-headers"},
		{[]string{"update", "x", "--in", "1s", "--at", "2030-01-01T00:00:00Z"}, "set exactly one of --in and --at, not both"},
		{[]string{"update", "x", "--header", "a=b", "--no-headers"}, "set at most one of --header and --no-headers"},
		{[]string{"update", "--in", "1s"}, "want exactly one event id, got 0 arguments"},
		{[]string{"list", "--state", "done"}, `--state "done": want scheduled, fired, cancelled or dead_lettered`},
		{[]string{"list", "--due-before", "1h", "--due-after", "2h"}, "--due-before 1h is not after --due-after 2h"},
		{[]string{"count", "--due-after", "yesterday"}, `--due-after "yesterday" is neither an RFC 3339 time like 2030-01-02T09:00:00Z nor a duration from now like 2h or -30m`},
		{[]string{"list", "order-42"}, `list takes no arguments, got ["order-42"] (filter with --prefix)`},
		{[]string{"list", "--priority", "9,10"}, `--priority "10": want 0 (lowest) to 9 (highest)`},
		{[]string{"count", "--priority", "high"}, `--priority "high": want 0 (lowest) to 9 (highest)`},
		{[]string{"cancel", "--priority", "9"}, "--priority alone selects too much to cancel: add --prefix, --topic or a due range (--due-before, --due-after)"},
		{[]string{"update", "--priority", "9", "--shift", "1h"}, "--priority alone selects too much to shift: add --prefix, --topic or a due range (--due-before, --due-after)"},
		{[]string{"update", "--topic", "t", "--priority", "-1", "--shift", "1h"}, `--priority "-1": want 0 (lowest) to 9 (highest)`},
		{[]string{"cancel", "x", "--prefix", "order-"}, "give an event id or filters (--prefix, --topic, --priority, --due-before, --due-after), not both"},
		{[]string{"cancel", "x", "--dry-run"}, "--dry-run needs filters (--prefix, --topic, --priority, --due-before, --due-after)"},
		{[]string{"update", "--prefix", "order-"}, "with filters, give --shift, a duration like 1h or -30m: how far each event moves"},
		{[]string{"update", "--shift", "1h"}, "--shift and --dry-run need filters (--prefix, --topic, --priority, --due-before, --due-after)"},
		{[]string{"update", "x", "--prefix", "order-", "--shift", "1h"}, "give an event id or filters (--prefix, --topic, --priority, --due-before, --due-after) with --shift, not both"},
		{[]string{"update", "--prefix", "order-", "--shift", "1h", "--payload", "p"}, "--payload changes one event: with filters, only --shift (and --dry-run) apply"},
	} {
		cmd := tc.args[0]
		r := chimectl(t, nil, "", append([]string{"--addr", addr}, tc.args...)...)
		want := "chimectl " + cmd + ": " + tc.msg + "\nRun 'chimectl " + cmd + " --help' for usage.\n"
		r.want(t, 2, "", want)
	}
	if calls := b.Calls(); len(calls) != 0 {
		t.Fatalf("usage errors reached the server: %+v", calls)
	}
}

func TestSchedule(t *testing.T) {
	addr, b := startChime(t)
	args := []string{"--addr", addr, "schedule", "--topic", "orders", "--in", "2s", "--id", "order-42",
		"--key", "customer-7", "--payload", "hello", "--header", "trace=abc", "--header", "eq=a=b"}
	chimectl(t, nil, "", args...).want(t, 0, "scheduled order-42 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")
	chimectl(t, nil, "", args...).want(t, 0, "already scheduled order-42 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")

	rec, found, _ := b.Get(context.Background(), "order-42")
	wantHeaders := []raftfsm.Header{{Key: "trace", Value: []byte("abc")}, {Key: "eq", Value: []byte("a=b")}}
	if !found || rec.Topic != "orders" || string(rec.Key) != "customer-7" || string(rec.Payload) != "hello" ||
		len(rec.Headers) != 2 || rec.Headers[0].Key != wantHeaders[0].Key || string(rec.Headers[1].Value) != "a=b" {
		t.Fatalf("stored %+v", rec)
	}

	// The global flags work after the command too.
	chimectl(t, nil, "", "schedule", "--topic", "orders", "--at", "2026-03-01T14:00:00+01:00", "--id", "abs", "--json", "--addr", addr).
		want(t, 0, `{"id":"abs","due":"2026-03-01T13:00:00Z","existing":false,"version":1}`+"\n", "")
	chimectl(t, nil, "", "--json", "--addr", addr, "schedule", "--topic", "orders", "--at", "2026-03-01T13:00:00Z", "--id", "abs").
		want(t, 0, `{"id":"abs","due":"2026-03-01T13:00:00Z","existing":true,"version":0}`+"\n", "")

	// A due time in the past is said so.
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--at", "2026-03-01T11:58:30Z", "--id", "past").
		want(t, 0, "scheduled past due 2026-03-01T12:58:30+01:00 (1m30s ago)\n", "")

	r := chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--in", "90m")
	if !regexp.MustCompile(`^scheduled [a-z2-7]{26} due 2026-03-01T14:30:00\+01:00 \(in 1h30m\)\n$`).MatchString(r.stdout) || r.code != 0 {
		t.Fatalf("generated id: %+v", r)
	}
}

func TestSchedulePayloadFromAFileOrStdin(t *testing.T) {
	addr, b := startChime(t)
	chimectl(t, nil, "from stdin\n", "--addr", addr, "schedule", "--topic", "t", "--in", "1s", "--id", "stdin", "--payload-file", "-").
		want(t, 0, "scheduled stdin due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	binary := []byte{0, 1, 2, 0xff, 'x'}
	path := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(path, binary, 0o600); err != nil {
		t.Fatal(err)
	}
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "1s", "--id", "file", "--payload-file", path).
		want(t, 0, "scheduled file due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	for id, want := range map[string]string{"stdin": "from stdin\n", "file": string(binary)} {
		if rec, _, _ := b.Get(context.Background(), id); string(rec.Payload) != want {
			t.Errorf("%s: stored payload %q, want %q", id, rec.Payload, want)
		}
	}
	r := chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "1s", "--payload-file", filepath.Join(t.TempDir(), "missing"))
	if r.code != 1 || !strings.HasPrefix(r.stderr, "chimectl: --payload-file: open ") {
		t.Fatalf("missing file: %+v", r)
	}
}

func TestServerErrorsPrintTheCodeAndExit1(t *testing.T) {
	addr, _ := startChime(t)
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "a b", "--in", "1s").
		want(t, 1, "", `chimectl: InvalidArgument: event.topic: "a b" is not a valid Kafka topic name (1-249 characters of [a-zA-Z0-9._-], not "." or "..")`+"\n")
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "-1s").
		want(t, 1, "", "chimectl: InvalidArgument: event.delay: must not be negative (got -1s)\n")
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "1s", "--id", "x").want(t, 0, "scheduled x due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "2s", "--id", "x").
		want(t, 1, "", `chimectl: AlreadyExists: event.id: "x" already scheduled with different content`+"\n")
	chimectl(t, nil, "", "--addr", addr, "get", "nope").want(t, 1, "", `chimectl: NotFound: id: no event "nope" (never scheduled, or settled longer ago than the cluster's retention and removed)`+"\n")
	chimectl(t, nil, "", "--addr", addr, "cancel", "nope").want(t, 1, "", `chimectl: NotFound: id: no event "nope" (never scheduled, or settled longer ago than the cluster's retention and removed)`+"\n")

	// Nothing listens on a port we just closed: Unavailable, promptly.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	r := chimectl(t, nil, "", "--addr", dead, "--timeout", "5s", "get", "x")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "chimectl: Unavailable: ") {
		t.Fatalf("dead address: %+v", r)
	}
}

func TestAddrComesFromTheEnvironmentUnlessGiven(t *testing.T) {
	addr, _ := startChime(t)
	env := map[string]string{"CHIME_ADDR": addr}
	chimectl(t, env, "", "schedule", "--topic", "t", "--in", "1s", "--id", "env").want(t, 0, "scheduled env due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	r := chimectl(t, map[string]string{"CHIME_ADDR": "127.0.0.1:1"}, "", "--addr", addr, "get", "env")
	if r.code != 0 {
		t.Fatalf("--addr did not override CHIME_ADDR: %+v", r)
	}
}

func TestGetAndCancelText(t *testing.T) {
	addr, b := startChime(t)
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--in", "2s", "--id", "order-42",
		"--key", "customer-7", "--payload", `{"remind":true}`, "--header", "trace=abc", "--header", "bin=x").want(t, 0, "scheduled order-42 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")
	chimectl(t, nil, "", "--addr", addr, "get", "order-42").want(t, 0, `id          order-42
state       scheduled
due         2026-03-01T13:00:02+01:00 (in 2s)
created_at  2026-03-01T13:00:00+01:00
version     1
priority    5
topic       orders
key         customer-7
payload     {"remind":true}
headers     trace=abc
            bin=x
fired_at    -
attempts    0
last_error  -
`, "")

	chimectl(t, nil, "", "--addr", addr, "cancel", "order-42").want(t, 0, "id     order-42\nstate  cancelled\n", "")
	chimectl(t, nil, "", "--addr", addr, "cancel", "order-42", "--json").want(t, 0, `{"id":"order-42","state":"cancelled"}`+"\n", "")
	r := chimectl(t, nil, "", "--addr", addr, "get", "order-42")
	if !strings.Contains(r.stdout, "\nstate         cancelled\n") || !strings.Contains(r.stdout, "\ncancelled_at  2026-03-01T13:00:00+01:00\n") {
		t.Fatalf("get of a cancelled event:\n%s", r.stdout)
	}

	// A binary payload without key, fired after two attempts.
	path := filepath.Join(t.TempDir(), "p")
	if err := os.WriteFile(path, []byte{0xff, 0x00, 0x10}, 0o600); err != nil {
		t.Fatal(err)
	}
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "bin", "--in", "1s", "--id", "bin", "--payload-file", path).want(t, 0, "scheduled bin due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	b.Fire("bin", t0.Add(1003*time.Millisecond), 2)
	chimectl(t, nil, "", "--addr", addr, "get", "bin").want(t, 0, `id          bin
state       fired
due         2026-03-01T13:00:01+01:00 (in 1s)
created_at  2026-03-01T13:00:00+01:00
version     1
priority    5
topic       bin
key         (none)
payload     base64:/wAQ
headers     (none)
fired_at    2026-03-01T13:00:01.003+01:00
attempts    2
last_error  -
`, "")
	chimectl(t, nil, "", "--addr", addr, "cancel", "bin").
		want(t, 1, "", `chimectl: FailedPrecondition: id: event "bin" already fired at 2026-03-01T12:00:01.003Z; it can no longer be cancelled`+"\n")

	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "t", "--in", "1s", "--id", "dead", "--payload", strings.Repeat("é", 300)).want(t, 0, "scheduled dead due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	b.DeadLetter("dead", t0.Add(time.Minute), 5, "kafka: MESSAGE_TOO_LARGE", "chime.dlq")
	r = chimectl(t, nil, "", "--addr", addr, "get", "dead")
	for _, want := range []string{
		"\nstate              dead_lettered\n",
		"\npayload            " + strings.Repeat("é", 256) + "... (600 bytes)\n",
		"\nfired_at           2026-03-01T13:01:00+01:00\n",
		"\nattempts           5\n",
		"\nlast_error         kafka: MESSAGE_TOO_LARGE\n",
		"\ndead_letter_topic  chime.dlq\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get of a dead-lettered event lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestGetJSON(t *testing.T) {
	addr, b := startChime(t)
	path := filepath.Join(t.TempDir(), "p")
	if err := os.WriteFile(path, []byte{0xff, 0x00, 0x10}, 0o600); err != nil {
		t.Fatal(err)
	}
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--in", "2s", "--id", "order-42",
		"--key", "customer-7", "--payload-file", path, "--header", "trace=abc").want(t, 0, "scheduled order-42 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")

	want := `{"id":"order-42","state":"scheduled","due":"2026-03-01T12:00:02Z","created_at":"2026-03-01T12:00:00Z",` +
		`"topic":"orders","key":"customer-7","key_encoding":"utf8","payload":"/wAQ","payload_encoding":"base64",` +
		`"headers":[{"key":"trace","value":"abc","value_encoding":"utf8"}],"fired_at":null,"cancelled_at":null,` +
		`"attempts":0,"last_error":"","dead_letter_topic":"","version":1,"priority":5}` + "\n"
	chimectl(t, nil, "", "--addr", addr, "--json", "get", "order-42").want(t, 0, want, "")

	b.Fire("order-42", t0.Add(2*time.Second+5*time.Millisecond), 1)
	r := chimectl(t, nil, "", "--addr", addr, "get", "order-42", "--json")
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("get --json printed %q: %v", r.stdout, err)
	}
	for k, v := range map[string]any{"id": "order-42", "state": "fired", "due": "2026-03-01T12:00:02Z", "topic": "orders",
		"fired_at": "2026-03-01T12:00:02.005Z", "attempts": 1.0} {
		if got[k] != v {
			t.Errorf("get --json: %s = %v, want %v", k, got[k], v)
		}
	}
}

// TestSchedulePriorityAndWindow: --priority and --window reach the event,
// and get shows them; a priority out of range is refused by the server,
// naming the field.
func TestSchedulePriorityAndWindow(t *testing.T) {
	addr, _ := startChime(t)
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "alerts", "--in", "2s", "--id", "a1",
		"--priority", "9", "--window", "1m").want(t, 0, "scheduled a1 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")
	r := chimectl(t, nil, "", "--addr", addr, "--json", "get", "a1")
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("get --json printed %q: %v", r.stdout, err)
	}
	if got["priority"] != 9.0 || got["window"] != "1m0s" {
		t.Fatalf("get --json: priority %v, window %v; want 9 and 1m0s", got["priority"], got["window"])
	}
	r = chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "alerts", "--in", "2s", "--priority", "10")
	if r.code == 0 || !strings.Contains(r.stderr, "event.priority: 10 is not a priority") {
		t.Fatalf("--priority 10: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestSchedulePartitionAndTombstone: --partition (0 included) and
// --tombstone reach the event, get shows them in text and JSON (and
// neither for an event without them), the help says what they do, and the
// server refuses a negative partition and a tombstone with a payload,
// naming the field.
func TestSchedulePartitionAndTombstone(t *testing.T) {
	addr, _ := startChime(t)
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "users", "--in", "2s", "--id", "u7",
		"--key", "user-7", "--partition", "0", "--tombstone").want(t, 0, "scheduled u7 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")
	chimectl(t, nil, "", "--addr", addr, "get", "u7").want(t, 0, `id          u7
state       scheduled
due         2026-03-01T13:00:02+01:00 (in 2s)
created_at  2026-03-01T13:00:00+01:00
version     1
priority    5
topic       users
partition   0
key         user-7
payload     (null: a tombstone)
headers     (none)
fired_at    -
attempts    0
last_error  -
`, "")
	r := chimectl(t, nil, "", "--addr", addr, "--json", "get", "u7")
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("get --json printed %q: %v", r.stdout, err)
	}
	if got["partition"] != 0.0 || got["tombstone"] != true {
		t.Fatalf("get --json: partition %v, tombstone %v; want 0 and true", got["partition"], got["tombstone"])
	}
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "users", "--in", "2s", "--id", "plain").want(t, 0, "scheduled plain due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")
	r = chimectl(t, nil, "", "--addr", addr, "--json", "get", "plain")
	if strings.Contains(r.stdout, "partition") || strings.Contains(r.stdout, "tombstone") {
		t.Fatalf("get --json of an event with neither shows them: %s", r.stdout)
	}
	if r = chimectl(t, nil, "", "--addr", addr, "get", "plain"); strings.Contains(r.stdout, "partition") || !strings.Contains(r.stdout, "\npayload     (empty)\n") {
		t.Fatalf("get of an event with neither:\n%s", r.stdout)
	}

	r = chimectl(t, nil, "", "schedule", "--help")
	for _, want := range []string{"-partition partition", "-tombstone", "null value"} {
		if !strings.Contains(r.stdout+r.stderr, want) {
			t.Errorf("schedule --help lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	r = chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "users", "--in", "2s", "--partition", "-1")
	if r.code == 0 || !strings.Contains(r.stderr, "event.partition: -1, must be 0 or more") {
		t.Fatalf("--partition -1: exit %d, stderr %q", r.code, r.stderr)
	}
	r = chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "users", "--in", "2s", "--tombstone", "--payload", "x")
	if r.code == 0 || !strings.Contains(r.stderr, "event.payload: 1 bytes with tombstone set, must be empty") {
		t.Fatalf("--tombstone --payload x: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestRateLimitRefusesBadRules: rules that do not parse are a usage error
// before any call.
func TestRateLimitRefusesBadRules(t *testing.T) {
	for _, args := range [][]string{{"rate-limit", "set", "reports=5000"}, {"rate-limit", "set"}, {"rate-limit", "frob"}} {
		r := chimectl(t, nil, "", append([]string{"--addr", "127.0.0.1:1"}, args...)...)
		if r.code != 2 {
			t.Errorf("%v: exit %d (stderr %q), want 2", args, r.code, r.stderr)
		}
	}
}

func TestShowBytes(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		max  int
		want string
	}{
		{[]byte("plain text"), 0, "plain text"},
		{[]byte("tab\there"), 0, "base64:dGFiCWhlcmU="},
		{[]byte{0xff}, 0, "base64:/w=="},
		{[]byte("abcdef"), 4, "abcd... (6 bytes)"},
		{[]byte("aéé"), 4, "aé... (5 bytes)"}, // never cut inside a rune
		{nil, 0, ""},
	} {
		if got := showBytes(tc.in, tc.max); got != tc.want {
			t.Errorf("showBytes(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		2 * time.Second:                            "2s",
		1998 * time.Millisecond:                    "2s",
		1450 * time.Millisecond:                    "1.5s",
		250 * time.Millisecond:                     "250ms",
		90 * time.Minute:                           "1h30m",
		30*time.Minute - time.Millisecond:          "30m",
		3*24*time.Hour + 4*time.Hour + time.Second: "3d4h",
		48 * time.Hour:                             "2d",
		36 * time.Hour:                             "36h",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestUpdate(t *testing.T) {
	addr, b := startChime(t)
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--in", "2s", "--id", "order-42",
		"--key", "customer-7", "--payload", "first", "--header", "trace=abc").want(t, 0, "scheduled order-42 due 2026-03-01T13:00:02+01:00 (in 2s)\n", "")
	chimectl(t, nil, "", "--addr", addr, "update", "order-42", "--in", "1h", "--payload", "second").
		want(t, 0, "updated order-42 to version 2, due 2026-03-01T14:00:00+01:00 (in 1h)\n", "")
	rec, _, _ := b.Get(context.Background(), "order-42")
	if string(rec.Payload) != "second" || string(rec.Key) != "customer-7" || len(rec.Headers) != 1 || rec.Version != 2 {
		t.Fatalf("after the update: %+v", rec)
	}
	chimectl(t, nil, "", "--addr", addr, "update", "order-42", "--no-headers", "--key", "", "--if-version", "2", "--json").
		want(t, 0, `{"id":"order-42","due":"2026-03-01T13:00:00Z","version":3}`+"\n", "")
	if rec, _, _ = b.Get(context.Background(), "order-42"); len(rec.Headers) != 0 || len(rec.Key) != 0 {
		t.Fatalf("headers and key not removed: %+v", rec)
	}
	chimectl(t, nil, "", "--addr", addr, "update", "order-42", "--in", "1s", "--if-version", "2").
		want(t, 1, "", `chimectl: FailedPrecondition: expected_version: event "order-42" is at version 3, not 2`+"\n")
	b.Fire("order-42", t0, 1)
	chimectl(t, nil, "", "--addr", addr, "update", "order-42", "--in", "1s").
		want(t, 1, "", `chimectl: FailedPrecondition: id: event "order-42" has already fired; only a scheduled event can be updated`+"\n")
}

func TestScheduleReplace(t *testing.T) {
	addr, b := startChime(t)
	args := []string{"--addr", addr, "schedule", "--topic", "sessions", "--id", "s-7"}
	chimectl(t, nil, "", append(args, "--in", "30m", "--payload", "first")...).want(t, 0, "scheduled s-7 due 2026-03-01T13:30:00+01:00 (in 30m)\n", "")
	chimectl(t, nil, "", append(args, "--in", "40m", "--payload", "second")...).
		want(t, 1, "", "chimectl: AlreadyExists: event.id: \"s-7\" already scheduled with different content\n")
	chimectl(t, nil, "", append(args, "--in", "40m", "--payload", "second", "--replace")...).
		want(t, 0, "replaced s-7 due 2026-03-01T13:40:00+01:00 (in 40m), version 2\n", "")
	if rec, _, _ := b.Get(context.Background(), "s-7"); string(rec.Payload) != "second" || rec.Version != 2 {
		t.Fatalf("after --replace: %+v", rec)
	}
}

func TestListCountAndBulkCancel(t *testing.T) {
	addr, b := startChime(t)
	for i, in := range []string{"3s", "1s", "2s", "1s"} {
		chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--in", in, "--id", fmt.Sprintf("order-42/%d", i), "--payload", "p").
			want(t, 0, fmt.Sprintf("scheduled order-42/%d due 2026-03-01T13:00:0%c+01:00 (in %s)\n", i, in[0], in), "")
	}
	chimectl(t, nil, "", "--addr", addr, "schedule", "--topic", "orders", "--in", "1s", "--id", "order-43/0").want(t, 0, "scheduled order-43/0 due 2026-03-01T13:00:01+01:00 (in 1s)\n", "")
	b.Fire("order-42/1", t0.Add(time.Second), 1)

	r := chimectl(t, nil, "", "--addr", addr, "list", "--prefix", "order-42/", "--limit", "3")
	r.want(t, 0,
		"ID          STATE      DUE                        WHEN   VERSION  TOPIC   PAYLOAD\n"+
			"order-42/1  fired      2026-03-01T13:00:01+01:00  in 1s  1        orders  p\n"+
			"order-42/3  scheduled  2026-03-01T13:00:01+01:00  in 1s  1        orders  p\n"+
			"order-42/2  scheduled  2026-03-01T13:00:02+01:00  in 2s  1        orders  p\n",
		r.stderr)
	token, ok := strings.CutPrefix(strings.TrimSpace(r.stderr), "more events follow: continue with --page-token ")
	if !ok {
		t.Fatalf("list --limit 3 of 4: stderr %q", r.stderr)
	}
	chimectl(t, nil, "", "--addr", addr, "list", "--prefix", "order-42/", "--page-token", token).want(t, 0,
		"ID          STATE      DUE                        WHEN   VERSION  TOPIC   PAYLOAD\n"+
			"order-42/0  scheduled  2026-03-01T13:00:03+01:00  in 3s  1        orders  p\n", "")
	r = chimectl(t, nil, "", "--addr", addr, "list", "--prefix", "order-42/", "--state", "scheduled", "--due-after", "2s", "--json")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, `"id":"order-42/2"`) || !strings.Contains(r.stdout, `"id":"order-42/0"`) {
		t.Fatalf("list --json: %+v", r)
	}
	chimectl(t, nil, "", "--addr", addr, "count", "--prefix", "order-4").want(t, 0, "5\n", "")
	chimectl(t, nil, "", "--addr", addr, "count", "--state", "scheduled,fired", "--json").want(t, 0, `{"count":5}`+"\n", "")

	chimectl(t, nil, "", "--addr", addr, "update", "--prefix", "order-42/", "--shift", "1h", "--dry-run").
		want(t, 0, "matched  3\nmoved    0 (dry run)\n", "")
	chimectl(t, nil, "", "--addr", addr, "update", "--prefix", "order-42/", "--shift", "1h", "--json").
		want(t, 0, `{"matched":3,"moved":3,"skipped":0}`+"\n", "")
	// Nothing scheduled due within the hour is left: all three moved.
	chimectl(t, nil, "", "--addr", addr, "count", "--prefix", "order-42/", "--state", "scheduled", "--due-before", "1h").want(t, 0, "0\n", "")
	chimectl(t, nil, "", "--addr", addr, "cancel", "--prefix", "order-42/", "--dry-run").
		want(t, 0, "matched    3\ncancelled  0 (dry run)\n", "")
	chimectl(t, nil, "", "--addr", addr, "cancel", "--prefix", "order-42/").
		want(t, 0, "matched        3\ncancelled      3\nskipped_fired  0\nskipped_held   0\n", "")
	chimectl(t, nil, "", "--addr", addr, "cancel", "--prefix", "order-42/", "--json").
		want(t, 0, `{"dry_run":false,"matched":0,"cancelled":0,"skipped_fired":0,"skipped_held":0}`+"\n", "")
	chimectl(t, nil, "", "--addr", addr, "count", "--state", "cancelled").want(t, 0, "3\n", "")
}

func TestFilterFlagsByPriority(t *testing.T) {
	addr, _ := startChime(t)
	for _, ev := range [][]string{
		{"p/0", "orders", "--priority", "9"},
		{"p/1", "orders"},
		{"p/2", "mail", "--priority", "9"},
		{"p/3", "orders", "--priority", "0"},
	} {
		chimectl(t, nil, "", append([]string{"--addr", addr, "schedule", "--id", ev[0], "--topic", ev[1], "--in", "1h", "--json"}, ev[2:]...)...)
	}
	chimectl(t, nil, "", "--addr", addr, "count", "--priority", "9").want(t, 0, "2\n", "")
	// An event scheduled without --priority has 5.
	chimectl(t, nil, "", "--addr", addr, "count", "--prefix", "p/", "--priority", "5").want(t, 0, "1\n", "")
	chimectl(t, nil, "", "--addr", addr, "count", "--priority", "0", "--priority", "9,5").want(t, 0, "4\n", "")
	r := chimectl(t, nil, "", "--addr", addr, "list", "--topic", "orders", "--priority", "9,0", "--json")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, `"id":"p/0"`) || !strings.Contains(r.stdout, `"id":"p/3"`) {
		t.Fatalf("list --topic orders --priority 9,0: %+v", r)
	}
	chimectl(t, nil, "", "--addr", addr, "update", "--prefix", "p/", "--priority", "5", "--shift", "1h", "--dry-run").
		want(t, 0, "matched  1\nmoved    0 (dry run)\n", "")
	chimectl(t, nil, "", "--addr", addr, "cancel", "--topic", "orders", "--priority", "9").
		want(t, 0, "matched        1\ncancelled      1\nskipped_fired  0\nskipped_held   0\n", "")
	chimectl(t, nil, "", "--addr", addr, "count", "--state", "scheduled", "--priority", "9").want(t, 0, "1\n", "")
}

// TestTokenNeverInPlaintextBeyondLoopback: chimectl refuses to send a
// bearer token without TLS to an address beyond this machine, from the flag
// or the environment, naming what to add; to loopback it sends it (chimed
// dev). The refusal comes before any connection is attempted.
func TestTokenNeverInPlaintextBeyondLoopback(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		sent bool // passes the check (and then fails to connect)
	}{
		{nil, []string{"--addr", "10.0.0.9:7070", "--token", "secret", "get", "x"}, false},
		{map[string]string{"CHIME_TOKEN": "secret"}, []string{"--addr", "chime.example:7070", "get", "x"}, false},
		{nil, []string{"--addr", "127.0.0.1:1", "--token", "secret", "--timeout", "1s", "get", "x"}, true},
		{nil, []string{"--addr", "localhost:1", "--token", "secret", "--timeout", "1s", "get", "x"}, true},
		{nil, []string{"--addr", "10.0.0.9:7070", "--token-file", tokenFile, "get", "x"}, false},
		{nil, []string{"--addr", "127.0.0.1:1", "--token-file", tokenFile, "--timeout", "1s", "get", "x"}, true},
	} {
		r := chimectl(t, tc.env, "", tc.args...)
		refused := strings.Contains(r.stderr, "refusing to send the bearer token in plaintext to ") &&
			strings.Contains(r.stderr, "the token of --token, --token-file or CHIME_TOKEN; add --tls")
		if refused == tc.sent || r.code == 0 {
			t.Errorf("%v %v: exit %d, stderr %q; want the token refused: %v", tc.env, tc.args, r.code, r.stderr, !tc.sent)
		}
		if strings.Contains(r.stderr, "secret") {
			t.Errorf("%v: the token is in the error: %q", tc.args, r.stderr)
		}
	}
}
