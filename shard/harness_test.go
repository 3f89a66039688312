package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard/raftmux"
)

// testFlushWait is how long a snapshot waits for Pebble to flush by itself in these tests, where
// nothing fills a memtable: a user snapshot would otherwise take the full default.
const testFlushWait = 10 * time.Millisecond

// This file is a copy of the harness in shard/host's tests, for shard's own
// tests, with replicas opened by Open directly on a raftmux (shard cannot
// import shard/host, which imports it).

// testNode is one node's worth of the real stack on loopback: Pebble, a Raft
// port, the shards, and a publisher pointed at a kfake broker.
type testNode struct {
	t       *testing.T
	dir     string
	addr    string // Raft address, kept across restarts
	store   *raftfsm.Store
	pub     *publish.Publisher
	host    *testHost
	metrics *Metrics
}

func startBroker(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func openNode(t *testing.T, dir, addr string, brokers []string, shards int, tune ...func(*Tuning)) *testNode {
	t.Helper()
	n := &testNode{t: t, dir: dir}
	var err error
	if n.store, err = raftfsm.OpenStore(dir+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait}); err != nil {
		t.Fatal(err)
	}
	if n.pub, err = publish.New(publish.Config{Brokers: brokers}); err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	n.metrics = NewMetrics(nil)
	tuning := Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond}
	for _, f := range tune {
		f(&tuning)
	}
	n.host = &testHost{mux: raftmux.New(ln, nil)}
	for id := range uint32(shards) {
		layer, err := n.host.mux.Layer(id)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(Config{
			ID: id, NodeID: "n1", Dir: fmt.Sprintf("%s/raft/shard-%04d", dir, id), Store: n.store, Layer: layer,
			Publisher: n.pub, Metrics: n.metrics, Tuning: tuning,
			Bootstrap: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: raft.ServerAddress(n.addr)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		n.host.shards = append(n.host.shards, s)
	}
	waitFor(t, 10*time.Second, "every shard has a leader", n.host.Ready)
	return n
}

func (n *testNode) close() {
	n.t.Helper()
	if err := n.host.Close(); err != nil {
		n.t.Errorf("host close: %v", err)
	}
	n.pub.Close()
	if err := n.store.Close(); err != nil {
		n.t.Errorf("store close: %v", err)
	}
}

// testHost routes requests to the replicas of one single-node test node.
type testHost struct {
	mux    *raftmux.Mux
	shards []*Shard
}

func (h *testHost) Replica(id uint32) *Shard { return h.shards[id] }

func (h *testHost) Ready() bool {
	for _, s := range h.shards {
		if s.Leader() == "" {
			return false
		}
	}
	return true
}

func (h *testHost) Schedule(ctx context.Context, reqs []Request) ([]Result, error) {
	out := make([]Result, len(reqs))
	for i, r := range reqs {
		res, err := h.shards[For(r.ID, len(h.shards))].Schedule(ctx, []Request{r})
		if err != nil {
			return nil, err
		}
		out[i] = res[0]
	}
	return out, nil
}

func (h *testHost) Cancel(ctx context.Context, id string) (raftfsm.CancelResult, error) {
	return h.shards[For(id, len(h.shards))].Cancel(ctx, id)
}

func (h *testHost) Close() error {
	var errs []error
	for _, s := range h.shards {
		errs = append(errs, s.Close())
	}
	return errors.Join(append(errs, h.mux.Close())...)
}

// NewMux keeps tests written before the mux moved to shard/raftmux compiling.
func NewMux(ln net.Listener, logger *slog.Logger) *raftmux.Mux { return raftmux.New(ln, logger) }

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// consumed is what a record said when an independent client read it.
type consumed struct {
	due, fired time.Time
	attempt    string
	value      string
}

// consume reads topic from the start until want distinct ids arrived or the
// deadline passed, and returns every record by chime-id (with duplicates
// counted).
func consume(t *testing.T, brokers []string, topic string, want int, d time.Duration) (map[string]consumed, int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := make(map[string]consumed)
	dups := 0
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for len(got) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			due, _ := strconv.ParseInt(h[publish.HeaderDue], 10, 64)
			fired, _ := strconv.ParseInt(h[publish.HeaderFired], 10, 64)
			id := h[publish.HeaderID]
			if _, dup := got[id]; dup {
				dups++
				return
			}
			got[id] = consumed{due: time.UnixMilli(due), fired: time.UnixMilli(fired), attempt: h[publish.HeaderAttempt], value: string(r.Value)}
		})
	}
	return got, dups
}
