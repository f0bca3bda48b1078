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

say() { echo "e2e-cluster: $*" >&2; }
# shellcheck source=scripts/e2e-cluster-lib.sh
. scripts/e2e-cluster-lib.sh

# Same fixed host dirs as `make e2e`: one tier run at a time on a machine.
cluster_tier_lock
started=$(date +%s)
cluster_tier_build || exit 1

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
