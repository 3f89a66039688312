package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

// securePKI is the certificates of a secured test cluster: its node CA, a
// client CA, and a CA nobody trusts.
type securePKI struct {
	dir                 string
	nodes, clients, bad *certstest.CA
}

func newSecurePKI(t testing.TB) *securePKI {
	t.Helper()
	p := &securePKI{dir: t.TempDir()}
	var err error
	for _, ca := range []struct {
		ca   **certstest.CA
		name string
	}{{&p.nodes, "cluster"}, {&p.clients, "clients"}, {&p.bad, "stranger"}} {
		if *ca.ca, err = certstest.NewCA(p.dir, ca.name); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// clientSource loads a client's TLS material: pair may be zero (no
// certificate).
func clientSource(t testing.TB, pair certstest.Pair, ca string) *certs.Source {
	t.Helper()
	s, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// secure makes d a TLS node of the PKI, with client certificates required
// (signed by clientCA) and authFile's credentials, and its test clients
// present client's certificate.
func (p *securePKI) secure(t *testing.T, d *daemon, clientCA, authFile string, client certstest.Pair) {
	t.Helper()
	pair, err := p.nodes.Node(d.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	d.extra = append(d.extra, "--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", p.nodes.File, "--tls-client-ca", clientCA,
		"--auth-file", authFile, "--audit-log", d.dataDir+"/audit.log", "--debug-endpoints")
	src := clientSource(t, client, p.nodes.File)
	d.creds = credentials.NewTLS(src.ClientConfig(""))
	d.httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig("")}}
	d.scheme = "https"
}

// TestSecuredClusterRefusesWhatItMust runs three chimed processes with TLS
// on every port and client certificates required, and shows that they
// replicate, forward and fire over TLS while every connection that is not a
// node's (on the Raft port) or a known client's (on the gRPC and HTTP ports)
// is refused, and that a rotated client CA applies without a restart.
func TestSecuredClusterRefusesWhatItMust(t *testing.T) {
	t.Parallel()
	p := newSecurePKI(t)
	clientCA := p.dir + "/client-ca.pem"
	copyFile(t, p.clients.File, clientCA)
	app, err := p.clients.Client("app")
	if err != nil {
		t.Fatal(err)
	}
	// The test's own certificate is an admin's; tokens carry the other roles.
	authFile := p.dir + "/auth.json"
	writeAuth := func(schedulerToken string) {
		copyFileContent(t, authFile, fmt.Sprintf(`{
  "tokens": [
    {"name": "billing", "sha256": "%s", "role": "scheduler", "topics": ["secure"]},
    {"name": "dashboard", "sha256": "%s", "role": "reader"}
  ],
  "certificates": [{"name": "test-admin", "common_name": "app", "role": "admin"}]
}`, sha256Hex(schedulerToken), sha256Hex("reader-token")))
	}
	writeAuth("scheduler-token")
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	for _, id := range []string{"n1", "n2", "n3"} {
		c.addWith(id, func(d *daemon) { p.secure(t, d, clientCA, authFile, app) })
	}
	// Converged: every shard's voters replicate over the TLS Raft port, and
	// the status gathers every member's answer over the nodes' own TLS calls.
	c.waitConverged(60 * time.Second)

	// An event scheduled through a node that does not lead its shard is
	// forwarded over TLS and fires.
	got := collect(t, c.brokers, "secure")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := map[string]time.Time{}
	for i, id := range c.order {
		for j := range 8 {
			evID := id + "-" + string(rune('a'+j))
			if _, err := c.nodes[c.order[(i+1)%3]].client().Schedule(withToken(ctx, "scheduler-token"), &chimev1.ScheduleRequest{Event: &chimev1.Event{
				Id: evID, Topic: "secure", Payload: []byte("x"), Delay: durationpb.New(time.Second)}}); err != nil {
				t.Fatalf("schedule %s over TLS: %v", evID, err)
			}
			want[evID] = time.Now()
		}
	}
	got.waitIDs(t, want, 30*time.Second)

	n1 := c.nodes["n1"]
	refused := func(what string, creds credentials.TransportCredentials) {
		t.Helper()
		cc, err := grpc.NewClient(n1.grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = chimev1.NewSchedulerClient(cc).Get(ctx, &chimev1.GetRequest{Id: "n1-a"})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: Get answered %v, want the connection refused (UNAVAILABLE)", what, err)
		}
	}
	refused("plaintext to the TLS gRPC port", insecure.NewCredentials())
	refused("no client certificate", credentials.NewTLS(clientSource(t, certstest.Pair{}, p.nodes.File).ClientConfig("")))
	stranger, err := p.bad.Client("app")
	if err != nil {
		t.Fatal(err)
	}
	refused("a client certificate from another CA", credentials.NewTLS(clientSource(t, stranger, p.nodes.File).ClientConfig("")))

	// The HTTP port is TLS too.
	if resp, err := http.Get("http://" + n1.httpAddr + "/readyz"); err == nil {
		_ = resp.Body.Close() // the status is what is checked; the body is not read
		if resp.StatusCode == http.StatusOK {
			t.Error("plaintext /readyz answered 200 on a TLS node")
		}
	}

	// The Raft port accepts nodes of the cluster's CA only.
	raftRefused := func(what string, dial func() (net.Conn, error)) {
		t.Helper()
		conn, err := dial()
		if err != nil {
			return // refused in the handshake
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("CHRM\x01\x00\x00\x00\x00")); err != nil {
			t.Fatal(err)
		}
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
			t.Errorf("%s: the Raft port kept the connection open (read: %v)", what, err)
		}
	}
	foreignNode, err := p.bad.Node("n9")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := certs.Load(certs.Files{Cert: foreignNode.Cert, Key: foreignNode.Key, CA: p.nodes.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raftRefused("a node certificate from another CA", func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n1.raftAd, foreign.PeerClientConfig())
	})
	raftRefused("a client certificate of the client CA", func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n1.raftAd, clientSource(t, app, p.nodes.File).PeerClientConfig())
	})
	raftRefused("plaintext", func() (net.Conn, error) { return net.DialTimeout("tcp", n1.raftAd, 5*time.Second) })
	// Of the cluster's CA, a node certificate speaks Raft only for a member:
	// n8 is none, and a certificate naming no node id is nobody's. n2's
	// own key (a second certificate for n2) is let through, and raft keeps
	// its connection open waiting for a message.
	nodeSource := func(pair certstest.Pair) *certs.Source {
		src, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: p.nodes.File}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	nonMember, err := p.nodes.Node("n8")
	if err != nil {
		t.Fatal(err)
	}
	raftRefused("a node certificate of the cluster's CA for a node that is not a member", func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n1.raftAd, nodeSource(nonMember).PeerClientConfig())
	})
	anonymous, err := p.nodes.Issue("old-style", []string{certs.NodeName}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	raftRefused("a node certificate naming no node id", func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n1.raftAd, nodeSource(anonymous).PeerClientConfig())
	})
	member, err := p.nodes.Node("n2")
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n1.raftAd, nodeSource(member).PeerClientConfig()); err != nil {
		t.Errorf("a member's certificate was refused in the handshake: %v", err)
	} else {
		if _, err := conn.Write([]byte("CHRM\x01\x00\x00\x00\x00")); err != nil {
			t.Fatal(err)
		}
		if err := conn.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Read(make([]byte, 1)); !os.IsTimeout(err) {
			t.Errorf("a member's Raft connection was closed: read %v", err)
		}
		_ = conn.Close() // only held open to see the member's connection stay so
	}

	// Authentication and roles.
	other, err := p.clients.Client("other-app")
	if err != nil {
		t.Fatal(err)
	}
	otherCC, err := grpc.NewClient(n1.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientSource(t, other, p.nodes.File).ClientConfig(""))))
	if err != nil {
		t.Fatal(err)
	}
	defer otherCC.Close()
	sched := func(cl chimev1.SchedulerClient, token, topic string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cl.Schedule(withToken(ctx, token), &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: "auth-" + topic, Topic: topic, Delay: durationpb.New(time.Hour)}})
		return err
	}
	expect := func(what string, err error, code codes.Code, msg string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
			t.Errorf("%s: %v; want %v with %q", what, err, code, msg)
		}
	}
	expect("no token, a certificate the auth file does not list", sched(chimev1.NewSchedulerClient(otherCC), "", "secure"), codes.Unauthenticated, `"other-app" has no role`)
	expect("a reader token scheduling", sched(n1.client(), "reader-token", "secure"), codes.PermissionDenied, "needs the scheduler or admin role")
	expect("a scheduler token outside its topics", sched(n1.client(), "scheduler-token", "payroll"), codes.PermissionDenied, `"payroll" is outside "billing"'s topics`)
	// Reserved topics are refused whatever the role: an admin cannot target
	// Kafka's internal topics or Chime's dead-letter topic either.
	expect("an admin scheduling to __consumer_offsets", sched(n1.client(), "", "__consumer_offsets"), codes.InvalidArgument,
		`"__consumer_offsets" is reserved: names starting with "__" are Kafka's internal topics`)
	expect("an admin scheduling to chime.deadletter", sched(n1.client(), "", "chime.deadletter"), codes.InvalidArgument,
		`"chime.deadletter" is reserved: it is one of Chime's own topics`)
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = c.admin("n1").Drain(withToken(drainCtx, "scheduler-token"), &chimev1.DrainRequest{Node: "n2"})
	cancelDrain()
	expect("a scheduler token calling Drain", err, codes.PermissionDenied, "needs the admin role")
	audit, _ := os.ReadFile(n1.dataDir + "/audit.log")
	if !strings.Contains(string(audit), `"who":"billing","peer":`) || !strings.Contains(string(audit), `"method":"/chime.v1.Admin/Drain","result":"PermissionDenied"`) {
		t.Errorf("n1's audit log does not show the refused Drain:\n%s", audit)
	}
	if strings.Contains(string(audit), "scheduler-token") {
		t.Error("a token reached the audit log")
	}

	// The debug endpoints are an admin's: the test's certificate is one, a
	// reader's token is not.
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusOK}, {"reader-token", http.StatusForbidden}} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+n1.httpAddr+"/debug/pebble", nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := n1.httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close() // the status is what is checked; the body is not read
		if resp.StatusCode != tc.want {
			t.Errorf("/debug/pebble with token %q: %s, want %d", tc.token, resp.Status, tc.want)
		}
	}

	// Token rotation: the scheduler's token is replaced in every node's
	// file (they share it here); the new one works and the old one is
	// refused within a couple of seconds, without a restart.
	writeAuth("scheduler-token-2")
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		return sched(c.nodes["n2"].client(), "scheduler-token-2", "secure") == nil, "the rotated token accepted"
	})
	expect("the rotated-out token", sched(c.nodes["n2"].client(), "scheduler-token", "secure"), codes.Unauthenticated, "not in the node's auth file")

	// chimectl with the TLS flags gets through; without a client
	// certificate it is refused.
	ctl := func(args ...string) (string, error) {
		out, err := exec.Command(chimectlBin, append([]string{"--addr", n1.grpcAddr, "--timeout", "5s", "--tls-ca", p.nodes.File}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := ctl("--tls-cert", app.Cert, "--tls-key", app.Key, "get", "n2-a"); err != nil || !strings.Contains(out, "fired") {
		t.Errorf("chimectl get over TLS with a client certificate: %v\n%s", err, out)
	}
	if out, err := ctl("get", "n2-a"); err == nil {
		t.Errorf("chimectl get without a client certificate succeeded:\n%s", out)
	}
	if out, err := ctl("--tls-cert", app.Cert, "--tls-key", app.Key, "--token", "reader-token", "schedule", "--topic", "secure", "--in", "1h"); err == nil ||
		!strings.Contains(out, "needs the scheduler or admin role") {
		t.Errorf("chimectl schedule --token with a reader's token: %v\n%s", err, out)
	}

	// Rotation: the client CA file is replaced on every node; within a
	// couple of seconds clients of the new CA are accepted and the old
	// CA's refused, with no restart.
	newClients, err := certstest.NewCA(p.dir, "clients-2026")
	if err != nil {
		t.Fatal(err)
	}
	app2, err := newClients.Client("app")
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, newClients.File, clientCA)
	creds2 := credentials.NewTLS(clientSource(t, app2, p.nodes.File).ClientConfig(""))
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		cc, err := grpc.NewClient(n1.grpcAddr, grpc.WithTransportCredentials(creds2))
		if err != nil {
			return false, err.Error()
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = chimev1.NewSchedulerClient(cc).Get(ctx, &chimev1.GetRequest{Id: "n1-a"})
		return err == nil, "a client of the new CA accepted after the rotation"
	})
	refused("a client of the rotated-out CA", n1.creds)
	if t.Failed() {
		for _, id := range c.order {
			t.Logf("%s stderr:\n%s", id, tail(c.nodes[id].stderr.String(), 3000))
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	copyFileContent(t, to, string(b))
}

// copyFileContent replaces the file at to with content, atomically.
func copyFileContent(t *testing.T, to, content string) {
	t.Helper()
	if err := os.WriteFile(to+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(err)
	}
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
