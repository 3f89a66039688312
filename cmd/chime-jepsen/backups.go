package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/backup"
	"github.com/chimehq/chime/cmd/chime-jepsen/checker"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/raftfsm"
)

// Backups during a run: every --backup-every, the backer takes a backup of
// the live cluster, under the nemesis, from a node picked at random, with
// backup.Take (what chimectl backup runs), into <out>/backup-NNN, and
// records it as a "backup" op. Once the op completes it reads the directory
// back, so that the history holds what the backup holds.
const (
	// backupRetries and backupIdle are chimectl backup's --retries and
	// --timeout for these backups: a copy that breaks off is taken again,
	// one that stalls (a paused node) is given up after backupIdle.
	backupRetries = 5
	backupIdle    = 10 * time.Second
	// backupLimit bounds one whole backup: a cluster with no quorum for a
	// shard fails it, cleanly, instead of holding the run.
	backupLimit = 2 * time.Minute
	// backupProcess is the history's process number of backup ops (client
	// workers are 0..clients and 1000 up).
	backupProcess = 2000
)

type backer struct {
	c      *cluster
	h      *history
	out    string // the run's folder
	every  time.Duration
	r      *rand.Rand
	logger *slog.Logger
	n      int // backups taken
}

// run takes a backup every b.every until runCtx ends. A backup under way
// then is finished (ctx, the whole run's, bounds it), so that one taken
// under the last fault counts too. It returns once no backup is under way.
func (b *backer) run(runCtx, ctx context.Context) {
	t := time.NewTicker(b.every)
	defer t.Stop()
	for {
		select {
		case <-runCtx.Done():
			return
		case <-t.C:
			b.take(ctx)
		}
	}
}

// take takes one backup and records it.
func (b *backer) take(ctx context.Context) {
	b.n++
	name := fmt.Sprintf("backup-%03d", b.n)
	dir := filepath.Join(b.out, name)
	ns := b.c.active()
	n := ns[b.r.IntN(len(ns))]
	op := checker.Op{Process: backupProcess, F: checker.FBackup, Node: n.id, Dir: name}
	ctx, cancel := context.WithTimeout(ctx, backupLimit)
	defer cancel()
	op.InvokeNs = time.Now().UnixNano()
	_, err := backup.Take(ctx, n.driver(), dir, backup.Options{
		Source: n.grpcAddr(), Retries: backupRetries, Timeout: backupIdle,
		Progress: func(p backup.Progress) {
			if p.Retry != nil {
				b.logger.Info("backup: copying a shard again", "backup", name, "shard", p.Shard, "attempt", p.Attempt, "err", p.Retry)
			}
		},
	})
	op.CompleteNs = time.Now().UnixNano()
	if err != nil {
		op.Type, op.Error = checker.TypeFail, err.Error()
		if st, ok := status.FromError(err); ok {
			op.Code = st.Code().String()
		}
		_, serr := os.Stat(filepath.Join(dir, backup.ManifestName))
		op.LeftManifest = serr == nil
		b.logger.Info("backup failed", "backup", name, "node", n.id, "took", time.Duration(op.CompleteNs-op.InvokeNs).Round(time.Millisecond), "err", err)
		b.h.add(op)
		return
	}
	op.Type = checker.TypeOK
	op.BackupShards, op.BackupEvents, err = readBackup(dir)
	if err != nil {
		op.BackupReadError = err.Error()
		b.logger.Error("backup does not read back", "backup", name, "err", err)
	} else {
		b.logger.Info("backup", "backup", name, "node", n.id, "took", time.Duration(op.CompleteNs-op.InvokeNs).Round(time.Millisecond),
			"shards", len(op.BackupShards), "events", len(op.BackupEvents))
	}
	b.h.add(op)
}

// readBackup reads backup dir back as chimed restore would check it (the
// manifest, each file's size and SHA-256, each stream as a restore verifies
// it, through raftfsm.ForEachSnapshotEvent) and returns its shards and the
// events its shard files hold, id → state. Every id must be in the file of
// the shard it belongs to.
func readBackup(dir string) ([]checker.BackupShard, map[string]string, error) {
	m, err := backup.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	events := map[string]string{}
	var shards []checker.BackupShard
	for _, s := range m.Shards {
		bs := checker.BackupShard{Shard: s.Shard, AppliedIndex: s.AppliedIndex, Node: s.Node}
		err := backup.VerifyFile(dir, s, func(r io.Reader) error {
			h, err := raftfsm.ForEachSnapshotEvent(r, s.Shard, func(e raftfsm.SnapshotEvent) error {
				if want := chimev1.ShardOf(e.ID, uint32(m.ShardCount)); want != s.Shard {
					return fmt.Errorf("id %q is in shard %d's file, and belongs to shard %d", e.ID, s.Shard, want)
				}
				events[e.ID] = stateOf(e.State)
				bs.Events++
				return nil
			})
			if err == nil && h.AppliedIndex != s.AppliedIndex {
				err = fmt.Errorf("the stream is at applied index %d, the manifest says %d", h.AppliedIndex, s.AppliedIndex)
			}
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		shards = append(shards, bs)
	}
	return shards, events, nil
}

// stateOf names a stored state as the history names Get's states.
func stateOf(s raftfsm.State) string {
	switch s {
	case raftfsm.StateScheduled:
		return checker.StateScheduled
	case raftfsm.StateFired:
		return checker.StateFired
	case raftfsm.StateCancelled:
		return checker.StateCancelled
	case raftfsm.StateDeadLettered:
		return checker.StateDeadLettered
	}
	return s.String()
}
