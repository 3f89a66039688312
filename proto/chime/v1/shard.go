package chimev1

import "hash/fnv"

// ShardOf maps an event id to its shard: FNV-1a (64-bit) over the id's
// bytes, modulo shardCount. It is part of the API contract that
// Admin.GetClusterMap documents: a client that routes each request to the
// leader of ShardOf(id, ClusterMap.shard_count) reaches the shard that owns
// the id. The shard count is fixed when a cluster is created, so the mapping
// never changes for a cluster. shardCount must not be 0.
//
// This file is written by hand; the generated code lives next to it.
func ShardOf(id string, shardCount uint32) uint32 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return uint32(h.Sum64() % uint64(shardCount))
}
