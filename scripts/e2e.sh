#!/usr/bin/env bash
# The real-kubelet tier: builds Kubernetes' kubelet once into a cache outside the checkout
# (scripts/e2e-build-kubelet.sh), then runs tests/kubelet/ against it with a private containerd.
# Whatever happens to pytest, the ledger of host changes is undone on exit and the host is
# compared with the snapshot taken before the run (the last line says "clean" or what differs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

# The tier uses the kubelet's fixed host dirs: one run at a time on a machine (other checkouts
# wait here rather than undo each other's ledger).
exec 9>/run/lock/enflame-e2e-tier.lock
if ! flock -n 9; then
    echo "e2e: another run holds /run/lock/enflame-e2e-tier.lock; waiting" >&2
    flock 9
fi

started=$(date +%s)
kubelet_dir=$(bash scripts/e2e-build-kubelet.sh) || { echo "e2e: building the kubelet failed" >&2; exit 1; }
echo "e2e: kubelet $("$kubelet_dir/bin/kubelet" --version 2>&1) from $kubelet_dir ($(($(date +%s) - started)) s)" >&2
export ENFLAME_E2E_KUBELET_DIR="$kubelet_dir"

restore() { .venv/bin/python -m tests.kubelet.host restore; }
trap restore EXIT
trap 'exit 130' INT TERM

tier_started=$(date +%s)
bash scripts/pytest.sh -m kubelet -p no:cacheprovider tests/kubelet "$@"
rc=$?
echo "e2e: tier took $(($(date +%s) - tier_started)) s (pytest exit $rc)" >&2
restore
trap - EXIT
.venv/bin/python -m tests.kubelet.host check || rc=1
exit "$rc"
