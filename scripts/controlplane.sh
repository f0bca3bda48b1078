#!/usr/bin/env bash
# The control-plane harness (`make controlplane`): Kubernetes' own etcd, kube-apiserver,
# kube-scheduler and kube-controller-manager from the cluster tier's cached build
# (scripts/e2e-build-cluster.sh: a first build is the tier's, minutes; later runs find the
# stamp at once), with simulated nodes and no kubelet, no containerd, no host change: every
# process listens on 127.0.0.1 and keeps its files under a temporary directory. Runs
# tests/controlplane/ (one control plane for the whole run) and prints pytest's summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"
say() { echo "controlplane: $*" >&2; }

started=$(date +%s)
cluster_dir=$(bash scripts/e2e-build-cluster.sh) || { say "building the control plane failed"; exit 1; }
say "control plane $("$cluster_dir/bin/kube-apiserver" --version) ready in $(($(date +%s) - started)) s"
export ENFLAME_E2E_CLUSTER_DIR="$cluster_dir"
ran=$(date +%s)
bash scripts/pytest.sh -m controlplane -p no:cacheprovider --timeout=900 tests/controlplane "$@"
rc=$?
say "ran $(($(date +%s) - ran)) s (exit $rc)"
exit "$rc"
