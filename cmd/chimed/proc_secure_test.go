package main

import (
	"context"
	"crypto/tls"
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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/cmd/chimed/node/nodetest"
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

func newSecurePKI(t *testing.T) *securePKI {
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
func clientSource(t *testing.T, pair certstest.Pair, ca string) *certs.Source {
	t.Helper()
	s, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// secure makes d a TLS node of the PKI, with client certificates required
// (signed by clientCA), and its test clients present client's certificate.
func (p *securePKI) secure(t *testing.T, d *daemon, clientCA string, client certstest.Pair) {
	t.Helper()
	pair, err := p.nodes.Node(d.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	d.extra = append(d.extra, "--tls-cert", pair.Cert, "--tls-key", pair.Key, "--tls-ca", p.nodes.File, "--tls-client-ca", clientCA)
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
	p := newSecurePKI(t)
	clientCA := p.dir + "/client-ca.pem"
	copyFile(t, p.clients.File, clientCA)
	app, err := p.clients.Client("app")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, brokers: broker(t), nodes: map[string]*daemon{}}
	for _, id := range []string{"n1", "n2", "n3"} {
		c.addWith(id, func(d *daemon) { p.secure(t, d, clientCA, app) })
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
			if _, err := c.nodes[c.order[(i+1)%3]].client().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
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
		resp.Body.Close()
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
		conn.Write([]byte("CHRM\x01\x00\x00\x00\x00"))
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
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
	if err := os.WriteFile(to+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
