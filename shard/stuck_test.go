package shard

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
)

// TestStuckLeadershipTransfer strands a leadership transfer in raft the
// way hashicorp/raft v1.7.3 allows: the target is a ghost that takes Raft
// RPCs and never answers, so the leader's replication of it hangs. A first
// transfer times out and leaves its catch-up request queued with that
// replication; a second one blocks behind it, and raft's "transfer in
// progress" flag stays set, refusing every entry, until the replication
// moves again. Stuck must report the replica once that has gone on for
// Knobs.StuckAfter, and not before, and clear once raft accepts entries again.
func TestStuckLeadershipTransfer(t *testing.T) {
	dir := t.TempDir()
	store, err := raftfsm.OpenStore(dir+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	pub, err := publish.New(publish.Config{Brokers: publishtest.NewBroker(t).Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })

	// The leader waits up to a minute for an RPC's answer: far longer than
	// the test, so only the ghost decides when its replication moves.
	addr, trans := raft.NewInmemTransportWithTimeout("n1", time.Minute)
	ghostAddr, ghost := raft.NewInmemTransport("ghost")
	trans.Connect(ghostAddr, ghost)
	g := newGhost(ghost)
	t.Cleanup(g.stop)

	s, err := Open(Config{
		ID: 0, NodeID: "n1", Dir: dir + "/raft", Store: store, Transport: trans, Publisher: pub,
		Bootstrap: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: addr}},
		Tuning: Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond},
		Knobs: Knobs{StuckAfter: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	t.Cleanup(g.release) // before Close: raft's shutdown waits for the held RPCs
	waitFor(t, 30*time.Second, "a leader", s.IsLeader)

	n := 0
	schedule := func() error {
		n++
		_, err := s.Schedule(t.Context(), []Request{{ID: fmt.Sprintf("e%d", n),
			Delay: time.Hour, HasDelay: true, Topic: "stuck", Payload: []byte("p")}})
		return err
	}
	if err := s.raft.AddNonvoter("ghost", ghostAddr, 0, 0).Error(); err != nil {
		t.Fatal(err)
	}
	// An entry the ghost lacks, so that a transfer to it must catch it up.
	if err := schedule(); err != nil {
		t.Fatal(err)
	}
	if err := s.TransferLeadership("ghost", string(ghostAddr)); err == nil {
		t.Fatal("a transfer to the ghost succeeded")
	}
	// raft answers a transfer before it clears its flag.
	waitFor(t, 10*time.Second, "raft accepts entries after the first transfer", func() bool { return schedule() == nil })
	if s.Stuck() != "" {
		t.Fatal("Stuck after a transfer that ended")
	}
	if err := s.TransferLeadership("ghost", string(ghostAddr)); err == nil {
		t.Fatal("the second transfer to the ghost succeeded")
	}
	if err := schedule(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("schedule during the stranded transfer: %v, want refused (%v)", err, ErrNotLeader)
	}
	if s.Stuck() != "" {
		t.Fatal("Stuck at the first refusal, before StuckAfter")
	}
	waitFor(t, 10*time.Second, "the replica counts as stuck", func() bool {
		if err := schedule(); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("schedule during the stranded transfer: %v, want refused", err)
		}
		return s.Stuck() != ""
	})

	g.release()
	waitFor(t, 30*time.Second, "raft accepts entries once the ghost's replication moves", func() bool { return schedule() == nil })
	if s.Stuck() != "" {
		t.Fatal("still Stuck after raft accepted an entry")
	}
}

// ghost is a Raft peer that holds every RPC it gets, unanswered, until
// release; after that it refuses them at once.
type ghost struct {
	releaseOnce, stopOnce sync.Once
	released, stopped     chan struct{}
	wg                    sync.WaitGroup
}

func newGhost(trans *raft.InmemTransport) *ghost {
	g := &ghost{released: make(chan struct{}), stopped: make(chan struct{})}
	refuse := func(rpc raft.RPC) { rpc.Respond(nil, errors.New("ghost: no raft here")) }
	g.wg.Go(func() {
		var held []raft.RPC
		released := g.released
		for {
			select {
			case rpc := <-trans.Consumer():
				if released == nil {
					refuse(rpc)
				} else {
					held = append(held, rpc)
				}
			case <-released:
				for _, rpc := range held {
					refuse(rpc)
				}
				held, released = nil, nil
			case <-g.stopped:
				for _, rpc := range held {
					refuse(rpc)
				}
				return
			}
		}
	})
	return g
}

func (g *ghost) release() { g.releaseOnce.Do(func() { close(g.released) }) }

func (g *ghost) stop() {
	g.stopOnce.Do(func() { close(g.stopped) })
	g.wg.Wait()
}

// TestStuckFollowerWithoutItsLog: a follower whose raft counts log entries
// its log store no longer holds (what hashicorp/raft v1.7.3 leaves after it
// installs a snapshot older than the log it had, on raft-wal) is Stuck once
// that has lasted goneAfter with the same last index, not before; a replica
// whose log store holds its entries never is.
func TestStuckFollowerWithoutItsLog(t *testing.T) {
	leader, follower, trans := openPair(t, publishtest.NewBroker(t).Addrs(), 500*time.Millisecond)
	r := Request{ID: "logged", Delay: time.Hour, HasDelay: true, Topic: "gone", Payload: []byte("p")}
	r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
	if _, err := leader.Schedule(t.Context(), []Request{r}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the follower has the entry", func() bool { return follower.raft.LastIndex() == leader.raft.LastIndex() })
	if why := follower.Stuck(); why != "" {
		t.Fatalf("a healthy follower is Stuck: %s", why)
	}

	// Its log store loses every entry, raft's memory keeps its last index.
	first, err := follower.logs.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := follower.logs.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := follower.logs.DeleteRange(first, last); err != nil {
		t.Fatal(err)
	}
	// Cut off, so that no entry of the leader's lands on the emptied log
	// (an entry after raft's last index would be taken, and cure it).
	for _, tr := range trans {
		tr.DisconnectAll()
	}
	if why := follower.Stuck(); why != "" {
		t.Fatalf("Stuck at once, before goneAfter: %s", why)
	}
	start := time.Now()
	waitFor(t, goneAfter+5*time.Second, "the follower counts as stuck", func() bool { return follower.Stuck() != "" })
	if waited := time.Since(start); waited < goneAfter-200*time.Millisecond {
		t.Fatalf("Stuck after %v, before goneAfter (%v)", waited, goneAfter)
	}
	if why := follower.Stuck(); why == "" || !strings.Contains(why, "log store no longer holds") {
		t.Fatalf("Stuck says %q", why)
	}
	if why := leader.Stuck(); why != "" {
		t.Fatalf("the other replica, its log whole, is Stuck: %s", why)
	}
	// The leader first, so that its hand-over finds the follower open.
	if err := leader.Close(); err != nil {
		t.Errorf("closing the leader: %v", err)
	}
	if err := follower.Close(); err != nil {
		t.Errorf("closing the follower: %v", err)
	}
}
