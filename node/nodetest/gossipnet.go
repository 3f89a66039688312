package nodetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// gossipNet is an in-memory network for memberlist. memberlist's own
// MockNetwork cannot serve here: its maps are unguarded (adding a node to a
// running cluster races), a packet to a node that has shut down blocks the
// sender forever (its channels are unbuffered and nobody reads them), and it
// cannot cut links. Here packets are dropped as UDP would drop them: when
// the receiver is gone, cut off, or behind on reading.
type gossipNet struct {
	mu    sync.Mutex
	nodes map[string]*gossipTransport // by address
	cut   map[[2]string]bool
	port  int
}

func newGossipNet() *gossipNet {
	return &gossipNet{nodes: map[string]*gossipTransport{}, cut: map[[2]string]bool{}}
}

// packetBuffer is how many packets a node may have unread before more are
// dropped; memberlist reads them as they come, so this only absorbs bursts.
const packetBuffer = 256

// transport returns a transport at addr, or at a new address if addr is "".
// A restarted node takes its old address again, as a process restarted on
// the same --gossip-addr does, so the members' reconnects find it.
func (n *gossipNet) transport(addr string) (*gossipTransport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr == "" {
		n.port++
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
	}
	if _, ok := n.nodes[addr]; ok {
		return nil, fmt.Errorf("nodetest: gossip address %s is in use", addr)
	}
	t := &gossipTransport{
		net: n, addr: addr, packets: make(chan *memberlist.Packet, packetBuffer),
		streams: make(chan net.Conn), done: make(chan struct{}),
	}
	n.nodes[addr] = t
	return t, nil
}

// reach returns the transport at to if from can reach it.
func (n *gossipNet) reach(from, to string) *gossipTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[pair(from, to)] {
		return nil
	}
	return n.nodes[to]
}

func (n *gossipNet) setCut(a, b string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cut {
		n.cut[pair(a, b)] = true
	} else {
		delete(n.cut, pair(a, b))
	}
}

// gossipTransport is one node's memberlist.Transport on a gossipNet.
type gossipTransport struct {
	net     *gossipNet
	addr    string
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
}

var _ memberlist.NodeAwareTransport = (*gossipTransport)(nil)

type gossipAddr string

func (a gossipAddr) Network() string { return "inmem" }
func (a gossipAddr) String() string  { return string(a) }

func (t *gossipTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(t.addr)
	if err != nil {
		return nil, 0, err
	}
	p, err := strconv.Atoi(port)
	return net.ParseIP(host), p, err
}

func (t *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *gossipTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest := t.net.reach(t.addr, a.Addr)
	if dest == nil {
		return now, nil // lost, as a datagram to nobody is
	}
	select {
	case dest.packets <- &memberlist.Packet{Buf: bytes.Clone(b), From: gossipAddr(t.addr), Timestamp: now}:
	default: // the receiver is behind or gone: dropped
	}
	return now, nil
}

func (t *gossipTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *gossipTransport) IngestPacket(conn net.Conn, addr net.Addr, now time.Time, shouldClose bool) error {
	if shouldClose {
		defer func() { _ = conn.Close() }() // read only: a read error is what matters
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, conn); err != nil {
		return fmt.Errorf("reading packet: %w", err)
	}
	if buf.Len() < 1 {
		return fmt.Errorf("packet too short (%d bytes) from %s", buf.Len(), addr)
	}
	select {
	case t.packets <- &memberlist.Packet{Buf: buf.Bytes(), From: addr, Timestamp: now}:
	default:
	}
	return nil
}

func (t *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// errUnreachable is what a dial to a node that is down or cut off gets.
var errUnreachable = errors.New("nodetest: gossip address unreachable")

func (t *gossipTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest := t.net.reach(t.addr, a.Addr)
	if dest == nil {
		return nil, fmt.Errorf("%w: %s", errUnreachable, a.Addr)
	}
	local, remote := net.Pipe()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case dest.streams <- remote:
		return local, nil
	case <-dest.done:
	case <-timer.C:
	}
	// A net.Pipe's Close returns nil.
	_ = local.Close()
	_ = remote.Close()
	return nil, fmt.Errorf("%w: %s did not accept", errUnreachable, a.Addr)
}

func (t *gossipTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *gossipTransport) IngestStream(conn net.Conn) error {
	select {
	case t.streams <- conn:
		return nil
	case <-t.done:
		_ = conn.Close() // refused unread: the stream's data is lost either way
		return errUnreachable
	}
}

// Shutdown takes the transport off the network; memberlist calls it.
func (t *gossipTransport) Shutdown() error {
	t.once.Do(func() {
		close(t.done)
		t.net.mu.Lock()
		if t.net.nodes[t.addr] == t {
			delete(t.net.nodes, t.addr)
		}
		t.net.mu.Unlock()
	})
	return nil
}
