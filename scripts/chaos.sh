#!/usr/bin/env bash
# `make chaos`: GCU pods churning on the real-cluster tier while its components are killed,
# restarted or cut off (tests/cluster/chaos.py), with the tier's machinery: the machine-wide tier
# lock, the cached kubelet/control-plane build and images (scripts/e2e-cluster-lib.sh), a private
# network namespace, and the host ledger undone and checked after. Options go to the driver:
#   make chaos CHAOS_ARGS="--seed 3 --minutes 3 --min-faults 15 --report /tmp/chaos.json"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

say() { echo "chaos: $*" >&2; }
# shellcheck source=scripts/e2e-cluster-lib.sh
. scripts/e2e-cluster-lib.sh

if [ "$(id -u)" != 0 ]; then
    say "needs root (a control plane, kubelets and mount namespaces)"
    exit 1
fi
cluster_tier_lock
started=$(date +%s)
cluster_tier_build || exit 1
say "builds ready in $(($(date +%s) - started)) s"

restore() { .venv/bin/python -m tests.kubelet.host restore; }
trap restore EXIT
trap 'exit 130' INT TERM

unshare --net -- bash -c 'ip link set lo up && ENFLAME_E2E_NETNS=private exec .venv/bin/python -m tests.cluster.chaos "$@"' chaos "$@"
rc=$?
restore
trap - EXIT
.venv/bin/python -m tests.kubelet.host check || rc=1
say "took $(($(date +%s) - started)) s (exit $rc)"
exit "$rc"
