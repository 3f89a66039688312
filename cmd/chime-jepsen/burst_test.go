package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

func TestBurstRateLimit(t *testing.T) {
	for _, tc := range []struct {
		size, shards, rate int
		want               string
	}{
		{300, 8, 0, "jepsen-burst=1200/s"}, // 150/s per shard: 300 events in 2 s
		{301, 3, 0, "jepsen-burst=452/s"},  // rounded up
		{300, 8, 500, "jepsen-burst=500/s"},
		{0, 8, 500, ""}, // no bursts, no limit
	} {
		if got := burstRateLimit(tc.size, tc.shards, tc.rate); got != tc.want {
			t.Errorf("burstRateLimit(%d, %d, %d) = %q, want %q", tc.size, tc.shards, tc.rate, got, tc.want)
		}
	}
}

func TestServeArgsCarryTheRateLimit(t *testing.T) {
	n := &node{id: "n1", ip: "10.77.0.11", shards: 8, topicRateLimit: "jepsen-burst=1200/s"}
	args, err := n.serveArgs()
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(args, "--topic-rate-limit"); i < 0 || i+1 >= len(args) || args[i+1] != "jepsen-burst=1200/s" || args[0] != "serve" {
		t.Errorf("args %q", args)
	}
	n.topicRateLimit = ""
	if args, _ := n.serveArgs(); slices.Contains(args, "--topic-rate-limit") || !slices.Contains(args, "--insecure") {
		t.Errorf("args without bursts %q", args)
	}
}

// TestBurstIDsShareAShard: a burst's ids are distinct, of the size asked, and all route to
// its shard.
func TestBurstIDsShareAShard(t *testing.T) {
	seen := map[string]bool{}
	for n := range 10 {
		shard := uint32(n % 8)
		ids := burstIDs(n, shard, 8, 300)
		if len(ids) != 300 {
			t.Fatalf("burst %d: %d ids", n, len(ids))
		}
		for _, id := range ids {
			if seen[id] || chimev1.ShardOf(id, 8) != shard || chimev1.RoutingKey(id) != id {
				t.Fatalf("burst %d: id %s (seen %v, shard %d, want %d)", n, id, seen[id], chimev1.ShardOf(id, 8), shard)
			}
			seen[id] = true
		}
	}
}

