package shard

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// hangingLog is a log store whose appends wait for release, as on a disk that hangs.
type hangingLog struct {
	*raft.InmemStore
	release chan struct{}
}

func (h hangingLog) StoreLogs(ls []*raft.Log) error {
	<-h.release
	return h.InmemStore.StoreLogs(ls)
}

func TestWatchedLogReportsAStalledWrite(t *testing.T) {
	mem := raft.NewInmemStore()
	h := hangingLog{InmemStore: mem, release: make(chan struct{})}
	failed := make(chan error, 8)
	w := &watchedLog{LogStore: h, stable: mem, shard: 3, after: 100 * time.Millisecond, failed: func(err error) { failed <- err }}

	// Writes that return in time report nothing.
	for i := range 5 {
		if err := w.StoreLog(&raft.Log{Index: uint64(i + 1), Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := w.SetUint64([]byte("CurrentTerm"), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		t.Fatalf("a write that returned at once was reported: %v", err)
	case <-time.After(300 * time.Millisecond):
	}

	done := make(chan error, 1)
	go func() { done <- w.StoreLogs([]*raft.Log{{Index: 6}}) }()
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "shard 3: a Raft log append has been under way") {
			t.Errorf("failed(%q)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an append stalled for 10 s was not reported")
	}
	close(h.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(failed); n != 0 {
		t.Errorf("one stalled append reported %d more times", n)
	}
	if v, err := w.GetUint64([]byte("CurrentTerm")); err != nil || v != 4 {
		t.Errorf("GetUint64 = %d, %v; want 4 through the watch", v, err)
	}
}
