#!/usr/bin/env bash
# Fails when the committed generated Go code under proto/ is not exactly what
# proto/gen.sh produces from the .proto files in the working tree. Nothing in
# the working tree is modified: generation goes to a temporary directory.
#
#   proto/check.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$root/proto/gen.sh" "$tmp"

# Compare every generated file either side, so that a stale file left behind
# by a deleted or renamed .proto counts too.
generated() { (cd "$1" && find . -name '*.pb.go' | sed 's|^\./||'); }
stale=()
while IFS= read -r f; do
	if [ ! -e "$root/proto/$f" ]; then
		stale+=("proto/$f (missing)")
	elif [ ! -e "$tmp/$f" ]; then
		stale+=("proto/$f (no longer generated: delete it)")
	elif ! cmp -s "$tmp/$f" "$root/proto/$f"; then
		stale+=("proto/$f")
		diff -u --label "committed proto/$f" --label "regenerated proto/$f" \
			"$root/proto/$f" "$tmp/$f" | head -40 >&2 || true
	fi
done < <({ generated "$tmp"; generated "$root/proto"; } | LC_ALL=C sort -u)

if [ ${#stale[@]} -gt 0 ]; then
	{
		echo
		echo "proto/check.sh: the committed generated code is stale:"
		printf '  %s\n' "${stale[@]}"
		echo "Run proto/gen.sh (or go generate ./proto/...) and commit the result."
		echo "If only the 'protoc vX' header line differs, your protoc is not the version pinned in proto/gen.sh."
	} >&2
	exit 1
fi
echo "proto/check.sh: generated code is up to date"