// TestBurstOps: a burst is sent in BatchSchedule calls of at most burstChunk events, every
// event on the burst's shard and topic, due at one time D about burstLead ahead, with a
// priority 0-9; each is an op of the history, tagged with the burst, with its own result's
// outcome or the call's error. The checker then judges it.
func TestBurstOps(t *testing.T) {
	fake := &fakeScheduler{result: func(batch, i int, e *chimev1.Event) *chimev1.ScheduleResult {
		switch {
		case batch == 2 && i == 3:
			return &chimev1.ScheduleResult{Id: e.Id, Code: int32(codes.AlreadyExists), Message: "already scheduled with other content"}
		case batch == 2 && i == 4:
			return &chimev1.ScheduleResult{Id: e.Id, Code: int32(codes.Unavailable), Message: "no leader"}
		}
		return nil
	}}
	n := serveFake(t, fake, "n7", "127.0.0.77")
	w := &workload{c: &cluster{nodes: []*node{n}}, h: &history{}, opTimeout: 5 * time.Second, versions: map[string]uint64{},
		shards: 4, burstSize: 250, burstEvery: time.Second}
	before := time.Now()
	w.burst(9, rand.New(rand.NewPCG(1, 2)), 5)

	if len(fake.batches) != 3 || len(fake.batches[0].Events) != 100 || len(fake.batches[1].Events) != 100 || len(fake.batches[2].Events) != 50 {
		t.Fatalf("%d calls", len(fake.batches))
	}
	d := fake.batches[0].Events[0].DeliverAt.AsTime()
	if d.Sub(before) < burstLead-time.Millisecond || d.Sub(before) > burstLead+time.Second || d.Nanosecond()%1e6 != 0 {
		t.Errorf("due %v, %v after the start", d, d.Sub(before))
	}
	prios := map[uint32]bool{}
	var sent []*chimev1.Event
	for _, b := range fake.batches {
		sent = append(sent, b.Events...)
	}
	for _, e := range sent {
		if e.Topic != burstTopic || !e.DeliverAt.AsTime().Equal(d) || e.Delay != nil || e.Priority == nil || *e.Priority > 9 ||
			e.Window != nil || chimev1.ShardOf(e.Id, 4) != 1 || string(e.Payload) != "p-"+e.Id {
			t.Fatalf("event %v", e)
		}
		prios[*e.Priority] = true
	}
	if len(prios) != 10 {
		t.Errorf("priorities %v, want each of 0-9", prios)
	}

	ops := w.h.snapshot()
	if len(ops) != 250 {
		t.Fatalf("%d ops", len(ops))
	}
	for i, op := range ops {
		e := sent[i]
		if op.F != checker.FSchedule || op.ID != e.Id || op.Burst != "burst5-shard1" || op.Topic != burstTopic || op.Process != 9 ||
			op.Payload != "p-"+e.Id || op.DeliverAtNs != d.UnixNano() || op.Priority == nil || *op.Priority != *e.Priority ||
			op.Node != "n7" || op.InvokeNs == 0 || op.CompleteNs < op.InvokeNs {
			t.Fatalf("op %d %+v for event %v", i, op, e)
		}
		want, code := checker.TypeOK, ""
		switch i {
		case 103:
			want, code = checker.TypeFail, "AlreadyExists"
		case 104:
			want, code = checker.TypeInfo, "Unavailable"
		}
		if op.Type != want || op.Code != code || (want == checker.TypeOK) != (op.AckDueNs == d.UnixNano()) || (want != checker.TypeOK) == (op.Error == "") {
			t.Errorf("op %d: %s %s ack %d error %q, want %s %s", i, op.Type, op.Code, op.AckDueNs, op.Error, want, code)
		}
	}
	if w.maxDue.Before(d) {
		t.Errorf("maxDue %v before the burst's due %v", w.maxDue, d)
	}

	// Produced in priority order within the tolerance, the burst passes check 12; produced
	// in reverse, it does not.
	check := func(reverse bool) checker.Results {
		evs := slices.Clone(sent)
		slices.SortStableFunc(evs, func(x, y *chimev1.Event) int { return int(*y.Priority) - int(*x.Priority) })
		if reverse {
			slices.Reverse(evs)
		}
		var recs []checker.Record
		for rank, e := range evs {
			if e.Id == ops[103].ID || e.Id == ops[104].ID {
				continue // never stored; the unknown one may not have been
			}
			recs = append(recs, checker.Record{ID: e.Id, Topic: burstTopic, Payload: string(e.Payload), DueMs: d.UnixMilli(),
				Attempt: 1, AppendMs: d.Add(time.Duration(rank) * 8 * time.Millisecond).UnixMilli(), Offset: int64(rank)})
		}
		final := checker.Cluster{Shards: []checker.ShardState{{ID: 0, Leaders: []string{"n1"}, Replicas: []checker.ReplicaState{{Node: "n1"}}}}}
		return checker.Check(ops, recs, final, checker.Config{})
	}
	res := check(false)
	if !res.Valid || res.BurstsChecked != 1 || res.Bursts[0].Judged != 248 || res.Bursts[0].Burst != "burst5-shard1" {
		t.Errorf("in order: valid %v, bursts %+v, examples %v", res.Valid, res.Bursts, res.Examples)
	}
	if res := check(true); res.Valid || res.PriorityViolations == 0 || res.Lost+res.Early+res.Phantom != 0 {
		t.Errorf("in reverse: valid %v, priority_violations %d", res.Valid, res.PriorityViolations)
	}

	// A call that fails as a whole: every event of it gets its outcome.
	for _, tc := range []struct {
		err  error
		want string
	}{{status.Error(codes.Unavailable, "no leader"), checker.TypeInfo}, {status.Error(codes.InvalidArgument, "events: 0"), checker.TypeFail}} {
		fake.batchErr = tc.err
		w.h = &history{}
		w.burstSize = 30
		w.burst(9, rand.New(rand.NewPCG(1, 2)), 6)
		ops := w.h.snapshot()
		if len(ops) != 30 || !strings.HasPrefix(ops[0].Burst, "burst6-shard2") {
			t.Fatalf("%d ops", len(ops))
		}
		for _, op := range ops {
			if op.Type != tc.want || op.Error == "" || op.AckDueNs != 0 {
				t.Fatalf("call failing with %v: op %+v", tc.err, op)
			}
		}
	}
}
