package kafkaflag

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
)

// parse runs the flags on args and returns what Security makes of them,
// with env as the environment.
func parse(t *testing.T, env map[string]string, args ...string) (publish.Security, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := Register(fs, "the test's")
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return f.Security(func(k string) string { return env[k] })
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSecurityFromFlags(t *testing.T) {
	ca, cert, key := publishtest.NewCA(t, "ca").WriteFiles(t)
	noEnv := map[string]string{}

	sec, err := parse(t, noEnv)
	if err != nil || sec.TLS != nil || sec.SASL != nil {
		t.Fatalf("no flags: %+v, %v; want plaintext without SASL", sec, err)
	}
	sec, err = parse(t, noEnv, "--kafka-tls")
	if err != nil || sec.TLS == nil || sec.TLS.RootCAs != nil || len(sec.TLS.Certificates) != 0 || sec.SASL != nil {
		t.Fatalf("--kafka-tls: %+v, %v; want TLS with the system's roots", sec, err)
	}
	sec, err = parse(t, noEnv, "--kafka-tls-ca", ca)
	if err != nil || sec.TLS == nil || sec.TLS.RootCAs == nil {
		t.Fatalf("--kafka-tls-ca: %+v, %v; want TLS trusting the bundle", sec, err)
	}
	sec, err = parse(t, noEnv, "--kafka-tls-cert", cert, "--kafka-tls-key", key)
	if err != nil || sec.TLS == nil || sec.TLS.RootCAs != nil || len(sec.TLS.Certificates) != 1 {
		t.Fatalf("--kafka-tls-cert/key: %+v, %v; want TLS with a client certificate", sec, err)
	}

	sec, err = parse(t, map[string]string{PasswordEnv: "from-env"}, "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "chime")
	if err != nil || sec.TLS != nil || *sec.SASL != (publish.SASL{Mechanism: publish.SASLScramSHA512, User: "chime", Password: "from-env"}) {
		t.Fatalf("SASL from the environment: %+v, %v", sec.SASL, err)
	}
	// The file wins over the environment, without its trailing newline.
	sec, err = parse(t, map[string]string{PasswordEnv: "from-env"}, "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "chime",
		"--kafka-sasl-password-file", writeFile(t, "from file\n"), "--kafka-tls")
	if err != nil || sec.TLS == nil || *sec.SASL != (publish.SASL{Mechanism: publish.SASLPlain, User: "chime", Password: "from file"}) {
		t.Fatalf("SASL from a file: %+v, %v", sec.SASL, err)
	}
}

// Args gives back what was set, in a form the flags parse again, without
// the password.
func TestArgs(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--kafka-tls"},
		{"--kafka-tls-ca", "ca.pem", "--kafka-tls-cert", "c.pem", "--kafka-tls-key", "k.pem"},
		{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", "pw"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f := Register(fs, "the test's")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if got := f.Args(); strings.Join(got, " ") != strings.Join(args, " ") {
			t.Errorf("Args() = %q after parsing %q", got, args)
		}
	}
}

// Each rule, broken: the error names the flag (and the environment
// variable where it is an alternative), and never holds the password.
func TestSecurityRefuses(t *testing.T) {
	ca, cert, key := publishtest.NewCA(t, "ca").WriteFiles(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	env := map[string]string{PasswordEnv: "s3cret"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--kafka-tls-cert", cert}, "--kafka-tls-cert and --kafka-tls-key go together: give both or neither"},
		{nil, []string{"--kafka-tls-key", key}, "--kafka-tls-cert and --kafka-tls-key go together"},
		{nil, []string{"--kafka-tls-ca", missing}, "--kafka-tls-ca: open " + missing},
		{nil, []string{"--kafka-tls-ca", key}, "--kafka-tls-ca " + key + ": no PEM certificate in it"},
		{nil, []string{"--kafka-tls-cert", ca, "--kafka-tls-key", key}, "--kafka-tls-cert " + ca + ", --kafka-tls-key " + key + ": tls:"},
		{env, []string{"--kafka-sasl-user", "u"}, "--kafka-sasl-user and --kafka-sasl-password-file need --kafka-sasl-mechanism (PLAIN or SCRAM-SHA-512)"},
		{env, []string{"--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "u"}, `--kafka-sasl-mechanism "SCRAM-SHA-256": must be PLAIN or SCRAM-SHA-512`},
		{env, []string{"--kafka-sasl-mechanism", "PLAIN"}, "--kafka-sasl-mechanism PLAIN needs --kafka-sasl-user"},
		{nil, []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "u"},
			"--kafka-sasl-mechanism PLAIN needs a password: give --kafka-sasl-password-file FILE or set CHIME_KAFKA_SASL_PASSWORD"},
		{env, []string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", missing}, "--kafka-sasl-password-file: open " + missing},
		{env, []string{"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", writeFile(t, "\n")}, "is empty"},
	} {
		sec, err := parse(t, tc.env, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %+v, %v; want an error saying %q", tc.args, sec, err, tc.want)
		}
	}
}

// The help says what each flag does.
func TestHelp(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	Register(fs, "the consumer")
	var help strings.Builder
	fs.SetOutput(&help)
	fs.PrintDefaults()
	for _, want := range []string{"-kafka-tls\n", "-kafka-tls-ca file", "-kafka-tls-cert file", "-kafka-tls-key file",
		"-kafka-sasl-mechanism mechanism", "-kafka-sasl-user name", "-kafka-sasl-password-file file", "connect the consumer to",
		"$CHIME_KAFKA_SASL_PASSWORD", "There is no password flag"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, help.String())
		}
	}
}
