#!/usr/bin/env bash
# Builds the real control plane (hack/kube/main.go: kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd, kubectl) from the published Go modules pinned in versions.env, into a
# cache directory outside the repository keyed by those versions, and prints the binary's path as
# its last line. A no-op when that binary exists. Module cache, build cache and binary all live
# under $SCALABLE_TOPICS_CACHE (default ~/.cache/scalable-topics); see README "Real control plane".
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$KUBE_DIR"

if [[ -x "$BINARY" ]]; then
	echo "$BINARY"
	exit 0
fi

log() { echo "kube-binaries: $*" >&2; }

go_version="$(go env GOVERSION)"
release_go="$(awk '$1 == "go" {print $2; exit}' go.mod)"
if [[ "$(printf '%s\n' "go$release_go" "$go_version" | sort -V | head -n1)" != "go$release_go" ]]; then
	log "go.mod needs go $release_go, the local toolchain is $go_version (GOTOOLCHAIN=local)"
	exit 1
fi

log "Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, $go_version; caches in $CACHE_ROOT"
log "[1/3] downloading modules (first build: about 100 MB from the Go module proxy, 600 MB unpacked)"
go mod download
pinned="$(go list -m -f '{{.Path}}@{{.Version}}' k8s.io/kubernetes go.etcd.io/etcd/server/v3 | tr '\n' ' ')"
if [[ "$pinned" != "k8s.io/kubernetes@$KUBERNETES_VERSION go.etcd.io/etcd/server/v3@$ETCD_VERSION " ]]; then
	log "go.mod pins $pinned but versions.env says $KUBERNETES_VERSION and $ETCD_VERSION: run hack/kube/pin.sh"
	exit 1
fi

tags=providerless
total="$(go list -tags "$tags" -deps . | wc -l)"
minor="${KUBERNETES_VERSION#v1.}"
minor="${minor%%.*}"
ver=k8s.io/component-base/version
ldflags=(
	-s -w
	-X "$ver.gitVersion=$KUBERNETES_VERSION"
	-X "$ver.gitMajor=1"
	-X "$ver.gitMinor=$minor"
	# Built from the module zip: there is no git commit to report.
	-X "$ver.gitCommit="
	-X "$ver.gitTreeState=archive"
	-X "$ver.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
)

mkdir -p "$BIN_DIR"
tmp="$(mktemp "$BIN_DIR/.kube.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
log "[2/3] compiling $total packages (first build: about 14 min on 2 cores, 4 GB of build cache; later builds reuse it)"
# go build -v names each package as it compiles it (cached ones are not named); count them.
if ! go build -v -trimpath -tags "$tags" -ldflags "${ldflags[*]}" -o "$tmp" . 2>&1 |
	awk -v total="$total" -v main="$(go list -m)" '
		$0 == main { print "kube-binaries: [3/3] linking" > "/dev/stderr"; next }
		/^[a-zA-Z0-9_.\/-]+$/ {
			n++
			if (n % 100 == 0) printf "kube-binaries:   compiled %d of at most %d packages\n", n, total > "/dev/stderr"
			next
		}
		{ print > "/dev/stderr" }'; then
	log "go build failed"
	exit 1
fi
mv "$tmp" "$BINARY"
trap - EXIT
log "built $BINARY ($(du -h "$BINARY" | cut -f1))"
echo "$BINARY"
