#!/usr/bin/env bash
# Runs every benchmarks/bench_*.py with the venv's python; each prints one JSON document.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for bench in benchmarks/bench_*.py; do
    echo "# $bench" >&2
    .venv/bin/python "$bench" || status=1
done
exit "$status"
