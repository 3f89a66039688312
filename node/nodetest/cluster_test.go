package nodetest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// A minority partition loses the leadership of every shard it led, the
// majority elects new leaders and keeps scheduling; after Heal the cluster
// converges again and a killed node restarts on its data.
func TestPartitionKillRestart(t *testing.T) {
	c := MakeCluster(t, 3, Options{Shards: 4})
	var led []uint32
	for id := range uint32(c.Shards()) {
		if c.Leader(id) == "n1" {
			led = append(led, id)
		}
	}
	c.Partition("n1")
	WaitFor(t, 20*time.Second, func() (bool, string) {
		for id := range uint32(c.Shards()) {
			if l := c.Leader(id); l == "" || l == "n1" {
				return false, fmt.Sprintf("shard %d led by %q, want n2 or n3", id, l)
			}
		}
		return true, ""
	})
	t.Logf("n1 (led shards %v) partitioned away; every shard led by the majority", led)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	for i := range 8 {
		id := fmt.Sprintf("p-%d", i)
		// UNAVAILABLE is retried, as clients do: the majority's
		// balancer may be moving a leader just now.
		var err error
		WaitFor(t, 30*time.Second, func() (bool, string) {
			_, err = c.Node("n2").Scheduler().Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
				Id: id, Topic: "t", Delay: durationpb.New(time.Hour)}})
			return status.Code(err) != codes.Unavailable, fmt.Sprintf("schedule %s (shard %d) in the majority: %v", id, shard.For(id, c.Shards()), err)
		})
		if err != nil {
			t.Fatalf("schedule %s: %v", id, err)
		}
	}
	t.Logf("8 events scheduled in the majority in %v", time.Since(start).Round(time.Millisecond))
	c.Heal()
	c.WaitConverged(30*time.Second, "n1")

	c.Node("n3").Kill()
	if c.Node("n3").Up() {
		t.Fatal("n3 up after Kill")
	}
	c.Node("n3").Restart()
	c.WaitConverged(30*time.Second, "n3")
	g, err := c.Node("n3").Scheduler().Get(ctx, &chimev1.GetRequest{Id: "p-0"})
	if err != nil || g.State != chimev1.EventState_EVENT_STATE_SCHEDULED {
		t.Fatalf("get after restart: %v, %v", g, err)
	}
}
