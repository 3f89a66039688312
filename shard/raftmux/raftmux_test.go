package raftmux

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/chimehq/chime/rpc/certs"
	"github.com/chimehq/chime/rpc/certs/certstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRoutesByShardHeader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(ln, nil, nil)
	defer m.Close()
	l3, err := m.Layer(3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Layer(3); err == nil {
		t.Fatal("a second layer for shard 3 was registered")
	}
	l4, err := m.Layer(4)
	if err != nil {
		t.Fatal(err)
	}
	// A dial for shard 4 reaches shard 4's layer, bytes after the header intact.
	c, err := (&streamLayer{mux: m, id: 4}).Dial(raft.ServerAddress(ln.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("raft")); err != nil {
		t.Fatal(err)
	}
	got, err := l4.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "raft" {
		t.Fatalf("shard 4 read %q, %v; want the bytes after the header", buf, err)
	}

	// A connection for a shard without a layer, or without the header, is closed.
	for name, dial := range map[string]func() (net.Conn, error){
		"unregistered shard": func() (net.Conn, error) {
			return (&streamLayer{mux: m, id: 9}).Dial(raft.ServerAddress(ln.Addr().String()), time.Second)
		},
		"no header": func() (net.Conn, error) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err == nil {
				_, err = c.Write([]byte("GET / HTTP/1.1\r\n"))
			}
			return c, err
		},
	} {
		c, err := dial()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		// EOF, or a reset when the mux closed it with bytes unread.
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: read %v, want the connection closed by the mux", name, err)
		}
		_ = c.Close()
	}

	// Close stops every layer; a closed mux registers none.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l3.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := m.Layer(5); !errors.Is(err, ErrClosed) {
		t.Fatalf("Layer after Close: %v, want ErrClosed", err)
	}
}

// TestClosedLayerLeavesNoConnectionOpen: a connection routed to a layer as
// it closes is closed, never left in the layer's queue. route's send and
// the layer's closing are both ready then, and Go picks between them at
// random, so over 64 connections a queue that is not emptied again after
// the send keeps some of them open.
func TestClosedLayerLeavesNoConnectionOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(ln, nil, slog.New(slog.DiscardHandler))
	defer m.Close()
	l, err := m.Layer(3)
	if err != nil {
		t.Fatal(err)
	}
	sl := l.(*streamLayer)
	sl.shut() // closed, but still routable, as in the moment before Close unregisters it
	m.mu.Lock()
	m.layers[3] = sl
	m.mu.Unlock()

	var hdr [muxHeaderLen]byte
	copy(hdr[:], muxMagic)
	hdr[len(muxMagic)] = muxVersion
	binary.BigEndian.PutUint32(hdr[len(muxMagic)+1:], 3)
	for i := range 64 {
		local, remote := net.Pipe()
		go func() { _, _ = remote.Write(hdr[:]) }()
		m.route(local)
		_ = remote.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := remote.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("connection %d: read %v, want it closed", i, err)
		}
		_ = remote.Close()
	}
	if n := len(sl.conns); n != 0 {
		t.Fatalf("%d connections left in a closed layer's queue", n)
	}
}

// TestTLS: with TLS, a node of the cluster's CA reaches its shard's layer
// through the handshake; a plaintext connection, a node of another CA and a
// connection that never finishes its handshake are closed by the mux.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := certstest.NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	other, err := certstest.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	source := func(ca *certstest.CA, node string) *certs.Source {
		pair, err := ca.Node(node)
		if err != nil {
			t.Fatal(err)
		}
		s, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca.File}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	muxTLS := func(s *certs.Source) *TLS { return &TLS{Server: s.PeerServerConfig(), Client: s.PeerClientConfig()} }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(ln, muxTLS(source(ca, "n1")), nil)
	defer m.Close()
	l1, err := m.Layer(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := raft.ServerAddress(ln.Addr().String())

	peer := &Mux{tls: muxTLS(source(ca, "n2"))}
	c, err := (&streamLayer{mux: peer, id: 1}).Dial(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("raft")); err != nil {
		t.Fatal(err)
	}
	got, err := l1.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "raft" {
		t.Fatalf("shard 1 read %q, %v; want the bytes after the header", buf, err)
	}

	intruder := &Mux{tls: muxTLS(source(other, "n3"))}
	if c, err := (&streamLayer{mux: intruder, id: 1}).Dial(addr, 5*time.Second); err == nil {
		// TLS 1.3 tells the client of a refused certificate on its first read.
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a node of another CA was accepted: read %v", err)
		}
		_ = c.Close()
	}
	plain := &Mux{}
	if c, err := (&streamLayer{mux: plain, id: 1}).Dial(addr, 5*time.Second); err == nil {
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a plaintext connection was accepted: read %v", err)
		}
		_ = c.Close()
	}
	select {
	case c := <-l1.(*streamLayer).conns:
		_ = c.Close()
		t.Fatal("a refused connection reached the layer")
	default:
	}
}

