# shellcheck shell=bash disable=SC2034
# Shared by pin.sh and build.sh: the pinned versions, the cache layout and the Go environment.
# Sourced, not run.
KUBE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$KUBE_DIR/versions.env"

# Caches and the binary live outside the repository; the binary's directory is keyed by the
# pinned versions, so a version bump builds beside the old binary instead of over it.
CACHE_ROOT="${SCALABLE_TOPICS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalable-topics}/kube"
BIN_DIR="$CACHE_ROOT/kubernetes-$KUBERNETES_VERSION-etcd-$ETCD_VERSION"
BINARY="$BIN_DIR/kube"

# The staging modules (k8s.io/api, ...) are published as v0.<minor>.<patch> of the release.
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"

export GOTOOLCHAIN=local
export GOMODCACHE="$CACHE_ROOT/gomod"
export GOCACHE="$CACHE_ROOT/gocache"
export GOPATH="$CACHE_ROOT/gopath"
# -modcacherw: the module cache can be removed with rm -rf like the rest of the cache.
# -buildvcs=false: the binary does not depend on the state of this repository's git checkout.
export GOFLAGS="-modcacherw -buildvcs=false"
export CGO_ENABLED=0
