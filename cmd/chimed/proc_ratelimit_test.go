package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestTopicRateLimitAcrossProcesses, on a 3-process cluster started with
// --topic-rate-limit proc.limited=40/s: 200 events of the topic due at once
// go out at the limit across the cluster (no second holds more than the
// rate and the shard leaders' bursts; the whole takes about 5 s); every node
// reports the rule; SetTopicRateLimits through one node changes it on all
// three, and the next 200 go at the new rate; a rule that does not parse is
// refused, naming it, and changes nothing.
func TestTopicRateLimitAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster for about half a minute; skipped with -short")
	}
	t.Parallel()
	c := newCluster(t, 3, "--topic-rate-limit", "proc.limited=40/s")
	c.waitSettled(30 * time.Second)
	col := collect(t, c.brokers, "proc.limited")
	ctx := context.Background()

	limits := func(node string) []string {
		t.Helper()
		resp, err := c.admin(node).GetTopicRateLimits(ctx, &chimev1.GetTopicRateLimitsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range resp.Nodes {
			var rules []string
			for _, l := range n.Limits {
				rules = append(rules, fmt.Sprintf("%s=%g/s", l.Topic, l.PerSecond))
			}
			out = append(out, n.Node+":"+strings.Join(rules, ",")+n.Error)
		}
		return out
	}
	if got, want := limits("n2"), []string{"n1:proc.limited=40/s", "n2:proc.limited=40/s", "n3:proc.limited=40/s"}; !slices.Equal(got, want) {
		t.Fatalf("GetTopicRateLimits = %v, want %v", got, want)
	}

	// burst schedules 200 events due 2 s from now and returns how long
	// their records took to go out, first to last, and the most within any
	// one second.
	burst := func(name string) (span time.Duration, peak int) {
		t.Helper()
		at := time.Now().Add(2 * time.Second)
		want := map[string]time.Time{}
		var evs []*chimev1.Event
		for i := range 200 {
			id := fmt.Sprintf("%s-%03d", name, i)
			want[id] = at
			evs = append(evs, &chimev1.Event{Id: id, Topic: "proc.limited", DeliverAt: timestamppb.New(at)})
		}
		resp, err := c.nodes["n1"].client().BatchSchedule(ctx, &chimev1.BatchScheduleRequest{Events: evs})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Results {
			if r.Code != 0 {
				t.Fatalf("schedule %s: %s", r.Id, r.Message)
			}
		}
		got := col.waitIDs(t, want, 60*time.Second)
		var times []time.Time
		for id := range want {
			if got[id].Fired.Before(at) {
				t.Errorf("%s produced at %v, before its due time %v", id, got[id].Fired, at)
			}
			times = append(times, got[id].Kafka.Timestamp)
		}
		slices.SortFunc(times, time.Time.Compare)
		for i, from := range times {
			n, _ := slices.BinarySearchFunc(times[i:], from.Add(time.Second), time.Time.Compare)
			peak = max(peak, n)
		}
		return times[len(times)-1].Sub(times[0]), peak
	}

	// 40/s over 8 shards: 5/s each, a burst of one each.
	span, peak := burst("slow")
	t.Logf("at 40/s: 200 records over %v, at most %d in a second", span, peak)
	if span < 4*time.Second || peak > 48+8 { // a fifth over the rate, and the leaders' bursts: see TestTopicRateLimit
		t.Errorf("at 40/s: 200 records over %v, at most %d in a second; want about 5 s, at most 56 a second", span, peak)
	}

	if _, err := c.admin("n1").SetTopicRateLimits(ctx, &chimev1.SetTopicRateLimitsRequest{
		Limits: []*chimev1.TopicRateLimit{{Topic: "proc.limited", PerSecond: 0}}}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "limits[0]") {
		t.Fatalf("a rate of 0: %v, want INVALID_ARGUMENT naming limits[0]", err)
	}
	resp, err := c.admin("n1").SetTopicRateLimits(ctx, &chimev1.SetTopicRateLimitsRequest{
		Limits: []*chimev1.TopicRateLimit{{Topic: "proc.*", PerSecond: 4000}}})
	if err != nil || len(resp.Nodes) != 3 {
		t.Fatalf("SetTopicRateLimits = %v, %v; want an entry for each of 3 nodes", resp, err)
	}
	if got, want := limits("n3"), []string{"n1:proc.*=4000/s", "n2:proc.*=4000/s", "n3:proc.*=4000/s"}; !slices.Equal(got, want) {
		t.Fatalf("after the change GetTopicRateLimits = %v, want %v", got, want)
	}
	span, peak = burst("fast")
	t.Logf("at 4000/s: 200 records over %v, at most %d in a second", span, peak)
	if span > 2*time.Second {
		t.Errorf("at 4000/s: 200 records took %v; the new limit did not apply", span)
	}
}