// TestAdmitAndDialled: the mux asks Admit about every accepted connection,
// with the layer its header names and the handshake's peer, and closes the
// ones it refuses before they reach the layer; a layer's Dial asks Dialled
// about the node it reached, and fails when that refuses.
func TestAdmitAndDialled(t *testing.T) {
	dir := t.TempDir()
	ca, err := certstest.NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	source := func(node string) *certs.Source {
		pair, err := ca.Node(node)
		if err != nil {
			t.Fatal(err)
		}
		s, err := certs.Load(certs.Files{Cert: pair.Cert, Key: pair.Key, CA: ca.File}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	type asked struct {
		layer uint32
		node  string
	}
	admitted := make(chan asked, 4)
	n1 := source("n1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(ln, &TLS{Server: n1.PeerServerConfig(), Client: n1.PeerClientConfig(), Admit: func(layer uint32, cs tls.ConnectionState) error {
		node := certs.PeerNodeID(cs)
		admitted <- asked{layer, node}
		if node != "n2" {
			return fmt.Errorf("node %q may not speak", node)
		}
		return nil
	}}, nil)
	defer m.Close()
	l7, err := m.Layer(7)
	if err != nil {
		t.Fatal(err)
	}
	addr := raft.ServerAddress(ln.Addr().String())
	dialAt := func(node string, at raft.ServerAddress, dialled func(uint32, string, tls.ConnectionState) error) (net.Conn, error) {
		s := source(node)
		return (&streamLayer{mux: &Mux{tls: &TLS{Server: s.PeerServerConfig(), Client: s.PeerClientConfig(), Dialled: dialled}}, id: 7}).Dial(at, 5*time.Second)
	}
	dial := func(node string, dialled func(uint32, string, tls.ConnectionState) error) (net.Conn, error) {
		return dialAt(node, addr, dialled)
	}

	c, err := dial("n2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := l7.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = got.Close()
	if a := <-admitted; a != (asked{7, "n2"}) {
		t.Fatalf("Admit was asked about %+v, want layer 7 and node n2", a)
	}

	c3, err := dial("n3", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if a := <-admitted; a != (asked{7, "n3"}) {
		t.Fatalf("Admit was asked about %+v, want layer 7 and node n3", a)
	}
	if err := c3.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection Admit refused was left open: read %v", err)
	}
	select {
	case c := <-l7.(*streamLayer).conns:
		_ = c.Close()
		t.Fatal("a refused connection reached the layer")
	default:
	}

	// The dialling side: the node reached at addr is n1; a Dialled that
	// wants another refuses it, and the dial fails naming why.
	_, err = dial("n2", func(layer uint32, a string, cs tls.ConnectionState) error {
		if layer != 7 || a != string(addr) {
			t.Errorf("Dialled was asked about layer %d and %s, want 7 and %s", layer, a, addr)
		}
		if got := certs.PeerNodeID(cs); got != "n4" {
			return fmt.Errorf("%s is node %q's address, not n4's", a, got)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), `is node "n1"'s address, not n4's`) {
		t.Fatalf("Dial to n1's address expecting n4: %v", err)
	}

	// An address bound to a node (Bind) is dialled at its host:port, and
	// Dialled is told which node the dial meant.
	cb, err := dialAt("n2", Bind("n1", addr), func(_ uint32, a string, cs tls.ConnectionState) error {
		if node, at, ok := Bound(a); !ok || node != "n1" || at != string(addr) || certs.PeerNodeID(cs) != "n1" {
			return fmt.Errorf("Dialled was told %q (%q %q %v), reaching %s", a, node, at, ok, certs.PeerNodeID(cs))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Dial of a bound address: %v", err)
	}
	_ = cb.Close()
	if _, at, ok := Bound("10.0.0.1:7071"); ok || at != "10.0.0.1:7071" {
		t.Errorf("a bare address reads as bound (%v) or changes (%q)", ok, at)
	}
}

// TestRefusalsCannotFloodTheLog: a host refused in a loop gets its first
// refusal logged, then one line a window counting the others; another host
// is its own.
func TestRefusalsCannotFloodTheLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		m := &Mux{logger: slog.New(slog.NewTextHandler(&buf, nil))}
		a := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 1000}
		for i := range 500 {
			a.Port = 1000 + i // a new connection each time
			m.refused("raft mux: connection without a Chime header", a, nil)
		}
		m.refused("raft mux: connection without a Chime header", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 8), Port: 1}, nil)
		if n := strings.Count(buf.String(), "\n"); n != 2 {
			t.Fatalf("%d lines for 500 refusals of one host and one of another:\n%s", n, &buf)
		}
		time.Sleep(refusedLogEvery)
		m.refused("raft mux: connection without a Chime header", a, nil)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[2], "more=500") {
			t.Fatalf("a window later: %q; want a third line counting 500", lines)
		}
	})
}
