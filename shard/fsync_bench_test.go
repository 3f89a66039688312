package shard

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// BenchmarkFsync measures the machine's durable-write latency the way the
// Raft log pays it: append 4 KiB to a file and fdatasync it; a single
// client's Schedule acknowledgement is measured against it. Run it with
// TMPDIR on the disk chimed's data directory lives on.
func BenchmarkFsync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "fsync"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for b.Loop() {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLogAppend measures one append to a shard's Raft log: raft-wal,
// as the shard opens it, writes the entry into its segment file and
// fdatasyncs it once; raft-boltdb, which builds before it used, commits a
// bbolt transaction with two fdatasyncs (the pages, then the meta page).
// Entries of 200 bytes are a single client's Schedule, which waits for one
// append on the leader and then one on a follower, in series: twice this is
// the floor of its acknowledgement; entries of 64 KiB are a batch under load.
func BenchmarkLogAppend(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) raft.LogStore
	}{
		{"raft-wal", func(b *testing.B) raft.LogStore {
			logs, err := openLogStore(b.TempDir(), slog.New(slog.DiscardHandler), hclog.NewNullLogger())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { logs.Close() })
			return logs
		}},
		{"raft-boltdb", func(b *testing.B) raft.LogStore {
			logs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(b.TempDir(), "raft.db")})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { logs.Close() })
			return logs
		}},
	}
	for _, size := range []int{200, 64 << 10} {
		for _, st := range stores {
			b.Run(fmt.Sprintf("%s/%dB", st.name, size), func(b *testing.B) {
				logs := st.open(b)
				data := make([]byte, size)
				for i := range data {
					data[i] = byte(i * 7)
				}
				b.ReportAllocs()
				b.SetBytes(int64(size))
				index := uint64(0)
				for b.Loop() {
					index++
					if err := logs.StoreLogs([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
