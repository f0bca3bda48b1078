#!/usr/bin/env bash
# `make demo-cluster`: the cluster tour (tests/cluster/demo.py) on the real-cluster tier's
# machinery: the machine-wide tier lock, the cached kubelet/control-plane build and images
# (scripts/e2e-cluster-lib.sh; a first build takes about 8 minutes on an idle machine, 45 on a
# loaded one), a private network namespace, and the host ledger undone and checked after.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

say() { echo "demo-cluster: $*" >&2; }
# shellcheck source=scripts/e2e-cluster-lib.sh
. scripts/e2e-cluster-lib.sh

if [ "$(id -u)" != 0 ]; then
    say "needs root (a control plane, kubelets and mount namespaces)"
    exit 1
fi
cluster_tier_lock
started=$(date +%s)
if [ ! -d /var/cache/enflame-e2e ] || ! compgen -G "/var/cache/enflame-e2e/cluster-*/stamp" >/dev/null; then
    say "first run: building Kubernetes and the images (about 8 min idle, 45 min on a loaded machine)"
fi
cluster_tier_build || exit 1
say "builds ready in $(($(date +%s) - started)) s"

restore() { .venv/bin/python -m tests.kubelet.host restore; }
trap restore EXIT
trap 'exit 130' INT TERM

unshare --net -- bash -c 'ip link set lo up && ENFLAME_E2E_NETNS=private exec .venv/bin/python -m tests.cluster.demo'
rc=$?
restore
trap - EXIT
.venv/bin/python -m tests.kubelet.host check || rc=1
say "took $(($(date +%s) - started)) s (exit $rc)"
exit "$rc"
