#!/usr/bin/env bash
# `make demo-cluster`: the cluster tour (tests/cluster/demo.py) on the real-cluster tier's
# machinery (cluster_tier_run in scripts/e2e-cluster-lib.sh: the machine-wide tier lock, the
# cached kubelet/control-plane build and images — a first build takes about 8 minutes on an idle
# machine, 45 on a loaded one —, a private network namespace, and the host ledger undone and
# checked after).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

say() { echo "demo-cluster: $*" >&2; }
# shellcheck source=scripts/e2e-cluster-lib.sh
. scripts/e2e-cluster-lib.sh

cluster_tier_run .venv/bin/python -m tests.cluster.demo
