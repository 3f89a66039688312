package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestExitsWhenTheDataDirectoryCannotBeWritten: a node whose Pebble directory is removed
// under it cannot flush. It used to retry forever, logging tens of thousands of lines a
// second, while it went on leading shards it could no longer apply to. It must exit with
// status 1 once its flushes have failed for --disk-failure-timeout, saying why, and log the
// repeated error sparingly.
func TestExitsWhenTheDataDirectoryCannotBeWritten(t *testing.T) {
	t.Parallel()
	d := newDaemon(t, broker(t))
	// One shard, so that the calls below pass its snapshot threshold (256 entries): the
	// snapshot waits for a flush, and after 10 s asks for one.
	d.extra = []string{"--shards", "1", "--disk-failure-timeout", "1s"}
	d.start()
	if err := os.RemoveAll(filepath.Join(d.dataDir, "pebble")); err != nil {
		t.Fatal(err)
	}
	cl := d.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 300 {
		_, err := cl.Schedule(ctx, &chimev1.ScheduleRequest{Event: &chimev1.Event{
			Id: fmt.Sprintf("disk-%d", i), Topic: "e2e.disk", Delay: durationpb.New(time.Hour)}})
		if err != nil {
			break // the node may already be gone
		}
	}
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("chimed still runs 60 s after its Pebble directory was removed: %s", tail(d.stderr.String(), 2000))
	}
	log := d.stderr.String()
	if code := d.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(log, "the data directory cannot be written") {
		t.Fatalf("exit %d, want 1 saying the data directory cannot be written: %s", code, tail(log, 2000))
	}
	if n := strings.Count(log, "background error"); n > 10 {
		t.Errorf("%d lines of background errors: repeated errors are to be logged every few seconds", n)
	}
}

// TestClusterOutlivesALeaderWhoseDiskFails: the leader of a shard loses its Pebble
// directory while events are scheduled. It exits once its flushes have failed for
// --disk-failure-timeout, the other voters elect a leader, and every acknowledged event
// fires, none early.
func TestClusterOutlivesALeaderWhoseDiskFails(t *testing.T) {
	if testing.Short() {
		t.Skip("three chimed processes, one of which loses its disk; skipped with -short")
	}
	t.Parallel()
	c := newCluster(t, 3, "--disk-failure-timeout", "1s")
	st := c.waitSettled(60 * time.Second)
	broken := c.nodes[st.GetShards()[0].GetLeader()]
	var alive []*daemon
	for _, id := range c.order {
		if c.nodes[id] != broken {
			alive = append(alive, c.nodes[id])
		}
	}
	col := collect(t, c.brokers, "e2e.diskfail")
	if err := os.RemoveAll(filepath.Join(broken.dataDir, "pebble")); err != nil {
		t.Fatal(err)
	}
	// Enough entries for the broken node's replicas to pass their snapshot threshold
	// (256 entries a shard): the snapshot waits for a flush, and after 10 s asks for one.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := []chimev1.SchedulerClient{alive[0].client(), alive[1].client()}
	due := time.Now().Add(30 * time.Second)
	want := map[string]time.Time{}
	const events = 400 * clusterShards
	for i := range events {
		want[fmt.Sprintf("diskfail-%d", i)] = due
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			retry := time.NewTicker(100 * time.Millisecond)
			defer retry.Stop()
			for i := w; i < events; i += 4 {
				req := &chimev1.ScheduleRequest{Event: &chimev1.Event{Id: fmt.Sprintf("diskfail-%d", i), Topic: "e2e.diskfail", DeliverAt: timestamppb.New(due)}}
				for attempt := 0; ; attempt++ {
					_, err := clients[(w+attempt)%2].Schedule(ctx, req)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						errs <- fmt.Errorf("schedule %s: %v", req.Event.Id, err)
						return
					}
					<-retry.C // a leader change: the same id again is idempotent
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case <-broken.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s still runs 60 s after its Pebble directory was removed: %s", broken.nodeID, tail(broken.stderr.String(), 2000))
	}
	if code := broken.cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("%s exited with %d, want 1: %s", broken.nodeID, code, tail(broken.stderr.String(), 2000))
	}
	got := col.waitIDs(t, want, 90*time.Second)
	for id, r := range got {
		if _, ok := want[id]; ok && r.Fired.Before(due.Truncate(time.Millisecond)) {
			t.Errorf("%s fired at %s, before its due time %s", id, r.Fired, due)
		}
	}
}
