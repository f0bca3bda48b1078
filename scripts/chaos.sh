#!/usr/bin/env bash
# `make chaos`: GCU pods churning on the real-cluster tier while its components are killed,
# restarted or cut off (tests/cluster/chaos.py), with the tier's machinery (cluster_tier_run in
# scripts/e2e-cluster-lib.sh: the machine-wide tier lock, the cached kubelet/control-plane build
# and images, a private network namespace, and the host ledger undone and checked after).
# Options go to the driver:
#   make chaos CHAOS_ARGS="--seed 3 --minutes 3 --min-faults 15 --report /tmp/chaos.json"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"

say() { echo "chaos: $*" >&2; }
# shellcheck source=scripts/e2e-cluster-lib.sh
. scripts/e2e-cluster-lib.sh

cluster_tier_run .venv/bin/python -m tests.cluster.chaos "$@"
