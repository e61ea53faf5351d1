#!/usr/bin/env bash
# Builds bench/nats-go (NATS JetStream publisher/consumer on the official Go client, pinned in
# go.mod/go.sum, fetched from the Go module proxy) into a cache directory outside the repository,
# keyed by the hash of its sources, and prints the binary's path as its last line. A no-op when
# that binary exists. Same cache layout as hack/kube/build.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
CACHE_ROOT="${SCALABLE_TOPICS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalable-topics}/bench-nats-go"
key="$(cat go.mod go.sum main.go | sha256sum | cut -c1-16)"
BINARY="$CACHE_ROOT/$key/nats-bench"
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
tmp="$(mktemp "$CACHE_ROOT/$key/.nats-bench.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
go mod download >&2
go build -trimpath -ldflags "-s -w" -o "$tmp" .
mv "$tmp" "$BINARY"
echo "$BINARY"
