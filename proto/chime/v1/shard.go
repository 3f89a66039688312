package chimev1

import "hash/fnv"

// ShardOf maps an event id to its shard: FNV-1a (64-bit) over the id's
// routing key, modulo shardCount. It is part of the API contract that
// Admin.GetClusterMap documents: a client that routes each request to the
// leader of ShardOf(id, ClusterMap.shard_count) reaches the shard that owns
// the id. The shard count is fixed when a cluster is created, so the mapping
// never changes for a cluster. shardCount must not be 0.
//
// This file is written by hand; the generated code lives next to it.
func ShardOf(id string, shardCount uint32) uint32 {
	h := fnv.New64a()
	h.Write([]byte(RoutingKey(id)))
	return uint32(h.Sum64() % uint64(shardCount))
}

// RoutingKey is the part of an id that ShardOf hashes. An id that ends in
// '@' and 1 to 19 decimal digits is routed by what comes before the '@': the
// occurrences of a recurring schedule (<schedule id>@<Unix ms>) live on the
// schedule's shard, which creates them. Any id of that form is routed so, so
// that "order-42@1" and "order-42@2" share a shard too. Every other id is its
// own routing key.
func RoutingKey(id string) string {
	at := len(id) - 1
	for at >= 0 && id[at] >= '0' && id[at] <= '9' {
		at--
	}
	if digits := len(id) - 1 - at; at >= 0 && id[at] == '@' && digits >= 1 && digits <= 19 {
		return id[:at]
	}
	return id
}
