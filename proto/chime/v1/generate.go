// Package chimev1 is the generated Go code for Chime's gRPC API, chime.v1,
// defined in the .proto files next to this file: the public Scheduler
// (scheduler.proto), the operator API Admin (admin.proto), and Peer
// (peer.proto), node-to-node, not for clients, free to change between
// versions.
//
// Two files are written by hand, for what the API promises beyond its
// messages: shard.go (ShardOf, the id-to-shard mapping clients may route
// by) and headers.go (the chime-* headers on every produced record, and
// ParseHeaders, which reads them without linking a Kafka client).
//
// Do not edit the .pb.go files: change the .proto and run `go generate
// ./proto/...` (which runs proto/gen.sh); proto/check.sh fails when the
// committed code is stale.
package chimev1

//go:generate bash ../../gen.sh
