package shard

import (
	"os"
	"path/filepath"
	"testing"

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

// BenchmarkLogAppend measures one append to a shard's Raft log as
// raft-boltdb makes it: a bbolt transaction holding one 200-byte entry,
// committed with its two fdatasyncs (the pages, then the meta page). A
// single client's Schedule waits for this on the leader and then on a
// follower, in series: twice this is the floor of its acknowledgement.
func BenchmarkLogAppend(b *testing.B) {
	logs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(b.TempDir(), "raft.db")})
	if err != nil {
		b.Fatal(err)
	}
	defer logs.Close()
	data := make([]byte, 200)
	index := uint64(0)
	for b.Loop() {
		index++
		if err := logs.StoreLog(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}
