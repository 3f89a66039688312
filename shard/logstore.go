package shard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"

	"github.com/chimehq/chime/internal/durable"
)

// A replica's Raft log and stable store is a raft-wal directory, <dir>/wal: segment files
// of 16 MiB (preallocated; walSegmentSize), each append written and fsynced once, and a bbolt file,
// wal-meta.db, that lists the segments and holds raft's term and vote. Replicas written by
// builds before it keep both in a raft-boltdb file, <dir>/raft.db, which openLogStore moves
// into a new wal before raft starts, once:
//
//  1. remove what an interrupted move left in <dir>/wal.tmp, and create it empty;
//  2. copy raft.db's stable keys and its log into a raft-wal opened there, and close both
//     (raft-wal fsyncs each append, and a segment's directory after the segment's
//     first sync; its bbolt file syncs each commit);
//  3. sync wal.tmp, rename it to wal, and sync <dir>: from here the replica has a wal;
//  4. remove raft.db, and sync <dir>.
//
// A crash before 3 leaves raft.db alone, and the move starts over; a crash between 3 and 4
// leaves both, and the wal, complete, is kept.
const (
	walDirName      = "wal"
	walTmpDirName   = "wal.tmp"
	boltLogName     = "raft.db"
	migrateLogs     = 256      // entries per raft-wal append while moving a log
	migrateBytes    = 16 << 20 // data bytes per append, at most (unless one entry is larger)
	boltOpenTimeout = 10 * time.Second
)

// boltUint64Keys are the stable keys raft (v1.7.3) writes with SetUint64. raft-boltdb
// stores them big-endian and raft-wal little-endian, so they are moved as numbers; every
// other key (LastVoteCand) is moved as its bytes.
var boltUint64Keys = map[string]bool{"CurrentTerm": true, "LastVoteTerm": true}

// logStore is raft-wal with the bbolt metadata store it opens: WAL.Close leaves that
// store open, and with it bbolt's lock on wal-meta.db, on which the replica's next open in
// the same process would wait forever.
type logStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

// GetLog reads the entry at index, or answers raft.ErrLogNotFound for an index before the
// first. raft-wal (v0.4.1) reads on from its tail segment the entries a compaction removed
// (until the segment is sealed or the log reopened); raft would then replicate a follower
// from entries behind the latest snapshot instead of sending it a snapshot.
func (l *logStore) GetLog(index uint64, log *raft.Log) error {
	first, err := l.WAL.FirstIndex() //nolint:staticcheck // QF1008: asked of raft-wal itself, as l.WAL.GetLog below, whose answers this method corrects
	if err != nil {
		return err
	}
	if index < first {
		return raft.ErrLogNotFound
	}
	return l.WAL.GetLog(index, log)
}

// Close closes the log and its metadata store. Raft must have shut down.
func (l *logStore) Close() error {
	return errors.Join(l.WAL.Close(), l.meta.Close())
}

// walSegmentSize is the size of each raft-wal segment file, allocated in full when it is
// created. raft-wal's 64 MiB took 65 MB of disk for every replica however idle, 1.5 GB for a
// test cluster of 24 replicas; at 16 MiB a shard ingesting 30k events a second starts a new
// segment every few seconds, which costs one small metadata commit. An entry larger than a
// segment still fits (the size is a soft limit); entries above 64 MiB do not
// (rpc.Limits.Validate bounds --max-payload well below).
const walSegmentSize = 16 << 20

// openWAL opens (or creates) the raft-wal in dir, which must exist.
func openWAL(dir string, logger hclog.Logger) (*logStore, error) {
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithMetaStore(meta), wal.WithLogger(logger), wal.WithSegmentSize(walSegmentSize))
	if err != nil {
		_ = meta.Close() // releases bbolt's lock, if the open took it; err is what failed
		return nil, err
	}
	return &logStore{WAL: w, meta: meta}, nil
}

// openLogStore opens the Raft log and stable store of the replica whose Raft directory is
// dir (which exists), creating it, or moving the raft-boltdb file of an older build into
// it first.
func openLogStore(dir string, logger *slog.Logger, hlog hclog.Logger) (*logStore, error) {
	walDir := filepath.Join(dir, walDirName)
	boltPath := filepath.Join(dir, boltLogName)
	hasWAL, err := exists(walDir)
	if err != nil {
		return nil, err
	}
	hasBolt, err := exists(boltPath)
	if err != nil {
		return nil, err
	}
	switch {
	case hasBolt && !hasWAL:
		started := time.Now()
		moved, dropped, err := migrateBoltLog(dir, hlog)
		if err != nil {
			return nil, fmt.Errorf("moving the Raft log from %s to raft-wal: %w", boltPath, err)
		}
		logger.Info("moved the Raft log from raft-boltdb to raft-wal", "entries", moved,
			"dropped_before_a_gap", dropped, "took", time.Since(started).Round(time.Millisecond))
	case hasBolt:
		// The move was interrupted after the wal was renamed into place: the wal is whole.
		if err := removeSynced(dir, boltPath); err != nil {
			return nil, err
		}
		logger.Info("removed the raft-boltdb log a move to raft-wal left behind")
	case !hasWAL:
		if err := os.RemoveAll(filepath.Join(dir, walTmpDirName)); err != nil {
			return nil, err
		}
		if err := os.Mkdir(walDir, 0o700); err != nil {
			return nil, err
		}
		if err := durable.SyncDir(dir); err != nil {
			return nil, err
		}
	}
	return openWAL(walDir, hlog)
}

