package raftfsm

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// stagingTableBytes is how many bytes of keys and values a staged restore writes into one
// sstable before it starts the next (tables come out smaller, compressed).
const stagingTableBytes = 64 << 20

// stagingSeq names staging directories apart within one process.
var stagingSeq atomic.Uint64

// staging is a restore's data written as sstables in a directory of their own under the
// store's, before anything of the shard is replaced. Keys must be set in strictly increasing
// order. Nothing is visible to the store until install.
type staging struct {
	fs    vfs.FS
	dir   string
	opts  sstable.WriterOptions
	w     *sstable.Writer
	bytes int // keys and values in w
	paths []string
}

// newStaging makes an empty staging directory for shard. Directories a crash left behind
// are removed by OpenStore.
func (s *Store) newStaging(shard uint32) (*staging, error) {
	dir := s.fs.PathJoin(s.dir, fmt.Sprintf("%s%d-%d", stagingPrefix, shard, stagingSeq.Add(1)))
	if err := s.fs.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftfsm: staging a restore: %w", err)
	}
	return &staging{fs: s.fs, dir: dir, opts: s.opts.MakeWriterOptions(0, s.db.TableFormat())}, nil
}

const stagingPrefix = "restore-staging-"

func (st *staging) set(k, v []byte) error {
	if st.w != nil && st.bytes >= stagingTableBytes {
		if err := st.closeTable(); err != nil {
			return err
		}
	}
	if st.w == nil {
		path := st.fs.PathJoin(st.dir, fmt.Sprintf("%06d.sst", len(st.paths)))
		f, err := st.fs.Create(path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		st.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), st.opts)
		st.paths = append(st.paths, path)
	}
	st.bytes += len(k) + len(v)
	return st.w.Set(k, v)
}

func (st *staging) closeTable() error {
	w := st.w
	st.w, st.bytes = nil, 0
	return w.Close() // syncs and closes the file
}

// finish closes the last table.
func (st *staging) finish() error {
	if st.w == nil {
		return nil
	}
	return st.closeTable()
}

// remove deletes the staging directory and what is left in it (after install, Pebble has
// taken the tables).
func (st *staging) remove() {
	if st.w != nil {
		_ = st.w.Close()
	}
	_ = st.fs.RemoveAll(st.dir)
}

// install replaces every key in [start, end) with the staged tables, atomically: Pebble
// excises the span and ingests the tables in one version edit. It then flushes, because
// Pebble has no WAL and an ingest that overlaps the memtables waits in their queue: raft
// discards its log behind an installed snapshot, so nothing could re-create a restored
// state a crash took.
func (s *Store) install(st *staging, start, end []byte) error {
	span := pebble.KeyRange{Start: start, End: end}
	if len(st.paths) == 0 {
		// Nothing to ingest (a snapshot of an empty shard): the excise alone.
		if err := s.db.DeleteRange(start, end, pebble.NoSync); err != nil {
			return err
		}
	} else if _, err := s.db.IngestAndExcise(context.Background(), st.paths, nil, nil, span); err != nil {
		return fmt.Errorf("raftfsm: installing a restored shard: %w", err)
	}
	return s.flush()
}
