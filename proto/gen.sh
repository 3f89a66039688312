#!/usr/bin/env bash
# Regenerates the Go code for every .proto file under proto/, next to its
# source (proto/chime/v1/*.proto -> proto/chime/v1/*.pb.go).
#
#   proto/gen.sh            # or: go generate ./proto/...
#   proto/gen.sh OUT_DIR    # write the generated tree under OUT_DIR instead (check.sh uses this)
#
# The generated code is committed, and proto/check.sh fails when it differs from
# what this script produces, so the tool versions are pinned here. protoc-gen-go
# and protoc-gen-go-grpc are installed at exactly these versions into a cache
# directory of their own (never over the ones on your PATH). protoc is the one
# on PATH, installed from Debian's protobuf-compiler when missing; its version is
# stamped into each .pb.go header, so a different protoc shows up as a diff.
set -euo pipefail

PROTOC_VERSION=3.21.12 # Debian bookworm's protobuf-compiler
PROTOC_GEN_GO_VERSION=v1.36.12 # matches google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2 # generated code needs grpc >= v1.64; go.mod has v1.85.0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/proto}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# wkt_found reports whether protoc can resolve the well-known types, which
# Debian ships in libprotobuf-dev (only a Recommends of protobuf-compiler).
wkt_found() {
	local dir
	dir=$(mktemp -d)
	printf 'syntax = "proto3";\nimport "google/protobuf/timestamp.proto";\n' >"$dir/probe.proto"
	local ok=0
	protoc -I "$dir" --descriptor_set_out=/dev/null "$dir/probe.proto" 2>/dev/null || ok=1
	rm -rf "$dir"
	return $ok
}

if ! command -v protoc >/dev/null || ! wkt_found; then
	if ! command -v apt-get >/dev/null; then
		echo "gen.sh: protoc $PROTOC_VERSION with the well-known types (google/protobuf/*.proto) is needed; install it and re-run" >&2
		exit 1
	fi
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	pkgs=(protobuf-compiler libprotobuf-dev)
	echo "gen.sh: installing ${pkgs[*]}" >&2
	"${sudo[@]}" apt-get install -y "${pkgs[@]}" >&2 ||
		{ "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y "${pkgs[@]}" >&2; }
fi
have=$(protoc --version)
if [ "$have" != "libprotoc $PROTOC_VERSION" ]; then
	echo "gen.sh: warning: $have, not libprotoc $PROTOC_VERSION: the .pb.go headers will differ from the committed ones" >&2
fi

bin=${XDG_CACHE_HOME:-$HOME/.cache}/chime/protoc-plugins
# plugin NAME PACKAGE VERSION prints the path of NAME at VERSION, installing it when missing.
plugin() {
	local dir=$bin/$1@$3
	if [ ! -x "$dir/$1" ]; then
		echo "gen.sh: installing $2@$3" >&2
		GOBIN=$dir go install "$2@$3" >&2 || return 1
	fi
	echo "$dir/$1"
}
gen_go=$(plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION")
gen_go_grpc=$(plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION")

# Import paths are relative to proto/, so files register as chime/v1/...,
# matching their package, and admin.proto can import "chime/v1/scheduler.proto".
cd "$root/proto"
mapfile -t sources < <(find . -name '*.proto' | sed 's|^\./||' | LC_ALL=C sort)
protoc -I . \
	--plugin=protoc-gen-go="$gen_go" \
	--plugin=protoc-gen-go-grpc="$gen_go_grpc" \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	"${sources[@]}"
