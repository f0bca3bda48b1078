#!/usr/bin/env bash
# The real-cluster tier (`make e2e-cluster`): builds the control plane from Debian's kubernetes
# source once (scripts/e2e-build-cluster.sh, after the kubelet of scripts/e2e-build-kubelet.sh),
# builds the device plugin and toolkit images from Debian packages + this tree's wheel
# (deploy/build-image.sh --from-debian; cached per source tree), then runs tests/cluster/ in a
# private network namespace: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
# two simulated GCU nodes on 127.0.0.1. Whatever happens to pytest, the ledger of host changes
# is undone on exit and the host is compared with the snapshot taken before the run
# (cluster_tier_run in scripts/e2e-cluster-lib.sh; one tier run at a time on a machine, as
# `make e2e`: the same fixed host dirs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

say() { echo "e2e-cluster: $*" >&2; }
# shellcheck source=scripts/e2e-cluster-lib.sh
. scripts/e2e-cluster-lib.sh

cluster_tier_run bash scripts/pytest.sh -m cluster -p no:cacheprovider --timeout=900 tests/cluster "$@"
