package snapshot

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/raftfsm"
)

// TestInstallsArePaced: an expansion is written and read no faster than the
// install rate, whatever sizes the caller asks for at once. It runs on the
// bubble's clock, which the limiter's waits advance.
func TestInstallsArePaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rateBps, size = 256 << 10, 512 << 10
		lim := NewLimiter(rateBps)
		f, err := os.CreateTemp(t.TempDir(), "paced")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		start := time.Now()
		if _, err := Paced(f, lim).Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		wrote := time.Since(start)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		n, err := io.Copy(io.Discard, &expansion{x: &expanded{}, f: f, store: &Store{pace: lim}})
		read := time.Since(start)
		if err != nil || n != size {
			t.Fatalf("read %d bytes, %v", n, err)
		}
		// The first burst (256 KiB) is free; the rest takes at least a second at 256 KiB/s.
		if min := 900 * time.Millisecond; wrote < min || read < min+900*time.Millisecond {
			t.Fatalf("512 KiB written in %v and read in %v at 256 KiB/s", wrote, read)
		}
	})
}

// TestCompactionKeepsTheSnapshotEntry: KeepSnapshotEntry keeps the last
// entry of a compaction and deletes exactly what it is asked to otherwise.
func TestCompactionKeepsTheSnapshotEntry(t *testing.T) {
	mem := raft.NewInmemStore()
	for i := uint64(1); i <= 10; i++ {
		if err := mem.StoreLog(&raft.Log{Index: i, Term: 1}); err != nil {
			t.Fatal(err)
		}
	}
	l := KeepSnapshotEntry(mem)
	bounds := func() (uint64, uint64) {
		first, _ := l.FirstIndex()
		last, _ := l.LastIndex()
		return first, last
	}
	for _, c := range []struct {
		name                string
		min, max            uint64
		wantFirst, wantLast uint64
	}{
		{"a compaction keeps the entry at its end", 1, 4, 4, 10},
		{"a compaction of one entry keeps it", 4, 4, 4, 10},
		{"a truncated suffix goes whole", 8, 10, 4, 7},
		{"deleting everything deletes everything", 4, 7, 0, 0},
	} {
		if err := l.DeleteRange(c.min, c.max); err != nil {
			t.Fatal(err)
		}
		if first, last := bounds(); first != c.wantFirst || last != c.wantLast {
			t.Fatalf("%s: DeleteRange(%d, %d) left [%d, %d], want [%d, %d]", c.name, c.min, c.max, first, last, c.wantFirst, c.wantLast)
		}
	}
}

// TestLogKeptWhileAnInstallIsSent: while a full snapshot is being written or
// sent to a follower, and for the grace after (Knobs.KeepLogGrace), raft keeps
// its whole log, so that the follower can replay what was committed meanwhile
// instead of needing another install; then TrailingLogs is back. The
// bubble's clock runs the grace: each time.Sleep below advances it.
func TestLogKeptWhileAnInstallIsSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace, want = 200 * time.Millisecond, 128
		var (
			mu       sync.Mutex
			trailing uint64    = want
			backAt   time.Time // when TrailingLogs was last set back to want
		)
		k := &logKeeper{grace: grace, trailing: want, set: func(n uint64) {
			mu.Lock()
			defer mu.Unlock()
			trailing = n
			if n == want {
				backAt = time.Now()
			}
		}}
		get := func() uint64 {
			mu.Lock()
			defer mu.Unlock()
			return trailing
		}
		k.expanding(true)
		k.expanding(true) // two followers at once
		k.expanding(false)
		if got := get(); got != math.MaxUint64 {
			t.Fatalf("TrailingLogs %d with an install open, want all", got)
		}
		closed := time.Now()
		k.expanding(false)
		time.Sleep(grace - time.Millisecond)
		if got := get(); got != math.MaxUint64 {
			t.Fatalf("TrailingLogs %d %v after the install closed, within the %v grace", got, time.Since(closed), grace)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := get(); got != want || backAt.Sub(closed) != grace {
			t.Fatalf("TrailingLogs %d at %v after the install closed, want %d at the %v grace", got, backAt.Sub(closed), want, grace)
		}
		// A new install within the grace keeps the log past the first grace.
		k.expanding(true)
		k.expanding(false)
		time.Sleep(grace / 2)
		k.expanding(true)
		time.Sleep(2 * grace)
		if got := get(); got != math.MaxUint64 {
			t.Fatalf("TrailingLogs %d with a second install open, want all", got)
		}
		// Once stopped, a closing install releases nothing.
		k.expanding(false)
		k.stop()
		time.Sleep(2 * grace)
		if got := get(); got != math.MaxUint64 {
			t.Fatalf("TrailingLogs %d changed after the keeper stopped", got)
		}
	})
}

