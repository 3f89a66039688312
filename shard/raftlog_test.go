package shard

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/raftfsm"
)

// recorder is a slog.Handler that keeps every record at or above level,
// with the attributes its logger was given.
type recorder struct {
	level slog.Level
	mu    *sync.Mutex
	recs  *[]slog.Record
	attrs []slog.Attr
}

func newRecorder(level slog.Level) *recorder {
	return &recorder{level: level, mu: new(sync.Mutex), recs: new([]slog.Record)}
}

func (h *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.mu.Lock()
	*h.recs = append(*h.recs, r)
	h.mu.Unlock()
	return nil
}

func (h *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(slices.Clip(h.attrs), as...)
	return &c
}

func (h *recorder) WithGroup(string) slog.Handler { return h }

// records returns the records kept so far and forgets them.
func (h *recorder) records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := *h.recs
	*h.recs = nil
	return out
}

// attr is r's attribute key as a string, "" when it has none.
func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestStartLogsNoWarning: a single-replica shard's start, first and after a
// restart, logs no record at WARN or above, raft's own lines included; raft's
// lines reach the shard's slog logger with the shard's attributes, its start
// of an election with no leader known among them at INFO.
func TestStartLogsNoWarning(t *testing.T) {
	dir := t.TempDir()
	store, err := raftfsm.OpenStore(dir+"/pebble", raftfsm.StoreOptions{SnapshotFlushWait: testFlushWait})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pub, err := publish.New(publish.Config{Brokers: startBroker(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	rec := newRecorder(slog.LevelDebug - 4) // everything raft says, down to Trace
	addr, trans := raft.NewInmemTransport("n1")
	open := func() *Shard {
		t.Helper()
		s, err := Open(Config{
			ID: 3, NodeID: "n1", Dir: dir + "/raft", Store: store, Transport: trans, Publisher: pub,
			Bootstrap: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: addr}},
			Tuning: Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
				LeaderLeaseTimeout: 100 * time.Millisecond},
			Logger: slog.New(rec).With("node", "n1"),
		})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the replica leads", func() bool {
			_, err := s.lease.deadline(context.Background())
			return s.IsLeader() && err == nil
		})
		return s
	}
	check := func(what string, wantElection bool) {
		t.Helper()
		elected := false
		for _, r := range rec.records() {
			if r.Level >= slog.LevelWarn {
				t.Errorf("%s: %v %q %v", what, r.Level, r.Message, r)
			}
			if attr(r, "component") == "raft" && r.Message == electionNoLeader {
				elected = true
				if r.Level != slog.LevelInfo || attr(r, "shard") != "3" || attr(r, "node") != "n1" {
					t.Errorf("%s: raft's election logged as %v %v; want INFO with the shard's attributes", what, r.Level, r)
				}
			}
		}
		if wantElection && !elected {
			t.Errorf("%s: no election in raft's lines: they did not reach the shard's logger", what)
		}
	}

	s := open()
	check("first start", true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check("stop", false)
	_, trans = raft.NewInmemTransport(addr)
	s = open()
	check("restart", true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check("stop after the restart", false)
}

// TestRaftLoggerLevels: raft's levels map onto slog's, a handler's level
// decides what raft logs and reports, and an election started after a
// leader went quiet stays a warning.
func TestRaftLoggerLevels(t *testing.T) {
	rec := newRecorder(slog.LevelInfo)
	l := newRaftLogger(slog.New(rec).With("shard", 1))
	if l.IsInfo() || !l.IsWarn() || l.GetLevel() != hclog.Warn {
		t.Fatalf("under an Info handler: IsInfo %v, IsWarn %v, GetLevel %v", l.IsInfo(), l.IsWarn(), l.GetLevel())
	}
	if l := newRaftLogger(slog.New(newRecorder(slog.LevelDebug))); !l.IsInfo() || l.IsDebug() || l.GetLevel() != hclog.Info {
		t.Fatalf("under a Debug handler: IsInfo %v, IsDebug %v, GetLevel %v", l.IsInfo(), l.IsDebug(), l.GetLevel())
	}
	if l := newRaftLogger(slog.New(newRecorder(slog.LevelDebug - 8))); !l.IsTrace() || l.GetLevel() != hclog.Trace {
		t.Fatalf("under a handler keeping everything: IsTrace %v, GetLevel %v", l.IsTrace(), l.GetLevel())
	}
	l.Debug("dropped")
	l.Info("dropped: raft's routine is the node's debug")
	l.Named("wal").With("segment", hclog.Hex(255)).Error("kept", "err", "boom", "servers", hclog.Fmt("%d of %d", 2, 3))
	l.Warn(electionNoLeader, "last-leader-addr", raft.ServerAddress(""), "last-leader-id", raft.ServerID(""))
	l.Warn(electionNoLeader, "last-leader-addr", raft.ServerAddress("10.0.0.2:7071"), "last-leader-id", raft.ServerID("n2"))
	got := rec.records()
	if len(got) != 3 {
		t.Fatalf("%d records, want 3: %v", len(got), got)
	}
	if r := got[0]; r.Level != slog.LevelError || attr(r, "component") != "raft.wal" || attr(r, "segment") != "0xff" || attr(r, "shard") != "1" ||
		attr(r, "err") != "boom" || attr(r, "servers") != "2 of 3" {
		t.Errorf("a named logger's error: %v %v", r.Level, r)
	}
	if got[1].Level != slog.LevelInfo {
		t.Errorf("an election with no leader known at %v, want INFO", got[1].Level)
	}
	if got[2].Level != slog.LevelWarn {
		t.Errorf("an election after a leader went quiet at %v, want WARN", got[2].Level)
	}

	// raft's warnings and errors of a normal course of events, and the same
	// messages reporting trouble.
	for _, c := range []struct {
		l    hclog.Level
		msg  string
		args []any
		want slog.Level
	}{
		{hclog.Warn, "failed to get previous log", []any{"previous-index", uint64(6), "last-index", uint64(0), "error", raft.ErrLogNotFound}, slog.LevelInfo},
		{hclog.Warn, "failed to get previous log", []any{"previous-index", uint64(6), "last-index", uint64(4), "error", raft.ErrLogNotFound}, slog.LevelWarn},
		{hclog.Warn, "appendEntries rejected, sending older logs", []any{"peer", "n2", "next", uint64(1)}, slog.LevelInfo},
		{hclog.Warn, "appendEntries rejected, sending older logs", []any{"peer", "n2", "next", uint64(40)}, slog.LevelWarn},
		{hclog.Error, "failed to decode incoming command", []any{"error", raft.ErrTransportShutdown}, slog.LevelDebug},
		{hclog.Error, "failed to decode incoming command", []any{"error", errors.New("unknown rpc type 9")}, slog.LevelError},
		{hclog.Warn, electionNoLeader, nil, slog.LevelWarn}, // no argument to tell by
		{hclog.Warn, noPeers, nil, slog.LevelInfo},
		{hclog.Info, "failed to get previous log", []any{"last-index", uint64(0)}, slog.LevelDebug}, // raft's own INFO
	} {
		if got, ok := level(c.l, c.msg, c.args); !ok || got != c.want {
			t.Errorf("%v %q %v: logged at %v, want %v", c.l, c.msg, c.args, got, c.want)
		}
	}
}
