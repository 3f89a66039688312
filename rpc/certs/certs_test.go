package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chimehq/chime/rpc/certs/certstest"
)

type pki struct {
	ca, other, clients *certstest.CA
	node, node2        certstest.Pair
	foreignNode        certstest.Pair // a node certificate from another CA
	client             certstest.Pair // signed by the client CA
	nodeCAClient       certstest.Pair // signed by the node CA, without NodeName
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	p := &pki{}
	var err error
	must := func(e error) {
		t.Helper()
		if e != nil {
			t.Fatal(e)
		}
	}
	p.ca, err = certstest.NewCA(dir, "cluster")
	must(err)
	p.other, err = certstest.NewCA(dir, "other")
	must(err)
	p.clients, err = certstest.NewCA(dir, "clients")
	must(err)
	p.node, err = p.ca.Node("node-1")
	must(err)
	p.node2, err = p.ca.Node("node-2")
	must(err)
	p.foreignNode, err = p.other.Node("intruder")
	must(err)
	p.client, err = p.clients.Client("app-1")
	must(err)
	p.nodeCAClient, err = p.ca.Client("not-a-node")
	must(err)
	return p
}

func load(t *testing.T, f Files) *Source {
	t.Helper()
	s, err := Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve accepts TLS connections with cfg on loopback and reports each
// handshake's outcome.
func serve(t *testing.T, cfg *tls.Config) (addr string, results <-chan error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan error, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			err = handshake(c.(*tls.Conn), 5*time.Second)
			if err == nil {
				_, err = io.WriteString(c, "ok")
			}
			out <- err
			_ = c.Close() // the test's answer went through out; the connection is done
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String(), out
}

// dial connects with cfg and returns the client's error and the server's.
func dial(t *testing.T, addr string, cfg *tls.Config, results <-chan error) (client, server error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err == nil {
		// TLS 1.3 reports a client certificate the server refuses only on
		// the first read.
		_, err = io.ReadAll(c)
		_ = c.Close() // the handshake's outcome is err, from the read above
	}
	select {
	case server = <-results:
	case <-time.After(5 * time.Second):
		t.Fatal("the server reported no handshake")
	}
	return err, server
}

func TestRaftPortAcceptsOnlyNodes(t *testing.T) {
	p := newPKI(t)
	srv := load(t, Files{Cert: p.node.Cert, Key: p.node.Key, CA: p.ca.File})
	if err := srv.CheckNode("node-1"); err != nil {
		t.Fatal(err)
	}
	// node-1's certificate is not node-2's, and one that names no node id
	// (node.chime alone, as before node ids) is nobody's.
	if err := srv.CheckNode("node-2"); err == nil || !strings.Contains(err.Error(), `is node "node-1"'s: the certificate of node "node-2" must name "node-2.node.chime"`) {
		t.Errorf("CheckNode(node-2) with node-1's certificate: %v", err)
	}
	anon, err := p.ca.Issue("old", []string{NodeName}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	if err := load(t, Files{Cert: anon.Cert, Key: anon.Key, CA: p.ca.File}).CheckNode("old"); err == nil || !strings.Contains(err.Error(), `names no node id: the certificate of node "old" must name "old.node.chime"`) {
		t.Errorf("CheckNode of a certificate without a node id: %v", err)
	}
	two, err := p.ca.Issue("two", []string{NodeName, NodeIDName("n2"), NodeIDName("n3")}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	if err := load(t, Files{Cert: two.Cert, Key: two.Key, CA: p.ca.File}).CheckNode("n2"); err == nil || !strings.Contains(err.Error(), "names no node id") {
		t.Errorf("CheckNode of a certificate naming two node ids: %v", err)
	}
	addr, results := serve(t, srv.PeerServerConfig())
	for _, tc := range []struct {
		name string
		from Files
		ok   bool
	}{
		{"a node of the cluster", Files{Cert: p.node2.Cert, Key: p.node2.Key, CA: p.ca.File}, true},
		{"a node certificate from another CA", Files{Cert: p.foreignNode.Cert, Key: p.foreignNode.Key, CA: p.ca.File}, false},
		{"a certificate of the node CA without the node name", Files{Cert: p.nodeCAClient.Cert, Key: p.nodeCAClient.Key, CA: p.ca.File}, false},
		{"no certificate", Files{CA: p.ca.File}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cerr, serr := dial(t, addr, load(t, tc.from).PeerClientConfig(), results)
			if tc.ok && (cerr != nil || serr != nil) {
				t.Fatalf("refused: client %v, server %v", cerr, serr)
			}
			if !tc.ok && (cerr == nil || serr == nil) {
				t.Fatalf("accepted: client %v, server %v", cerr, serr)
			}
		})
	}
	// A node dialling a server whose certificate is another CA's refuses it.
	foreign := load(t, Files{Cert: p.foreignNode.Cert, Key: p.foreignNode.Key, CA: p.other.File})
	addr2, results2 := serve(t, foreign.PeerServerConfig())
	if cerr, _ := dial(t, addr2, load(t, Files{Cert: p.node2.Cert, Key: p.node2.Key, CA: p.ca.File}).PeerClientConfig(), results2); cerr == nil ||
		!strings.Contains(cerr.Error(), "not a node of this cluster") {
		t.Fatalf("a node accepted a server of another CA: %v", cerr)
	}
}

func TestAPIPortIdentities(t *testing.T) {
	p := newPKI(t)
	srv := load(t, Files{Cert: p.node.Cert, Key: p.node.Key, CA: p.ca.File, ClientCA: p.clients.File})
	addr, results := serve(t, srv.ServerConfig())
	for _, tc := range []struct {
		name string
		from Files
		ok   bool
	}{
		{"a client of the client CA", Files{Cert: p.client.Cert, Key: p.client.Key, CA: p.ca.File}, true},
		{"a node", Files{Cert: p.node2.Cert, Key: p.node2.Key, CA: p.ca.File}, true},
		{"a client certificate from another CA", Files{Cert: p.foreignNode.Cert, Key: p.foreignNode.Key, CA: p.ca.File}, false},
		{"no certificate, with a client CA set", Files{CA: p.ca.File}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cerr, serr := dial(t, addr, load(t, tc.from).ClientConfig(""), results)
			if tc.ok && (cerr != nil || serr != nil) {
				t.Fatalf("refused: client %v, server %v", cerr, serr)
			}
			if !tc.ok && (cerr == nil || serr == nil) {
				t.Fatalf("accepted: client %v, server %v", cerr, serr)
			}
		})
	}
	// Without a client CA, a client need not present a certificate.
	open := load(t, Files{Cert: p.node.Cert, Key: p.node.Key, CA: p.ca.File})
	addr2, results2 := serve(t, open.ServerConfig())
	if cerr, serr := dial(t, addr2, load(t, Files{CA: p.ca.File}).ClientConfig("localhost"), results2); cerr != nil || serr != nil {
		t.Fatalf("refused a client without a certificate: %v, %v", cerr, serr)
	}
	// The client verifies the server's name.
	if cerr, _ := dial(t, addr2, load(t, Files{CA: p.ca.File}).ClientConfig("127.0.0.2"), results2); cerr == nil {
		t.Fatal("a client accepted a certificate that does not name the host it dialled")
	}

	m := srv.current()
	for _, tc := range []struct {
		pair certstest.Pair
		want Identity
	}{
		{p.client, Identity{Cert: true, Name: "app-1"}},
		{p.node2, Identity{Node: true, NodeID: "node-2", Name: "node-2"}},
	} {
		cert, err := tls.LoadX509KeyPair(tc.pair.Cert, tc.pair.Key)
		if err != nil {
			t.Fatal(err)
		}
		leaf := cert.Leaf
		id, err := m.classify([]*x509.Certificate{leaf}, x509.ExtKeyUsageClientAuth)
		if err != nil || id != tc.want {
			t.Errorf("%s: identity %+v, %v; want %+v", tc.pair.Cert, id, err, tc.want)
		}
	}
}

func TestReloadOnChange(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	files := Files{Cert: dir + "/node.pem", Key: dir + "/node-key.pem", CA: dir + "/ca.pem"}
	install := func(cert, key, ca string) {
		t.Helper()
		for src, dst := range map[string]string{cert: files.Cert, key: files.Key, ca: files.CA} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst+".tmp", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(dst+".tmp", dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(p.node.Cert, p.node.Key, p.ca.File)
	srv := load(t, files)
	now := time.Now()
	srv.now = func() time.Time { return now }
	addr, results := serve(t, srv.PeerServerConfig())
	intruder := load(t, Files{Cert: p.foreignNode.Cert, Key: p.foreignNode.Key, CA: p.other.File})
	member := load(t, Files{Cert: p.node2.Cert, Key: p.node2.Key, CA: p.ca.File})
	if _, serr := dial(t, addr, intruder.PeerClientConfig(), results); serr == nil {
		t.Fatal("accepted a node of another CA")
	}

	// The cluster moves to the other CA: the server's files are replaced.
	rotated, err := p.other.Node("node-1")
	if err != nil {
		t.Fatal(err)
	}
	install(rotated.Cert, rotated.Key, p.other.File)
	if _, serr := dial(t, addr, member.PeerClientConfig(), results); serr != nil {
		t.Fatalf("reloaded before a second passed: %v", serr)
	}
	now = now.Add(reloadEvery)
	if cerr, serr := dial(t, addr, intruder.PeerClientConfig(), results); cerr != nil || serr != nil {
		t.Fatalf("a node of the new CA was refused after the rotation: %v, %v", cerr, serr)
	}
	if _, serr := dial(t, addr, member.PeerClientConfig(), results); serr == nil {
		t.Fatal("a node of the old CA was accepted after the rotation")
	}

	// A broken rotation keeps what is in use.
	if err := os.WriteFile(files.Key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(reloadEvery)
	if cerr, serr := dial(t, addr, intruder.PeerClientConfig(), results); cerr != nil || serr != nil {
		t.Fatalf("a half-rotated key took the node down: %v, %v", cerr, serr)
	}
}

func TestLoadErrorsNameTheFlag(t *testing.T) {
	p := newPKI(t)
	for _, tc := range []struct {
		files Files
		want  string
	}{
		{Files{Cert: p.node.Cert}, "--tls-cert and --tls-key go together"},
		{Files{Cert: p.node.Cert, Key: p.client.Key}, "--tls-cert " + p.node.Cert + " with --tls-key"},
		{Files{CA: "/nonexistent/ca.pem"}, "--tls-ca /nonexistent/ca.pem"},
		{Files{ClientCA: p.node.Key}, "--tls-client-ca " + p.node.Key + ": no PEM certificate"},
	} {
		_, err := Load(tc.files, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%+v) = %v, want %q", tc.files, err, tc.want)
		}
	}
	for _, tc := range []struct {
		files Files
		want  string
	}{
		{Files{Cert: p.client.Cert, Key: p.client.Key, CA: p.clients.File}, "is not a node certificate"},
		{Files{Cert: p.foreignNode.Cert, Key: p.foreignNode.Key, CA: p.ca.File}, "is not a node certificate"},
		{Files{Cert: p.node.Cert, Key: p.node.Key}, "--tls-ca is required"},
	} {
		err := load(t, tc.files).CheckNode("node-1")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckNode(%+v) = %v, want %q", tc.files, err, tc.want)
		}
	}
}

// handshake runs c's TLS handshake within timeout.
func handshake(c *tls.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.HandshakeContext(ctx)
}
