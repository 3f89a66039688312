package main

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/chimehq/chime/node/nodetest"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

func (d *daemon) recurring() chimev1.RecurringClient {
	d.t.Helper()
	cc, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(d.creds))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { cc.Close() })
	return chimev1.NewRecurringClient(cc)
}

// occurrences returns, for schedule id, the nominal times of the occurrences the collector
// read (each once), in order, and fails the test on a record produced before its occurrence
// was due or naming another schedule.
func occurrences(t *testing.T, col collector, id string) []time.Time {
	t.Helper()
	seen := map[time.Time]bool{}
	for _, r := range col.Consumed().Records {
		if r.RecurringID != id {
			continue
		}
		if r.ID != fmt.Sprintf("%s@%d", id, r.Occurrence.UnixMilli()) {
			t.Fatalf("record %s carries occurrence %v of %s", r.ID, r.Occurrence, r.RecurringID)
		}
		if r.Fired.Before(r.Occurrence) {
			t.Fatalf("%s produced at %v, before its occurrence %v", r.ID, r.Fired, r.Occurrence)
		}
		seen[r.Occurrence] = true
	}
	out := make([]time.Time, 0, len(seen))
	for at := range seen {
		out = append(out, at)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

func seconds(from, to time.Time) []time.Time {
	var out []time.Time
	for at := from; !at.After(to); at = at.Add(time.Second) {
		out = append(out, at)
	}
	return out
}

// TestRecurringAcrossProcesses, on a 3-process cluster: a second-level cron schedule produces
// exactly its occurrences over 20 s while the leader of its shard is killed, none early and
// none missing (catch-up all); Pause and Resume do what each catch-up mode says; after
// Delete returns, no occurrence is produced.
func TestRecurringAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-process cluster for about a minute; skipped with -short")
	}
	t.Parallel()
	c := newCluster(t, 3)
	st := c.waitSettled(30 * time.Second)
	rc := c.nodes["n1"].recurring()
	col := collect(t, c.brokers, "proc.recurring")
	ctx := context.Background()
	create := func(id string, rule *chimev1.RecurringRule) {
		t.Helper()
		if _, err := rc.Create(ctx, &chimev1.CreateRecurringRequest{Id: id, Rule: rule, Target: &chimev1.RecurringTarget{Topic: "proc.recurring"}}); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
	}

	// "tick" occurs every second for 20 s; its shard's leader is killed after 6 s.
	start := time.Now().Truncate(time.Second).Add(3 * time.Second)
	end := start.Add(20 * time.Second)
	create("tick", &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "* * * * * *"}, TimeZone: "Australia/Lord_Howe",
		Start: timestamppb.New(start), End: timestamppb.New(end), CatchUp: chimev1.CatchUp_CATCH_UP_ALL})
	for _, mode := range []chimev1.CatchUp{chimev1.CatchUp_CATCH_UP_SKIP, chimev1.CatchUp_CATCH_UP_LAST, chimev1.CatchUp_CATCH_UP_ALL} {
		create("cu-"+mode.String(), &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Every{Every: durationpb.New(time.Second)}, Start: timestamppb.New(start), CatchUp: mode})
	}
	create("doomed", &chimev1.RecurringRule{Rule: &chimev1.RecurringRule_Cron{Cron: "* * * * * *"}, TimeZone: "America/New_York"})

	victim := ""
	for _, s := range st.Shards {
		if s.Id == chimev1.ShardOf("tick", clusterShards) {
			victim = s.Leader
		}
	}
	if victim == "n1" {
		// Keep the node the test talks to.
		rc = c.nodes["n2"].recurring()
	}
	// reached waits until schedule id has produced its occurrence at (or one
	// after it): occurrences are never produced before they are due, so the
	// schedules have run until then.
	reached := func(id string, at time.Time, d time.Duration) {
		t.Helper()
		nodetest.WaitFor(t, d, func() (bool, string) {
			got := occurrences(t, col, id)
			return len(got) > 0 && !got[len(got)-1].Before(at), fmt.Sprintf("%s produces its occurrence at %v: %d so far", id, at.Format("05.000"), len(got))
		})
	}
	modes := []chimev1.CatchUp{chimev1.CatchUp_CATCH_UP_SKIP, chimev1.CatchUp_CATCH_UP_LAST, chimev1.CatchUp_CATCH_UP_ALL}
	reached("tick", start.Add(5*time.Second), time.Until(start)+30*time.Second) // the schedule runs for a while first
	if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s: %v", victim, err)
	}
	killed := time.Now()
	t.Logf("killed %s, the leader of tick's shard, at %v", victim, killed.Format("15:04:05.000"))

	// Once every shard has a leader again and every schedule fires on it,
	// pause the catch-up schedules while tick, not paused, passes three
	// occurrences; then resume them.
	survivor := "n1"
	if victim == survivor {
		survivor = "n2"
	}
	c.waitLedWithout(victim, survivor, 30*time.Second)
	led := time.Now()
	for _, id := range []string{"tick", "cu-" + modes[0].String(), "cu-" + modes[1].String(), "cu-" + modes[2].String()} {
		reached(id, led.Add(time.Second), 30*time.Second)
	}
	paused := map[chimev1.CatchUp]time.Time{}
	for _, mode := range modes {
		id := "cu-" + mode.String()
		nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
			_, err := rc.Pause(ctx, &chimev1.PauseRecurringRequest{Id: id})
			return err == nil, fmt.Sprintf("pause %s: %v", id, err)
		})
		paused[mode] = time.Now()
	}
	reached("tick", paused[modes[len(modes)-1]].Add(3*time.Second), 30*time.Second)
	type resumption struct {
		before, after time.Time
		next          time.Time // the occurrence Resume made pending
	}
	resumed := map[chimev1.CatchUp]resumption{}
	for _, mode := range modes {
		before := time.Now()
		s, err := rc.Resume(ctx, &chimev1.ResumeRecurringRequest{Id: "cu-" + mode.String()})
		if err != nil {
			t.Fatalf("resume %v: %v", mode, err)
		}
		resumed[mode] = resumption{before, time.Now(), s.NextOccurrence.AsTime()}
	}

	// Delete doomed; nothing of it may be produced after that.
	var deleted time.Time
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		_, err := rc.Delete(ctx, &chimev1.DeleteRecurringRequest{Id: "doomed"})
		deleted = time.Now()
		return err == nil, fmt.Sprintf("delete doomed: %v", err)
	})

	// tick's last occurrence, and the catch-up schedules' at end + 2 s (the
	// checks below go that far); doomed, deleted seconds before, has had as
	// long to show up.
	reached("tick", end, time.Until(end)+30*time.Second)
	for _, mode := range modes {
		reached("cu-"+mode.String(), end.Add(2*time.Second), time.Until(end)+30*time.Second)
	}

	if got, want := occurrences(t, col, "tick"), seconds(start, end); !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("tick: %d occurrences %v\nwant %d: %v", len(got), got, len(want), want)
	}
	for _, r := range col.Consumed().Records {
		if r.RecurringID == "doomed" && r.Fired.After(deleted) {
			t.Errorf("doomed's %s produced at %v, after the Delete returned at %v", r.ID, r.Fired, deleted)
		}
	}
	for _, mode := range modes {
		id, r := "cu-"+mode.String(), resumed[mode]
		got := occurrences(t, col, id)
		// The last occurrence produced before the pause returned: none after it is, but
		// what the catch-up makes.
		var last time.Time
		for _, rec := range col.Consumed().Records {
			if rec.RecurringID == id && !rec.Fired.After(paused[mode]) && rec.Occurrence.After(last) {
				last = rec.Occurrence
			}
		}
		t.Logf("%s: last before the pause %v, resumed at %v with next %v", id, last.Format("05.000"), r.before.Format("05.000"), r.next.Format("05.000"))
		switch mode {
		case chimev1.CatchUp_CATCH_UP_SKIP:
			if !r.next.After(r.before) {
				t.Errorf("%s resumed with %v, not after the resume at %v", id, r.next, r.before)
			}
		case chimev1.CatchUp_CATCH_UP_LAST:
			if r.next.After(r.after) || !r.next.After(r.before.Add(-time.Second)) {
				t.Errorf("%s resumed with %v, not the latest occurrence by the resume at %v", id, r.next, r.before)
			}
		default:
			if !r.next.Equal(last.Add(time.Second)) {
				t.Errorf("%s resumed with %v, not the first missed occurrence %v", id, r.next, last.Add(time.Second))
			}
		}
		// Nothing between the last before the pause and the resumed one; every second from
		// the resumed one on.
		if want := append(seconds(start, last), seconds(r.next, end.Add(2*time.Second))...); !slices.EqualFunc(got[:min(len(got), len(want))], want, time.Time.Equal) {
			t.Errorf("%s: occurrences %v\nwant %v", id, got, want)
		}
	}
}
