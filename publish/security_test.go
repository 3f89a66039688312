package publish_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
)

// publishOne produces one record with sec to b and returns its outcome.
// One attempt on each topic, so that a connection that cannot be made ends
// the call with the connection's own error (on both topics) long before
// ctx's 10 s: a call that comes back with ctx's deadline instead has hung.
func publishOne(t *testing.T, b *publishtest.Broker, sec publish.Security, id string) publish.Outcome {
	t.Helper()
	return publishOneWith(t, b, publish.Config{Security: sec, WriteTimeout: 3 * time.Second}, id)
}

func publishOneWith(t *testing.T, b *publishtest.Broker, cfg publish.Config, id string) publish.Outcome {
	t.Helper()
	cfg.MaxAttempts, cfg.DeadLetterAttempts = 1, 1
	p := newPublisher(t, b, fastRetries(cfg))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	o := p.Publish(ctx, []publish.Record{{Seq: 1, ID: id, Topic: "secured", Value: []byte("v-" + id)}})[0]
	if took := time.Since(start); ctx.Err() != nil {
		t.Fatalf("Publish took %v, until its ctx ended: outcome %+v", took, o)
	}
	return o
}

// readBack reads the record id from b's topic "secured" with an
// independent client (franz-go) that reaches b with opts, and fails unless
// it arrives with its value.
func readBack(t *testing.T, b *publishtest.Broker, id string, opts ...kgo.Opt) {
	t.Helper()
	c := publishtest.CollectWith(t, append([]kgo.Opt{kgo.SeedBrokers(b.Addrs()...)}, opts...), "secured")
	got := c.WaitIDs(1, 10*time.Second)
	if r, ok := got.ByID[id]; !ok || r.Value() != "v-"+id {
		t.Fatalf("read back %d records, none %s with value v-%s", len(got.Records), id, id)
	}
}

// A broker that takes TLS only, and only from clients with a certificate
// its CA signed: with the CA and a client certificate the record arrives;
// without the certificate, with another CA, or in plaintext, Publish fails
// with an error that says why, in well under its ctx's 10 s.
func TestPublishOverTLS(t *testing.T) {
	ca := publishtest.NewCA(t, "kafka-ca")
	b := publishtest.NewBroker(t, kfake.TLS(ca.ServerTLS(t, true)))
	client := ca.Issue(t, "chime")
	mutual := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}}

	if o := publishOne(t, b, publish.Security{TLS: mutual}, "tls-1"); !o.Done || o.DeadLettered {
		t.Fatalf("over TLS: outcome %+v, want produced", o)
	}
	readBack(t, b, "tls-1", kgo.DialTLSConfig(mutual))

	for _, tc := range []struct {
		name string
		tls  *tls.Config
		want string
	}{
		{"no client certificate", ca.ClientTLS(), "certificate required"},
		{"another CA", publishtest.NewCA(t, "other").ClientTLS(), "certificate signed by unknown authority"},
		{"plaintext", nil, "EOF (the broker closed the connection, as brokers do when the client's TLS or SASL does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := publishOne(t, b, publish.Security{TLS: tc.tls}, "refused")
			if o.Done || !strings.Contains(o.Err, tc.want) {
				t.Fatalf("outcome %+v, want not done with an error saying %q", o, tc.want)
			}
			t.Logf("error: %s", o.Err)
		})
	}
}

// TLS to a broker that speaks plaintext cannot succeed and must not hang.
// Kafka closes the connection on a request as large as a TLS ClientHello
// reads (about 369 MB); kfake waits for the rest of it, so here the
// attempts end at WriteTimeout.
func TestTLSToPlaintextBrokerIsBounded(t *testing.T) {
	ca := publishtest.NewCA(t, "kafka-ca")
	start := time.Now()
	o := publishOneWith(t, publishtest.NewBroker(t), publish.Config{Security: publish.Security{TLS: ca.ClientTLS()},
		WriteTimeout: time.Second}, "tls-to-plain")
	if o.Done || !strings.Contains(o.Err, "dead-letter topic") {
		t.Fatalf("outcome %+v, want not done after an attempt on each topic", o)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Publish took %v with a 1 s WriteTimeout and one attempt on each topic", took)
	}
	t.Logf("error: %s", o.Err)
}

