package raftmux

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// The stream header a dialled connection starts with.
const (
	muxMagic        = "CHRM"
	muxVersion      = 1
	muxHeaderLen    = len(muxMagic) + 1 + 4
	muxHeaderWait   = 5 * time.Second // a peer that connects must name its shard promptly
	muxAcceptBuffer = 16
)

// Bind names, in the address a layer dials, the node meant there:
// "<node>@<host:port>". Dialled then sees which node the dial was for, and
// can take that node's certificate alone. Raft messages name no recipient,
// and an address can change hands (a removed node's IP given to its
// replacement); a connection meant for one node that reached another would
// carry one node's replication to the other's replica.
func Bind(node raft.ServerID, addr raft.ServerAddress) raft.ServerAddress {
	return raft.ServerAddress(string(node) + "@" + string(addr))
}

// Bound splits an address Bind made into the node and its host:port; ok is
// false for a bare host:port.
func Bound(addr string) (node, hostport string, ok bool) {
	i := strings.LastIndexByte(addr, '@')
	if i < 0 {
		return "", addr, false
	}
	return addr[:i], addr[i+1:], true
}

// Mux accepts Raft connections on one listener and hands each to the stream
// layer of the shard it names.
type Mux struct {
	ln     net.Listener
	tls    *TLS
	logger *slog.Logger

	mu     sync.Mutex
	layers map[uint32]*streamLayer
	closed bool

	done chan struct{} // closed when the accept loop has returned

	refusedMu sync.Mutex
	refusedBy map[string]*refusedHost // by remote host
}

// refusedLogEvery is how often, at most, the refusals of one remote host
// take a log line after its first: a peer retrying in a loop (a node with
// the wrong certificate, a scanner) cannot flood the log.
const refusedLogEvery = 10 * time.Second

// refusedHost is what the mux keeps of the refusals of one remote host.
type refusedHost struct {
	logged time.Time // the last line written
	more   int       // refusals since then
}

// ErrClosed is returned by Layer once the Mux is closed.
var ErrClosed = errors.New("raftmux: closed")

// TLS makes every connection of the mux TLS, both ways: Server for the
// connections it accepts, Client for those its layers dial. Both should
// verify the other end as a node of the cluster (the Raft port is for nodes
// only); the mux only runs the handshakes, and asks Admit and Dialled,
// when set, whether the node at the other end may speak.
type TLS struct {
	Server, Client *tls.Config
	// Admit is asked about each accepted connection once its handshake is
	// done and its header read (layer is the id the header names); an error
	// refuses it: the connection is closed and the refusal logged.
	Admit func(layer uint32, cs tls.ConnectionState) error
	// Dialled is asked about each connection a layer dials, once its
	// handshake is done (layer is the dialling layer's id, addr the address
	// dialled, as Bind made it when the dialler named the node); an error
	// fails the dial.
	Dialled func(layer uint32, addr string, cs tls.ConnectionState) error
}

// New serves Raft connections on ln until Close, in TLS if tlsConf is not
// nil. A nil logger discards.
func New(ln net.Listener, tlsConf *TLS, logger *slog.Logger) *Mux {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Mux{ln: ln, tls: tlsConf, logger: logger, layers: make(map[uint32]*streamLayer), done: make(chan struct{})}
	go m.acceptLoop()
	return m
}

// Addr is the address peers dial.
func (m *Mux) Addr() net.Addr { return m.ln.Addr() }

// Layer returns the raft.StreamLayer of shard id. Closing the layer
// unregisters it; connections for an unregistered shard are dropped.
func (m *Mux) Layer(id uint32) (raft.StreamLayer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if _, ok := m.layers[id]; ok {
		return nil, fmt.Errorf("shard %d: raft stream layer already registered", id)
	}
	l := &streamLayer{mux: m, id: id, conns: make(chan net.Conn, muxAcceptBuffer), closed: make(chan struct{})}
	m.layers[id] = l
	return l, nil
}

// Close stops accepting and closes every layer.
func (m *Mux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	layers := m.layers
	m.layers = map[uint32]*streamLayer{}
	m.mu.Unlock()
	err := m.ln.Close()
	// Layers first: a connection being routed may wait on its layer, and
	// the accept loop waits for the connections being routed.
	for _, l := range layers {
		l.shut()
	}
	<-m.done
	return err
}

