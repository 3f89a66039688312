package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/cmd/internal/backup"
	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

func backupCommand() *command {
	return &command{
		name:    "backup",
		summary: "copy every shard of a live cluster into a directory, for chimed restore",
		about: `Backup copies the whole state of a running cluster into the new or empty
directory --out, one shard after another, while the cluster goes on serving:
every event with its state (scheduled, fired, cancelled, dead-lettered) and
payload, and every settled event still kept for the retention. Each shard's
copy is taken by its leader after a Raft barrier, so it holds every event
acknowledged before backup started (and perhaps some after): it is
consistent per shard, at the applied index the manifest records. The node at
--addr relays the copies of shards it does not lead. Progress goes to
standard error: a line per shard (size, applied index, the leader it came
from) and, for a shard that takes longer, its bytes so far every second.

The directory then holds shard-NNN.snap per shard and manifest.json, written
last: the format version, the cluster's shard count, replication and
retention, and each file's applied index, size and SHA-256. A backup that
fails or is interrupted leaves no manifest.json, which chimed restore refuses;
delete it and run backup again. A shard whose copy breaks off (a leader
change, a node restarting) is copied again from the start, up to --retries
times. --timeout bounds the cluster map request and each wait for the next
part of a shard's copy, not the whole copy, which takes as long as the shard
is large: a leader writes it at most at 32 MiB/s of compressed data (about
100 MiB/s of events), the rate it sends snapshots to followers at.

chimed restore --from DIR creates a new cluster's first node from the
backup; see docs/operations.md. --json prints the manifest when it is done.`,
		example: `  chimectl backup --out /backups/chime-2026-03-01
  chimectl --addr chime-2:7070 backup --out "/backups/$(date -u +%Y%m%dT%H%M%SZ)" --json
  chimectl backup --out /backups/b1 --retries 10 --timeout 1m`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			out := fs.String("out", "", "new or empty `directory` to write the backup into (required)")
			retries := fs.Int("retries", 5, "copy a shard again up to `n` times when its copy breaks off (UNAVAILABLE, or no data for --timeout)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *out == "" {
					return usagef("--out is required: the directory to write the backup into")
				}
				if *retries < 0 {
					return usagef("--retries must not be negative")
				}
				return c.backup(ctx, *out, *retries)
			}
		},
	}
}

// errIncomplete is the advice that ends a failed backup's error.
const errIncomplete = "%s has no manifest.json, so it is not a usable backup: delete it and run backup again"

func (c *cli) backup(ctx context.Context, out string, retries int) error {
	switch entries, err := os.ReadDir(out); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("--out %s: %w", out, err)
	case len(entries) > 0:
		names := make([]string, 0, 3)
		for _, e := range entries[:min(3, len(entries))] {
			names = append(names, e.Name())
		}
		more := ""
		if len(entries) > 3 {
			more = fmt.Sprintf(" and %d more", len(entries)-3)
		}
		return fmt.Errorf("--out %s is not empty (it holds %s%s): back up into a new or empty directory", out, strings.Join(names, ", "), more)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("--out %s: %w", out, err)
	}
	ac, closeConn, err := c.dialAdmin()
	if err != nil {
		return err
	}
	defer closeConn()
	var m *chimev1.ClusterMap
	mctx, cancel := c.requestCtx(ctx)
	m, err = ac.GetClusterMap(mctx, &chimev1.GetClusterMapRequest{})
	cancel()
	if err != nil {
		return err
	}
	if m.GetShardCount() == 0 {
		return fmt.Errorf("the cluster map from %s has no shards", c.addr)
	}
	man := &backup.Manifest{
		Format: backup.Format, Source: c.addr, ShardCount: int(m.GetShardCount()),
		Replication: int(max(m.GetReplication(), 1)), Retention: m.GetRetention().AsDuration(),
	}
	start := c.now()
	var total int64
	for s := range m.GetShardCount() {
		entry, err := c.backupShard(ctx, ac, out, s, m.GetShardCount(), retries)
		if err != nil {
			if st, ok := status.FromError(err); ok {
				err = fmt.Errorf("%s: %s", st.Code(), st.Message())
			}
			return fmt.Errorf("backup: shard %d: %v; "+errIncomplete, s, err, out)
		}
		man.Shards = append(man.Shards, entry)
		total += entry.Size
	}
	man.Created = c.now().UTC()
	if err := backup.WriteManifest(out, man); err != nil {
		return fmt.Errorf("%w; "+errIncomplete, err, out)
	}
	if c.json {
		return c.printJSON(man)
	}
	_, err = fmt.Fprintf(c.stdout, "backed up %d shards (%s) to %s in %s\nrestore with: chimed restore --from %s --data-dir DIR --node-id ID --raft-addr HOST:PORT\n",
		len(man.Shards), byteSize(total), out, humanDuration(c.now().Sub(start)), out)
	return err
}

