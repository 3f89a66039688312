package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// Bursts make the backlog under which a shard's leader must produce the due events of
// higher priority first (checker, check 12). A burst is --burst-size events on burstTopic,
// all on one shard and all due at one time, with priorities uniform 0-9, scheduled with
// BatchSchedule. The nodes run with a rate limit on burstTopic (burstRateLimit) that lets
// the shard's leader produce them only over about 2 s, so that all of them wait, due, at
// once.

// burstTopic is the bursts' own topic: the only one with a rate limit.
const burstTopic = "jepsen-burst"

const (
	// burstLead: a burst is due this long after it is sent, time for its BatchSchedule
	// calls to be acked first (the checker compares only events acked by the due time).
	burstLead = 2 * time.Second
	// burstChunk bounds one BatchSchedule call, far below the server's limit (10,000
	// events, 16 MiB), so that a call meeting a leader change loses little.
	burstChunk = 100
	// burstFirst: the first burst is sent this long after the workload starts, within the
	// nemesis's healthy first 10 s, so that a run judges at least one burst clear of faults.
	burstFirst = 3 * time.Second
)

// burstRateLimit is chimed's --topic-rate-limit for a run's bursts of size events on
// shards shards: burstTopic=rate/s, where rate 0 means size/2 × shards (rounded up), so
// that each shard's leader, which enforces rate/shards of it, takes about 2 s to produce a
// burst. "" when there are no bursts (size 0).
func burstRateLimit(size, shards, rate int) string {
	if size <= 0 {
		return ""
	}
	if rate <= 0 {
		rate = (size*shards + 1) / 2
	}
	return fmt.Sprintf("%s=%d/s", burstTopic, rate)
}

// burstIDs returns size ids for burst n, "burst<n>-<k>" for the smallest k whose id
// lives on shard (chimev1.ShardOf, which routes by the id's routing key).
func burstIDs(n int, shard uint32, shards, size int) []string {
	ids := make([]string, 0, size)
	for k := 0; len(ids) < size; k++ {
		if id := fmt.Sprintf("burst%d-%d", n, k); chimev1.ShardOf(id, uint32(shards)) == shard {
			ids = append(ids, id)
		}
	}
	return ids
}

// burster is process p of the workload: it sends a burst burstFirst after it starts, then
// one every w.burstEvery, on shards in turn, until ctx ends.
func (w *workload) burster(ctx context.Context, p int, r *rand.Rand) {
	wait := burstFirst
	for n := 0; sleep(ctx, wait); n++ {
		w.burst(p, r, n)
		wait = w.burstEvery
	}
}

// burst sends burst n: w.burstSize events on shard n mod shards, each due at D = now +
// burstLead, in BatchSchedule calls of burstChunk events to random nodes. Each event is a
// schedule op of its own, tagged with the burst. Its events are never re-sent, cancelled,
// updated or read: they are not in w.events.
func (w *workload) burst(p int, r *rand.Rand, n int) {
	shard := uint32(n % w.shards)
	tag := fmt.Sprintf("burst%d-shard%d", n, shard)
	ids := burstIDs(n, shard, w.shards, w.burstSize)
	d := time.Now().Add(burstLead).Truncate(time.Millisecond)
	events := make([]*chimev1.Event, len(ids))
	ops := make([]checker.Op, len(ids))
	for i, id := range ids {
		prio := uint32(r.IntN(10))
		events[i] = &chimev1.Event{Id: id, Topic: burstTopic, Payload: []byte("p-" + id), DeliverAt: timestamppb.New(d), Priority: &prio}
		ops[i] = checker.Op{Process: p, F: checker.FSchedule, ID: id, Topic: burstTopic, Payload: "p-" + id,
			DeliverAtNs: d.UnixNano(), Priority: &prio, Burst: tag}
	}
	w.mu.Lock()
	if d.After(w.maxDue) {
		w.maxDue = d
	}
	w.mu.Unlock()
	for i := 0; i < len(events); i += burstChunk {
		j := min(i+burstChunk, len(events))
		w.batch(w.node(r), events[i:j], ops[i:j])
	}
}

// batch sends events in one BatchSchedule call to node n and records ops, one per event,
// with the call's times: each with its own result's outcome, or all with the call's error.
func (w *workload) batch(n *node, events []*chimev1.Event, ops []checker.Op) {
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	invoke := time.Now().UnixNano()
	resp, err := n.scheduler().BatchSchedule(ctx, &chimev1.BatchScheduleRequest{Events: events})
	complete := time.Now().UnixNano()
	if err == nil && len(resp.Results) != len(events) {
		// Which result is whose cannot be told: every outcome is unknown.
		err = status.Errorf(codes.Unknown, "BatchSchedule returned %d results for %d events", len(resp.Results), len(events))
	}
	unknown := false
	for i := range ops {
		op := ops[i]
		op.Node, op.InvokeNs, op.CompleteNs = n.id, invoke, complete
		var res *chimev1.ScheduleResult
		if err == nil {
			res = resp.Results[i]
		}
		switch {
		case err != nil:
			op.Type, op.Code = classify(err)
			op.Error = err.Error()
		case res.Code != int32(codes.OK):
			e := status.Error(codes.Code(res.Code), res.Message)
			op.Type, op.Code = classify(e)
			op.Error = e.Error()
		default:
			op.Type, op.Existing = checker.TypeOK, res.Existing
			if res.Due != nil {
				op.AckDueNs = res.Due.AsTime().UnixNano()
			}
		}
		unknown = unknown || op.Type == checker.TypeInfo
		w.h.add(op)
	}
	if unknown {
		time.Sleep(50 * time.Millisecond) // as record does, once for the call
	}
}
