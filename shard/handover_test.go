package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestQuiesceBeforeHandover: while events fall due steadily, a leader about
// to hand its shard over quiesces. When quiesce returns, every record it put
// in Kafka has its MarkFired committed (so the next leader will not fire it
// again), and until resume nothing more is produced though events keep
// falling due; after resume every event arrives.
func TestQuiesceBeforeHandover(t *testing.T) {
	brokers := startBroker(t)
	n := openNode(t, t.TempDir(), "", brokers, 1)
	defer n.close()
	s := n.host.shards[0]
	ctx := context.Background()
	const events = 3000
	var reqs []Request
	for i := range events {
		id := fmt.Sprintf("e%d", i)
		// 3,000 events over 3 s: batches are always in flight.
		reqs = append(reqs, Request{ID: id, Delay: 500*time.Millisecond + time.Duration(i)*time.Millisecond, HasDelay: true,
			Topic: "handover", Payload: []byte(id)})
	}
	c := publishtest.Collect(t, brokers, "handover")
	defer c.Close()
	start := time.Now()
	if _, err := s.Schedule(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		time.Sleep(time.Until(start.Add(time.Duration(800+600*round) * time.Millisecond)))
		resume := s.quiesce()
		marked := s.Stats().Fired
		// Nothing is produced while quiesced: what the broker holds after
		// a moment is what it held when quiesce returned.
		time.Sleep(200 * time.Millisecond)
		seen := len(c.Consumed().ByID)
		time.Sleep(300 * time.Millisecond)
		if later := len(c.Consumed().ByID); later != seen {
			t.Errorf("round %d: %d records produced while quiesced", round, later-seen)
		}
		if uint64(seen) != marked {
			t.Errorf("round %d: %d records in Kafka, %d of them marked fired when quiesce returned", round, seen, marked)
		}
		t.Logf("round %d: %d records in Kafka, %d marked", round, seen, marked)
		resume()
	}
	if got := c.WaitIDs(events, 30*time.Second); len(got.ByID) != events {
		t.Fatalf("%d of %d events arrived after resume", len(got.ByID), events)
	}
}

// pairDirectory places shard 0 on n1 and n2 and answers LogIndex from the
// replicas themselves.
type pairDirectory struct {
	Directory
	addrs    map[string]string
	replicas sync.Map // node id → *Shard
}

func (d *pairDirectory) Desired(uint32) []string          { return []string{"n1", "n2"} }
func (d *pairDirectory) RaftAddr(n string) (string, bool) { a, ok := d.addrs[n]; return a, ok }
func (d *pairDirectory) Removed(string) bool              { return false }
func (d *pairDirectory) Leaving(string) bool              { return false }
func (d *pairDirectory) Replication() int                 { return 2 }
func (d *pairDirectory) Epoch() uint64                    { return 0 }
func (d *pairDirectory) LogIndex(_ context.Context, n string, _ uint32) (uint64, error) {
	r, ok := d.replicas.Load(n)
	if !ok {
		return 0, errors.New("no replica")
	}
	return r.(*Shard).raft.LastIndex(), nil
}
func (d *pairDirectory) Parked(_ context.Context, n string, _ uint32) ([]raftfsm.Fired, error) {
	r, ok := d.replicas.Load(n)
	if !ok {
		return nil, errors.New("no replica")
	}
	return r.(*Shard).Parked(), nil
}

// TestCloseHandsLeadershipOver: a leader that closes hands its shard to the
// other voter before its Raft shuts down, so the shard has a leader again at
// once rather than after a heartbeat timeout and an election.
func TestCloseHandsLeadershipOver(t *testing.T) {
	const heartbeat = time.Second
	leader, other, _ := openPair(t, startBroker(t), heartbeat)
	if _, err := leader.Schedule(context.Background(), []Request{{ID: "e1", Delay: time.Hour, HasDelay: true, Topic: "t", Payload: []byte("p")}}); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	// An election would take a heartbeat timeout (1 s) after the close.
	waitFor(t, heartbeat/4, "the other voter leads once the leader has closed", other.IsLeader)
	t.Logf("the other voter led %v after the close began", time.Since(closed).Round(time.Millisecond))
}

// openPair opens shard 0 on two voters, n1 and n2, joined by an in-memory
// transport, with a LeaderLeaseTimeout of half the heartbeat, and returns
// them once one leads, with the transports by node id.
func openPair(t *testing.T, brokers []string, heartbeat time.Duration) (leader, other *Shard, trans map[string]*raft.InmemTransport) {
	t.Helper()
	return openPairWith(t, brokers, heartbeat, Knobs{})
}

