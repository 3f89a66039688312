package shard

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkFsync measures the machine's durable-write latency the way the
// Raft log pays it: append 4 KiB to a file and fdatasync it. BENCHMARKS.md
// compares a single client's Schedule acknowledgement to it. Run it with
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
