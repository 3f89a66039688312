package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWatchStallsDumpsOnce: a broker that has taken no produce request for
// stallAfter is reported once, with the goroutines written beside the run
// and what the collector did meanwhile, and a broker that takes requests is
// not reported (the busy spell comes first, so a report of it would make
// two). The log is read once the watch has returned.
func TestWatchStallsDumpsOnce(t *testing.T) {
	out := t.TempDir()
	var log bytes.Buffer
	l := &appendLog{at: map[appendKey]int64{}}
	l.last.Store(time.Now().UnixNano())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.watchStalls(ctx, out, func() []*node { return nil }, slog.New(slog.NewTextHandler(&log, nil)))
	}()
	// Busy for a while: nothing to report.
	for range 6 {
		time.Sleep(stallTick)
		l.last.Store(time.Now().UnixNano())
	}
	// Then silent for well over stallAfter: one report, one dump.
	time.Sleep(stallAfter + 4*stallTick)
	cancel()
	<-done
	if n := strings.Count(log.String(), "no produce request"); n != 1 {
		t.Fatalf("%d reports of one silence, want 1: %s", n, log.String())
	}
	if !strings.Contains(log.String(), "gc_cycles=") || !strings.Contains(log.String(), "heap_mib=") {
		t.Errorf("the report does not say what the collector did: %s", log.String())
	}
	b, err := os.ReadFile(filepath.Join(out, "stall-1.txt"))
	if err != nil || !strings.Contains(string(b), "watchStalls") {
		t.Fatalf("the dump: %v, %d bytes without the watch's own goroutine", err, len(b))
	}
}
