package shard

import (
	"errors"
	"io"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/shard/raftmux"
)

// boundTransport hands the network transport, for every call, the address
// raft dials with the server it means named in it (raftmux.Bind), so that a
// TLS stream layer takes that node's certificate there and no other. Raft
// messages name no recipient, and an address can change hands: in a fault
// run a removed node's IP was given to its replacement, the leader's
// replication still running to the removed node reached the replacement's
// replica alongside its own, and the replacement's raft panicked with "log
// not found" applying entries neither stream had sent it. The connection
// pool is keyed by the bound address too, so one node's connections never
// serve another's calls.
type boundTransport struct {
	raft.Transport
}

func (t boundTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	return t.Transport.AppendEntriesPipeline(id, raftmux.Bind(id, target))
}

func (t boundTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return t.Transport.AppendEntries(id, raftmux.Bind(id, target), args, resp)
}

func (t boundTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return t.Transport.RequestVote(id, raftmux.Bind(id, target), args, resp)
}

func (t boundTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	return t.Transport.InstallSnapshot(id, raftmux.Bind(id, target), args, resp, data)
}

func (t boundTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return t.Transport.TimeoutNow(id, raftmux.Bind(id, target), args, resp)
}

// RequestPreVote forwards to the wrapped transport, which raft's network
// transport implements (raft asks a transport for pre-vote support by type).
func (t boundTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := t.Transport.(raft.WithPreVote)
	if !ok {
		return errors.New("shard: the raft transport has no pre-vote")
	}
	return pv.RequestPreVote(id, raftmux.Bind(id, target), args, resp)
}

// Close closes the wrapped transport.
func (t boundTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// CloseStreams closes the wrapped transport's pooled connections.
func (t boundTransport) CloseStreams() {
	if c, ok := t.Transport.(interface{ CloseStreams() }); ok {
		c.CloseStreams()
	}
}
