#!/usr/bin/env bash
# Runs the test suite; exit 5 (nothing collected) is reported as the failure it is.
set -uo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.." || exit 1
# ENFLAME_HOST_CHECK=1 (make test sets it; =0 turns it off): the host is compared before and
# after the run (tests/hostcheck.py: mounts, CDI and engine config dirs, our paths under /run,
# /etc, /var, top-level cgroups, /dev/gcu*, processes left running); a difference fails the
# run. The snapshot is taken here, in the host's mount namespace, before the tmpfs below.
if [ "${ENFLAME_HOST_CHECK:-0}" = 1 ] && [ -z "${ENFLAME_HOST_CHECK_FILE:-}" ]; then
    ENFLAME_HOST_CHECK_FILE=$(mktemp "${TMPDIR:-/tmp}/enflame-host-check.XXXXXX") || exit 1
    export ENFLAME_HOST_CHECK_FILE
    .venv/bin/python -m tests.hostcheck snapshot "$ENFLAME_HOST_CHECK_FILE" || exit 1
    bash "$self" "$@"
    rc=$?
    if ! .venv/bin/python -m tests.hostcheck check "$ENFLAME_HOST_CHECK_FILE"; then
        [ "$rc" -eq 0 ] && rc=1
    fi
    rm -f "$ENFLAME_HOST_CHECK_FILE"
    exit "$rc"
fi
# ENFLAME_TEST_TMPFS=1 (make test sets it; =0 turns it off): the run's scratch space in memory.
# /tmp, where pytest's tmp_path and every temporary directory of the tests live, becomes a
# tmpfs mounted in a private mount namespace: the host's /tmp is not touched and nothing stays
# mounted after the run. The code under test syncs every file it writes (atomic writes); on a
# virtual disk those syncs and the file system's own work were a quarter of the suite's time
# (pytest 348 s -> 260 s; docs/benchmarks.md, "make test"). The kubelet and cluster tiers keep
# the real disk.
if [ "${ENFLAME_TEST_TMPFS:-0}" = 1 ] && [ -z "${ENFLAME_TEST_TMPFS_MOUNTED:-}" ]; then
    if [[ "$PWD/" == /tmp/* ]]; then
        echo "pytest.sh: the checkout is under /tmp, which the tmpfs would hide: the tests' scratch space stays on disk" >&2
    elif [ "$(id -u)" -eq 0 ] && unshare --mount --propagation private true 2>/dev/null; then
        export ENFLAME_TEST_TMPFS_MOUNTED=/tmp
        # shellcheck disable=SC2016 # expanded by the inner bash, in the new namespace
        inner='mount -t tmpfs -o mode=1777 enflame-test-scratch /tmp || {
            echo "pytest.sh: cannot mount a tmpfs on /tmp (ENFLAME_TEST_TMPFS=0: on disk)" >&2
            exit 1
        }
        exec bash "$0" "$@"'
        exec unshare --mount --propagation private -- bash -c "$inner" "$self" "$@"
    else
        echo "pytest.sh: not root or no mount namespaces here: the tests' scratch space stays on disk" >&2
    fi
fi
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
