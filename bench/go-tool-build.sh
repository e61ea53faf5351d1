#!/usr/bin/env bash
# Builds one of the benchmark's Go tools (bench/nats-go, bench/ours-go: a main package pinned in
# its go.mod/go.sum, fetched from the Go module proxy) into a cache directory outside the
# repository, keyed by the hash of its sources, and prints the binary's path as its last line. A
# no-op when that binary exists. Same cache layout as hack/kube/build.sh.
#
#	bench/go-tool-build.sh bench/ours-go segment-bench
set -euo pipefail
if [[ $# -ne 2 ]]; then
	echo "usage: $0 TOOL_DIR BINARY_NAME" >&2
	exit 2
fi
cd "$1"
name="$2"
CACHE_ROOT="${SCALABLE_TOPICS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalable-topics}/bench-$(basename "$PWD")"
key="$(cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)"
BINARY="$CACHE_ROOT/$key/$name"
if [[ -x "$BINARY" ]]; then
	echo "$BINARY"
	exit 0
fi
export GOTOOLCHAIN=local
export GOMODCACHE="$CACHE_ROOT/gomod"
export GOCACHE="$CACHE_ROOT/gocache"
export GOPATH="$CACHE_ROOT/gopath"
export GOFLAGS="-modcacherw -buildvcs=false -mod=readonly"
export CGO_ENABLED=0
mkdir -p "$CACHE_ROOT/$key"
tmp="$(mktemp "$CACHE_ROOT/$key/.$name.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
go mod download >&2
go build -trimpath -ldflags "-s -w" -o "$tmp" .
mv "$tmp" "$BINARY"
echo "$BINARY"
