# shellcheck shell=bash
# Shared by scripts/e2e-cluster.sh (`make e2e-cluster`), scripts/demo-cluster.sh
# (`make demo-cluster`) and scripts/chaos.sh (`make chaos`); sourced from the checkout's root
# with `say` defined.
#
# cluster_tier_run CMD [ARG...]: all of the below, then CMD in a private network namespace
#   (ENFLAME_E2E_NETNS=private: the pod network's bridges, veths and routes die with it); the
#   ledger of host changes is undone whatever happens to CMD, and the host compared with the
#   snapshot taken before. Returns CMD's exit status, or 1 when the host check finds something.
# cluster_tier_lock: take the machine-wide tier lock on fd 9 (waits, saying so, when held).
# cluster_tier_build: the kubelet and control plane (scripts/e2e-build-*.sh, cached in
#   /var/cache/enflame-e2e), the plugin/toolkit images (cached per source tree), and the
#   ENFLAME_E2E_* variables the harness reads exported.

cluster_tier_lock() {
    exec 9>/run/lock/enflame-e2e-tier.lock
    if ! flock -n 9; then
        say "another tier run holds /run/lock/enflame-e2e-tier.lock; waiting"
        flock 9
    fi
}

cluster_tier_build() {
    local started kubelet_dir cluster_dir cache key images image_started
    started=$(date +%s)
    kubelet_dir=$(bash scripts/e2e-build-kubelet.sh) || { say "building the kubelet failed"; return 1; }
    cluster_dir=$(bash scripts/e2e-build-cluster.sh) || { say "building the control plane failed"; return 1; }
    say "binaries ready in $(($(date +%s) - started)) s: $("$cluster_dir/bin/kube-apiserver" --version), etcd $("$cluster_dir/bin/etcd" --version | sed -n 's/^etcd Version: //p')"

    # Images from Debian, rebuilt when the source tree or the image recipe changes.
    if ! command -v mmdebstrap >/dev/null; then
        say "installing mmdebstrap (Debian package)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >&2 || { say "cannot install mmdebstrap"; return 1; }
    fi
    cache=$(dirname "$kubelet_dir")
    key=$( (git ls-files -s src pyproject.toml README.md deploy/build-image.sh deploy/build-image-debian.sh; git diff HEAD -- src pyproject.toml deploy/build-image*.sh) | sha256sum | cut -c1-16)
    images="$cache/images-$key"
    if [ ! -f "$images/done" ]; then
        image_started=$(date +%s)
        rm -rf "$cache"/images-*
        ENFLAME_ROOTFS_CACHE="$cache/rootfs" PYTHON=${IMAGE_PYTHON:-python3} \
            bash deploy/build-image.sh --from-debian "$images" || { say "building the images failed"; return 1; }
        touch "$images/done"
        say "images built in $(($(date +%s) - image_started)) s"
    fi
    ls -l "$images" >&2
    export ENFLAME_E2E_KUBELET_DIR="$kubelet_dir" ENFLAME_E2E_CLUSTER_DIR="$cluster_dir" ENFLAME_E2E_IMAGES="$images"
}

cluster_tier_run() {
    local started ran rc
    if [ "$(id -u)" != 0 ]; then
        say "needs root (a control plane, kubelets and mount namespaces)"
        return 1
    fi
    cluster_tier_lock
    started=$(date +%s)
    if ! compgen -G "/var/cache/enflame-e2e/cluster-*/stamp" >/dev/null; then
        say "first run: building Kubernetes and the images (about 8 min idle, 45 min on a loaded machine)"
    fi
    cluster_tier_build || return 1
    say "builds ready in $(($(date +%s) - started)) s"

    trap '.venv/bin/python -m tests.kubelet.host restore' EXIT
    trap 'exit 130' INT TERM
    ran=$(date +%s)
    unshare --net -- bash -c 'ip link set lo up && ENFLAME_E2E_NETNS=private exec "$@"' tier "$@"
    rc=$?
    say "ran $(($(date +%s) - ran)) s (exit $rc); everything $(($(date +%s) - started)) s"
    .venv/bin/python -m tests.kubelet.host restore
    trap - EXIT
    .venv/bin/python -m tests.kubelet.host check || rc=1
    return "$rc"
}
