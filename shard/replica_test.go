package shard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// testFlushWait is how long a snapshot waits for Pebble to flush by itself in these tests, where
// nothing fills a memtable: a user snapshot would otherwise take the full default.
const testFlushWait = 10 * time.Millisecond

// testNode is one node's worth of replicas, opened with Open directly: Pebble,
// one single-voter replica per shard on raft's in-memory transport, and a
// publisher pointed at a kfake broker.
type testNode struct {
	t       *testing.T
	dir     string
	addr    string // base of the replicas' in-memory Raft addresses, kept across restarts
	store   *raftfsm.Store
	pub     *publish.Publisher
	host    *testHost
	metrics *Metrics
}

// startBroker and waitFor keep the names snapshots_test.go calls.
func startBroker(t *testing.T) []string { return publishtest.NewBroker(t).Addrs() }

var waitFor = publishtest.WaitFor

// openNode opens shards replicas in dir, each the only voter of its shard.
// addr "" picks new Raft addresses; a restart passes the node's addr.
func openNode(t *testing.T, dir, addr string, brokers []string, shards int, tune ...func(*Tuning)) *testNode {
	t.Helper()
	return openNodeWith(t, dir, addr, brokers, shards, Knobs{}, tune...)
}

// openNodeWith is openNode with every replica opened with knobs.
func openNodeWith(t *testing.T, dir, addr string, brokers []string, shards int, knobs Knobs, tune ...func(*Tuning)) *testNode {
	t.Helper()
	if addr == "" {
		addr = dir
	}
	n := &testNode{t: t, dir: dir, addr: addr, host: &testHost{}, metrics: NewMetrics(nil)}
	var err error
	if n.store, err = raftfsm.OpenStore(dir+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait}); err != nil {
		t.Fatal(err)
	}
	if n.pub, err = publish.New(publish.Config{Brokers: brokers}); err != nil {
		t.Fatal(err)
	}
	tuning := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond}
	for _, f := range tune {
		f(&tuning)
	}
	for id := range uint32(shards) {
		raddr, trans := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("%s/shard-%d", addr, id)))
		s, err := Open(Config{
			ID: id, NodeID: "n1", Dir: fmt.Sprintf("%s/raft/shard-%04d", dir, id), Store: n.store,
			Transport: trans, Publisher: n.pub, Tuning: tuning, Metrics: n.metrics, Knobs: knobs,
			Bootstrap: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: raddr}},
		})
		if err != nil {
			t.Fatal(err)
		}
		n.host.shards = append(n.host.shards, s)
	}
	publishtest.WaitFor(t, 30*time.Second, "every shard has a leader", n.host.Ready)
	return n
}

func (n *testNode) close() {
	n.t.Helper()
	if err := n.host.Close(); err != nil {
		n.t.Errorf("replicas close: %v", err)
	}
	if err := n.pub.Close(); err != nil {
		n.t.Errorf("publisher close: %v", err)
	}
	if err := n.store.Close(); err != nil {
		n.t.Errorf("store close: %v", err)
	}
}

// testHost routes requests to a testNode's replicas by event id.
type testHost struct {
	shards []*Shard // by shard id
}

// Replica returns the replica of shard id.
func (h *testHost) Replica(id uint32) *Shard { return h.shards[id] }

func (h *testHost) shardFor(id string) *Shard { return h.shards[For(id, len(h.shards))] }

// Ready reports whether every replica knows a leader.
func (h *testHost) Ready() bool {
	for _, s := range h.shards {
		if addr, _ := s.raft.LeaderWithID(); addr == "" {
			return false
		}
	}
	return true
}

// Schedule schedules each request on its shard, one shard after another.
func (h *testHost) Schedule(ctx context.Context, reqs []Request) ([]Result, error) {
	out := make([]Result, len(reqs))
	for id, s := range h.shards {
		var part []Request
		var idx []int
		for i, r := range reqs {
			if For(r.ID, len(h.shards)) == uint32(id) {
				part, idx = append(part, r), append(idx, i)
			}
		}
		if len(part) == 0 {
			continue
		}
		res, err := s.Schedule(ctx, part)
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			out[i] = res[j]
		}
	}
	return out, nil
}

func (h *testHost) Cancel(ctx context.Context, id string, scope Scope) (raftfsm.CancelResult, error) {
	return h.shardFor(id).Cancel(ctx, id, scope)
}

func (h *testHost) Get(ctx context.Context, id string) (raftfsm.Record, bool, error) {
	return h.shardFor(id).Get(ctx, id)
}

func (h *testHost) Close() error {
	var errs []error
	for _, s := range h.shards {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
