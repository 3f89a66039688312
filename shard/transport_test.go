package shard

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// TestReplicationIsNotPipelined: a replica's transport refuses raft's pipelined
// replication, so raft sends each AppendEntries and waits for its answer. Raft 1.7.3's
// pipeline could wedge after a follower's Success=false, leaving the follower without
// entries and the leader's Shutdown waiting for ever (transportConfig).
func TestReplicationIsNotPipelined(t *testing.T) {
	nt := raft.NewNetworkTransportWithConfig(transportConfig(newIdleLayer(), hclog.NewNullLogger()))
	defer func() { _ = nt.Close() }() // closes the idle layer: nothing to report
	if _, err := nt.AppendEntriesPipeline("n2", "10.0.0.2:7071"); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("AppendEntriesPipeline: %v, want %v", err, raft.ErrPipelineReplicationNotSupported)
	}
}

// idleLayer is a stream layer that accepts nothing until closed and dials nowhere.
type idleLayer struct{ closed chan struct{} }

func newIdleLayer() *idleLayer { return &idleLayer{closed: make(chan struct{})} }

func (l *idleLayer) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *idleLayer) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}
func (l *idleLayer) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7071} }
func (l *idleLayer) Dial(raft.ServerAddress, time.Duration) (net.Conn, error) {
	return nil, errors.New("the idle layer dials nowhere")
}
