#!/usr/bin/env bash
# Runs the test suite; exit 5 (nothing collected) is reported as the failure it is.
set -uo pipefail
cd "$(dirname "$0")/.."
# -n auto: one worker more than there are cores. A fifth of a worker's time is spent waiting
# (on daemons it started, on sleeps in retry loops, on runc), so with one worker per core the
# cores sit idle that fifth (measured: 161 % CPU of 200 % on 2 cores; with 3 workers 180 %).
# xdist reads this variable for "auto"; set it to choose another number.
export PYTEST_XDIST_AUTO_NUM_WORKERS=${PYTEST_XDIST_AUTO_NUM_WORKERS:-$(( $(nproc) + 1 ))}
# Byte-code caches on, even where the environment turns them off: without them every worker
# rewrites and compiles every test module at collection (7 s of CPU each here), and every
# Python program the tests start compiles its modules again (caches go to __pycache__/,
# ignored by git).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
