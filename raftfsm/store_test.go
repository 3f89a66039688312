package raftfsm

import (
	"bytes"
	"testing"
)

// TestTablesEndAtRegionBoundaries: with two shards' events, cancels and marks in one memtable,
// a flush writes no table whose keys cross from one (shard, tag) region into another, so a
// table of new keys at the end of a region never covers the whole of the next one below it.
func TestTablesEndAtRegionBoundaries(t *testing.T) {
	st := openTestStore(t, t.TempDir(), StoreOptions{})
	defer st.Close()
	for shard := uint32(1); shard <= 2; shard++ {
		f, _ := newTestFSM(t, st, shard)
		defer f.Close()
		for _, l := range genLog(uint64(shard), 300) {
			f.Apply(l)
		}
	}
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	levels, err := st.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	regions := map[string]bool{}
	for level, tables := range levels {
		for _, tb := range tables {
			lo, hi := tb.Smallest.UserKey, tb.Largest.UserKey
			if len(lo) <= shardPrefixLen || len(hi) <= shardPrefixLen {
				t.Fatalf("L%d table %s: bounds %x..%x are shorter than a shard and a tag", level, tb.FileNum, lo, hi)
			}
			if !bytes.Equal(lo[:shardPrefixLen+1], hi[:shardPrefixLen+1]) {
				t.Fatalf("L%d table %s spans regions: %x..%x", level, tb.FileNum, lo, hi)
			}
			regions[string(lo[:shardPrefixLen+1])] = true
		}
	}
	// Two shards, each with bodies, due index, ids, meta and statuses.
	if len(regions) < 10 {
		t.Fatalf("tables cover %d regions, want at least 10: the log is too small to prove much", len(regions))
	}
}
