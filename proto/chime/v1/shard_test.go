package chimev1_test

import (
	"fmt"
	"testing"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
	"github.com/chimehq/chime/shard"
)

// TestShardOfIsTheServersMapping pins ShardOf to literal values, so that a
// change to the hash fails here even if shard.For is made to delegate to it,
// and checks it against shard.For, the mapping the servers route by.
func TestShardOfIsTheServersMapping(t *testing.T) {
	for _, c := range []struct {
		id     string
		shards uint32
		want   uint32
	}{
		{"", 3, 2}, {"", 8, 5}, {"", 1000, 37},
		{"a", 1, 0}, {"a", 3, 1}, {"a", 8, 4}, {"a", 64, 12}, {"a", 1000, 996},
		{"order-42-reminder", 8, 1}, {"order-42-reminder", 64, 57}, {"order-42-reminder", 1000, 833},
		{"bench-1700000000000-12345", 8, 6}, {"bench-1700000000000-12345", 1000, 902},
		{"ünïcode", 8, 3}, {"ünïcode", 1000, 171},
	} {
		if got := chimev1.ShardOf(c.id, c.shards); got != c.want {
			t.Errorf("ShardOf(%q, %d) = %d, want %d", c.id, c.shards, got, c.want)
		}
	}
	for i := range 2000 {
		id := fmt.Sprintf("event-%d", i)
		for _, n := range []uint32{1, 2, 3, 8, 64, 1 << 16} {
			if got, want := chimev1.ShardOf(id, n), shard.For(id, int(n)); got != want {
				t.Fatalf("ShardOf(%q, %d) = %d, shard.For = %d", id, n, got, want)
			}
		}
	}
}