// refused logs a connection refused from remote: a host's first refusal,
// then at most one line every refusedLogEvery, written by the refusal that
// comes after a window has passed and counting the window's ("more").
func (m *Mux) refused(msg string, remote net.Addr, err error) {
	host := remote.String()
	if h, _, serr := net.SplitHostPort(host); serr == nil {
		host = h
	}
	now := time.Now()
	m.refusedMu.Lock()
	r := m.refusedBy[host]
	switch {
	case r == nil || (r.more == 0 && now.Sub(r.logged) >= refusedLogEvery):
		if m.refusedBy == nil || len(m.refusedBy) > 1024 {
			for h, r := range m.refusedBy { // forget the quiet hosts
				if now.Sub(r.logged) >= refusedLogEvery {
					delete(m.refusedBy, h)
				}
			}
			if m.refusedBy == nil {
				m.refusedBy = map[string]*refusedHost{}
			}
		}
		m.refusedBy[host] = &refusedHost{logged: now}
		m.refusedMu.Unlock()
		m.logger.Warn(msg, "remote", remote, "err", err)
		return
	case now.Sub(r.logged) < refusedLogEvery:
		r.more++
		m.refusedMu.Unlock()
		return
	}
	more := r.more + 1
	r.logged, r.more = now, 0
	m.refusedMu.Unlock()
	m.logger.Warn(msg, "remote", remote, "err", err, "more", more, "since", refusedLogEvery)
}

func (m *Mux) acceptLoop() {
	defer close(m.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			m.logger.Warn("raft mux accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.route(c)
		}()
	}
}

// route reads the header (after the TLS handshake, with TLS) and hands c
// to its shard, or closes it. The handshake and the header together must
// arrive within muxHeaderWait.
func (m *Mux) route(c net.Conn) {
	var hdr [muxHeaderLen]byte
	deadline := time.Now().Add(muxHeaderWait)
	// Without the deadline a peer that sends nothing would hold this
	// goroutine, and Close, which waits for it, forever.
	if err := c.SetDeadline(deadline); err != nil {
		_ = c.Close()
		return
	}
	if m.tls != nil {
		tc := tls.Server(c, m.tls.Server)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			m.refused("raft mux: TLS handshake refused", c.RemoteAddr(), err)
			_ = c.Close()
			return
		}
		c = tc
	}
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		_ = c.Close()
		return
	}
	// Clearing the deadline fails only on a closed connection (a net.Pipe:
	// closed at either end, as by a peer that hung up after the header),
	// which raft then finds closed on its first read.
	_ = c.SetDeadline(time.Time{})
	if string(hdr[:len(muxMagic)]) != muxMagic || hdr[len(muxMagic)] != muxVersion {
		m.refused("raft mux: connection without a Chime header", c.RemoteAddr(), nil)
		_ = c.Close()
		return
	}
	id := binary.BigEndian.Uint32(hdr[len(muxMagic)+1:])
	if tc, ok := c.(*tls.Conn); ok && m.tls.Admit != nil {
		if err := m.tls.Admit(id, tc.ConnectionState()); err != nil {
			m.refused("raft mux: peer refused", c.RemoteAddr(), err)
			_ = c.Close()
			return
		}
	}
	m.mu.Lock()
	l := m.layers[id]
	m.mu.Unlock()
	if l == nil {
		_ = c.Close()
		return
	}
	select {
	case l.conns <- c:
		// A layer that closed while c was on its way may have emptied its
		// queue before this send: empty it again, or c stays open.
		select {
		case <-l.closed:
			l.drain()
		default:
		}
	case <-l.closed:
		_ = c.Close()
	}
}

// streamLayer is one shard's view of the mux: a raft.StreamLayer.
type streamLayer struct {
	mux       *Mux
	id        uint32
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *streamLayer) Close() error {
	l.mux.mu.Lock()
	if l.mux.layers[l.id] == l {
		delete(l.mux.layers, l.id)
	}
	l.mux.mu.Unlock()
	l.shut()
	return nil
}

func (l *streamLayer) shut() {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.drain()
	})
}

// drain closes the connections queued for Accept.
func (l *streamLayer) drain() {
	for {
		select {
		case c := <-l.conns:
			_ = c.Close()
		default:
			return
		}
	}
}

func (l *streamLayer) Addr() net.Addr { return l.mux.ln.Addr() }

func (l *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	hostport := string(addr)
	if _, at, ok := Bound(string(addr)); ok {
		hostport = at
	}
	c, err := net.DialTimeout("tcp", hostport, timeout)
	if err != nil {
		return nil, err
	}
	if l.mux.tls != nil {
		tc := tls.Client(c, l.mux.tls.Client)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("raft TLS handshake with %s: %w", addr, err)
		}
		if l.mux.tls.Dialled != nil {
			if err := l.mux.tls.Dialled(l.id, string(addr), tc.ConnectionState()); err != nil {
				_ = c.Close()
				return nil, fmt.Errorf("raft connection to %s: %w", addr, err)
			}
		}
		c = tc
	}
	var hdr [muxHeaderLen]byte
	copy(hdr[:], muxMagic)
	hdr[len(muxMagic)] = muxVersion
	binary.BigEndian.PutUint32(hdr[len(muxMagic)+1:], l.id)
	// Without the deadline a peer that reads nothing could hold the dial
	// past timeout; left on, it would cut raft's writes once it passed.
	if err := c.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		_ = c.Close()
		return nil, err
	}
	if _, err := c.Write(hdr[:]); err != nil {
		_ = c.Close()
		return nil, err
	}
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}
