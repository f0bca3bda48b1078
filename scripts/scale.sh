#!/usr/bin/env bash
# `make scale`: benchmarks/bench_scale.py on the control-plane harness (Kubernetes' own
# scheduler and controllers, simulated nodes; the cluster tier's cached build, built on first
# use). Options pass through (default --nodes 1000,5000); the JSON goes to stdout and to
# scale-report.json, progress to stderr.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"
cluster_dir=$(bash scripts/e2e-build-cluster.sh) || { echo "scale: building the control plane failed" >&2; exit 1; }
export ENFLAME_E2E_CLUSTER_DIR="$cluster_dir"
echo "scale: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start" >&2
.venv/bin/python benchmarks/bench_scale.py "$@" | tee scale-report.json
exit "${PIPESTATUS[0]}"
