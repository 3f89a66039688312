package main

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/cmd/internal/kafkaflag"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/publish/publishtest"
)

// TestServeOverTLSAndSASL: a chimed serve process given the --kafka-tls*
// and --kafka-sasl-* flags fires into a broker that takes only TLS with a
// client certificate its CA signed, and only SCRAM-SHA-512 users.
func TestServeOverTLSAndSASL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a chimed process; skipped with -short")
	}
	ca := publishtest.NewCA(t, "kafka-ca")
	b := publishtest.NewBroker(t, kfake.TLS(ca.ServerTLS(t, true)), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "chime", "s3cret"))
	caFile, certFile, keyFile := ca.WriteFiles(t)
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, b.Addrs())
	d.extra = []string{"--kafka-tls-ca", caFile, "--kafka-tls-cert", certFile, "--kafka-tls-key", keyFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "chime", "--kafka-sasl-password-file", pwFile}
	d.start()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := d.client().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
		Id: "secure-1", Topic: "secure.orders", Delay: durationpb.New(200 * time.Millisecond), Payload: []byte("over TLS")}})
	if err != nil {
		t.Fatal(err)
	}
	client := ca.Issue(t, "reader")
	col := collector{publishtest.CollectWith(t, []kgo.Opt{kgo.SeedBrokers(b.Addrs()...),
		kgo.DialTLSConfig(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}}),
		kgo.SASL(scram.Auth{User: "chime", Pass: "s3cret"}.AsSha512Mechanism())}, "secure.orders")}
	got := col.waitIDs(t, map[string]time.Time{"secure-1": resp.Due.AsTime()}, 10*time.Second)
	if got["secure-1"].Value() != "over TLS" {
		t.Fatalf("record value %q", got["secure-1"].Value())
	}
	d.stop() // stderr is complete, and no longer written, once chimed exited
	if strings.Contains(d.stderr.String(), "s3cret") {
		t.Errorf("chimed logged the password:\n%s", d.stderr)
	}
}

// TestDevDemandsSASL: chimed dev with --kafka-sasl-* (the password in
// CHIME_KAFKA_SASL_PASSWORD) makes its embedded broker demand that user,
// fires into it as that user, and says in its banner how chimectl tail
// reaches it. A client without SASL gets nothing in.
func TestDevDemandsSASL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a chimed dev process; skipped with -short")
	}
	t.Setenv(kafkaflag.PasswordEnv, "dev-secret") // the process inherits it
	grpcAddr, _ := devPorts(t)
	kafkaAddr := freeAddr(t)
	p := startDev(t, "--grpc-addr", grpcAddr, "--kafka-addr", kafkaAddr, "--data-dir", t.TempDir(), "--shards", "2",
		"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "dev")
	publishtest.WaitFor(t, 60*time.Second, "the banner", func() bool { return strings.Contains(p.stdout.String(), "Try it:") })
	banner := p.stdout.String()
	if want := "chimectl tail --brokers " + kafkaAddr + " --kafka-sasl-mechanism PLAIN --kafka-sasl-user dev --topic demo"; !strings.Contains(banner, want) {
		t.Errorf("banner lacks %q:\n%s", want, banner)
	}
	if strings.Contains(banner, "kcat") || strings.Contains(banner, "dev-secret") {
		t.Errorf("banner shows kcat without SASL, or the password:\n%s", banner)
	}

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := chimev1.NewSchedulerClient(cc).Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
		Id: "dev-sasl", Topic: "dev.sasl", Delay: durationpb.New(200 * time.Millisecond), Payload: []byte("hello")}}); err != nil {
		t.Fatal(err)
	}
	col := collector{publishtest.CollectWith(t, []kgo.Opt{kgo.SeedBrokers(kafkaAddr),
		kgo.SASL(plain.Auth{User: "dev", Pass: "dev-secret"}.AsMechanism())}, "dev.sasl")}
	if got := col.waitIDs(t, map[string]time.Time{"dev-sasl": {}}, 10*time.Second); got["dev-sasl"].Value() != "hello" {
		t.Fatalf("record value %q", got["dev-sasl"].Value())
	}

	anon, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic("dev.sasl"))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	actx, acancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer acancel()
	if err := anon.ProduceSync(actx, &kgo.Record{Value: []byte("anonymous")}).FirstErr(); err == nil {
		t.Fatal("a client without SASL produced to dev's broker")
	}
}
