#!/usr/bin/env bash
# Builds the control plane of the real-cluster tier (`make e2e-cluster`) once, into the same cache
# as the kubelet (scripts/e2e-build-kubelet.sh, which it runs first: same source, same Go):
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#           from Debian 12's `kubernetes` source package (upstream v1.20.2), GOPATH mode, offline,
#           static, the reflect2 swap, versions stamped as the kubelet's. The release tree has no
#           pkg/generated/openapi/zz_generated.openapi.go: the vendored openapi-gen writes it first
#           from every package of pkg/ and vendor/k8s.io/ (symlinks into staging/ followed) that
#           holds a `+k8s:openapi-gen=true` line.
#   etcd    from Debian's etcd-server .deb, unpacked (not installed, no service).
#   CNI     bridge/host-local/loopback/portmap from Debian's containernetworking-plugins .deb.
#
# The system's apt configuration is not touched (the kubelet build's private apt view is reused).
# Prints the directory holding bin/ on stdout; progress on stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

kubelet_dir=$(bash "$here/e2e-build-kubelet.sh")
# The kubelet's pin names the source, Go and reflect2; ours adds the recipe of this script.
CLUSTER_RECIPE=1
pin="cluster-$(basename "$kubelet_dir")_c${CLUSTER_RECIPE}"
cache=$(dirname "$kubelet_dir")
out="$cache/$pin"
log() { echo "e2e-build-cluster: $*" >&2; }
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)

complete() {
    [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$pin" ] || return 1
    local tool
    for tool in "${tools[@]}"; do [ -x "$out/bin/$tool" ] || return 1; done
    [ -x "$out/cni/bridge" ] && [ -x "$out/cni/host-local" ] && [ -x "$out/cni/loopback" ]
}
if complete; then
    echo "$out"
    exit 0
fi
exec 9>"$cache/.cluster-lock"
flock 9
if complete; then
    echo "$out"
    exit 0
fi
started=$(date +%s)

# The kubelet build's private apt view and downloads.
apt_dir="$cache/apt"
apt_opts=(
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=$(id -un)"
    -o "Debug::NoLocking=true"
)
downloads="$cache/downloads"
fetch_deb() {  # fetch_deb PACKAGE: the newest .deb of PACKAGE into $downloads
    local package=$1
    if ! compgen -G "$downloads/${package}_*.deb" >/dev/null; then
        log "apt download $package"
        if ! (cd "$downloads" && apt-get "${apt_opts[@]}" -qq download "$package" >&2); then
            apt-get "${apt_opts[@]}" -qq update >&2
            (cd "$downloads" && apt-get "${apt_opts[@]}" -qq download "$package" >&2)
        fi
    fi
}
fetch_deb etcd-server
fetch_deb containernetworking-plugins

work="$cache/cluster-work"
rm -rf "$work"
mkdir -p "$work/bin" "$work/debs"

# 1. etcd and the CNI plugins, unpacked.
for deb in "$downloads"/etcd-server_*.deb "$downloads"/containernetworking-plugins_*.deb; do
    dpkg-deb -x "$deb" "$work/debs"
done
cp "$work/debs/usr/bin/etcd" "$work/bin/etcd"
mkdir -p "$work/cni"
for plugin in bridge host-local loopback portmap; do
    cp "$work/debs/usr/lib/cni/$plugin" "$work/cni/$plugin"
done
"$work/bin/etcd" --version >&2

# 2. The source tree, as the kubelet build unpacks it.
go_root=$(ls -d "$cache"/go-*/go | sort -V | tail -n 1)
go="$go_root/bin/go"
KUBE_UPSTREAM=$(basename "$kubelet_dir" | sed -E 's/^k8s-([^_]+)_.*/\1/')
gopath="$work/gopath"
tree="$gopath/src/k8s.io/kubernetes"
mkdir -p "$tree" "$work/reflect2"
log "unpacking the kubernetes source ($KUBE_UPSTREAM)"
for orig in "$downloads/kubernetes_${KUBE_UPSTREAM}".orig.tar.*; do
    tar -xf "$orig" -C "$tree" --strip-components=1
done
for deb in "$downloads"/golang-github-modern-go-reflect2-dev_*_all.deb; do dpkg-deb -x "$deb" "$work/reflect2"; done
rm -rf "$tree/vendor/github.com/modern-go/reflect2"
cp -a "$work/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2" \
    "$tree/vendor/github.com/modern-go/reflect2"

export GOPATH="$gopath" GO111MODULE=off GOFLAGS='' GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
# The kubelet build's Go cache when it kept one ($cache/gocache): the packages both share
# (client-go, apimachinery, api, ...) are not compiled twice. Removed after this build.
export GOCACHE="$cache/gocache" GOTMPDIR="$work"

# 3. pkg/generated/openapi, which kube-apiserver needs and the release tree does not carry.
log "go build openapi-gen (vendored k8s.io/kube-openapi)"
(cd "$tree" && "$go" build -trimpath -o "$work/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen)
inputs=$(cd "$tree" && grep -RIl --include='*.go' --exclude='*_test.go' '+k8s:openapi-gen=true' pkg vendor/k8s.io \
    | xargs -n1 dirname | sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
[ -n "$inputs" ] || { log "no +k8s:openapi-gen=true packages found"; exit 1; }
log "openapi-gen over $(echo "$inputs" | tr ',' '\n' | wc -l) packages"
(cd "$tree" && "$work/openapi-gen" \
    --input-dirs "$inputs" \
    --output-base "$gopath/src" \
    --output-package k8s.io/kubernetes/pkg/generated/openapi \
    --output-file-base zz_generated.openapi \
    --go-header-file hack/boilerplate/boilerplate.generatego.txt \
    --report-filename "$work/openapi-violations.txt")
[ -s "$tree/pkg/generated/openapi/zz_generated.openapi.go" ] \
    || { log "openapi-gen wrote no pkg/generated/openapi/zz_generated.openapi.go"; exit 1; }

# 4. The four binaries, stamped as the kubelet is.
version_pkg=k8s.io/kubernetes/vendor/k8s.io/component-base/version
kube_version=${KUBE_UPSTREAM##*really}
ldflags="-s -w -X $version_pkg.gitVersion=v$kube_version -X $version_pkg.gitTreeState=clean"
ldflags+=" -X $version_pkg.gitMajor=${kube_version%%.*} -X $version_pkg.gitMinor=$(echo "$kube_version" | cut -d. -f2)"
for tool in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    log "go build k8s.io/kubernetes/cmd/$tool"
    tool_started=$(date +%s)
    (cd "$tree" && "$go" build -trimpath -ldflags "$ldflags" -o "$work/bin/$tool" "./cmd/$tool")
    log "built $tool in $(($(date +%s) - tool_started)) s"
done
"$work/bin/kube-apiserver" --version >&2
"$work/bin/kubectl" version --client --short >&2 || true

rm -rf "$out"
mkdir -p "$out"
mv "$work/bin" "$work/cni" "$out/"
echo "$pin" >"$out/stamp"
rm -rf "$work" "$cache/gocache"
for old in "$cache"/cluster-k8s-*; do
    [ "$old" = "$out" ] || rm -rf "$old"
done
log "built $pin in $(($(date +%s) - started)) s"
echo "$out"
