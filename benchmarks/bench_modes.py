"""Node modes: the node-side time of starting a GCU pod and a non-GCU pod, against plain runc.

For each mode the same engine runs three kinds of pod, interleaved in a shuffled order:
plain (runc, no GCU: the reference), gcu (two cards as the mode delivers them) and non-gcu (no
GCU, as every other pod on the node). Time = RunPodSandbox until the container has exited
(sandbox + create + start + a busybox `true`), through containerd 1.6's CRI as the kubelet
drives it; for cdi, `podman run` with the CDI devices against a plain `podman run` (containerd
1.6 resolves no CDI). Medians over BENCH_RUNS iterations (default 15); ratios against the
plain pod of the same engine in the same run. Prints one JSON document.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import yaml

# The CRI client and containerd set-up are the node-mode tests' own (tests/e2e/cri).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu.container_toolkit import cdi_keeper
from enflame_gcu.simulation.testing import plugin_process
from tests.e2e import test_node_modes_cri as modes
from tests.e2e.cri import harness

RUNS = int(os.environ.get("BENCH_RUNS", "15"))
CARDS = ["gcu0", "gcu1"]
TRUE = "true"


def _podman(base: str) -> tuple[list[str], str]:
    rootfs = os.path.join(base, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"))
    shutil.copy(harness.BUSYBOX, os.path.join(rootfs, "bin", "busybox"))
    for applet in harness.APPLETS:
        os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    prefix = [modes.PODMAN, "--root", f"{base}/s", "--runroot", f"{base}/r"]
    prefix += [
        "--storage-driver",
        "vfs",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "none",
    ]
    return prefix, rootfs


def _timed_podman(prefix: list[str], rootfs: str, *args: str) -> float:
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    command = [*prefix, "run", "--rm", "--network", "none", *limits, *args, "--rootfs", rootfs]
    started = time.perf_counter()
    result = subprocess.run([*command, "/bin/true"], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"podman run failed: {result.stderr}")
    return seconds


def main() -> int:
    """Run every mode's three pods RUNS times, interleaved; print medians and ratios."""
    work, root, plugins = plugin_process.make_node("vendor-8card")
    engines: dict[str, harness.Engine] = {}
    podman_base = tempfile.mkdtemp(prefix="enf-pb-", dir="/tmp")
    vendor = f"b{uuid.uuid4().hex[:10]}.enflame.com"
    installed = os.path.join(modes.CDI_DIR, f"{vendor}.yaml")
    cdi_dir_existed = os.path.isdir(modes.CDI_DIR)
    runc_root_existed = os.path.isdir(harness.RUNC_DEFAULT_ROOT)
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for mode in ("device-specs", "runtimeclass", "default-runtime"):
            engine = harness.Engine(mode, node_root=root, runtime_log=False)
            engines[mode] = engine
            engine.configure()
            engine.start()
        answers = {m: modes.allocate(root, plugins, m, CARDS) for m in (*engines, "cdi")}
        requests = {m: modes.cri_request(root, answers[m]) for m in engines}
        # cdi: the keeper's spec under this run's own vendor (podman reads /var/run/cdi only).
        output = os.path.join(work, "cdi")
        cdi_keeper.refresh(root, output)
        with open(os.path.join(output, "enflame.com-gcu.yaml"), encoding="utf-8") as handle:
            spec = yaml.safe_load(handle)
        spec["kind"] = f"{vendor}/gcu"
        os.makedirs(modes.CDI_DIR, exist_ok=True)
        with open(installed, "w", encoding="utf-8") as handle:
            yaml.safe_dump(spec, handle)
        prefix, rootfs = _podman(podman_base)
        cdi_flags = [
            flag
            for device in answers["cdi"].cdi_devices
            for flag in ("--device", device.name.replace("enflame.com", vendor, 1))
        ]

        def pod(mode: str, **kwargs: Any) -> Callable[[], float]:
            return lambda: engines[mode].run_pod("b", script=TRUE, **kwargs).seconds

        variants: dict[tuple[str, str], Callable[[], float]] = {
            ("device-specs", "plain"): pod("device-specs"),
            ("device-specs", "gcu"): pod("device-specs", **requests["device-specs"]),
            ("device-specs", "non-gcu"): pod("device-specs"),
            ("runtimeclass", "plain"): pod("runtimeclass"),
            ("runtimeclass", "gcu"): pod(
                "runtimeclass", handler=harness.RUNTIME_NAME, **requests["runtimeclass"]
            ),
            ("runtimeclass", "non-gcu"): pod("runtimeclass"),
            ("default-runtime", "plain"): pod("default-runtime", handler="runc"),
            ("default-runtime", "gcu"): pod("default-runtime", **requests["default-runtime"]),
            ("default-runtime", "non-gcu"): pod("default-runtime"),
            ("cdi", "plain"): lambda: _timed_podman(prefix, rootfs),
            ("cdi", "gcu"): lambda: _timed_podman(prefix, rootfs, *cdi_flags),
            ("cdi", "non-gcu"): lambda: _timed_podman(prefix, rootfs),
        }
        for run in variants.values():  # warm caches, shims and images once
            run()
        rng = random.Random(12)  # noqa: S311 - shuffles the order, no secrets
        for _ in range(RUNS):
            order = list(variants)
            rng.shuffle(order)
            for key in order:
                samples.setdefault(key, []).append(variants[key]())
    finally:
        for engine in engines.values():
            engine.stop()
        if os.path.exists(installed):
            os.unlink(installed)
        subprocess.run(
            [*_podman_prefix(podman_base), "rm", "--all", "--force"],
            capture_output=True,
            check=False,
        )
        modes._unmount_under(podman_base)
        shutil.rmtree(podman_base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        # Host dirs the engines and podman made (when they were missing), once empty again.
        for made, existed in (
            (modes.CDI_DIR, cdi_dir_existed),
            (harness.RUNC_DEFAULT_ROOT, runc_root_existed),
        ):
            if not existed:
                with contextlib.suppress(OSError):
                    os.rmdir(made)
    result: dict[str, Any] = {
        "benchmark": "node modes: pod start, node side",
        "runs": RUNS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "engines": {"containerd": "1.6 (CRI)", "podman": "4.3 (cdi)"},
        "modes": {},
    }
    for mode in ("device-specs", "cdi", "runtimeclass", "default-runtime"):
        plain = statistics.median(samples[(mode, "plain")])
        row: dict[str, Any] = {"plain_ms": round(plain * 1000, 1)}
        for kind in ("gcu", "non-gcu"):
            median = statistics.median(samples[(mode, kind)])
            row[f"{kind}_ms"] = round(median * 1000, 1)
            row[f"{kind}_added_ms"] = round((median - plain) * 1000, 1)
            row[f"{kind}_ratio"] = round(median / plain, 3)
        # The run's noise floor: plain runs' own spread (interquartile range over the median).
        quartiles = statistics.quantiles(samples[(mode, "plain")], n=4)
        row["plain_iqr_ratio"] = round((quartiles[2] - quartiles[0]) / plain, 3)
        result["modes"][mode] = row
    print(json.dumps(result, indent=2))
    return 0


def _podman_prefix(base: str) -> list[str]:
    return [
        modes.PODMAN,
        "--root",
        f"{base}/s",
        "--runroot",
        f"{base}/r",
        "--storage-driver",
        "vfs",
    ]


if __name__ == "__main__":
    sys.exit(main())
