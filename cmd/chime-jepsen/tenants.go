package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// With --secure the cluster has two tenants. Tenant B is the workload: its
// token schedules on every topic, and its events and schedules are the ones
// every other check judges. Tenant A's token (tenantName) is a scheduler
// of tenantTopicGrant and of ids beginning with tenantIDPrefix only. A's
// own events (tenanter) are scheduled like B's and judged by the same
// checks; a third client, the prober, holds A's token and keeps calling
// on B's ids and schedules and on ids nobody has. Check 13 (the checker's
// tenant_violations) counts every probe let through, every refusal that is
// not the one words-for-all PERMISSION_DENIED, and every record carrying a
// probe's payload; a probe's effect whose answer was lost shows as B's
// event lost, cancelled or changed (checks 1, 3 and 9).
const (
	tenantName       = "tenant-a"
	tenantTopicGrant = "tenant-a.*"
	tenantTopic      = "tenant-a.x"
	tenantIDPrefix   = "ta-"
)

// tenanter schedules tenant A's events, one every 100-300 ms, due within
// the workload's delays, until ctx ends.
func (w *workload) tenanter(ctx context.Context, p int, r *rand.Rand) {
	for ctx.Err() == nil {
		w.mu.Lock()
		w.seq++
		id := tenantIDPrefix + strconv.Itoa(w.seq)
		w.mu.Unlock()
		now := time.Now()
		ev := sent{id: id, topic: tenantTopic, payload: "p-" + id, at: now, tenant: true}
		ev.delay, ev.deliverAt, ev.due = w.dueTime(r, now)
		w.schedule(p, w.node(r), ev)
		select {
		case <-ctx.Done():
		case <-time.After(100*time.Millisecond + time.Duration(r.Int64N(int64(200*time.Millisecond)))):
		}
	}
}

// prober calls with tenant A's token on ids outside A's scope, one call
// every 20-80 ms until ctx ends: B's events (upsert, update, cancel, get),
// B's recurring schedules (get, pause), and ids nobody has (any of these),
// whose refusal must read the same.
func (w *workload) prober(ctx context.Context, p int, r *rand.Rand) {
	events := []string{checker.ProbeUpsert, checker.ProbeUpdate, checker.ProbeCancel, checker.ProbeGet}
	scheds := []string{checker.ProbeRecurringGet, checker.ProbeRecurringPause}
	for n := 0; ctx.Err() == nil; n++ {
		var id, action string
		switch x := r.IntN(100); {
		case x < 70:
			ev, ok := w.pick(r)
			if !ok {
				break
			}
			id, action = ev.id, events[r.IntN(len(events))]
		case x < 85:
			id, action = recurringSchedules[r.IntN(len(recurringSchedules))].id, scheds[r.IntN(len(scheds))]
		default:
			all := append(events[:len(events):len(events)], scheds...)
			id, action = fmt.Sprintf("e%d", 1_000_000_000+n), all[r.IntN(len(all))]
		}
		if id != "" {
			w.probe(p, w.node(r), action, id, fmt.Sprintf("%s%d", checker.ProbePayloadPrefix, n))
		}
		select {
		case <-ctx.Done():
		case <-time.After(20*time.Millisecond + time.Duration(r.Int64N(int64(60*time.Millisecond)))):
		}
	}
}

// probe makes one call with tenant A's token and records it.
func (w *workload) probe(p int, n *node, action, id, payload string) {
	cc := n.tenant()
	sc, rc := chimev1.NewSchedulerClient(cc), chimev1.NewRecurringClient(cc)
	op := checker.Op{Process: p, F: checker.FTenantProbe, Node: n.id, Action: action, ID: id, Credential: tenantName}
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer cancel()
	op.InvokeNs = time.Now().UnixNano()
	var err error
	switch action {
	case checker.ProbeUpsert:
		op.Topic, op.Payload = tenantTopic, payload
		_, err = sc.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: id, Topic: tenantTopic, Payload: []byte(payload),
			Delay: durationpb.New(time.Second), OnConflict: chimev1.OnConflict_ON_CONFLICT_REPLACE}})
	case checker.ProbeUpdate:
		op.Payload = payload
		_, err = sc.Update(ctx, &chimev1.UpdateRequest{Id: id, Payload: []byte(payload)})
	case checker.ProbeCancel:
		_, err = sc.Cancel(ctx, &chimev1.CancelRequest{Id: id})
	case checker.ProbeGet:
		_, err = sc.Get(ctx, &chimev1.GetRequest{Id: id})
	case checker.ProbeRecurringGet:
		_, err = rc.Get(ctx, &chimev1.GetRecurringRequest{Id: id})
	case checker.ProbeRecurringPause:
		_, err = rc.Pause(ctx, &chimev1.PauseRecurringRequest{Id: id})
	}
	op.CompleteNs = time.Now().UnixNano()
	op.Type = probeType(err)
	if err != nil {
		st, _ := status.FromError(err)
		op.Code, op.Error = st.Code().String(), st.Message()
	}
	w.record(op)
}

// probeType is a probe's history type: ok, fail for any answer the server
// gave (a refusal of some kind), info when no answer came (the node down,
// cut off or too slow, the leader lost).
func probeType(err error) string {
	if err == nil {
		return checker.TypeOK
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Aborted:
		return checker.TypeInfo
	}
	return checker.TypeFail
}