// TestInstallRefusesACopyOlderThanTheLog: a follower refuses a received copy
// whose state is older than the last entry of its own raft log, and drops
// it: raft would count that entry (perhaps a deposed leader's) committed
// once the copy is installed, without comparing it with the leader's.
func TestInstallRefusesACopyOlderThanTheLog(t *testing.T) {
	st, err := raftfsm.OpenStore(t.TempDir(), raftfsm.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fsm, err := raftfsm.NewFSM(st, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fsm.Close()
	for i := uint64(1); i <= 3; i++ {
		cmd := raftfsm.ScheduleBatch{ProposedAt: 1, Events: []raftfsm.NewEvent{{ID: fmt.Sprintf("e%d", i), Due: 5, Topic: "t", ContentHash: 9}}}
		if r := fsm.Apply(&raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: raftfsm.AppendScheduleBatch(nil, &cmd)}); r != nil {
			if err, ok := r.(error); ok {
				t.Fatal(err)
			}
		}
	}
	dir := t.TempDir()
	name := strings.Repeat("ab", 16)
	path := filepath.Join(dir, installPrefix+name+".done")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := fsm.WriteSnapshot(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if h.AppliedIndex != 3 {
		t.Fatalf("the copy holds the log up to %d, want 3", h.AppliedIndex)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		last   uint64
		refuse bool
	}{{h.AppliedIndex, false}, {h.AppliedIndex + 1, true}} {
		// The accepted case leaves no file: write the copy each time.
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		tr := &Transport{dir: dir, lastLog: func() (uint64, error) { return c.last, nil }}
		req := &raft.InstallSnapshotRequest{Peers: []byte(installMarker + name)}
		rpc := raft.RPC{Command: req}
		err := tr.attach(&rpc, req)
		if c.refuse {
			if err == nil {
				t.Fatalf("a copy at %d installed over a log ending at %d", h.AppliedIndex, c.last)
			}
			if _, serr := os.Stat(path); !errors.Is(serr, os.ErrNotExist) {
				t.Fatalf("the refused copy is kept (%v)", serr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("a copy at %d refused over a log ending at %d: %v", h.AppliedIndex, c.last, err)
		}
		if n, _ := io.Copy(io.Discard, rpc.Reader); n != req.Size || n == 0 {
			t.Fatalf("the copy handed to raft has %d bytes, the request says %d", n, req.Size)
		}
		if _, serr := os.Stat(path); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("the installed copy is kept after raft read it (%v)", serr)
		}
	}
}

// TestOpenRemovesHalfWrittenSnapshots: a snapshot that raft's file store was writing when
// the process was killed (its sink neither closed nor cancelled) is gone once the store
// opens again, and a complete one is kept. The store never reaped one, and a kill during
// the receipt of a leader's copy left a copy of the shard behind for good.
func TestOpenRemovesHalfWrittenSnapshots(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	conf := raft.Configuration{Servers: []raft.Server{{ID: "n1", Address: "n1:7071"}}}
	done, err := s.Create(raft.SnapshotVersionMax, 10, 1, conf, 10, addrEncoder{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := done.Write([]byte("a complete snapshot")); err != nil {
		t.Fatal(err)
	}
	if err := done.Close(); err != nil {
		t.Fatal(err)
	}
	cut, err := s.Create(raft.SnapshotVersionMax, 20, 1, conf, 20, addrEncoder{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cut.Write([]byte("the first bytes of a copy")); err != nil {
		t.Fatal(err)
	}
	tmps := func() []string {
		m, err := filepath.Glob(filepath.Join(dir, "snapshots", "*.tmp"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if len(tmps()) != 1 {
		t.Fatalf("half-written snapshots %q, want the one being written", tmps())
	}

	// The process is killed here: the sink is never closed.
	if _, err := Open(Config{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if left := tmps(); len(left) != 0 {
		t.Fatalf("half-written snapshots left after opening: %q", left)
	}
	again, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	list, err := again.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Index != 10 {
		t.Fatalf("snapshots after opening %+v, want the complete one (index 10)", list)
	}
}
