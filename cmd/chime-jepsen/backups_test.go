package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	"github.com/chimehq/chime/cmd/internal/backup"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
)

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// writeTestBackup writes a backup of two shards, as chimectl backup would, holding the
// events of states (id → state); stray names an id stored in the other shard's file than
// the one it belongs to ("" for none).
func writeTestBackup(t *testing.T, states map[string]string, stray string) string {
	t.Helper()
	const shards = 2
	st, err := raftfsm.OpenStore(t.TempDir(), raftfsm.StoreOptions{Logger: quietPebble{}, SnapshotFlushWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := filepath.Join(t.TempDir(), "backup-001")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &backup.Manifest{Format: backup.Format, Created: time.Now().UTC(), ShardCount: shards, Replication: 3}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano()
	for s := range uint32(shards) {
		f, err := raftfsm.NewFSM(st, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		var index uint64
		apply := func(b []byte) {
			index++
			f.ApplyBatch([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: b}})
		}
		var seq uint64
		for _, id := range slices.Sorted(maps.Keys(states)) {
			if (chimev1.ShardOf(id, shards) == s) == (id == stray) {
				continue
			}
			e := raftfsm.NewEvent{ID: id, Due: now + int64(time.Hour), Topic: "jepsen.a", Payload: []byte("p-" + id)}
			apply(raftfsm.AppendScheduleBatch(nil, &raftfsm.ScheduleBatch{ProposedAt: now, Events: []raftfsm.NewEvent{e}}))
			seq++
			switch states[id] {
			case checker.StateFired:
				apply(raftfsm.AppendMarkFired(nil, &raftfsm.MarkFired{ProposedAt: now, Entries: []raftfsm.Fired{{Seq: seq, FiredAt: now, Attempts: 1}}}))
			case checker.StateCancelled:
				apply(raftfsm.AppendCancel(nil, &raftfsm.Cancel{ProposedAt: now, IDs: []string{id}}))
			case checker.StateDeadLettered:
				apply(raftfsm.AppendMarkDeadLettered(nil, &raftfsm.MarkDeadLettered{ProposedAt: now,
					Entries: []raftfsm.DeadLettered{{Seq: seq, At: now, Attempts: 5, Error: "no", Topic: "chime.deadletter"}}}))
			}
		}
		w, err := backup.CreateShard(dir, s)
		if err != nil {
			t.Fatal(err)
		}
		h, err := f.WriteSnapshot(w)
		if err != nil {
			t.Fatal(err)
		}
		entry, err := w.Commit()
		if err != nil {
			t.Fatal(err)
		}
		entry.AppliedIndex, entry.AppliedTerm, entry.Node = h.AppliedIndex, h.AppliedTerm, "n1"
		m.Shards = append(m.Shards, entry)
		f.Close()
	}
	if err := backup.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReadBackup: readBackup returns every event of a backup with its state, as the history
// names states, and each shard's applied index and event count; it refuses a backup whose
// manifest or file no longer match, and one whose file holds an id of another shard.
func TestReadBackup(t *testing.T) {
	states := map[string]string{}
	for i, st := range []string{checker.StateScheduled, checker.StateFired, checker.StateCancelled, checker.StateDeadLettered} {
		for j := range 3 {
			states[fmt.Sprintf("e%d", 10*i+j)] = st
		}
	}
	dir := writeTestBackup(t, states, "")
	shards, events, err := readBackup(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(events, states) {
		t.Errorf("events %v, want %v", events, states)
	}
	m, err := backup.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, s := range shards {
		n += s.Events
		if s.Shard != uint32(i) || s.AppliedIndex != m.Shards[i].AppliedIndex || s.AppliedIndex == 0 || s.Node != "n1" || s.Events == 0 {
			t.Errorf("shard %d: %+v (manifest %+v)", i, s, m.Shards[i])
		}
	}
	if len(shards) != 2 || n != len(states) {
		t.Errorf("%d shards holding %d events, want 2 holding %d", len(shards), n, len(states))
	}

	// A manifest that names another applied index than the stream's.
	rewrite := func(m *backup.Manifest) {
		if err := backup.WriteManifest(dir, m); err != nil {
			t.Fatal(err)
		}
	}
	m.Shards[0].AppliedIndex++
	rewrite(m)
	if _, _, err := readBackup(dir); err == nil || !strings.Contains(err.Error(), "the manifest says") {
		t.Errorf("a manifest with another applied index: %v", err)
	}
	m.Shards[0].AppliedIndex--
	rewrite(m)

	// A byte of a shard file changed after the backup.
	path := filepath.Join(dir, backup.FileName(1))
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 1
	os.WriteFile(path, b, 0o644)
	if _, _, err := readBackup(dir); err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Errorf("a changed file: %v, want a sha256 mismatch", err)
	}

	// A shard file that holds an id of the other shard.
	dir = writeTestBackup(t, states, "e21")
	if _, _, err := readBackup(dir); err == nil || !strings.Contains(err.Error(), `id "e21" is in shard`) {
		t.Errorf("an id in the wrong shard: %v", err)
	}
}
