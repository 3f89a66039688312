package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestExitsWhenTheDataDirectoryCannotBeWritten: a node whose Pebble directory is removed
// under it cannot flush. It used to retry forever, logging tens of thousands of lines a
// second, while it went on leading shards it could no longer apply to. It must exit with
// status 1 once its flushes have failed for --disk-failure-timeout, saying why, and log the
// repeated error sparingly.
func TestExitsWhenTheDataDirectoryCannotBeWritten(t *testing.T) {
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