// migrateBoltLog copies dir's raft.db into a new dir/wal and removes it (steps 1-4 above).
// It returns how many entries it copied, and how many it dropped: entries before the last
// gap in the log. raft-boltdb takes a gap (a follower that installs a snapshot appends after
// the snapshot's index, keeping older entries); raft-wal refuses one, and raft needs none of
// the entries before it, which the installed snapshot covers.
func migrateBoltLog(dir string, hlog hclog.Logger) (moved, dropped uint64, err error) {
	boltPath := filepath.Join(dir, boltLogName)
	tmp := filepath.Join(dir, walTmpDirName)
	if err := os.RemoveAll(tmp); err != nil {
		return 0, 0, err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return 0, 0, err
	}
	stable, first, last, total, err := scanBolt(boltPath)
	if err != nil {
		return 0, 0, err
	}
	if last > 0 {
		moved = last - first + 1
	}
	dropped = total - moved
	if err := copyBoltLog(boltPath, tmp, stable, first, last, hlog); err != nil {
		return 0, 0, err
	}
	if err := durable.SyncDir(tmp); err != nil {
		return 0, 0, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, walDirName)); err != nil {
		return 0, 0, err
	}
	if err := durable.SyncDir(dir); err != nil {
		return 0, 0, err
	}
	return moved, dropped, removeSynced(dir, boltPath)
}

// copyBoltLog copies the stable pairs and the entries first..last of the raft-boltdb file at
// boltPath into a new raft-wal in walDir, and closes both.
func copyBoltLog(boltPath, walDir string, stable [][2][]byte, first, last uint64, hlog hclog.Logger) (err error) {
	old, err := raftboltdb.New(raftboltdb.Options{Path: boltPath,
		BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: boltOpenTimeout}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, old.Close()) }()
	w, err := openWAL(walDir, hlog)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, w.Close()) }()

	for _, kv := range stable {
		k := kv[0]
		if boltUint64Keys[string(k)] {
			v, err := old.GetUint64(k)
			if err != nil {
				return fmt.Errorf("reading %s: %w", k, err)
			}
			if err := w.SetUint64(k, v); err != nil {
				return err
			}
		} else if err := w.Set(k, kv[1]); err != nil {
			return err
		}
	}
	if last == 0 {
		return nil
	}
	batch := make([]*raft.Log, 0, migrateLogs)
	size := 0
	for i := first; ; i++ {
		l := new(raft.Log)
		if err := old.GetLog(i, l); err != nil {
			return fmt.Errorf("reading entry %d: %w", i, err)
		}
		batch = append(batch, l)
		size += len(l.Data) + len(l.Extensions)
		if len(batch) == migrateLogs || size >= migrateBytes || i == last {
			if err := w.StoreLogs(batch); err != nil {
				return fmt.Errorf("appending entries %d-%d: %w", batch[0].Index, i, err)
			}
			clear(batch)
			batch, size = batch[:0], 0
		}
		if i == last {
			break
		}
	}
	if f, l, err := firstLast(w); err != nil || f != first || l != last {
		return fmt.Errorf("raft-wal holds entries %d-%d (%v) after entries %d-%d were copied", f, l, err, first, last)
	}
	return nil
}

func firstLast(s raft.LogStore) (first, last uint64, err error) {
	if first, err = s.FirstIndex(); err != nil {
		return 0, 0, err
	}
	last, err = s.LastIndex()
	return first, last, err
}

// scanBolt reads the raft-boltdb file at path: every pair of its stable store (bucket
// "conf"), the bounds of the last unbroken run of its log (bucket "logs", keyed by big-endian
// index; 0, 0 for none), and how many entries the log holds.
func scanBolt(path string) (stable [][2][]byte, first, last, total uint64, err error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: boltOpenTimeout})
	if err != nil {
		return nil, 0, 0, 0, err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	err = db.View(func(tx *bbolt.Tx) error {
		if conf := tx.Bucket([]byte("conf")); conf != nil {
			if err := conf.ForEach(func(k, v []byte) error {
				stable = append(stable, [2][]byte{append([]byte{}, k...), append([]byte{}, v...)})
				return nil
			}); err != nil {
				return err
			}
		}
		logs := tx.Bucket([]byte("logs"))
		if logs == nil {
			return nil
		}
		c := logs.Cursor()
		k, _ := c.Last()
		if k == nil {
			return nil
		}
		if len(k) != 8 {
			return fmt.Errorf("a log key of %d bytes", len(k))
		}
		last = binary.BigEndian.Uint64(k)
		first, total = last, 1
		broken := false
		for k, _ = c.Prev(); k != nil; k, _ = c.Prev() {
			total++
			if len(k) != 8 {
				return fmt.Errorf("a log key of %d bytes", len(k))
			}
			if i := binary.BigEndian.Uint64(k); !broken && i == first-1 {
				first = i
			} else {
				broken = true
			}
		}
		return nil
	})
	return stable, first, last, total, err
}

// removeSynced removes the file path and syncs its directory dir.
func removeSynced(dir, path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return durable.SyncDir(dir)
}

// exists reports whether path exists.
func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
