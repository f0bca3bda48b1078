"""Device plugin start-up: exec -> registered with the kubelet -> first ListAndWatch answer; JSON.

After a kubelet restart, an upgrade or a crash a node serves no GCU until the plugin is back,
so this measures the real ``enflame-device-plugin`` process (``python -m``, as
``plugin_process`` starts it) on the simulated vendor 8-card node against the stub kubelet:
from just before the exec to the kubelet's accepted Register call (after it dialled the plugin
back, as the kubelet does), and to the first device list on the ListAndWatch stream. Also the
process's CPU time and resident memory once it listed, and its import time alone
(``python -X importtime``-free: a bare ``import`` of the entry module, timed in a fresh
interpreter). Medians and maxima over BENCH_RUNS starts (default 10).

``BENCH_BASELINE_SRC=/path/to/other/checkout/src`` also starts that tree's plugin (through
``PYTHONPATH``) in every iteration, interleaved with this one, and reports it as ``baseline``:
an A/B in one run, so a busy machine slows both alike.

Bytecode: every install of the plugin runs from compiled modules (pip and the packages write
``.pyc`` files at install; the images compile them at build), so the processes started here
get a private ``PYTHONPYCACHEPREFIX`` filled by the warm-up start, with
``PYTHONDONTWRITEBYTECODE`` cleared (the test environment sets it, which would make every
start compile the whole package again: about 45 ms of CPU on the idle machine).
``BENCH_NO_BYTECODE=1`` measures that case instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from enflame_gcu.simulation.testing import kubelet_stub, plugin_process

RUNS = int(os.environ.get("BENCH_RUNS", "10"))
BASELINE_SRC = os.environ.get("BENCH_BASELINE_SRC", "")
RESOURCE = "enflame.com/gcu"
TICKS = os.sysconf("SC_CLK_TCK")
NO_BYTECODE = os.environ.get("BENCH_NO_BYTECODE", "") == "1"
# Filled by the warm-up start; removed at the end.
PYCACHE = tempfile.mkdtemp(prefix="bench-plugin-pycache-")


def _env(src: str) -> dict[str, str]:
    """The plugin's environment on top of ours: the other tree's ``src``, the bytecode cache."""
    env = {"PYTHONPATH": src} if src else {}
    if not NO_BYTECODE:
        env |= {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": PYCACHE}
    return env


def _cpu_ms(pid: int) -> float:
    """User + system CPU time the process has used, in ms."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def one_start(src: str = "") -> dict[str, float]:
    """One plugin start on a fresh simulated node; times in ms from just before the exec.
    ``src``: another tree's ``src`` to run instead of this one."""
    work, root, plugins = plugin_process.make_node("vendor-8card")
    env = _env(src)
    try:
        async with kubelet_stub.KubeletStub(plugins) as kubelet:
            plugin = plugin_process.PluginProcess(plugins, root, env=env)
            started = time.monotonic()
            await plugin.start()
            try:
                await kubelet.wait_for(
                    lambda k: any(a.resource_name == RESOURCE and a.healthy > 0 for a in k.history),
                    30,
                    "the plugin to register and list its cards",
                )
                listed = next(
                    a.at for a in kubelet.history if a.resource_name == RESOURCE and a.healthy
                )
                registered = next(
                    r.at for r in kubelet.registrations if r.resource_name == RESOURCE
                )
                pid = plugin._running().pid
                sample = {
                    "registered_ms": (registered - started) * 1000,
                    "first_list_ms": (listed - started) * 1000,
                    "cpu_ms_when_listed": _cpu_ms(pid),
                    "rss_mb_when_listed": _rss_mb(pid),
                }
            except BaseException:
                sys.stderr.write(plugin.log_text())
                raise
            finally:
                await plugin.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return sample


def import_ms(src: str = "") -> float:
    """Wall time of importing the entry module in a fresh interpreter (no plugin start)."""
    code = (
        "import time; t = time.perf_counter(); import enflame_gcu.device_plugin.main; "
        "print((time.perf_counter() - t) * 1000)"
    )
    env = {**os.environ, **_env(src)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, env=env)
    return float(done.stdout)


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    return {
        key: {
            "median": round(statistics.median(s[key] for s in samples), 1),
            "max": round(max(s[key] for s in samples), 1),
        }
        for key in samples[0]
    }


async def main() -> dict[str, Any]:
    """Start the plugin RUNS times (and the baseline's, interleaved); medians and maxima."""
    trees = {"current": ""} | ({"baseline": BASELINE_SRC} if BASELINE_SRC else {})
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for src in trees.values():
        await one_start(src)  # warm the page cache and the .pyc files once
    for _ in range(RUNS):
        for name, src in trees.items():
            sample = await one_start(src)
            sample["import_entry_module_ms"] = import_ms(src)
            samples[name].append(sample)
    summary = {name: _summary(values) for name, values in samples.items()}
    return {
        "benchmark": "device plugin start-up",
        "runs": RUNS,
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "loadavg_at_end": os.getloadavg()[0],
        },
        "baseline_src": BASELINE_SRC or None,
        "bytecode": "none: every start compiles" if NO_BYTECODE else "compiled by the warm-up",
        "results": summary,
        "targets": {"registered_ms": 250},
    }


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main()), indent=2))
    finally:
        shutil.rmtree(PYCACHE, ignore_errors=True)
    sys.exit(0)
