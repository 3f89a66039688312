package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/chimehq/chime/cmd/internal/backup"
	"github.com/chimehq/chime/publish"
	"github.com/chimehq/chime/publish/publishtest"
	"github.com/chimehq/chime/raftfsm"
	"github.com/chimehq/chime/rpc"
	"github.com/chimehq/chime/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testShards    = 3
	testRetention = 36 * time.Hour
)

// events of a test backup: past-due ones fire as soon as the restored node
// leads, later ones stay pending, cancelled ones never fire.
type testEvents struct {
	pastDue, later, cancelled []string
}

// makeBackup writes a backup of a 3-shard cluster as chimectl backup does:
// each shard's state (built by applying entries to an FSM, as a leader
// would) as a full snapshot stream, and the manifest last.
func makeBackup(t *testing.T) (string, testEvents) {
	t.Helper()
	st, err := raftfsm.OpenStore(filepath.Join(t.TempDir(), "pebble"), raftfsm.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	var ev testEvents
	batches := make([][]raftfsm.NewEvent, testShards)
	cancels := make([][]string, testShards)
	for i := range 60 {
		id := fmt.Sprintf("ev-%d", i)
		due := now.Add(-time.Hour)
		switch i % 3 {
		case 0:
			ev.pastDue = append(ev.pastDue, id)
		case 1:
			ev.later = append(ev.later, id)
			due = now.Add(time.Hour)
		case 2:
			ev.cancelled = append(ev.cancelled, id)
			due = now.Add(time.Hour)
		}
		s := shard.For(id, testShards)
		batches[s] = append(batches[s], raftfsm.NewEvent{ID: id, Due: due.UnixNano(), Topic: "restored", Payload: []byte("payload-" + id)})
		if i%3 == 2 {
			cancels[s] = append(cancels[s], id)
		}
	}
	dir := t.TempDir()
	m := &backup.Manifest{Format: backup.Format, Created: now.UTC(), ShardCount: testShards, Replication: 3, Retention: testRetention}
	for s := range uint32(testShards) {
		f, err := raftfsm.NewFSM(st, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		logs := []*raft.Log{
			{Index: 3, Term: 2, Type: raft.LogCommand, Data: raftfsm.AppendScheduleBatch(nil, &raftfsm.ScheduleBatch{ProposedAt: now.UnixNano(), Events: batches[s]})},
			{Index: 5, Term: 2, Type: raft.LogCommand, Data: raftfsm.AppendCancel(nil, &raftfsm.Cancel{ProposedAt: now.UnixNano(), IDs: cancels[s]})},
		}
		f.ApplyBatch(logs)
		w, err := backup.CreateShard(dir, s)
		if err != nil {
			t.Fatal(err)
		}
		h, err := f.WriteSnapshot(w)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		e, err := w.Commit()
		if err != nil {
			t.Fatal(err)
		}
		e.AppliedIndex, e.AppliedTerm = h.AppliedIndex, h.AppliedTerm
		m.Shards = append(m.Shards, e)
	}
	if err := backup.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir, ev
}

// startRestored starts the node restored in dataDir as node r1 alone, with
// Raft on in-memory transports advertised as raftAddr.
func startRestored(t *testing.T, dataDir, raftAddr string, brokers []string) (*Node, error) {
	return Start(Config{
		NodeID: "r1", DataDir: dataDir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Brokers: brokers, Shards: 8, Limits: rpc.DefaultLimits(),
		MaxInFlight: publish.DefaultMaxInFlight, MaxAttempts: publish.DefaultMaxAttempts, DeadLetter: publish.DefaultDeadLetterTopic,
		Logger: slog.New(slog.DiscardHandler), Now: time.Now,
		RaftAdvertise: raftAddr,
		RaftTransport: func(uint32) (raft.Transport, error) {
			_, tr := raft.NewInmemTransport(raft.ServerAddress(raftAddr))
			return tr, nil
		},
	})
}

// TestRestoreFoundsANodeThatFiresWhatFellDue: a restored data directory
// starts as a node leading every shard of the backup alone, with the
// backup's shard count and retention; it fires what fell due at once, keeps
// the rest pending, and Get finds every event in its backed-up state.
func TestRestoreFoundsANodeThatFiresWhatFellDue(t *testing.T) {
	from, ev := makeBackup(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	var steps []string
	m, err := Restore(RestoreConfig{From: from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1",
		Progress: func(s string) { steps = append(steps, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if m.ShardCount != testShards || len(steps) != 2*testShards {
		t.Fatalf("restored %+v with steps %q", m, steps)
	}
	meta, ok, err := loadMeta(dataDir)
	if err != nil || !ok {
		t.Fatalf("cluster.json: %v %v", ok, err)
	}
	if meta.Shards != testShards || meta.Replication != 3 || meta.Retention != testRetention || meta.NodeID != "r1" ||
		meta.RaftAddr != "r1" || meta.ClusterID == "" || !filepath.IsAbs(meta.RestoredFrom) {
		t.Fatalf("cluster.json: %+v", meta)
	}
	if _, err := os.Stat(filepath.Join(dataDir, restoringName)); !os.IsNotExist(err) {
		t.Fatalf("the marker is still there: %v", err)
	}

	// Started under another Raft address or node id, it refuses.
	if n, err := startRestored(t, dataDir, "elsewhere", nil); err == nil || !strings.Contains(err.Error(), "restored for the Raft address r1") {
		if n != nil {
			n.Close(context.Background())
		}
		t.Fatalf("start with another Raft address: %v", err)
	}

	broker := publishtest.NewBroker(t)
	col := publishtest.Collect(t, broker.Addrs(), "restored")
	n, err := startRestored(t, dataDir, "r1", broker.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.Config(); got.Shards != testShards || got.Tuning.Retention != testRetention {
		t.Fatalf("the node runs %d shards with retention %v", got.Shards, got.Tuning.Retention)
	}
	// The data directory, which holds every payload, and the files the node
	// writes in it are its owner's alone.
	for path, want := range map[string]os.FileMode{dataDir: 0o700, metaPath(dataDir): 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %v", path, fi.Mode().Perm(), err, want)
		}
	}
	got := col.WaitIDs(len(ev.pastDue), 30*time.Second)
	for _, id := range ev.pastDue {
		if r, ok := got.ByID[id]; !ok || r.Value() != "payload-"+id {
			t.Errorf("past-due %s: %v %q", id, ok, r.Value())
		}
	}
	if len(got.ByID) != len(ev.pastDue) {
		t.Errorf("%d records, want only the %d past-due events", len(got.ByID), len(ev.pastDue))
	}
	// A record reaches Kafka before its MarkFired is applied.
	publishtest.WaitFor(t, 10*time.Second, "every past-due event marked fired", func() bool {
		for _, id := range ev.pastDue {
			if rec, ok, err := n.Host().Get(ctx, id); err != nil || !ok || rec.State != raftfsm.StateFired {
				return false
			}
		}
		return true
	})
	for ids, want := range map[*[]string]raftfsm.State{&ev.later: raftfsm.StateScheduled, &ev.cancelled: raftfsm.StateCancelled} {
		for _, id := range *ids {
			rec, ok, err := n.Host().Get(ctx, id)
			if err != nil || !ok || rec.State != want {
				t.Errorf("Get %s: %v %v state %v, want %v", id, ok, err, rec.State, want)
			}
		}
	}
	var pending uint64
	for _, s := range n.Host().Shards() {
		pending += s.Stats().Pending
	}
	if pending != uint64(len(ev.later)) {
		t.Errorf("%d pending, want %d", pending, len(ev.later))
	}
}

// TestRestoreRefusesABadBackupByName: a backup that is corrupt, incomplete,
// of another format or whose files do not say what the manifest says is
// refused with the file and the rule, and the data directory stays empty.
func TestRestoreRefusesABadBackupByName(t *testing.T) {
	good, _ := makeBackup(t)
	readManifest := func(dir string) map[string]any {
		var m map[string]any
		b, _ := os.ReadFile(filepath.Join(dir, backup.ManifestName))
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	writeManifest := func(dir string, m map[string]any) {
		b, _ := json.Marshal(m)
		os.WriteFile(filepath.Join(dir, backup.ManifestName), b, 0o644)
	}
	shardEntry := func(m map[string]any, i int) map[string]any { return m["shards"].([]any)[i].(map[string]any) }
	for _, tc := range []struct {
		name  string
		spoil func(dir string)
		want  string
	}{
		{"a flipped byte", func(dir string) {
			p := filepath.Join(dir, "shard-001.snap")
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 0x10
			os.WriteFile(p, b, 0o644)
		}, "shard-001.snap: sha256 mismatch (manifest says "},
		{"a missing shard file", func(dir string) { os.Remove(filepath.Join(dir, "shard-002.snap")) }, "shard-002.snap: missing"},
		{"no manifest", func(dir string) { os.Remove(filepath.Join(dir, backup.ManifestName)) }, "no manifest.json"},
		{"a newer format", func(dir string) {
			m := readManifest(dir)
			m["format"] = 2
			writeManifest(dir, m)
		}, "manifest.json: format: 2, this build reads format 1"},
		{"another shard's copy", func(dir string) {
			// shard-001.snap holds shard 0's stream, and the manifest its size
			// and digest: only the stream's header tells.
			m := readManifest(dir)
			b, _ := os.ReadFile(filepath.Join(dir, "shard-000.snap"))
			os.WriteFile(filepath.Join(dir, "shard-001.snap"), b, 0o644)
			e0, e1 := shardEntry(m, 0), shardEntry(m, 1)
			e1["size"], e1["sha256"], e1["applied_index"], e1["applied_term"] = e0["size"], e0["sha256"], e0["applied_index"], e0["applied_term"]
			writeManifest(dir, m)
		}, "shard-001.snap: holds a copy of shard 0, not of shard 1"},
		{"another applied index", func(dir string) {
			m := readManifest(dir)
			shardEntry(m, 2)["applied_index"] = 4
			writeManifest(dir, m)
		}, "shard-002.snap: the copy is at applied index 5 (term 2), the manifest says 4 (term 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS(good)); err != nil {
				t.Fatal(err)
			}
			tc.spoil(dir)
			dataDir := t.TempDir()
			_, err := Restore(RestoreConfig{From: dir, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1"})
			if err == nil || !strings.Contains(err.Error(), "backup "+dir+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: %v\nwant an error naming %s and saying %q", err, dir, tc.want)
			}
			if left, _ := os.ReadDir(dataDir); len(left) > 0 {
				t.Fatalf("a refused restore left %v in the data directory", left)
			}
		})
	}
}

func TestRestoreNeedsAnEmptyDataDirectory(t *testing.T) {
	from, _ := makeBackup(t)
	dataDir := t.TempDir()
	os.WriteFile(filepath.Join(dataDir, lockFileName), nil, 0o644) // chimed's own lock is no data
	if _, err := Restore(RestoreConfig{From: from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1"}); err != nil {
		t.Fatalf("a directory holding only chimed.lock: %v", err)
	}
	_, err := Restore(RestoreConfig{From: from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1"})
	if err == nil || !strings.Contains(err.Error(), "data directory "+dataDir+" is not empty (it holds cluster.json, raft)") {
		t.Fatalf("a restore over a restored directory: %v", err)
	}

	// A directory a restore did not finish is refused at start.
	os.WriteFile(filepath.Join(dataDir, restoringName), nil, 0o644)
	n, err := startRestored(t, dataDir, "r1", nil)
	if err == nil || !strings.Contains(err.Error(), "a chimed restore into this directory did not finish") {
		if n != nil {
			n.Close(context.Background())
		}
		t.Fatalf("start on an unfinished restore: %v", err)
	}
}
