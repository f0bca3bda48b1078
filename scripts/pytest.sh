#!/usr/bin/env bash
# Runs the test suite; exit 5 (nothing collected) is reported as the failure it is.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