// A broker that demands SASL: PLAIN and SCRAM-SHA-512 users get their
// record in; a wrong password fails at once. kfake closes the connection
// on a refused password (Kafka answers SASL_AUTHENTICATION_FAILED, which
// kafka-go reports as such), so the error is the closed connection and
// what that usually means.
func TestPublishWithSASL(t *testing.T) {
	b := publishtest.NewBroker(t, kfake.EnableSASL(),
		kfake.Superuser(publish.SASLPlain, "plain-user", "plain-secret"),
		kfake.Superuser(publish.SASLScramSHA512, "scram-user", "scram-secret"))
	for _, tc := range []struct {
		id   string
		sasl publish.SASL
		want string // the error; "" when the record must arrive
	}{
		{"plain", publish.SASL{Mechanism: publish.SASLPlain, User: "plain-user", Password: "plain-secret"}, ""},
		{"scram", publish.SASL{Mechanism: publish.SASLScramSHA512, User: "scram-user", Password: "scram-secret"}, ""},
		{"plain-wrong", publish.SASL{Mechanism: publish.SASLPlain, User: "plain-user", Password: "wrong"}, refusedSASL},
		{"scram-wrong", publish.SASL{Mechanism: publish.SASLScramSHA512, User: "scram-user", Password: "wrong"}, refusedSASL},
		// The user exists, but for the other mechanism.
		{"scram-as-plain", publish.SASL{Mechanism: publish.SASLPlain, User: "scram-user", Password: "scram-secret"}, refusedSASL},
	} {
		t.Run(tc.id, func(t *testing.T) {
			o := publishOne(t, b, publish.Security{SASL: &tc.sasl}, tc.id)
			if tc.want != "" {
				if o.Done || !strings.Contains(o.Err, tc.want) || strings.Contains(o.Err, tc.sasl.Password) {
					t.Fatalf("outcome %+v, want not done with an error saying %q (and not the password)", o, tc.want)
				}
				t.Logf("error: %s", o.Err)
				return
			}
			if !o.Done || o.DeadLettered {
				t.Fatalf("outcome %+v, want produced", o)
			}
			readBack(t, b, tc.id, kgo.SASL(scram.Auth{User: "scram-user", Pass: "scram-secret"}.AsSha512Mechanism()))
		})
	}
	// Without SASL the broker answers nothing but the handshake.
	if o := publishOne(t, b, publish.Security{}, "anonymous"); o.Done || !strings.Contains(o.Err, refusedSASL) {
		t.Fatalf("without SASL: outcome %+v, want refused", o)
	}
}

const refusedSASL = "or its SASL credentials are refused)"

// TLS and SASL together: SCRAM inside TLS.
func TestPublishWithTLSAndSASL(t *testing.T) {
	ca := publishtest.NewCA(t, "kafka-ca")
	b := publishtest.NewBroker(t, kfake.TLS(ca.ServerTLS(t, false)), kfake.EnableSASL(),
		kfake.Superuser(publish.SASLScramSHA512, "chime", "s3cret"))
	sec := publish.Security{TLS: ca.ClientTLS(), SASL: &publish.SASL{Mechanism: publish.SASLScramSHA512, User: "chime", Password: "s3cret"}}
	if o := publishOne(t, b, sec, "both"); !o.Done || o.DeadLettered {
		t.Fatalf("outcome %+v, want produced", o)
	}
	readBack(t, b, "both", kgo.DialTLSConfig(ca.ClientTLS()), kgo.SASL(scram.Auth{User: "chime", Pass: "s3cret"}.AsSha512Mechanism()))
}

// The SCRAM library quotes the password in its error; New must not pass
// it on.
func TestSCRAMErrorKeepsThePassword(t *testing.T) {
	const password = "hunter2\x00"
	_, err := publish.New(publish.Config{Brokers: []string{"127.0.0.1:9092"},
		Security: publish.Security{SASL: &publish.SASL{Mechanism: publish.SASLScramSHA512, User: "u", Password: password}}})
	if err == nil || !strings.Contains(err.Error(), "Security.SASL.Password") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("New: %v; want an error naming Security.SASL.Password without the password", err)
	}
}
