#!/usr/bin/env bash
# Runs every benchmarks/bench_*.py with the venv's python; each prints one JSON document.
# Names select some: `scripts/bench.sh churn sharing` runs bench_churn.py and bench_sharing.py.
set -euo pipefail
cd "$(dirname "$0")/.."
benches=(benchmarks/bench_*.py)
if [ "$#" -gt 0 ]; then
    benches=()
    for name in "$@"; do
        if [ ! -f "benchmarks/bench_$name.py" ]; then
            echo "no benchmark named $name; there are: $(cd benchmarks && ls bench_*.py | sed 's/^bench_//; s/\.py$//' | tr '\n' ' ')" >&2
            exit 2
        fi
        benches+=("benchmarks/bench_$name.py")
    done
fi
status=0
for bench in "${benches[@]}"; do
    echo "# $bench" >&2
    .venv/bin/python "$bench" || status=1
done
exit "$status"
