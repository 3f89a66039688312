package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/chimehq/chime/backup"
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

// testKey is the backup key makeBackup signs with.
var testKey = []byte("restore-test-key-0123456789abcdefghijk")

// backupSpec says what makeBackupOf writes besides the events of
// testEvents.
type backupSpec struct {
	// topic is each event's topic (nil: "restored").
	topic func(id string) string
	// schedules are recurring schedules to create in shard 0, id → topic.
	schedules map[string]string
	// key signs the manifest; nil leaves it unsigned.
	key []byte
}

// makeBackup writes a backup of a 3-shard cluster as chimectl backup
// --backup-key-file does: each shard's state (built by applying entries to
// an FSM, as a leader would) as a full snapshot stream, and the manifest
// last, naming the cluster and signed with testKey.
func makeBackup(t *testing.T) (string, testEvents) {
	t.Helper()
	return makeBackupOf(t, backupSpec{key: testKey})
}

func makeBackupOf(t *testing.T, spec backupSpec) (string, testEvents) {
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
		topic := "restored"
		if spec.topic != nil {
			topic = spec.topic(id)
		}
		batches[s] = append(batches[s], raftfsm.NewEvent{ID: id, Due: due.UnixNano(), Topic: topic, Payload: []byte("payload-" + id)})
		if i%3 == 2 {
			cancels[s] = append(cancels[s], id)
		}
	}
	dir := t.TempDir()
	m := &backup.Manifest{Format: backup.Format, ClusterID: "c-backed-up", Created: now.UTC(), ShardCount: testShards, Replication: 3, Retention: testRetention}
	for s := range uint32(testShards) {
		f, err := raftfsm.NewFSM(st, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		logs := []*raft.Log{
			{Index: 3, Term: 2, Type: raft.LogCommand, Data: raftfsm.AppendScheduleBatch(nil, &raftfsm.ScheduleBatch{ProposedAt: now.UnixNano(), Events: batches[s]})},
			{Index: 5, Term: 2, Type: raft.LogCommand, Data: raftfsm.AppendCancel(nil, &raftfsm.Cancel{ProposedAt: now.UnixNano(), IDs: cancels[s]})},
		}
		if s == 0 {
			for id, topic := range spec.schedules {
				logs = append(logs, &raft.Log{Index: logs[len(logs)-1].Index + 1, Term: 2, Type: raft.LogCommand, Data: raftfsm.AppendRecurring(nil, &raftfsm.Recurring{
					Op: raftfsm.RecurringCreate, ProposedAt: now.UnixNano(), ID: id, Hash: 1,
					Def: raftfsm.Definition{Every: int64(time.Hour), CatchUp: raftfsm.CatchUpLast, Topic: topic, Payload: []byte("tick")},
				})})
			}
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
	if spec.key != nil {
		if err := m.Sign(spec.key); err != nil {
			t.Fatal(err)
		}
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
	m, err := Restore(RestoreConfig{From: from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1", Key: testKey,
		Progress: func(s string) { steps = append(steps, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if m.ShardCount != testShards || len(steps) != 1+2*testShards || m.ClusterID != "c-backed-up" ||
		!strings.HasPrefix(steps[0], "backup of cluster c-backed-up: 3 shards, taken ") ||
		!strings.HasSuffix(steps[0], "; manifest signed, and its HMAC verified with the backup key") {
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
			_ = n.Close(context.Background()) // only releases the node that should not have started
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
			if rec, ok, err := n.Cluster().Get(ctx, id); err != nil || !ok || rec.State != raftfsm.StateFired {
				return false
			}
		}
		return true
	})
	for ids, want := range map[*[]string]raftfsm.State{&ev.later: raftfsm.StateScheduled, &ev.cancelled: raftfsm.StateCancelled} {
		for _, id := range *ids {
			rec, ok, err := n.Cluster().Get(ctx, id)
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
	readManifest := func(t *testing.T, dir string) map[string]any {
		t.Helper()
		var m map[string]any
		b, _ := os.ReadFile(filepath.Join(dir, backup.ManifestName))
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// writeManifest writes m as it is; signed writes it signed again with
	// testKey, as one who holds the key could, so that the checks after
	// the HMAC's are reached.
	writeManifest := func(t *testing.T, dir string, m map[string]any) {
		t.Helper()
		b, _ := json.Marshal(m)
		if err := os.WriteFile(filepath.Join(dir, backup.ManifestName), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	signed := func(t *testing.T, dir string, m map[string]any) {
		t.Helper()
		delete(m, "hmac_sha256")
		writeManifest(t, dir, m)
		man, err := backup.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := man.Sign(testKey); err != nil {
			t.Fatal(err)
		}
		if err := backup.WriteManifest(dir, man); err != nil {
			t.Fatal(err)
		}
	}
	shardEntry := func(m map[string]any, i int) map[string]any { return m["shards"].([]any)[i].(map[string]any) }
	for _, tc := range []struct {
		name string
		// spoil runs in the subtest, and is given its t: Fatal must end the
		// goroutine that runs the test it fails.
		spoil func(t *testing.T, dir string)
		want  string
	}{
		{"a flipped byte", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "shard-001.snap")
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 0x10
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "shard-001.snap: sha256 mismatch (manifest says "},
		{"a missing shard file", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "shard-002.snap")); err != nil {
				t.Fatal(err)
			}
		}, "shard-002.snap: missing"},
		{"no manifest", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, backup.ManifestName)); err != nil {
				t.Fatal(err)
			}
		}, "no manifest.json"},
		{"a newer format", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			m["format"] = 3
			writeManifest(t, dir, m)
		}, "manifest.json: format: 3, this build reads formats 1 to 2"},
		{"another cluster id", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			m["cluster_id"] = "c-other"
			writeManifest(t, dir, m)
		}, "manifest.json: hmac_sha256 does not verify with the backup key"},
		{"a shard file replaced along with its entry", func(t *testing.T, dir string) {
			// The copy of shard 2 is swapped for an empty one, and the
			// manifest says its size and digest: only the HMAC tells.
			m := readManifest(t, dir)
			if err := os.WriteFile(filepath.Join(dir, "shard-002.snap"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			e := shardEntry(m, 2)
			e["size"], e["sha256"] = 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
			writeManifest(t, dir, m)
		}, "manifest.json: hmac_sha256 does not verify with the backup key"},
		{"its signature removed", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			delete(m, "hmac_sha256")
			writeManifest(t, dir, m)
		}, "manifest.json: unsigned (no hmac_sha256), and a restore with --backup-key-file takes only a signed backup"},
		{"another shard's copy", func(t *testing.T, dir string) {
			// shard-001.snap holds shard 0's stream, and the manifest its size
			// and digest: only the stream's header tells.
			m := readManifest(t, dir)
			b, _ := os.ReadFile(filepath.Join(dir, "shard-000.snap"))
			if err := os.WriteFile(filepath.Join(dir, "shard-001.snap"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			e0, e1 := shardEntry(m, 0), shardEntry(m, 1)
			e1["size"], e1["sha256"], e1["applied_index"], e1["applied_term"] = e0["size"], e0["sha256"], e0["applied_index"], e0["applied_term"]
			signed(t, dir, m)
		}, "shard-001.snap: holds a copy of shard 0, not of shard 1"},
		{"another applied index", func(t *testing.T, dir string) {
			m := readManifest(t, dir)
			shardEntry(m, 2)["applied_index"] = 4
			signed(t, dir, m)
		}, "shard-002.snap: the copy is at applied index 5 (term 2), the manifest says 4 (term 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS(good)); err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, dir)
			dataDir := t.TempDir()
			_, err := Restore(RestoreConfig{From: dir, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1", Key: testKey})
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
	// chimed's own lock is no data.
	if err := os.WriteFile(filepath.Join(dataDir, lockFileName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(RestoreConfig{From: from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1", Key: testKey}); err != nil {
		t.Fatalf("a directory holding only chimed.lock: %v", err)
	}
	_, err := Restore(RestoreConfig{From: from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1", Key: testKey})
	if err == nil || !strings.Contains(err.Error(), "data directory "+dataDir+" is not empty (it holds cluster.json, raft)") {
		t.Fatalf("a restore over a restored directory: %v", err)
	}

	// A directory a restore did not finish is refused at start.
	if err := os.WriteFile(filepath.Join(dataDir, restoringName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := startRestored(t, dataDir, "r1", nil)
	if err == nil || !strings.Contains(err.Error(), "a chimed restore into this directory did not finish") {
		if n != nil {
			_ = n.Close(context.Background()) // only releases the node that should not have started
		}
		t.Fatalf("start on an unfinished restore: %v", err)
	}
}

// TestRestoreTakesAnUnsignedBackupOnlyWhenTold: without a key a backup is
// refused, signed or not, unless AllowUnsigned; with one, an unsigned
// backup or one signed with another key is refused; every refusal names
// the manifest and leaves the data directory empty.
func TestRestoreTakesAnUnsignedBackupOnlyWhenTold(t *testing.T) {
	signed, _ := makeBackup(t)
	unsigned, _ := makeBackupOf(t, backupSpec{})
	for _, tc := range []struct {
		name          string
		from          string
		key           []byte
		allowUnsigned bool
		want          string // "": restored, with this first step
		step          string
	}{
		{"unsigned, no key", unsigned, nil, false, "manifest.json: unsigned (no hmac_sha256): pass --backup-key-file to restore a signed backup, or --allow-unsigned", ""},
		{"signed, no key", signed, nil, false, "manifest.json: signed (hmac_sha256), and no key to check it with: pass --backup-key-file", ""},
		{"unsigned, with a key", unsigned, testKey, false, "manifest.json: unsigned (no hmac_sha256), and a restore with --backup-key-file takes only a signed backup", ""},
		{"signed, with another key", signed, []byte("another key, of thirty-two bytes or more"), false, "manifest.json: hmac_sha256 does not verify with the backup key", ""},
		{"unsigned, allowed", unsigned, nil, true, "", "manifest unsigned, restored with --allow-unsigned"},
		{"signed, allowed without the key", signed, nil, true, "", "manifest signed, and its HMAC not checked (--allow-unsigned, no --backup-key-file)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			var steps []string
			_, err := Restore(RestoreConfig{From: tc.from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1", Key: tc.key, AllowUnsigned: tc.allowUnsigned,
				Progress: func(s string) { steps = append(steps, s) }})
			if tc.want == "" {
				if err != nil || len(steps) == 0 || !strings.HasSuffix(steps[0], tc.step) {
					t.Fatalf("restore: %v, steps %q; want it restored, saying %q", err, steps, tc.step)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "backup "+tc.from+": "+tc.want) {
				t.Fatalf("restore: %v\nwant an error naming %s and saying %q", err, tc.from, tc.want)
			}
			if left, _ := os.ReadDir(dataDir); len(left) > 0 {
				t.Fatalf("a refused restore left %v in the data directory", left)
			}
		})
	}
}

// TestRestoreRefusesReservedTopics: an event or a recurring schedule of the
// backup that targets a topic the node's limits reserve (the default
// reserved topics, patterns of the operator's, the dead-letter topic) is
// refused with its shard, id, topic and rule, and the data directory stays
// empty; AllowTopics lets it through, as it lets the API take it.
func TestRestoreRefusesReservedTopics(t *testing.T) {
	audit, _ := makeBackupOf(t, backupSpec{key: testKey, topic: func(id string) string {
		if id == "ev-7" {
			return "chime.audit"
		}
		return "restored"
	}})
	auditShard := shard.For("ev-7", testShards)
	plain, _ := makeBackup(t)
	dlq, _ := makeBackupOf(t, backupSpec{key: testKey, topic: func(id string) string {
		if id == "ev-4" {
			return "dead.letters"
		}
		return "restored"
	}})
	sched, _ := makeBackupOf(t, backupSpec{key: testKey, schedules: map[string]string{"tick": "__consumer_offsets"}})
	defaults := rpc.DefaultLimits()
	withDLQ := rpc.Limits{ReservedTopics: append(slices.Clone(rpc.DefaultReservedTopics), "dead.letters")}
	for _, tc := range []struct {
		name string
		from string
		lim  rpc.Limits
		want string // "": restored
	}{
		{"a default reserved topic", audit, rpc.Limits{}, fmt.Sprintf(`shard-%03d.snap: shard %d: event "ev-7" targets the reserved topic "chime.audit": names starting with "chime." are Chime's own topics (--allow-topic chime.audit restores it all the same)`, auditShard, auditShard)},
		{"the same, the node's default limits", audit, defaults, `event "ev-7" targets the reserved topic "chime.audit"`},
		{"the same, allowed", audit, rpc.Limits{AllowTopics: []string{"chime.audit"}}, ""},
		{"an operator's pattern", plain, rpc.Limits{ReservedTopics: []string{"restor*"}}, `shard-000.snap: shard 0: event "ev-`},
		{"the dead-letter topic", dlq, withDLQ, `event "ev-4" targets the reserved topic "dead.letters": it is one of Chime's own topics`},
		{"a recurring schedule's topic", sched, rpc.Limits{}, `shard-000.snap: shard 0: recurring schedule "tick" targets the reserved topic "__consumer_offsets": names starting with "__" are Kafka's internal topics (--allow-topic __consumer_offsets restores it all the same); 1 more events or schedules of the shard target reserved topics`},
		{"no reserved topic", plain, rpc.Limits{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			_, err := Restore(RestoreConfig{From: tc.from, DataDir: dataDir, NodeID: "r1", RaftAddr: "r1", Key: testKey, Limits: tc.lim})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "backup "+tc.from+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: %v\nwant an error naming %s and saying %q", err, tc.from, tc.want)
			}
			if left, _ := os.ReadDir(dataDir); len(left) > 0 {
				t.Fatalf("a refused restore left %v in the data directory", left)
			}
		})
	}
	// A pattern that every event of shard 0 matches names the first and
	// counts the others.
	_, err := Restore(RestoreConfig{From: plain, DataDir: t.TempDir(), NodeID: "r1", RaftAddr: "r1", Key: testKey, Limits: rpc.Limits{ReservedTopics: []string{"restor*"}}})
	if err == nil || !strings.Contains(err.Error(), `": it matches the reserved pattern "restor*" (--allow-topic restored restores it all the same); `) ||
		!strings.Contains(err.Error(), " more events or schedules of the shard target reserved topics") {
		t.Errorf("restore: %v", err)
	}
}
