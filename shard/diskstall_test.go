package shard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
)

// diskHang makes one replica's Raft log writes wait while it is on, as on a filesystem that
// is frozen: the process runs and answers the network, its writes never return.
type diskHang struct {
	mu      sync.Mutex
	on      bool
	thawed  chan struct{}
	waiting atomic.Int32
}

func newDiskHang() *diskHang { return &diskHang{thawed: make(chan struct{})} }

func (h *diskHang) freeze() {
	h.mu.Lock()
	h.on = true
	h.mu.Unlock()
}

func (h *diskHang) thaw() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.on {
		h.on = false
		close(h.thawed)
	}
}

// write is Knobs.LogWrite.
func (h *diskHang) write() {
	h.mu.Lock()
	on, thawed := h.on, h.thawed
	h.mu.Unlock()
	if on {
		h.waiting.Add(1)
		<-thawed
		h.waiting.Add(-1)
	}
}

// TestLeaderWhoseDiskHangsStopsLeading: the leader of a three-replica shard whose Raft log
// writes hang (its process running, its network fine, no DiskFailed to end it) must stop
// leading within a few heartbeat timeouts, so that another replica leads and the shard
// takes and applies writes again, rather than hold the shard, heartbeating, until its disk
// returns. Once the disk returns it must follow the new leader and apply what it missed.
// Before stallGate, the followers kept hearing the frozen leader's heartbeats and elected
// no one: the shard took nothing for as long as the disk hung.
func TestLeaderWhoseDiskHangsStopsLeading(t *testing.T) {
	brokers := startBroker(t)
	hangs := map[raft.ServerID]*diskHang{}
	var servers []raft.Server
	transports := map[raft.ServerID]*raft.InmemTransport{}
	for i := 1; i <= 3; i++ {
		id := raft.ServerID(fmt.Sprintf("n%d", i))
		addr, trans := raft.NewInmemTransportWithTimeout(raft.ServerAddress(id), 500*time.Millisecond)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: id, Address: addr})
		transports[id] = trans
		hangs[id] = newDiskHang()
	}
	for _, a := range servers {
		for _, b := range servers {
			if a.ID != b.ID {
				transports[a.ID].Connect(b.Address, transports[b.ID])
			}
		}
	}
	replicas := map[raft.ServerID]*Shard{}
	for _, srv := range servers {
		dir := t.TempDir()
		store, err := raftfsm.OpenStore(dir+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := publish.New(publish.Config{Brokers: brokers})
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(Config{
			ID: 0, NodeID: string(srv.ID), Dir: dir + "/raft", Store: store, Transport: transports[srv.ID], Publisher: pub,
			Bootstrap: servers,
			Tuning: Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
				LeaderLeaseTimeout: 100 * time.Millisecond},
			Knobs: Knobs{LogWrite: hangs[srv.ID].write},
		})
		if err != nil {
			t.Fatal(err)
		}
		replicas[srv.ID] = s
		t.Cleanup(func() {
			hangs[srv.ID].thaw() // raft's shutdown waits for the hung write
			_ = s.Close()
			_ = pub.Close()
			_ = store.Close() // the test is over; Close's error changes nothing it found
		})
	}
	leader := func() (raft.ServerID, *Shard) {
		for id, s := range replicas {
			if s.IsLeader() {
				return id, s
			}
		}
		return "", nil
	}
	waitFor(t, 30*time.Second, "a leader", func() bool { id, _ := leader(); return id != "" })
	frozenID, frozen := leader()
	schedule := func(s *Shard, id string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := s.Schedule(ctx, []Request{{ID: id, Delay: time.Hour, HasDelay: true, Topic: "stall", Payload: []byte("p")}})
		return err
	}
	if err := schedule(frozen, "before", 10*time.Second); err != nil {
		t.Fatal(err)
	}

	hangs[frozenID].freeze()
	// A write the frozen leader must make, and which hangs.
	frozenDone := make(chan error, 1)
	go func() { frozenDone <- schedule(frozen, "during-frozen", 30*time.Second) }()
	waitFor(t, 10*time.Second, "the leader's append hangs", func() bool { return hangs[frozenID].waiting.Load() > 0 })
	frozeAt := time.Now()
	var newID raft.ServerID
	var next *Shard
	waitFor(t, 10*time.Second, "another replica leads", func() bool {
		for id, s := range replicas {
			if id != frozenID && s.IsLeader() {
				newID, next = id, s
				return true
			}
		}
		return false
	})
	if err := schedule(next, "during", 10*time.Second); err != nil {
		t.Fatalf("%s, the new leader, took no write while %s's disk hung: %v", newID, frozenID, err)
	}
	t.Logf("%s led %s after %s's disk hung", newID, time.Since(frozeAt).Round(time.Millisecond), frozenID)

	hangs[frozenID].thaw()
	select {
	case <-frozenDone: // ok or not: the frozen leader answered once its disk returned
	case <-time.After(30 * time.Second):
		t.Fatal("the schedule sent to the frozen leader never returned after the thaw")
	}
	waitFor(t, 30*time.Second, "the thawed replica follows and applies what it missed", func() bool {
		return !frozen.IsLeader() || frozenID == func() raft.ServerID { id, _ := leader(); return id }()
	})
	want := next.AppliedIndex()
	waitFor(t, 30*time.Second, "the thawed replica catches up", func() bool { return frozen.AppliedIndex() >= want })
}
