package main

import (
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chimehq/chime/cmd/internal/kafkaflag"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// TestRetentionFlag: --retention takes Go durations and days, refuses what
// is neither or negative, and prints days back when it is whole days.
func TestRetentionFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour, "36h": 36 * time.Hour, "2m": 2 * time.Minute, "0": 0, "0d": 0,
	} {
		var d daysDuration
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for _, in := range []string{"", "7 days", "-1h", "-2d", "d", "1e9d"} {
		var d daysDuration
		if err := d.Set(in); err == nil {
			t.Errorf("Set(%q) = %v, want an error", in, time.Duration(d))
		}
	}
	if s := (daysDuration(7 * 24 * time.Hour)).String(); s != "7d" {
		t.Errorf("7 days prints %q, want 7d", s)
	}
	if s := (daysDuration(90 * time.Minute)).String(); s != "1h30m0s" {
		t.Errorf("90 minutes prints %q", s)
	}
}

// TestRestoreUsage: chimed restore explains itself, needs --from, and
// refuses a Raft address the other nodes could not dial; a backup it cannot
// use is an error naming it, exit 1, not a usage error.
func TestRestoreUsage(t *testing.T) {
	restore := func(args ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := run(append([]string{"restore"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, _, help := restore("--help"); code != 0 || !strings.Contains(help, "Usage: chimed restore --from DIR") ||
		!strings.Contains(help, "sha256 mismatch") || !strings.Contains(help, "Examples:") {
		t.Errorf("--help: exit %d\n%s", code, help)
	}
	_, _, help := restore("--help")
	for _, want := range []string{"  -backup-key-file file", "  -allow-unsigned", "  -reserved-topics patterns", "  -allow-topic topic", "  -dead-letter-topic topic",
		"head -c 32 /dev/urandom | base64", "--backup-key-file /etc/chime/backup.key", "restore --from /backups/b1 --allow-unsigned"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q:\n%s", want, help)
		}
	}
	dir := t.TempDir()
	shortKey := filepath.Join(dir, "short.key")
	if err := os.WriteFile(shortKey, []byte("too short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	openKey := filepath.Join(dir, "open.key")
	if err := os.WriteFile(openKey, []byte(strings.Repeat("k", 44)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(openKey, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "chimed restore: --from is required"},
		{[]string{"--from", "b", "--raft-addr", ":7071"}, `--raft-addr ":7071": give the address the other nodes reach`},
		{[]string{"--from", "b", "--raft-addr", "127.0.0.1:0"}, `--raft-addr "127.0.0.1:0": give the address`},
		{[]string{"--from", "b", "--raft-addr", "127.0.0.1"}, `--raft-addr "127.0.0.1": `},
		{[]string{"--from", "b", "--node-id", ""}, "--node-id must not be empty"},
		{[]string{"--from", "b", "extra"}, `unexpected argument "extra"`},
		{[]string{"--from", "b", "--backup-key-file", shortKey, "--allow-unsigned"}, "give --backup-key-file or --allow-unsigned, not both"},
		{[]string{"--from", "b", "--backup-key-file", shortKey}, "backup key file " + shortKey + ": a key of 9 bytes (surrounding whitespace trimmed), and a key must be at least 32"},
		{[]string{"--from", "b", "--backup-key-file", openKey}, "backup key file " + openKey + ": mode 0644 lets its group or others read or change it"},
		{[]string{"--from", "b", "--backup-key-file", filepath.Join(dir, "none")}, "backup key file: open " + filepath.Join(dir, "none") + ": no such file or directory"},
		{[]string{"--from", "b", "--allow-unsigned", "--reserved-topics", "a,[b"}, `--reserved-topics): "[b" is not a topic pattern`},
	} {
		code, _, stderr := restore(tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "Run 'chimed restore --help' for usage.") {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 saying %q", tc.args, code, stderr, tc.want)
		}
	}
	data := filepath.Join(t.TempDir(), "data")
	code, _, stderr := restore("--from", t.TempDir(), "--data-dir", data, "--node-id", "a")
	if code != 1 || !strings.Contains(stderr, "no manifest.json: not a backup, or one that did not finish") {
		t.Errorf("a directory that is not a backup: exit %d, stderr %q", code, stderr)
	}
	if got, err := raftAdvertise("localhost:7071", ""); err != nil || !strings.HasSuffix(got, ":7071") || strings.HasPrefix(got, "localhost") {
		t.Errorf("localhost:7071 advertises as %q (%v), want the IP the listener reports", got, err)
	}
}

// TestServeRefusesToListenBeyondLoopbackInTheClear: chimed serve stops at
// once, naming the flag, when any address it would listen on is reachable
// from other machines and --insecure is not given; loopback addresses, and
// --insecure, pass (to the next check: here, the missing --kafka-brokers).
func TestServeRefusesToListenBeyondLoopbackInTheClear(t *testing.T) {
	serve := func(args ...string) (int, string) {
		var out, errOut strings.Builder
		code := run(append([]string{"serve", "--data-dir", t.TempDir()}, args...), &out, &errOut)
		return code, errOut.String()
	}
	for _, tc := range []struct {
		args []string
		flag string // "" when the gate lets it through
	}{
		{nil, ""},
		{[]string{"--grpc-addr", "localhost:7070"}, ""},
		{[]string{"--grpc-addr", "[::1]:7070"}, ""},
		{[]string{"--grpc-addr", "10.0.0.1:7070"}, "--grpc-addr 10.0.0.1:7070"},
		{[]string{"--grpc-addr", ":7070"}, "--grpc-addr :7070"},
		{[]string{"--raft-addr", "0.0.0.0:7071"}, "--raft-addr 0.0.0.0:7071"},
		{[]string{"--gossip-addr", "chime-1:7072"}, "--gossip-addr chime-1:7072"},
		{[]string{"--http-addr", "10.0.0.1:7080"}, "--http-addr 10.0.0.1:7080"},
		{[]string{"--grpc-addr", "10.0.0.1:7070", "--insecure"}, ""},
	} {
		code, stderr := serve(tc.args...)
		if tc.flag == "" {
			if code != 2 || !strings.Contains(stderr, "--kafka-brokers is required") {
				t.Errorf("serve %v: exit %d, %q; want it past the gate, to the missing --kafka-brokers", tc.args, code, stderr)
			}
			continue
		}
		if want := "chimed serve: " + tc.flag + " is reachable beyond this machine"; code != 2 || !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, "pass --insecure") {
			t.Errorf("serve %v: exit %d, %q; want exit 2 and %q... pass --insecure", tc.args, code, stderr, want)
		}
	}

	// Secured, it passes only with all three: TLS, --auth-file and
	// --gossip-key-file; the refusal names what is missing.
	dir := t.TempDir()
	ca, err := certstest.NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Node("n1")
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "gossip.keys")
	if err := os.WriteFile(keys, []byte("qmq1KX6rpRsSdIlnYyt8gOjzeGUrjuhfKlVWE+pHu3U=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--grpc-addr", "10.0.0.1:7070", "--node-id", "n1", "--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", ca.File}
	for _, tc := range []struct {
		args    []string
		missing string // "" when the gate lets it through
	}{
		{[]string{"--grpc-addr", "10.0.0.1:7070"}, "without encryption (--tls-cert, --tls-key, --tls-ca), authentication (--auth-file), gossip encryption (--gossip-key-file)"},
		{append(slices.Clone(tlsFlags), "--gossip-key-file", keys), "without authentication (--auth-file): anyone who reaches it could schedule, cancel and drain"},
		{append(slices.Clone(tlsFlags), "--auth-file", filepath.Join(dir, "auth.json")), "without gossip encryption (--gossip-key-file): anyone who reaches it could join the gossip"},
		{append(slices.Clone(tlsFlags), "--auth-file", filepath.Join(dir, "auth.json"), "--gossip-key-file", keys), ""},
	} {
		code, stderr := serve(tc.args...)
		if tc.missing == "" {
			if code != 2 || !strings.Contains(stderr, "--kafka-brokers is required") {
				t.Errorf("serve %v: exit %d, %q; want it past the gate, to the missing --kafka-brokers", tc.args, code, stderr)
			}
			continue
		}
		if code != 2 || !strings.Contains(stderr, tc.missing) {
			t.Errorf("serve %v: exit %d, %q; want exit 2 and %q", tc.args, code, stderr, tc.missing)
		}
	}
}

// TestServeWithTLSRefusesPlaintextKafka: a node serving TLS stops at once
// rather than produce to Kafka in plaintext, unless --kafka-insecure says
// the brokers' network is trusted.
func TestServeWithTLSRefusesPlaintextKafka(t *testing.T) {
	ca, err := certstest.NewCA(t.TempDir(), "cluster")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Node("n1")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--data-dir", t.TempDir(), "--node-id", "n1", "--kafka-brokers", "127.0.0.1:9092", "--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", ca.File,
		"--grpc-addr", "127.0.0.1:1", "--http-addr", "127.0.0.1:1", "--raft-addr", "127.0.0.1:1", "--gossip-addr", "127.0.0.1:1"}
	var out, errOut strings.Builder
	want := "chimed serve: this node serves TLS (--tls-cert) but would produce to Kafka in plaintext: give --kafka-tls (or --kafka-tls-ca), or --kafka-insecure if the brokers are on a network you trust\n"
	if code := run(args, &out, &errOut); code != 2 || errOut.String() != want {
		t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, errOut.String(), want)
	}
	errOut.Reset()
	// With --kafka-insecure it goes on, to listening (port 1 is refused).
	if code := run(append(args, "--kafka-insecure"), &out, &errOut); strings.Contains(errOut.String(), "in plaintext") {
		t.Errorf("--kafka-insecure: exit %d, stderr %q", code, errOut.String())
	}
}

// TestGossipKeyFileFlag: a key file that does not load stops chimed at once,
// naming the flag, the file, the line and the rule; and dev refuses the flag
// when it does not gossip.
func TestGossipKeyFileFlag(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "# primary\n"+base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n")
	short := file("short", base64.StdEncoding.EncodeToString(make([]byte, 16))+"\n"+base64.StdEncoding.EncodeToString(make([]byte, 20))+"\n")
	empty := file("empty", "# no key yet\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--gossip-key-file", short}, "chimed serve: --gossip-key-file " + short + ": line 2: 20 bytes after base64 decoding, a key is 16, 24 or 32"},
		{[]string{"serve", "--gossip-key-file", empty}, "chimed serve: --gossip-key-file " + empty + ": no key in it"},
		{[]string{"serve", "--gossip-key-file", filepath.Join(dir, "missing")}, "--gossip-key-file " + filepath.Join(dir, "missing") + ": no such file"},
		{[]string{"dev", "--gossip-key-file", good}, "chimed dev: --gossip-key-file encrypts gossip, and one dev node does not gossip"},
		{[]string{"dev", "--nodes", "3", "--gossip-key-file", short}, "chimed dev: --gossip-key-file " + short + ": line 2"},
		// A good file passes, to the next check.
		{[]string{"serve", "--gossip-key-file", good}, "--kafka-brokers is required"},
		// chimed dev serves its embedded broker to whoever reaches it:
		// beyond loopback only when told, whatever else is set.
		{[]string{"dev", "--grpc-addr", "0.0.0.0:7070"}, "chimed dev: --grpc-addr 0.0.0.0:7070 is reachable beyond this machine, and chimed dev serves its embedded Kafka broker"},
		{[]string{"dev", "--kafka-addr", "10.0.0.1:9092"}, "chimed dev: --kafka-addr 10.0.0.1:9092 is reachable beyond this machine"},
		{[]string{"dev", "--reserved-topics", "a,[b"}, `--reserved-topics): "[b" is not a topic pattern`},
		// A dev cluster's nodes each need their own certificate.
		{[]string{"dev", "--nodes", "3", "--tls-cert", good, "--tls-key", good}, "chimed dev: --nodes 3 with TLS: each node needs a certificate of its own, naming <node-id>.node.chime: put {node} in --tls-cert and --tls-key"},
		{[]string{"dev", "--nodes", "2", "--tls-cert", filepath.Join(dir, "n-{node}.pem"), "--tls-key", filepath.Join(dir, "n-{node}-key.pem")}, "--tls-cert " + filepath.Join(dir, "n-node-0.pem")},
	} {
		var out, errOut strings.Builder
		code := run(append(tc.args, "--data-dir", t.TempDir()), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 saying %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// TestKafkaSecurityFlagsAtStart: chimed serve and dev take the
// --kafka-tls* and --kafka-sasl-* flags and say what each does; one that
// breaks a rule (SASL without a password above all) stops the start at
// once, in one line naming the flag and, for the password, the environment
// variable. dev's embedded broker serves plaintext, so dev refuses TLS.
func TestKafkaSecurityFlagsAtStart(t *testing.T) {
	t.Setenv(kafkaflag.PasswordEnv, "")
	for _, cmd := range []string{"serve", "dev"} {
		var out, errOut strings.Builder
		if code := run([]string{cmd, "--help"}, &out, &errOut); code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		for _, want := range []string{"-kafka-tls\n", "-kafka-tls-ca file", "-kafka-tls-cert file", "-kafka-tls-key file",
			"-kafka-sasl-mechanism mechanism", "-kafka-sasl-user name", "-kafka-sasl-password-file file", "$CHIME_KAFKA_SASL_PASSWORD"} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("chimed %s --help lacks %q", cmd, want)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--kafka-brokers", "127.0.0.1:9092", "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "chime"},
			"chimed serve: --kafka-sasl-mechanism SCRAM-SHA-512 needs a password: give --kafka-sasl-password-file FILE or set CHIME_KAFKA_SASL_PASSWORD\n"},
		{[]string{"dev", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "dev"},
			"chimed dev: --kafka-sasl-mechanism PLAIN needs a password: give --kafka-sasl-password-file FILE or set CHIME_KAFKA_SASL_PASSWORD\n"},
		{[]string{"serve", "--kafka-brokers", "127.0.0.1:9092", "--kafka-sasl-mechanism", "GSSAPI", "--kafka-sasl-user", "chime"},
			"chimed serve: --kafka-sasl-mechanism \"GSSAPI\": must be PLAIN or SCRAM-SHA-512\n"},
		{[]string{"serve", "--kafka-brokers", "127.0.0.1:9092", "--kafka-tls-key", "client-key.pem"},
			"chimed serve: --kafka-tls-cert and --kafka-tls-key go together: give both or neither\n"},
		{[]string{"dev", "--kafka-tls"},
			"chimed dev: the embedded broker serves plaintext only: --kafka-tls, --kafka-tls-ca, --kafka-tls-cert and --kafka-tls-key are for chimed serve\n"},
	} {
		var out, errOut strings.Builder
		code := run(append(tc.args, "--data-dir", t.TempDir()), &out, &errOut)
		if code != 2 || errOut.String() != tc.want {
			t.Errorf("chimed %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// TestTopicRateLimitFlag: a --topic-rate-limit that does not parse stops
// chimed before it opens anything, with the rule's problem and exit 2.
func TestTopicRateLimitFlag(t *testing.T) {
	for _, tc := range []struct{ flag, want string }{
		{"reports=5000", "--topic-rate-limit: \"reports=5000\": the rate \"5000\" has no unit"},
		{"reports=0/s", "not a positive number"},
		{"a[=1/s", "not a valid pattern"},
	} {
		var out, errOut strings.Builder
		code := run([]string{"dev", "--data-dir", t.TempDir(), "--topic-rate-limit", tc.flag}, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("--topic-rate-limit %q: exit %d, stderr %q; want 2 and %q", tc.flag, code, errOut.String(), tc.want)
		}
	}
}

// TestFlagsFromEnvironment: a CHIME_ variable sets the flag it names unless
// the command line set it, a repeatable flag takes a list, a value the flag
// refuses names the variable, and variables naming no flag are returned
// (the documented non-flag ones aside).
func TestFlagsFromEnvironment(t *testing.T) {
	f := newFlags("serve", io.Discard)
	if err := f.fs.Parse([]string{"--shards", "4"}); err != nil {
		t.Fatal(err)
	}
	unknown, err := setFromEnv(f.fs, []string{"allow-topic"}, []string{
		"CHIME_SHARDS=16", "CHIME_KAFKA_BROKERS=k1:9092,k2:9092", "CHIME_INSECURE=true",
		"CHIME_ALLOW_TOPIC=__consumer_offsets, chime.deadletter", "CHIME_WHEEL_HORIZON=90s",
		"CHIME_KAFKA_BROKER=typo:9092", "CHIME_TOKEN=t", "CHIME_ADDR=a:1", "CHIME_KAFKA_SASL_PASSWORD=p",
		"HOME=/root", "CHIME_ADVERTISE_HOST=chime-0.chime-headless",
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.shards != 4 {
		t.Errorf("--shards 4 on the command line and CHIME_SHARDS=16: got %d, want the command line's", f.shards)
	}
	if f.brokers != "k1:9092,k2:9092" || !f.insecure || f.wheelHorizon != 90*time.Second || f.advertiseHost != "chime-0.chime-headless" {
		t.Errorf("from the environment: brokers %q insecure %v wheel horizon %v advertise %q", f.brokers, f.insecure, f.wheelHorizon, f.advertiseHost)
	}
	if !slices.Equal(f.allowTopics, []string{"__consumer_offsets", "chime.deadletter"}) {
		t.Errorf("CHIME_ALLOW_TOPIC gave %q", f.allowTopics)
	}
	if !slices.Equal(unknown, []string{"CHIME_KAFKA_BROKER"}) {
		t.Errorf("unknown variables %q, want only the misspelt CHIME_KAFKA_BROKER", unknown)
	}
	f = newFlags("serve", io.Discard)
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := setFromEnv(f.fs, nil, []string{"CHIME_RETENTION=a week"}); err == nil || !strings.Contains(err.Error(), `CHIME_RETENTION="a week": invalid value for --retention`) {
		t.Errorf("a bad value: %v", err)
	}
	var help strings.Builder
	newFlags("serve", &help).fs.Usage()
	if !strings.Contains(help.String(), "CHIME_KAFKA_BROKERS") || !strings.Contains(help.String(), "-advertise-host host") {
		t.Errorf("serve --help does not teach the variables and --advertise-host:\n%s", help.String())
	}
}

// TestHealthCommand: chimed health fails, naming the address, when no node
// answers there, and refuses a malformed address as a usage error.
func TestHealthCommand(t *testing.T) {
	var out, errOut strings.Builder
	addr := freeAddr(t) // closed again: nothing listens
	if code := run([]string{"health", "--http-addr", addr, "--timeout", "2s"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), addr+"/healthz") {
		t.Errorf("no node: exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"health", "--http-addr", "7080"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `--http-addr "7080"`) {
		t.Errorf("malformed address: exit %d, stderr %q", code, errOut.String())
	}
}