// backupShard copies shard s into out, again from the start when a copy
// breaks off in a way another attempt can cure, up to retries times.
func (c *cli) backupShard(ctx context.Context, ac chimev1.AdminClient, out string, s, count uint32, retries int) (backup.Shard, error) {
	for attempt := 1; ; attempt++ {
		entry, err := c.copyShard(ctx, ac, out, s, count)
		if err == nil {
			return entry, nil
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		default:
			return backup.Shard{}, err
		}
		if attempt > retries || ctx.Err() != nil {
			return backup.Shard{}, err
		}
		fmt.Fprintf(c.stderr, "shard %d/%d: %s: %s; copying it again (%d of %d)\n", s, count, status.Code(err), status.Convert(err).Message(), attempt, retries)
		if err := c.pause(ctx, time.Duration(attempt)*500*time.Millisecond); err != nil {
			return backup.Shard{}, err
		}
	}
}

// errStalled ends a shard's copy that sent nothing for --timeout.
var errStalled = errors.New("stalled")

// copyShard copies shard s once, into its file in out, and checks what
// arrived against the summary the leader sent last.
func (c *cli) copyShard(ctx context.Context, ac chimev1.AdminClient, out string, s, count uint32) (_ backup.Shard, err error) {
	w, err := backup.CreateShard(out, s)
	if err != nil {
		return backup.Shard{}, err
	}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	// --timeout bounds each wait for the next message: the idle timer
	// cancels the copy when it runs out, and is reset by every message.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var idle *time.Timer
	if c.timeout > 0 {
		idle = time.AfterFunc(c.timeout, func() { cancel(errStalled) })
		defer idle.Stop()
		defer func() {
			if errors.Is(context.Cause(ctx), errStalled) {
				err = status.Errorf(codes.DeadlineExceeded, "no data for %s (--timeout)", humanDuration(c.timeout))
			}
		}()
	}
	stream, err := ac.Backup(ctx, &chimev1.BackupRequest{Shard: s})
	if err != nil {
		return backup.Shard{}, err
	}
	start := c.now()
	lastReport := start
	var sum *chimev1.BackupSummary
	for {
		msg, err := stream.Recv()
		if idle != nil {
			idle.Reset(c.timeout)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return backup.Shard{}, err
		}
		if sum != nil {
			return backup.Shard{}, status.Error(codes.Internal, "data after the stream's summary")
		}
		if _, err := w.Write(msg.GetData()); err != nil {
			return backup.Shard{}, err
		}
		sum = msg.GetSummary()
		if now := c.now(); now.Sub(lastReport) >= time.Second {
			fmt.Fprintf(c.stderr, "shard %d/%d: %s so far\n", s, count, byteSize(w.Size()))
			lastReport = now
		}
	}
	switch {
	case sum == nil:
		// The stream ended without its summary: a node went away mid-copy.
		return backup.Shard{}, status.Errorf(codes.Unavailable, "the copy ended after %s without its summary", byteSize(w.Size()))
	case sum.GetShard() != s:
		return backup.Shard{}, fmt.Errorf("the leader sent a copy of shard %d", sum.GetShard())
	case sum.GetSize() != uint64(w.Size()) || !bytes.Equal(sum.GetSha256(), w.SHA256()):
		return backup.Shard{}, status.Errorf(codes.Aborted, "received %d bytes with sha256 %x, the leader sent %d bytes with sha256 %s",
			w.Size(), w.SHA256(), sum.GetSize(), hex.EncodeToString(sum.GetSha256()))
	}
	entry, err := w.Commit()
	if err != nil {
		return backup.Shard{}, err
	}
	entry.AppliedIndex, entry.AppliedTerm, entry.Node = sum.GetAppliedIndex(), sum.GetAppliedTerm(), sum.GetNode()
	fmt.Fprintf(c.stderr, "shard %d/%d: %s at applied index %d, from %s (%s)\n", s, count, byteSize(entry.Size),
		entry.AppliedIndex, orDash(entry.Node), humanDuration(c.now().Sub(start)))
	return entry, nil
}

// byteSize prints n bytes in the largest binary unit under it: 512 B,
// 12.3 KiB, 4.0 MiB, 1.2 GiB.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n)/unit, 0
	for f >= unit && u < 3 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGT"[u])
}
