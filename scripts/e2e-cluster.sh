#!/usr/bin/env bash
# The real-cluster tier (`make e2e-cluster`): builds the control plane from Debian's kubernetes
# source once (scripts/e2e-build-cluster.sh, after the kubelet of scripts/e2e-build-kubelet.sh),
# builds the device plugin and toolkit images from Debian packages + this tree's wheel
# (deploy/build-image.sh --from-debian; cached per source tree), then runs tests/cluster/ in a
# private network namespace: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
# two simulated GCU nodes on 127.0.0.1. Whatever happens to pytest, the ledger of host changes
# is undone on exit and the host is compared with the snapshot taken before the run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

# Same fixed host dirs as `make e2e`: one tier run at a time on a machine.
exec 9>/run/lock/enflame-e2e-tier.lock
if ! flock -n 9; then
    echo "e2e-cluster: another tier run holds /run/lock/enflame-e2e-tier.lock; waiting" >&2
    flock 9
fi
say() { echo "e2e-cluster: $*" >&2; }

started=$(date +%s)
kubelet_dir=$(bash scripts/e2e-build-kubelet.sh) || { say "building the kubelet failed"; exit 1; }
cluster_dir=$(bash scripts/e2e-build-cluster.sh) || { say "building the control plane failed"; exit 1; }
say "binaries ready in $(($(date +%s) - started)) s: $("$cluster_dir/bin/kube-apiserver" --version), etcd $("$cluster_dir/bin/etcd" --version | sed -n 's/^etcd Version: //p')"

# Images from Debian, rebuilt when the source tree or the image recipe changes.
if ! command -v mmdebstrap >/dev/null; then
    say "installing mmdebstrap (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >&2 || { say "cannot install mmdebstrap"; exit 1; }
fi
cache=$(dirname "$kubelet_dir")
key=$( (git ls-files -s src pyproject.toml README.md deploy/build-image.sh deploy/build-image-debian.sh; git diff HEAD -- src pyproject.toml deploy/build-image*.sh) | sha256sum | cut -c1-16)
images="$cache/images-$key"
if [ ! -f "$images/done" ]; then
    image_started=$(date +%s)
    rm -rf "$cache"/images-*
    ENFLAME_ROOTFS_CACHE="$cache/rootfs" PYTHON=${IMAGE_PYTHON:-python3} \
        bash deploy/build-image.sh --from-debian "$images" || { say "building the images failed"; exit 1; }
    touch "$images/done"
    say "images built in $(($(date +%s) - image_started)) s"
fi
ls -l "$images" >&2
export ENFLAME_E2E_KUBELET_DIR="$kubelet_dir" ENFLAME_E2E_CLUSTER_DIR="$cluster_dir" ENFLAME_E2E_IMAGES="$images"

restore() { .venv/bin/python -m tests.kubelet.host restore; }
trap restore EXIT
trap 'exit 130' INT TERM

tier_started=$(date +%s)
# A private network namespace: the pod network's bridges, veths and routes die with it.
unshare --net -- bash -c 'ip link set lo up && ENFLAME_E2E_NETNS=private exec bash scripts/pytest.sh -m cluster -p no:cacheprovider --timeout=900 tests/cluster "$@"' e2e-cluster "$@"
rc=$?
say "tier took $(($(date +%s) - tier_started)) s (pytest exit $rc); everything $(($(date +%s) - started)) s"
restore
trap - EXIT
.venv/bin/python -m tests.kubelet.host check || rc=1
exit "$rc"
