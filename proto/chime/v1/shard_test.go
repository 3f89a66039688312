package chimev1_test

import (
	"testing"

	chimev1 "github.com/chimehq/chime/proto/chime/v1"
)

// TestShardOfIsPinned pins ShardOf to literal values: the servers route by
// it (shard.For delegates to it) and clients route by it, so a change to the
// hash would move every id of every existing cluster to another shard.
func TestShardOfIsPinned(t *testing.T) {
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
		// A recurring schedule's occurrences route with the schedule.
		{"a@1767225600000", 1000, 996}, {"order-42-reminder@1", 64, 57}, {"a@0", 3, 1}, {"@1", 3, 2},
		// Not that form: the whole id.
		{"a@", 1000, 588}, {"a@12345678901234567890", 1000, 236}, {"a@1x", 1000, 21},
	} {
		if got := chimev1.ShardOf(c.id, c.shards); got != c.want {
			t.Errorf("ShardOf(%q, %d) = %d, want %d", c.id, c.shards, got, c.want)
		}
	}
}

func TestRoutingKey(t *testing.T) {
	for id, want := range map[string]string{
		"nightly@1767225600000":  "nightly",
		"a@b@7":                  "a@b",
		"@7":                     "",
		"alice@example.com":      "alice@example.com",
		"a@":                     "a@",
		"a@-1":                   "a@-1",
		"a@1234567890123456789":  "a",
		"a@12345678901234567890": "a@12345678901234567890",
		"12345":                  "12345",
	} {
		if got := chimev1.RoutingKey(id); got != want {
			t.Errorf("RoutingKey(%q) = %q, want %q", id, got, want)
		}
	}
}
