// Package chimev1 is the generated Go code for Chime's public gRPC API,
// chime.v1, defined in scheduler.proto next to this file.
//
// Do not edit the .pb.go files: change the .proto and run `go generate
// ./proto/...` (which runs proto/gen.sh); proto/check.sh fails when the
// committed code is stale.
package chimev1

//go:generate bash ../../gen.sh
