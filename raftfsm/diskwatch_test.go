package raftfsm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// countingLogger records the lines Pebble and the disk watch log.
type countingLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *countingLogger) Infof(string, ...any) {}
func (l *countingLogger) Errorf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}
func (l *countingLogger) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (l *countingLogger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

func TestDiskWatch(t *testing.T) {
	boom := errors.New("boom")
	type step struct {
		at    time.Duration // since the start
		ok    bool          // a flush succeeded; otherwise a background error
		slow  time.Duration // a DiskSlow report of an operation under way this long
		fails bool          // Failed is called at this step
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"errors for FailAfter fail the store once", []step{
			{at: 0}, {at: 4 * time.Second}, {at: 9 * time.Second}, {at: 10 * time.Second, fails: true}, {at: 11 * time.Second},
		}},
		{"a success in between begins again", []step{
			{at: 0}, {at: 6 * time.Second}, {at: 7 * time.Second, ok: true}, {at: 8 * time.Second}, {at: 17 * time.Second},
			{at: 18 * time.Second, fails: true},
		}},
		{"errors further apart than FailAfter never add up", []step{
			{at: 0}, {at: 11 * time.Second}, {at: 22 * time.Second}, {at: 33 * time.Second},
		}},
		{"an operation under way for FailAfter fails the store", []step{
			{slow: 5 * time.Second}, {at: 2 * time.Second, slow: 7 * time.Second}, {at: 5 * time.Second, slow: 10 * time.Second, fails: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var failures []error
			log := &countingLogger{}
			w := newDiskWatch(10*time.Second, func(err error) { failures = append(failures, err) }, log)
			start := time.Unix(1_800_000_000, 0)
			for i, s := range tc.steps {
				w.now = func() time.Time { return start.Add(s.at) }
				before := len(failures)
				switch {
				case s.ok:
					w.flushEnded(pebble.FlushInfo{Done: true})
				case s.slow > 0:
					w.diskSlow(vfs.DiskSlowInfo{Path: "000123.sst", OpType: vfs.OpTypeSync, Duration: s.slow})
				default:
					w.backgroundError(boom)
				}
				if got := len(failures) > before; got != s.fails {
					t.Fatalf("step %d (%+v): Failed called = %v, want %v", i, s, got, s.fails)
				}
			}
			for _, err := range failures {
				if !strings.Contains(err.Error(), "10s") {
					t.Errorf("failure %q does not say how long", err)
				}
			}
		})
	}
}

// Pebble retries a failed flush at once: the watch logs a line every errorLogEvery, with
// the count of those it did not log.
func TestDiskWatchLogsRepeatedErrorsSparingly(t *testing.T) {
	log := &countingLogger{}
	w := newDiskWatch(time.Hour, nil, log)
	start := time.Unix(1_800_000_000, 0)
	for i := range 10_000 {
		w.now = func() time.Time { return start.Add(time.Duration(i) * time.Millisecond) } // 10 s of errors
		w.backgroundError(errors.New("open 000123.sst: no such file or directory"))
	}
	if got := log.count(); got != 2 {
		t.Fatalf("logged %d lines for 10,000 errors over 10 s, want 2: %q", got, log.lines)
	}
	if !strings.Contains(log.lines[1], "4999 more not logged") {
		t.Errorf("second line %q does not count the 4,999 errors between", log.lines[1])
	}
}

// A store whose directory is removed under it cannot flush. Failed must be called, once,
// soon after FailAfter; before this, Pebble retried the flush forever and the node went on
// leading shards it could not apply to.
func TestStoreFailsWhenItCannotFlush(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pebble")
	failed := make(chan error, 4)
	st, err := OpenStore(dir, StoreOptions{
		Logger:    &countingLogger{},
		FailAfter: 300 * time.Millisecond,
		Failed:    func(err error) { failed <- err },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.db.Set([]byte("k1"), []byte("v"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := st.db.Flush(); err != nil { // a flush that works: no failure
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := st.db.Set([]byte("k2"), []byte("v"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, err := st.db.AsyncFlush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "no such file or directory") {
			t.Errorf("Failed(%q): want the flush's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Failed not called 30 s after the directory was removed")
	}
	// The directory back, the flush goes through and the store closes.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(failed); n != 0 {
		t.Errorf("Failed called %d more times", n)
	}
}
