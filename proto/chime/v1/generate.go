// Package chimev1 is the generated Go code for Chime's gRPC API, chime.v1,
// defined in the .proto files next to this file: the public Scheduler
// (scheduler.proto), the operator API Admin (admin.proto), and Peer
// (peer.proto), node-to-node, not for clients, free to change between
// versions.
//
// Do not edit the .pb.go files: change the .proto and run `go generate
// ./proto/...` (which runs proto/gen.sh); proto/check.sh fails when the
// committed code is stale.
package chimev1

//go:generate bash ../../gen.sh
