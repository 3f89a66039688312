package cluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// TestMain fails the package's tests on a goroutine they leave running. It
// waits as nodetest does, up to 10 s: the in-process cluster's memberlist
// does not wait for a probe in flight when it shuts down.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := nodetest.FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// metric reads an unlabelled counter or gauge from a node's /metrics.
func metric(t *testing.T, n *nodetest.Node, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("%s: not in %s's metrics (%v)", name, n.ID, sc.Err())
	return 0
}

// TestScheduleThroughANonLeader: a Schedule sent to a node that does not
// lead the event's shard is validated there, once, and proposed by the
// leader as it was validated (the leader's count of validated events stays
// where it was); finding the leader takes one lookup, and the requests after
// it, to the same shard, none.
func TestScheduleThroughANonLeader(t *testing.T) {
	const shards = 2
	c := nodetest.MakeCluster(t, 3, nodetest.Options{Shards: shards})
	c.WaitSettled(60 * time.Second)
	id := func(i int) string {
		for j := 0; ; j++ {
			if s := fmt.Sprintf("route-%d-%d", i, j); shard.For(s, shards) == 0 {
				return s
			}
		}
	}
	leader := c.Node(c.Leader(0))
	var via *nodetest.Node
	for _, n := range c.IDs() {
		if n != leader.ID {
			via = c.Node(n)
			break
		}
	}
	const validated, lookups = "chime_rpc_validated_events_total", "chime_cluster_leader_lookups_total"
	viaValidated, leaderValidated, viaLookups := metric(t, via, validated), metric(t, leader, validated), metric(t, via, lookups)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schedule := func(i int) {
		t.Helper()
		ev := &chimev1.Event{Id: id(i), Topic: "route", Payload: []byte("p"), Delay: durationpb.New(time.Hour)}
		if _, err := via.Scheduler().Schedule(ctx, &chimev1.ScheduleRequest{Event: ev}); err != nil {
			t.Fatalf("schedule %s through %s: %v", ev.Id, via.ID, err)
		}
	}
	schedule(0)
	if got := metric(t, via, lookups) - viaLookups; got != 1 {
		t.Errorf("the first Schedule through %s took %v leader lookups, want 1", via.ID, got)
	}
	const more = 20
	for i := 1; i <= more; i++ {
		schedule(i)
	}
	if got := metric(t, via, lookups) - viaLookups; got != 1 {
		t.Errorf("%d more Schedules to the same shard's leader took %v more lookups, want none", more, got-1)
	}
	if got := metric(t, via, validated) - viaValidated; got != more+1 {
		t.Errorf("%s validated %v events, want the %d it was sent", via.ID, got, more+1)
	}
	if got := metric(t, leader, validated) - leaderValidated; got != 0 {
		t.Errorf("the leader, %s, validated %v events again", leader.ID, got)
	}
	got, err := leader.Scheduler().Get(ctx, &chimev1.GetRequest{Id: id(more)})
	if err != nil || got.State != chimev1.EventState_EVENT_STATE_SCHEDULED {
		t.Fatalf("get %s on the leader: %v, %v", id(more), got, err)
	}

	// Every other operation on one event goes the same way, and answers as
	// the leader would.
	up, err := via.Scheduler().Update(ctx, &chimev1.UpdateRequest{Id: id(1), Payload: []byte("p2"), ExpectedVersion: 1})
	if err != nil || up.Version != 2 {
		t.Fatalf("update through %s: %v, %v; want version 2", via.ID, up, err)
	}
	if _, err := via.Scheduler().Update(ctx, &chimev1.UpdateRequest{Id: id(1), Payload: []byte("p3"), ExpectedVersion: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a stale update through %s: %v; want FAILED_PRECONDITION", via.ID, err)
	}
	g, err := via.Scheduler().Get(ctx, &chimev1.GetRequest{Id: id(1)})
	if err != nil || string(g.Event.GetPayload()) != "p2" || g.Version != 2 {
		t.Fatalf("get through %s: %v, %v; want the update's payload", via.ID, g, err)
	}
	if _, err := via.Scheduler().Cancel(ctx, &chimev1.CancelRequest{Id: id(2)}); err != nil {
		t.Fatalf("cancel through %s: %v", via.ID, err)
	}
	if _, err := via.Scheduler().Get(ctx, &chimev1.GetRequest{Id: id(999)}); status.Code(err) != codes.NotFound {
		t.Fatalf("get of an unknown id through %s: %v; want NOT_FOUND", via.ID, err)
	}
	rid := id(more + 1)
	rs, err := via.Recurring().Create(ctx, &chimev1.CreateRecurringRequest{Id: rid,
		Rule:   &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "0 3 * * *"}, TimeZone: "Europe/Paris"},
		Target: &chimev1.RecurringTarget{Topic: "route", Payload: []byte("nightly")}})
	if err != nil || rs.Id != rid || rs.GetRule().GetTimeZone() != "Europe/Paris" {
		t.Fatalf("recurring create through %s: %v, %v", via.ID, rs, err)
	}
	if p, err := via.Recurring().Pause(ctx, &chimev1.PauseRecurringRequest{Id: rid}); err != nil || !p.GetResumesFrom().AsTime().Equal(rs.GetNextOccurrence().AsTime()) {
		t.Fatalf("recurring pause through %s: %v, %v; want it to resume from the cancelled %v", via.ID, p, err, rs.GetNextOccurrence().AsTime())
	}
	if got := metric(t, via, lookups) - viaLookups; got != 1 {
		t.Errorf("after every operation on shard 0: %v lookups, want the first one only", got)
	}
}
