package host

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testFlushWait is how long a snapshot waits for Pebble to flush by itself in these tests, where
// nothing fills a memtable: a user snapshot would otherwise take the full default.
const testFlushWait = 10 * time.Millisecond

// testNode is one node's worth of the real stack on loopback: Pebble, a Raft
// port, the shards, and a publisher pointed at a kfake broker.
type testNode struct {
	t       *testing.T
	dir     string
	addr    string // Raft address, kept across restarts
	store   *raftfsm.Store
	pub     *publish.Publisher
	host    *Host
	metrics *shard.Metrics
}

func openNode(t *testing.T, dir, addr string, brokers []string, shards int, tune ...func(*shard.Tuning)) *testNode {
	t.Helper()
	n := openNodeUnready(t, dir, addr, brokers, shards, tune...)
	publishtest.WaitFor(t, 30*time.Second, "every shard has a leader", n.host.Ready)
	return n
}

// openNodeUnready is openNode without waiting for the shards' leaders.
func openNodeUnready(t *testing.T, dir, addr string, brokers []string, shards int, tune ...func(*shard.Tuning)) *testNode {
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
	n.metrics = shard.NewMetrics(nil)
	tuning := shard.Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond}
	for _, f := range tune {
		f(&tuning)
	}
	n.host, err = Open(Config{
		NodeID: "n1", DataDir: dir + "/raft", Shards: shards, RaftListener: ln,
		Store: n.store, Publisher: n.pub, Bootstrap: true, Metrics: n.metrics, Tuning: tuning,
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The host runs replicas and routes nothing (package cluster does); these
// tests call the replica of an id's shard, which openNode waited to lead.

func (n *testNode) replicaFor(id string) *shard.Shard {
	return n.host.Replica(shard.For(id, n.host.cfg.Shards))
}

// schedule proposes reqs on their shards' replicas, a shard's part at once.
func (n *testNode) schedule(ctx context.Context, reqs []shard.Request) ([]shard.Result, error) {
	parts := map[uint32][]int{}
	for i, r := range reqs {
		s := shard.For(r.ID, n.host.cfg.Shards)
		parts[s] = append(parts[s], i)
	}
	out := make([]shard.Result, len(reqs))
	for s, idx := range parts {
		part := make([]shard.Request, len(idx))
		for j, i := range idx {
			part[j] = reqs[i]
		}
		res, err := n.host.Replica(s).Schedule(ctx, part)
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			out[i] = res[j]
		}
	}
	return out, nil
}

func (n *testNode) close() {
	n.t.Helper()
	if err := n.host.Close(); err != nil {
		n.t.Errorf("host close: %v", err)
	}
	if err := n.pub.Close(); err != nil {
		n.t.Errorf("publisher close: %v", err)
	}
	if err := n.store.Close(); err != nil {
		n.t.Errorf("store close: %v", err)
	}
}

func TestScheduleFireCancelRestart(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	dir := t.TempDir()
	n := openNode(t, dir, "", brokers, 2)
	ctx := context.Background()

	req := func(id string, delay time.Duration) shard.Request {
		r := shard.Request{ID: id, Delay: delay, HasDelay: true, Topic: "orders", Payload: []byte("p-" + id)}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		return r
	}
	// Soon, later (fires after the restart), and one to cancel.
	var reqs []shard.Request
	for i := range 20 {
		reqs = append(reqs, req(fmt.Sprintf("soon-%d", i), time.Duration(i)*20*time.Millisecond))
	}
	for i := range 10 {
		reqs = append(reqs, req(fmt.Sprintf("later-%d", i), 3*time.Second))
	}
	reqs = append(reqs, req("cancel-me", 2*time.Second))
	res, err := n.schedule(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != raftfsm.Created {
			t.Fatalf("request %d (%s): outcome %v", i, reqs[i].ID, r.Outcome)
		}
	}
	// A re-send is idempotent: same seq and due.
	again, err := n.schedule(ctx, reqs[:1])
	if err != nil || again[0].Outcome != raftfsm.Existing || again[0].Due != res[0].Due {
		t.Fatalf("re-send: %+v, %v; want Existing with due %d", again, err, res[0].Due)
	}
	cr, err := n.replicaFor("cancel-me").Cancel(ctx, "cancel-me", nil)
	if err != nil || cr.Outcome != raftfsm.Cancelled {
		t.Fatalf("cancel: %+v, %v", cr, err)
	}
	if cr, _ := n.replicaFor("nope").Cancel(ctx, "nope", nil); cr.Outcome != raftfsm.NotFound {
		t.Fatalf("cancel of an unknown id: %v", cr.Outcome)
	}

	if got := publishtest.Consume(t, brokers, 20, 30*time.Second, "orders"); len(got.ByID) != 20 {
		t.Fatalf("before restart: consumed %d records, want the 20 'soon' ones", len(got.ByID))
	}
	publishtest.WaitFor(t, 30*time.Second, "soon events marked fired", func() bool {
		rec, ok, _ := n.replicaFor("soon-19").Get(ctx, "soon-19")
		return ok && rec.State == raftfsm.StateFired
	})
	// Every stage of firing was timed: wake, slot, read, hold, lease, produce, mark.
	if got := testutil.CollectAndCount(n.metrics.FireStage); got != 7 {
		t.Fatalf("chime_fire_stage_seconds has %d stages, want 7", got)
	}

	// Restart before the 'later' events are due: they must fire from Pebble.
	n.close()
	n = openNode(t, dir, n.addr, brokers, 2)
	defer n.close()

	consumed := publishtest.Consume(t, brokers, 30, 30*time.Second, "orders")
	got := consumed.ByID
	if len(got) != 30 {
		t.Fatalf("after restart: consumed %d distinct records, want 30", len(got))
	}
	if _, ok := got["cancel-me"]; ok {
		t.Fatal("a cancelled event was produced")
	}
	for id, c := range got {
		if c.HeaderErr != nil || c.Fired.Before(c.Due) {
			t.Errorf("%s fired early: due %v, fired %v (%v)", id, c.Due, c.Fired, c.HeaderErr)
		}
		if c.Value() != "p-"+id {
			t.Errorf("%s: value %q", id, c.Value())
		}
	}
	t.Logf("duplicates: %d", consumed.Dups)
	rec, ok, err := n.replicaFor("later-3").Get(ctx, "later-3")
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	publishtest.WaitFor(t, 30*time.Second, "later events marked fired", func() bool {
		rec, _, _ = n.replicaFor("later-3").Get(ctx, "later-3")
		return rec.State == raftfsm.StateFired
	})
	if rec.FiredAt < rec.Due {
		t.Fatalf("later-3 marked fired at %d before due %d", rec.FiredAt, rec.Due)
	}
}

// reopenReplica is how the host cures a replica whose raft is wedged: the
// replica closes and opens again over the same data and Raft port, keeps
// its events and takes writes under a new raft instance.
func TestReopenReplica(t *testing.T) {
	brokers := publishtest.NewBroker(t).Addrs()
	n := openNode(t, t.TempDir(), "", brokers, 1)
	defer n.close()
	ctx := context.Background()
	req := func(id string, delay time.Duration) shard.Request {
		return shard.Request{ID: id, Delay: delay, HasDelay: true, Topic: "reopen", Payload: []byte("p-" + id)}
	}
	if _, err := n.schedule(ctx, []shard.Request{req("before", 2*time.Second)}); err != nil {
		t.Fatal(err)
	}
	old := n.host.Replica(0)
	if err := n.host.reopenReplica(0); err != nil {
		t.Fatal(err)
	}
	if n.host.Replica(0) == old {
		t.Fatal("the replica was not replaced")
	}
	publishtest.WaitFor(t, 30*time.Second, "the new raft leads", n.host.Ready)
	if _, err := n.schedule(ctx, []shard.Request{req("after", 0)}); err != nil {
		t.Fatalf("schedule after the reopen: %v", err)
	}
	got := publishtest.Consume(t, brokers, 2, 30*time.Second, "reopen").ByID
	for _, id := range []string{"before", "after"} {
		if _, ok := got[id]; !ok {
			t.Errorf("%s did not reach Kafka after the reopen", id)
		}
	}
}
