package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/backup"
	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
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
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readBackup(dir); err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Errorf("a changed file: %v, want a sha256 mismatch", err)
	}

	// A shard file that holds an id of the other shard.
	dir = writeTestBackup(t, states, "e21")
	if _, _, err := readBackup(dir); err == nil || !strings.Contains(err.Error(), `id "e21" is in shard`) {
		t.Errorf("an id in the wrong shard: %v", err)
	}
}

// fakeLeaders answers Admin.Backup with the shard files of a backup, as the
// shards' leaders would stream them; failShard's copy is refused.
type fakeLeaders struct {
	chimev1.UnimplementedAdminServer
	m         *backup.Manifest
	dir       string
	failShard uint32
}

func (f *fakeLeaders) GetClusterMap(context.Context, *chimev1.GetClusterMapRequest) (*chimev1.ClusterMap, error) {
	return &chimev1.ClusterMap{ShardCount: uint32(f.m.ShardCount), Replication: 3}, nil
}

func (f *fakeLeaders) Backup(req *chimev1.BackupRequest, stream chimev1.Admin_BackupServer) error {
	if req.Shard == f.failShard {
		return status.Errorf(codes.FailedPrecondition, "shard %d: no", req.Shard)
	}
	s := f.m.Shards[req.Shard]
	b, err := os.ReadFile(filepath.Join(f.dir, s.File))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	return stream.Send(&chimev1.BackupChunk{Data: b, Summary: &chimev1.BackupSummary{Shard: s.Shard, AppliedIndex: s.AppliedIndex,
		AppliedTerm: s.AppliedTerm, Size: uint64(len(b)), Sha256: sum[:], Node: s.Node}})
}

// TestBackerRecordsEachBackup: a backup op records the backup's directory, times and
// outcome; an ok one what the backup holds, a failed one its error and that it left no
// manifest.
func TestBackerRecordsEachBackup(t *testing.T) {
	// node.admin dials port 7070 of the node's address: a loopback address of its own.
	ln, err := net.Listen("tcp", "127.0.0.77:7070")
	if err != nil {
		t.Skipf("cannot serve a fake node on 127.0.0.77:7070: %v", err)
	}
	states := map[string]string{"a": checker.StateScheduled, "b": checker.StateFired, "c": checker.StateCancelled, "d": checker.StateScheduled}
	src := writeTestBackup(t, states, "")
	m, err := backup.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeLeaders{m: m, dir: src, failShard: 99}
	gs := grpc.NewServer()
	chimev1.RegisterAdminServer(gs, fake)
	served := make(chan struct{})
	go func() {
		defer close(served)
		// nil after Stop, ErrServerStopped when Stop came first
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving the fake: %v", err)
		}
	}()
	defer func() { gs.Stop(); <-served }()

	out := t.TempDir()
	n7 := &node{id: "n7", ip: "127.0.0.77"}
	defer func() {
		n7.closeClients()
	}()
	b := &backer{c: &cluster{nodes: []*node{n7}}, h: &history{}, out: out, every: time.Hour,
		r: newRand(1, 0xbac), logger: slog.New(slog.DiscardHandler)}
	b.take(context.Background())
	fake.failShard = 1
	b.take(context.Background())

	ops := b.h.snapshot()
	if len(ops) != 2 {
		t.Fatalf("%d ops, want 2", len(ops))
	}
	ok, failed := ops[0], ops[1]
	if ok.F != checker.FBackup || ok.Type != checker.TypeOK || ok.Dir != "backup-001" || ok.Node != "n7" || ok.Process != backupProcess ||
		ok.InvokeNs == 0 || ok.CompleteNs < ok.InvokeNs || !maps.Equal(ok.BackupEvents, states) || len(ok.BackupShards) != 2 || ok.BackupReadError != "" {
		t.Errorf("ok backup op %+v", ok)
	}
	if failed.Type != checker.TypeFail || failed.Dir != "backup-002" || failed.LeftManifest || len(failed.BackupEvents) != 0 ||
		!strings.Contains(failed.Error, "backup: shard 1: FailedPrecondition: shard 1: no") {
		t.Errorf("failed backup op %+v", failed)
	}
	if _, err := backup.Open(filepath.Join(out, "backup-001")); err != nil {
		t.Errorf("the ok backup does not open: %v", err)
	}

	// A failed backup that left a manifest all the same says so.
	if err := os.Mkdir(filepath.Join(out, "backup-003"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "backup-003", backup.ManifestName), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.take(context.Background())
	if op := b.h.snapshot()[2]; op.Type != checker.TypeFail || !op.LeftManifest {
		t.Errorf("a failed backup that left a manifest: %+v", op)
	}
}
