package nodetest

import (
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// raftNet connects the replicas of each shard across the nodes of a cluster
// with raft's in-memory transport: one transport per (shard, node), each
// connected to the same shard's transports on every node it can reach.
type raftNet struct {
	mu     sync.Mutex
	shards map[uint32]map[string]*inmemTransport // by shard, by node address
	cut    map[[2]string]bool                    // unordered pairs of node addresses that cannot talk
}

func newRaftNet() *raftNet {
	return &raftNet{shards: map[uint32]map[string]*inmemTransport{}, cut: map[[2]string]bool{}}
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// inmemTransport is a replica's transport; closing it (the shard does, when
// it closes) takes it off the network.
type inmemTransport struct {
	*raft.InmemTransport
	net   *raftNet
	shard uint32
	once  sync.Once
}

func (t *inmemTransport) Close() error {
	t.once.Do(func() { t.net.remove(t) })
	return t.InmemTransport.Close()
}

// transport returns a new transport for node addr's replica of shard id,
// connected both ways to the shard's replicas on the nodes addr can reach.
func (n *raftNet) transport(addr string, id uint32) (raft.Transport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	peers := n.shards[id]
	if peers == nil {
		peers = map[string]*inmemTransport{}
		n.shards[id] = peers
	}
	if _, ok := peers[addr]; ok {
		return nil, fmt.Errorf("nodetest: node %s already has an open replica of shard %d", addr, id)
	}
	_, it := raft.NewInmemTransport(raft.ServerAddress(addr))
	t := &inmemTransport{InmemTransport: it, net: n, shard: id}
	for p, pt := range peers {
		if !n.cut[pair(addr, p)] {
			t.Connect(raft.ServerAddress(p), pt.InmemTransport)
			pt.Connect(raft.ServerAddress(addr), t.InmemTransport)
		}
	}
	peers[addr] = t
	return t, nil
}

func (n *raftNet) remove(t *inmemTransport) {
	n.mu.Lock()
	defer n.mu.Unlock()
	addr := string(t.LocalAddr())
	peers := n.shards[t.shard]
	if peers[addr] != t {
		return
	}
	delete(peers, addr)
	for _, pt := range peers {
		pt.Disconnect(raft.ServerAddress(addr))
	}
}

// setCut cuts (or, with cut false, restores) the links between a and b on
// every shard.
func (n *raftNet) setCut(a, b string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cut {
		n.cut[pair(a, b)] = true
	} else {
		delete(n.cut, pair(a, b))
	}
	for _, peers := range n.shards {
		ta, tb := peers[a], peers[b]
		if ta == nil || tb == nil {
			continue
		}
		if cut {
			ta.Disconnect(raft.ServerAddress(b))
			tb.Disconnect(raft.ServerAddress(a))
		} else {
			ta.Connect(raft.ServerAddress(b), tb.InmemTransport)
			tb.Connect(raft.ServerAddress(a), ta.InmemTransport)
		}
	}
}
