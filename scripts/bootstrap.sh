#!/usr/bin/env bash
# Installs what `make demo` (argument "demo") or `make test` (no argument: everything) needs on a
# fresh Debian 12 machine: Debian packages (when missing, as root) and a virtualenv with the
# project. Idempotent: a second run only checks.
#   demo: runc and busybox-static (its real container), gcc (its simulated libefml), and the
#         project with the device plugin's dependencies ('.[plugin]'); nothing else.
#   all:  the demo's, then every test's tools: containerd, podman, shellcheck, packaging tools,
#         prometheus, strace, docker-registry, openssl, the dev extras and Helm's library
#         (.venv-helm).
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${1:-all}
case $set_name in
    demo | all) ;;
    *) echo "bootstrap: unknown set '$set_name' (demo or all)" >&2; exit 2 ;;
esac

want_debs=(runc busybox-static gcc)
if [ "$set_name" = all ]; then
    want_debs+=(containerd shellcheck podman)
    # make dist and its tests (tests/packaging): rpmbuild/rpm, the .deb's python3-tomlkit dependency
    # (Debian's 0.11.7 is the declared minimum, exercised there), logrotate to check our file.
    want_debs+=(rpm python3-tomlkit logrotate)
    # The .deb's lintian check; systemd-analyze (systemd) verifies the units the packages ship.
    want_debs+=(lintian systemd)
    # Card telemetry tests: a real Prometheus scrapes the plugin (gcc, above, builds the libefml).
    want_debs+=(prometheus)
    # The runtime front's test counts its system calls (tests/shim/test_front.py).
    want_debs+=(strace)
    # The cluster tier's loopback registry the chart's images are pushed to and pulled from
    # (tests/cluster/test_registry.py); skopeo-free: podman pushes.
    want_debs+=(docker-registry)
    # The DRA webhook's control-plane test makes the CA and serving certificate the API server
    # calls it with (tests/controlplane/test_dra_webhook.py).
    want_debs+=(openssl)
fi
missing=()
# The venv's interpreter: Debian's own python3 (the one the .deb runs on, and the only one on a
# fresh Debian 12) rather than the first python3 on PATH, which on a developer's machine is
# often a pyenv or conda build without PGO: the suite starts over a thousand Python processes
# and runs slower on those (docs/benchmarks.md, "make test"). VENV_PYTHON=... picks another.
python=${VENV_PYTHON:-}
if [ -z "$python" ]; then
    python=python3
    if /usr/bin/python3 -c 'import sys; assert sys.version_info >= (3, 10)' >/dev/null 2>&1; then
        python=/usr/bin/python3
    fi
fi
# Debian's own python3 needs python3-venv (ensurepip) before `python3 -m venv` works.
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    want_debs+=(python3-venv)
fi
for pkg in "${want_debs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: missing Debian packages ${missing[*]} and not root: install them with apt-get" >&2
        exit 1
    fi
    echo "bootstrap: installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    # Debian starts the packaged Prometheus as a service; the tests run their own on loopback.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    # The same for docker-registry's service (it would hold port 5000 on every address).
    if [[ " ${missing[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable --now docker-registry >/dev/null 2>&1 || true
    fi
fi

venv=${VENV:-.venv}
stamp="$venv/.installed"  # the whole set ('.[dev]'), which holds the demo's too
demo_stamp="$venv/.installed-demo"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
fresh() { [ -f "$1" ] && ! [ pyproject.toml -nt "$1" ]; }
if [ "$set_name" = demo ]; then
    if ! fresh "$stamp" && ! fresh "$demo_stamp"; then
        "$venv/bin/python" -m pip install -q --upgrade pip >&2
        "$venv/bin/python" -m pip install -q -e '.[plugin]' >&2
        touch "$demo_stamp"
    fi
    exit 0
fi
if ! fresh "$stamp"; then
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    "$venv/bin/python" -m pip install -q -e '.[dev]' >&2
    touch "$stamp"
fi

# Real `helm lint`, rendering and the cluster tier's install/upgrade/uninstall: Helm's Go
# library ships on PyPI as helm-python-sdk (Python >= 3.10, so Debian 12's python3 does), kept in
# a side venv so the project's own environment does not carry a Go shared library. Under CI=true
# the chart tests fail without it instead of skipping.
helm_venv=.venv-helm
if ! "$helm_venv/bin/python" -c 'import helm_python' >/dev/null 2>&1; then
    rm -rf "$helm_venv"
    if ! { python3 -m venv "$helm_venv" \
        && "$helm_venv/bin/python" -m pip install -q 'helm-python-sdk>=0.2.2' >&2; }; then
        echo "bootstrap: helm-python-sdk unavailable; the chart tests that need Helm skip (fail under CI=true)" >&2
        rm -rf "$helm_venv"
    fi
fi
