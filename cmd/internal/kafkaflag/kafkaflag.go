package kafkaflag

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/chimehq/chime/publish"
)

// PasswordEnv is the environment variable the SASL password is read from
// when --kafka-sasl-password-file is not given.
const PasswordEnv = "CHIME_KAFKA_SASL_PASSWORD"

// Flags holds the values of the flags Register defined.
type Flags struct {
	tls                           bool
	caFile, certFile, keyFile     string
	mechanism, user, passwordFile string
}

// Register defines the --kafka-tls* and --kafka-sasl-* flags on fs. who
// says whose connections they secure, for the help ("the producer's",
// "the consumer's").
func Register(fs *flag.FlagSet, who string) *Flags {
	f := &Flags{}
	fs.BoolVar(&f.tls, "kafka-tls", false, "connect "+who+" to the Kafka brokers over TLS, verifying their certificates against the\nsystem's roots (or --kafka-tls-ca)")
	fs.StringVar(&f.caFile, "kafka-tls-ca", "", "PEM `file` of the CA certificates that sign the brokers' certificates, trusted instead of\nthe system's roots; implies --kafka-tls")
	fs.StringVar(&f.certFile, "kafka-tls-cert", "", "PEM `file` of a client certificate, for brokers that require one (with --kafka-tls-key);\nimplies --kafka-tls")
	fs.StringVar(&f.keyFile, "kafka-tls-key", "", "PEM `file` of the private key of --kafka-tls-cert")
	fs.StringVar(&f.mechanism, "kafka-sasl-mechanism", "", "authenticate to the brokers with SASL `mechanism` PLAIN or SCRAM-SHA-512, as --kafka-sasl-user\nwith the password from --kafka-sasl-password-file or $"+PasswordEnv+" (PLAIN sends\nthe password as it is: use it with TLS)")
	fs.StringVar(&f.user, "kafka-sasl-user", "", "SASL user `name` (with --kafka-sasl-mechanism)")
	fs.StringVar(&f.passwordFile, "kafka-sasl-password-file", "", "`file` holding the SASL password (a trailing newline is dropped); without it the password\nis $"+PasswordEnv+". There is no password flag: it would show in ps")
	return f
}

// Security reads the files the flags name and returns the settings they
// ask for; the zero Security (plaintext, no SASL) when none is given.
// getenv reads PasswordEnv (os.Getenv; tests pass their own). An error
// names the flag, the file when there is one, and the rule; never the
// password.
func (f *Flags) Security(getenv func(string) string) (publish.Security, error) {
	var sec publish.Security
	var err error
	if sec.TLS, err = f.tlsConfig(); err != nil {
		return publish.Security{}, err
	}
	if sec.SASL, err = f.sasl(getenv); err != nil {
		return publish.Security{}, err
	}
	return sec, nil
}

func (f *Flags) tlsConfig() (*tls.Config, error) {
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("--kafka-tls-cert and --kafka-tls-key go together: give both or neither")
	}
	if !f.tls && f.caFile == "" && f.certFile == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--kafka-tls-ca %s: no PEM certificate in it", f.caFile)
		}
	}
	if f.certFile != "" {
		kp, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert %s, --kafka-tls-key %s: %w", f.certFile, f.keyFile, err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

func (f *Flags) sasl(getenv func(string) string) (*publish.SASL, error) {
	if f.mechanism == "" {
		if f.user != "" || f.passwordFile != "" {
			return nil, errors.New("--kafka-sasl-user and --kafka-sasl-password-file need --kafka-sasl-mechanism (PLAIN or SCRAM-SHA-512)")
		}
		return nil, nil
	}
	mech, err := publish.ParseSASLMechanism(f.mechanism)
	if err != nil {
		return nil, fmt.Errorf("--kafka-sasl-mechanism %w", err)
	}
	if f.user == "" {
		return nil, fmt.Errorf("--kafka-sasl-mechanism %s needs --kafka-sasl-user", mech)
	}
	s := &publish.SASL{Mechanism: mech, User: f.user}
	if f.passwordFile != "" {
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-sasl-password-file: %w", err)
		}
		// A file written by echo or an editor ends in a newline that is
		// not part of the password.
		s.Password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if s.Password == "" {
			return nil, fmt.Errorf("--kafka-sasl-password-file %s is empty", f.passwordFile)
		}
		return s, nil
	}
	if s.Password = getenv(PasswordEnv); s.Password == "" {
		return nil, fmt.Errorf("--kafka-sasl-mechanism %s needs a password: give --kafka-sasl-password-file FILE or set %s", mech, PasswordEnv)
	}
	return s, nil
}

// Args is the flags that were set, as a command line, for hints that show
// another command reaching the same brokers (chimed's banner shows chimectl
// tail). The password is not among them: its file's path is, or nothing
// when it is in the environment, which the other command then reads too.
func (f *Flags) Args() []string {
	var args []string
	if f.tls && f.caFile == "" && f.certFile == "" {
		args = append(args, "--kafka-tls")
	}
	for _, a := range []struct{ name, value string }{
		{"kafka-tls-ca", f.caFile}, {"kafka-tls-cert", f.certFile}, {"kafka-tls-key", f.keyFile},
		{"kafka-sasl-mechanism", f.mechanism}, {"kafka-sasl-user", f.user}, {"kafka-sasl-password-file", f.passwordFile},
	} {
		if a.value != "" {
			args = append(args, "--"+a.name, a.value)
		}
	}
	return args
}
