package cluster

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/chimehq/chime/membership"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
	"github.com/chimehq/chime/shard/host"
)

// openAlone opens a Cluster of one node (as chimed dev does) over a host of
// shards replicas on loopback, without waiting for their first elections.
func openAlone(t *testing.T, shards int, tune func(*shard.Tuning)) *Cluster {
	t.Helper()
	dir := t.TempDir()
	store, err := raftfsm.OpenStore(dir+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(publish.Config{Brokers: publishtest.NewBroker(t).Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var tuning shard.Tuning
	tune(&tuning)
	h, err := host.Open(host.Config{NodeID: "dev", DataDir: dir + "/raft", Shards: shards, RaftListener: ln,
		Store: store, Publisher: pub, Bootstrap: true, Metrics: shard.NewMetrics(nil), Tuning: tuning})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Self: membership.Meta{NodeID: "dev", GRPCAddr: "127.0.0.1:1"}, Shards: shards, Replication: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.SetHost(h)
	t.Cleanup(func() {
		c.Close()
		if err := h.Close(); err != nil {
			t.Errorf("host close: %v", err)
		}
		if err := pub.Close(); err != nil {
			t.Errorf("publisher close: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
	})
	return c
}

// A request that reaches a shard before its first election is over waits for
// the leader, within LeaderWait, instead of failing with ErrNotLeader: chimed
// dev serves gRPC as soon as its port is open, and `chimectl schedule` right
// after the start failed within 20 ms with "not the leader".
func TestRequestsWaitForTheFirstLeader(t *testing.T) {
	c := openAlone(t, 2, func(tu *shard.Tuning) {
		tu.HeartbeatTimeout, tu.ElectionTimeout, tu.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond
	})
	if c.Host().Ready() {
		t.Fatal("the shards had leaders at once: this test proves nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), LeaderWait)
	defer cancel()
	r := shard.Request{ID: "early", Delay: time.Hour, HasDelay: true, Topic: "t", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	res, err := c.Schedule(ctx, []shard.Request{r})
	if err != nil || res[0].Outcome != raftfsm.Created {
		t.Fatalf("schedule before the first election: %+v, %v; want Created", res, err)
	}
	if _, found, err := c.Get(ctx, "early"); err != nil || !found {
		t.Fatalf("get: found %v, %v", found, err)
	}
	if cr, err := c.Cancel(ctx, "early", nil); err != nil || cr.Outcome != raftfsm.Cancelled {
		t.Fatalf("cancel: %+v, %v", cr, err)
	}
}

// A failure that is not a missing leader is returned at once, and a missing
// leader is waited for no longer than ctx allows.
func TestAwaitLeaderStops(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	_, err := awaitLeader(context.Background(), func() (int, error) { calls++; return 0, boom })
	if !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("awaitLeader = %v after %d calls; want boom after 1", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = awaitLeader(ctx, func() (int, error) { return 0, shard.ErrNotLeader })
	if !errors.Is(err, shard.ErrNotLeader) {
		t.Fatalf("awaitLeader = %v; want the last ErrNotLeader", err)
	}
	if d := time.Since(start); d > LeaderWait/2 {
		t.Fatalf("awaitLeader waited %v past a 100 ms deadline", d)
	}
}

// TestCacheHoldsOnlyWhileTheReplicaFollowsIt: the cached leader is called
// only while this node's replica follows the same node (or this node holds
// no replica to ask). A replica in an election follows none, and its loser,
// often the cached leader, may be stalled: asking it would wait out the
// caller's deadline, so a lookup goes first.
func TestCacheHoldsOnlyWhileTheReplicaFollowsIt(t *testing.T) {
	for _, c := range []struct {
		replica      bool
		hint, cached string
		want         bool
	}{
		{replica: false, hint: "", cached: "n2", want: true},
		{replica: true, hint: "n2", cached: "n2", want: true},
		{replica: true, hint: "n3", cached: "n2", want: false},
		{replica: true, hint: "", cached: "n2", want: false},
	} {
		if got := cacheHolds(c.replica, c.hint, c.cached); got != c.want {
			t.Errorf("cacheHolds(replica %v, follows %q, cached %q) = %v, want %v", c.replica, c.hint, c.cached, got, c.want)
		}
	}
}