// openPairWith is openPair with knobs for both replicas.
func openPairWith(t *testing.T, brokers []string, heartbeat time.Duration, knobs Knobs) (leader, other *Shard, trans map[string]*raft.InmemTransport) {
	t.Helper()
	dir := &pairDirectory{addrs: map[string]string{}}
	trans = map[string]*raft.InmemTransport{}
	var servers []raft.Server
	for _, id := range []string{"n1", "n2"} {
		addr, tr := raft.NewInmemTransport("")
		trans[id], dir.addrs[id] = tr, string(addr)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: addr})
	}
	trans["n1"].Connect(raft.ServerAddress(dir.addrs["n2"]), trans["n2"])
	trans["n2"].Connect(raft.ServerAddress(dir.addrs["n1"]), trans["n1"])
	pub, err := publish.New(publish.Config{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	shards := map[string]*Shard{}
	for _, id := range []string{"n1", "n2"} {
		d := t.TempDir()
		store, err := raftfsm.OpenStore(d+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		s, err := Open(Config{ID: 0, NodeID: id, Dir: d + "/raft", Store: store, Transport: trans[id], Publisher: pub,
			Directory: dir, Bootstrap: servers, Knobs: knobs,
			Tuning: Tuning{HeartbeatTimeout: heartbeat, ElectionTimeout: heartbeat, LeaderLeaseTimeout: heartbeat / 2}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		shards[id] = s
		dir.replicas.Store(id, s)
	}
	waitFor(t, 30*time.Second, "a leader", func() bool {
		switch {
		case shards["n1"].IsLeader():
			leader, other = shards["n1"], shards["n2"]
		case shards["n2"].IsLeader():
			leader, other = shards["n2"], shards["n1"]
		}
		return leader != nil
	})
	return leader, other, trans
}

// TestLeaderWatchRecordsTheDeposed: a replica that sees the shard's leader go
// records it as deposed, which holds rule 5 back for balanceHold.
func TestLeaderWatchRecordsTheDeposed(t *testing.T) {
	leader, other, _ := openPair(t, startBroker(t), 500*time.Millisecond)
	gone := leader.cfg.NodeID
	if err := leader.Close(); err != nil {
		t.Errorf("closing the leader: %v", err)
	}
	waitFor(t, 10*time.Second, "the other replica records the closed leader as deposed", func() bool {
		other.transferMu.Lock()
		defer other.transferMu.Unlock()
		return other.deposed == gone && time.Since(other.deposedAt) < balanceHold
	})
	if err := other.Close(); err != nil {
		t.Errorf("closing the other replica: %v", err)
	}
}

// TestTimeoutsSettleOnALeader: a replica starts with the short timeouts of
// Tuning.startTimeout, so that a shard all of whose nodes restarted at once
// elects a leader sooner, and keeps them while it hears of no leader; the
// first leader it hears of gives it the Tuning's own.
func TestTimeoutsSettleOnALeader(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	tune := Tuning{HeartbeatTimeout: heartbeat, ElectionTimeout: heartbeat, LeaderLeaseTimeout: heartbeat / 2}
	tune.fill()
	if got := tune.startTimeout(); got != heartbeat/2 {
		t.Fatalf("startTimeout = %v, want %v", got, heartbeat/2)
	}

	// Alone of a group of two, it never hears of a leader.
	addr, tr := raft.NewInmemTransport("")
	d := t.TempDir()
	store, err := raftfsm.OpenStore(d+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	lone, err := Open(Config{ID: 0, NodeID: "n1", Dir: d + "/raft", Store: store, Transport: tr,
		Directory: &pairDirectory{addrs: map[string]string{"n1": string(addr), "n2": "nowhere"}},
		Bootstrap: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: addr}, {Suffrage: raft.Voter, ID: "n2", Address: "nowhere"}},
		Tuning:    tune})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * heartbeat) // it stands for election, and stands again
	if rc := lone.raft.ReloadableConfig(); rc.HeartbeatTimeout != heartbeat/2 || rc.ElectionTimeout != heartbeat/2 {
		t.Errorf("without a leader: heartbeat %v, election %v, want both %v", rc.HeartbeatTimeout, rc.ElectionTimeout, heartbeat/2)
	}
	if err := lone.Close(); err != nil {
		t.Errorf("closing the lone replica: %v", err)
	}

	leader, other, _ := openPair(t, startBroker(t), heartbeat)
	for _, s := range []*Shard{leader, other} {
		waitFor(t, 10*time.Second, "the timeouts settle on "+s.cfg.NodeID, func() bool {
			rc := s.raft.ReloadableConfig()
			return rc.HeartbeatTimeout == heartbeat && rc.ElectionTimeout == heartbeat
		})
	}
	if err := leader.Close(); err != nil {
		t.Errorf("closing the leader: %v", err)
	}
	if err := other.Close(); err != nil {
		t.Errorf("closing the other replica: %v", err)
	}
}
