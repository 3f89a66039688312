package publish

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kgo"
	kplain "github.com/twmb/franz-go/pkg/sasl/plain"
	kscram "github.com/twmb/franz-go/pkg/sasl/scram"
)

// The SASL mechanisms Chime speaks, by their Kafka names
// (sasl.enabled.mechanisms).
const (
	SASLPlain        = "PLAIN"
	SASLScramSHA512  = "SCRAM-SHA-512"
	saslMechanismSet = SASLPlain + " or " + SASLScramSHA512
)

// Security is how a client connects to the brokers: in TLS, with SASL
// authentication, both, or neither (the zero value: plaintext, no
// authentication). It holds what the connection needs, already loaded, and
// no Kafka client's types, so that the franz-go clients (chimectl's
// consumers, the ingest consumer: KgoOpts) take the same value as the
// Publisher (kafka-go). cmd/internal/kafkaflag builds it
// from the --kafka-tls* and --kafka-sasl-* flags.
type Security struct {
	// TLS, when set, wraps every connection to the brokers in TLS with
	// this configuration. An empty ServerName is set, per connection, to
	// the host of the broker dialled, so a broker's certificate must name
	// the host it is reached by.
	TLS *tls.Config
	// SASL, when set, authenticates every connection (inside TLS when TLS
	// is set) before any other request.
	SASL *SASL
}

// SASL is a SASL user and the mechanism it authenticates with.
type SASL struct {
	// Mechanism is SASLPlain or SASLScramSHA512. PLAIN sends the password
	// as it is: use it only inside TLS.
	Mechanism string
	User      string
	Password  string
}

// String names the mechanism and the user, never the password.
func (s *SASL) String() string { return s.Mechanism + " as " + s.User }

// ParseSASLMechanism returns the Kafka name of mechanism, given in any
// case, or an error naming the ones Chime speaks.
func ParseSASLMechanism(mechanism string) (string, error) {
	switch m := strings.ToUpper(mechanism); m {
	case SASLPlain, SASLScramSHA512:
		return m, nil
	}
	return "", fmt.Errorf("%q: must be %s", mechanism, saslMechanismSet)
}

// checkSASL checks Security.SASL, naming the field and the rule.
func (c *Config) checkSASL() error {
	s := c.Security.SASL
	switch {
	case s == nil:
		return nil
	case s.Mechanism != SASLPlain && s.Mechanism != SASLScramSHA512:
		return configError("Security.SASL.Mechanism", "must be %s (got %q)", saslMechanismSet, s.Mechanism)
	case s.User == "":
		return configError("Security.SASL.User", "must not be empty")
	case s.Password == "":
		return configError("Security.SASL.Password", "must not be empty")
	}
	return nil
}

// saslMechanism returns kafka-go's mechanism for Security.SASL, nil
// without SASL. c has passed checkSASL.
func (c *Config) saslMechanism() (sasl.Mechanism, error) {
	s := c.Security.SASL
	if s == nil {
		return nil, nil
	}
	if s.Mechanism == SASLPlain {
		return plain.Mechanism{Username: s.User, Password: s.Password}, nil
	}
	// SCRAM normalises the user and password (SASLprep) and refuses what
	// it cannot: say so here rather than at every connection. Its error
	// quotes the password, so it is not passed on.
	m, err := scram.Mechanism(scram.SHA512, s.User, s.Password)
	if err == nil {
		return m, nil
	}
	if _, err := scram.Mechanism(scram.SHA512, s.User, "password"); err != nil {
		return nil, configError("Security.SASL.User", "is refused by SCRAM's SASLprep: %v", err)
	}
	return nil, configError("Security.SASL.Password", "is refused by SCRAM's SASLprep (it has a control, prohibited or unassigned character)")
}

// ExplainClosed adds to an error that says the broker closed the connection
// what that usually means when it happens at every attempt; other errors
// it returns as they are. The Publisher's errors carry it already;
// chimectl's consumers (franz-go) add it to theirs. A broker
// answers a client whose TLS or SASL does not match its listener by
// closing the connection, without a word: Kafka's TLS listener does so to
// plaintext, and a SASL listener to a client that does not authenticate;
// kfake also does so to a refused password, where Kafka answers
// SASL_AUTHENTICATION_FAILED. kafka-go then reports only "unexpected EOF".
func ExplainClosed(err error) error {
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		return err
	}
	return fmt.Errorf("%w (the broker closed the connection, as brokers do when the client's TLS or SASL "+
		"does not match the listener's or its SASL credentials are refused)", err)
}

// KgoOpts are s as franz-go client options: its TLS configuration and SASL
// mechanism. s has passed the checks of the flags that built it.
func (s Security) KgoOpts() []kgo.Opt {
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS))
	}
	switch m := s.SASL; {
	case m == nil:
	case m.Mechanism == SASLScramSHA512:
		opts = append(opts, kgo.SASL(kscram.Auth{User: m.User, Pass: m.Password}.AsSha512Mechanism()))
	default:
		opts = append(opts, kgo.SASL(kplain.Auth{User: m.User, Pass: m.Password}.AsMechanism()))
	}
	return opts
}
