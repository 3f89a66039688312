package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"google.golang.org/grpc/status"

	"github.com/chimehq/chime/backup"
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
last: the format version, the cluster's id, shard count, replication and
retention, each file's applied index, size and SHA-256, and, with
--backup-key-file, an HMAC-SHA256 over all of it. A backup that
fails or is interrupted leaves no manifest.json, which chimed restore refuses;
delete it and run backup again. A shard whose copy breaks off (a leader
change, a node restarting) is copied again from the start, up to --retries
times. --timeout bounds the cluster map request and each wait for the next
part of a shard's copy, not the whole copy, which takes as long as the shard
is large: a leader writes it at most at 32 MiB/s of compressed data (about
100 MiB/s of events), the rate it sends snapshots to followers at.

--backup-key-file signs the manifest with the key in that file (its content
with surrounding whitespace trimmed, at least 32 bytes, readable by its
owner only), so that chimed restore --backup-key-file with the same file
refuses a backup whose manifest, or any file's size or SHA-256 in it, was
changed since. Make the key once and keep it apart from the backups:
  (umask 077; head -c 32 /dev/urandom | base64 > /etc/chime/backup.key)
Without it the manifest is unsigned, which backup says on standard error,
and chimed restore takes it only with --allow-unsigned.

chimed restore --from DIR creates a new cluster's first node from the
backup; see docs/operations.md. --json prints the manifest when it is done.`,
		example: `  chimectl backup --out /backups/chime-2026-03-01 --backup-key-file /etc/chime/backup.key
  chimectl --addr chime-2:7070 backup --out "/backups/$(date -u +%Y%m%dT%H%M%SZ)" --backup-key-file backup.key --json
  chimectl backup --out /backups/b1 --retries 10 --timeout 1m`,
		flags: func(c *cli, fs *flag.FlagSet) func(context.Context, []string) error {
			out := fs.String("out", "", "new or empty `directory` to write the backup into (required)")
			retries := fs.Int("retries", 5, "copy a shard again up to `n` times when its copy breaks off (UNAVAILABLE, or no data for --timeout)")
			keyFile := fs.String("backup-key-file", "", "`file` of the key that signs the manifest (HMAC-SHA256), which chimed restore --backup-key-file\nchecks: at least 32 bytes, surrounding whitespace trimmed, readable by its owner only.\nWithout it the backup is unsigned, and restoring it needs chimed restore --allow-unsigned")
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
				var key []byte
				if *keyFile != "" {
					var err error
					if key, err = backup.ReadKeyFile(*keyFile); err != nil {
						return usagef("%v", err)
					}
				}
				return c.backup(ctx, *out, *retries, key)
			}
		},
	}
}

func (c *cli) backup(ctx context.Context, out string, retries int, key []byte) error {
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
	if err := os.MkdirAll(out, 0o700); err != nil {
		return fmt.Errorf("--out %s: %w", out, err)
	}
	cl, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cl.Close() }() // fails only for a client already closed
	start := c.now()
	man, err := backup.Take(ctx, cl, out, backup.Options{
		Source: c.addr, Retries: retries, Timeout: c.timeout, TimeoutName: "--timeout",
		Key: key, Progress: c.backupProgress, Now: c.now, Sleep: c.sleep,
	})
	if err != nil {
		return err
	}
	keyFlag := "--backup-key-file KEYFILE"
	if key == nil {
		keyFlag = "--allow-unsigned"
		fmt.Fprintf(c.stderr, "the backup's manifest is unsigned (no --backup-key-file): restoring it will need chimed restore --allow-unsigned\n")
	}
	if c.json {
		return c.printJSON(man)
	}
	var total int64
	for _, s := range man.Shards {
		total += s.Size
	}
	_, err = fmt.Fprintf(c.stdout, "backed up %d shards (%s) of %s to %s in %s\nrestore with: chimed restore --from %s %s --data-dir DIR --node-id ID --raft-addr HOST:PORT\n",
		len(man.Shards), byteSize(total), clusterName(man.ClusterID), out, humanDuration(c.now().Sub(start)), out, keyFlag)
	return err
}

// clusterName names a backed-up cluster by its id; a cluster created before
// clusters had ids has none.
func clusterName(id string) string {
	if id == "" {
		return "a cluster with no id"
	}
	return "cluster " + id
}

// backupProgress prints backup.Take's progress to standard error: a line
// per shard copied, per copy that broke off, and every second of a long
// copy.
func (c *cli) backupProgress(p backup.Progress) {
	switch {
	case p.Copied != nil:
		fmt.Fprintf(c.stderr, "shard %d/%d: %s at applied index %d, from %s (%s)\n", p.Shard, p.ShardCount, byteSize(p.Copied.Size),
			p.Copied.AppliedIndex, orDash(p.Copied.Node), humanDuration(p.Took))
	case p.Retry != nil:
		fmt.Fprintf(c.stderr, "shard %d/%d: %s: %s; copying it again (%d of %d)\n", p.Shard, p.ShardCount,
			status.Code(p.Retry), status.Convert(p.Retry).Message(), p.Attempt, p.Retries)
	default:
		fmt.Fprintf(c.stderr, "shard %d/%d: %s so far\n", p.Shard, p.ShardCount, byteSize(p.Bytes))
	}
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
