package shard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
)

// TestEntriesBoundedInBytes: a ScheduleBatch entry holds at most
// ProposeBytes encoded bytes (or one event), whether one large Schedule call
// or many concurrent ones fill it, and every call gets its own results, in
// order. Bounded only by ProposeBatch, 1,024 events of 1 MiB made one entry
// of a gigabyte.
func TestEntriesBoundedInBytes(t *testing.T) {
	const limit = 8 << 10
	n := openNode(t, t.TempDir(), "", startBroker(t), 1, func(tu *Tuning) { tu.ProposeBytes = limit })
	defer n.close()
	s := n.host.Replica(0)
	ctx := context.Background()
	req := func(id string, size int) Request {
		return Request{ID: id, Delay: 1 << 62, HasDelay: true, Topic: "bounded", Payload: bytes.Repeat([]byte{'p'}, size),
			Headers: []raftfsm.Header{{Key: "h", Value: []byte(id)}}}
	}
	first := s.raft.LastIndex()

	// One call of 40 events of 1 KiB, one event larger than an entry, and
	// 8 concurrent calls of 5 events each.
	var big []Request
	for i := range 40 {
		big = append(big, req(fmt.Sprintf("big-%d", i), 1<<10))
	}
	big = append(big, req("huge", 3*limit))
	res, err := s.Schedule(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(big) {
		t.Fatalf("%d results for %d requests", len(res), len(big))
	}
	for i := 1; i < len(res); i++ {
		if res[i].Outcome != raftfsm.Created || res[i].Seq != res[i-1].Seq+1 {
			t.Fatalf("result %d: %+v after %+v: want created, in order", i, res[i], res[i-1])
		}
	}
	var wg sync.WaitGroup
	calls := make([][]Request, 8)
	results := make([][]Result, 8)
	for c := range calls {
		wg.Go(func() {
			for i := range 5 {
				calls[c] = append(calls[c], req(fmt.Sprintf("c%d-%d", c, i), 700))
			}
			res, err := s.Schedule(ctx, calls[c])
			if err != nil {
				t.Error(err)
				return
			}
			results[c] = res
		})
	}
	wg.Wait()
	for c, res := range results {
		for i, r := range res {
			id := calls[c][i].ID
			// A lease can lapse on a starved machine (the race detector,
			// other tests); a read then waits for it to be renewed.
			var rec raftfsm.Record
			var ok bool
			var err error
			waitFor(t, 10*time.Second, "a read of "+id+" under a lease", func() bool {
				rec, ok, err = s.Get(ctx, id)
				return !errors.Is(err, ErrNotLeader)
			})
			if err != nil || !ok || rec.Seq != r.Seq {
				t.Errorf("%s: result seq %d, stored %+v (%v, %v)", id, r.Seq, rec, ok, err)
			}
		}
	}

	entries, events := 0, 0
	for i := first + 1; i <= s.raft.LastIndex(); i++ {
		var l raft.Log
		if err := s.logs.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		cmd, err := raftfsm.DecodeCommand(l.Data)
		if err != nil {
			t.Fatal(err)
		}
		b, ok := cmd.(*raftfsm.ScheduleBatch)
		if !ok {
			continue
		}
		entries++
		events += len(b.Events)
		if len(b.Events) > 1 && len(l.Data) > limit+16 {
			t.Errorf("entry %d: %d events in %d bytes, over the %d-byte bound", i, len(b.Events), len(l.Data), limit)
		}
	}
	if events != 41+40 {
		t.Fatalf("the log holds %d scheduled events, want 81", events)
	}
	t.Logf("81 events in %d entries", entries)
	if entries < 81*900/limit {
		t.Fatalf("81 events of about 1 KiB in %d entries: the bound did not split them", entries)
	}
}

// TestReplaceUnknownWhenLeadershipLost: a Replace whose entry was handed to
// raft before the leader lost its leadership may still commit under the
// next leader, so it answers ErrChangeUnknown, which nobody retries blindly,
// while a plain Schedule in the same state answers ErrNotLeader, which is
// retried (a re-sent Schedule finds its id). A fault run's upsert was
// answered ErrNotLeader there, retried by the forwarding node, refused as in
// doubt ("nothing was changed"), and its version reached Kafka.
func TestReplaceUnknownWhenLeadershipLost(t *testing.T) {
	leader, other, trans := openPair(t, startBroker(t), 500*time.Millisecond)
	req := func(id, payload string, replace bool) Request {
		r := Request{ID: id, Delay: time.Hour, HasDelay: true, Topic: "unsure", Payload: []byte(payload), Replace: replace}
		r.ContentHash = raftfsm.ContentHash(r.Topic, r.Key, r.Payload, nil, 0, int64(r.Delay), false, true, raftfsm.DefaultPolicy, raftfsm.Output{})
		return r
	}
	if _, err := leader.Schedule(t.Context(), []Request{req("u", "v1", false)}); err != nil {
		t.Fatal(err)
	}
	// Cut off with a fresh lease: both calls are proposed, and neither can
	// commit before the leader steps down.
	waitFor(t, 10*time.Second, "a fresh lease", func() bool {
		d, err := leader.lease.deadline(t.Context())
		return err == nil && time.Until(d) > leader.tune.LeaderLeaseTimeout*3/4
	})
	for _, tr := range trans {
		tr.DisconnectAll()
	}
	var wg sync.WaitGroup
	var replaceErr, scheduleErr error
	wg.Go(func() { _, replaceErr = leader.Schedule(t.Context(), []Request{req("u", "v2", true)}) })
	wg.Go(func() { _, scheduleErr = leader.Schedule(t.Context(), []Request{req("w", "w1", false)}) })
	wg.Wait()
	if !errors.Is(replaceErr, ErrChangeUnknown) {
		t.Errorf("the Replace answered %v, want ErrChangeUnknown", replaceErr)
	}
	if !errors.Is(scheduleErr, ErrNotLeader) || errors.Is(scheduleErr, ErrChangeUnknown) {
		t.Errorf("the plain Schedule answered %v, want ErrNotLeader", scheduleErr)
	}
	if err := leader.Close(); err != nil {
		t.Errorf("closing the leader: %v", err)
	}
	if err := other.Close(); err != nil {
		t.Errorf("closing the other replica: %v", err)
	}
}
