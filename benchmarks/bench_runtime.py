"""Container runtime benchmark: the wrapper's cost in front of the real runc; JSON out.

Each iteration runs every variant once, in a shuffled order so drift hits all alike:
``runc run`` of busybox ``true`` directly; through the installed front (``launcher``: POSIX
``sh``, which execs runc itself unless the spec names a GCU, else ``python -IS``), through the
Python wrapper alone (``python_only``: the ``python -IS`` launcher installed before the front)
and through pip's console script, with no GCU and with all 8 cards of a simulated vendor node
(answered from the prepared edits file, and with no such file, i.e. by discovery);
and a pass-through ``state`` call on an existing container, plain and wrapped. Medians, and
ratios against plain runc measured in the same run. Plus the create path's own work measured
in-process (no interpreter start, no runc), where a change of a fraction of a millisecond shows.

``BENCH_BASELINE_SRC=/path/to/other/checkout/src`` adds that tree's front (written by its own
``launcher``, handing over to its own wrapper) to the focused pass-through measurement as
``front_baseline``: old and new front side by side in one run.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from enflame_gcu import devices
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.shim import launcher
from enflame_gcu.simulation import simulate, topofile

RUNS = int(os.environ.get("BENCH_RUNS", "30"))
# In-process create timings: many cheap repetitions, so the median is stable on a busy machine.
IN_PROCESS_RUNS = int(os.environ.get("BENCH_IN_PROCESS_RUNS", "300"))
BASELINE_SRC = os.environ.get("BENCH_BASELINE_SRC", "")
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "enflame-container-runtime")
PACKAGE_DIR = launcher.default_package_dir()
# The launcher installed before the sh front: every call starts Python.
PYTHON_ONLY = """#!{python} -IS
import sys
sys.path.insert(0, {package!r})
from enflame_gcu.shim.main import main
sys.exit(main())
"""


# CPU time (user + system) of each call's processes, by variant: on a busy machine wall time
# mostly measures the wait for a CPU, CPU time what the call itself costs.
CPU_MS: dict[str, list[float]] = {}


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def timed(argv: list[str], env: dict[str, str], cpu_key: str = "") -> float:
    """Milliseconds for one call; fails loudly when the call fails. With ``cpu_key``, the
    call's CPU time is kept in CPU_MS under that name."""
    cpu = _children_cpu_ms()
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, env=env, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if result.returncode != 0:
        raise SystemExit(f"benchmark call failed: {argv}: {result.stderr.decode()}")
    if cpu_key:
        CPU_MS.setdefault(cpu_key, []).append(_children_cpu_ms() - cpu)
    return elapsed


def pass_through_focused(
    binaries: dict[str, str], work: str, env: dict[str, str], runs: int = 200
) -> dict[str, Any]:
    """Only the pass-through cost: ``state`` of a container that does not exist (runc answers
    at once, exit 1), through ``binaries`` (runc, the front, the Python-only launcher),
    interleaved; median wall and CPU ms and what each adds to runc's."""
    root = os.path.join(work, "focused-root")
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in binaries}

    def once(binary: str) -> tuple[float, float]:
        cpu = _children_cpu_ms()
        start = time.perf_counter()
        argv = [binary, "--root", root, "state", "nope"]
        subprocess.run(argv, env=env, capture_output=True, check=False)  # exit 1: no container
        return (time.perf_counter() - start) * 1000, _children_cpu_ms() - cpu

    for binary in binaries.values():
        once(binary)  # leaves the front its verdict, warms the caches
    order = list(binaries)
    shuffle = random.Random(7).shuffle  # noqa: S311 - ordering, not security
    for _ in range(runs):
        shuffle(order)
        for name in order:
            samples[name].append(once(binaries[name]))
    wall = {name: median([w for w, _ in values]) for name, values in samples.items()}
    cpu = {name: median([c for _, c in values]) for name, values in samples.items()}
    others = [name for name in binaries if name != "runc"]
    return {
        "runs": runs,
        "wall_ms": wall,
        "cpu_ms": cpu,
        "added_wall_ms": {n: round(wall[n] - wall["runc"], 2) for n in others},
        "added_cpu_ms": {n: round(cpu[n] - cpu["runc"], 2) for n in others},
        "loadavg_after": round(os.getloadavg()[0], 2),
    }


def baseline_front(work: str) -> str:
    """The front of the tree at BASELINE_SRC, written by its own launcher module."""
    path = os.path.join(work, "baseline", "enflame-container-runtime")
    os.mkdir(os.path.dirname(path))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from enflame_gcu.shim import launcher; "
        "launcher.write_launcher(sys.argv[2], sys.executable, sys.argv[1], sys.argv[3])"
    )
    verdict = os.path.join(work, "verdict-baseline")
    subprocess.run([sys.executable, "-c", code, BASELINE_SRC, path, verdict], check=True)
    return path


def make_bundle(work: str, runc: str, busybox: str, name: str, env: list[str]) -> str:
    """A busybox bundle running ``true``; returns its dir."""
    bundle = os.path.join(work, name)
    os.makedirs(os.path.join(bundle, "rootfs", "bin"))
    shutil.copy2(busybox, os.path.join(bundle, "rootfs", "bin", "busybox"))
    os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", "true"))
    subprocess.run([runc, "spec", "--bundle", bundle], check=True)
    path = os.path.join(bundle, "config.json")
    with open(path, encoding="utf-8") as handle:
        spec = json.load(handle)
    spec["process"].update(terminal=False, args=["true"])
    spec["process"]["env"].extend(env)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    return bundle


class _QuietLog:
    """The create path's log interface, writing nothing (the runtime log is not measured)."""

    def debug(self, message: str, /, *args: object) -> None:
        """Drop the line."""

    info = warning = error = debug


def in_process_create_ms(node: str, prepared: str, work: str) -> dict[str, float]:
    """Median ms of the create path's own work (already imported) for 8 cards: load the
    spec, resolve, check the node, edit, save; answered from the prepared edits and by
    discovery. Separates the runtime's per-create cost from Python start-up and runc."""
    from enflame_gcu.shim import config as runtime_config
    from enflame_gcu.shim import create

    bundle = os.path.join(work, "in-process")
    os.makedirs(bundle)
    spec = {"ociVersion": "1.0.2", "process": {"env": ["ENFLAME_VISIBLE_DEVICES=all"]}}
    original = json.dumps(spec).encode()
    result = {}
    for name, path in (("prepared", prepared), ("discovery", "")):
        config = runtime_config.RuntimeConfig(root=node, prepared_edits=path, log_file="")
        samples = []
        for _ in range(IN_PROCESS_RUNS):
            with open(os.path.join(bundle, "config.json"), "wb") as handle:
                handle.write(original)
            start = time.perf_counter()
            create.edit_bundle(bundle, config, _QuietLog())
            samples.append((time.perf_counter() - start) * 1000)
        result[f"create_8_cards_{name}"] = round(statistics.median(samples), 3)
    return result


def median(samples: list[float]) -> float:
    """Median rounded to 0.01 ms."""
    return round(statistics.median(samples), 2)


def main() -> int:
    """Run every variant ``RUNS`` times and print the JSON summary."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    busybox = shutil.which("busybox") or "/bin/busybox"
    work = tempfile.mkdtemp(prefix="bench-runtime-")
    try:
        node = os.path.join(work, "node")
        simulate.create(node, topofile.load("vendor-8card"))
        prepared = os.path.join(work, "prepared-edits.json")
        if not cdi.refresh_prepared_edits(prepared, devices.discover(node)):
            raise SystemExit("could not prepare the simulated node's edits")
        configs = {}
        # The configs and the verdicts in directories of their own, as /etc and /var/run on a
        # node: the front trusts a verdict only while it is newer than the config's directory,
        # which the bundles and verdicts written into ``work`` would keep touching.
        os.mkdir(os.path.join(work, "etc"))
        os.mkdir(os.path.join(work, "run"))
        for name, prepared_path in (("prepared", prepared), ("discovery", "")):
            configs[name] = os.path.join(work, "etc", f"config-{name}.toml")
            with open(configs[name], "w", encoding="utf-8") as handle:
                handle.write(
                    f'runtimes = ["{runc}"]\nroot = "{node}"\n'
                    f'log-file = "{os.path.join(work, "runtime.log")}"\n'
                    f'prepared-edits = "{prepared_path}"\n'
                )
        wrapper = os.path.join(work, "enflame-container-runtime")
        launcher.write_launcher(
            wrapper, sys.executable, verdict=os.path.join(work, "run", "verdict")
        )
        # One config per node in real life: the discovery config gets its own front (and
        # verdict), so the two configs do not take turns invalidating one verdict.
        wrapper_discovery = os.path.join(work, "discovery", "enflame-container-runtime")
        os.mkdir(os.path.dirname(wrapper_discovery))
        launcher.write_launcher(
            wrapper_discovery,
            sys.executable,
            verdict=os.path.join(work, "run", "verdict-discovery"),
        )
        python_only = os.path.join(work, "python-only", "enflame-container-runtime")
        os.mkdir(os.path.dirname(python_only))
        with open(python_only, "w", encoding="utf-8") as handle:
            handle.write(PYTHON_ONLY.format(python=sys.executable, package=PACKAGE_DIR))
        os.chmod(python_only, 0o755)  # noqa: S103 - an executable script, like runc
        env = dict(os.environ, ENFLAME_CONTAINER_RUNTIME_CONFIG=configs["prepared"])
        env_discovery = dict(os.environ, ENFLAME_CONTAINER_RUNTIME_CONFIG=configs["discovery"])
        state = os.path.join(work, "state")
        bundles = {
            "none": make_bundle(work, runc, busybox, "none", []),
            "all": make_bundle(work, runc, busybox, "all", ["ENFLAME_VISIBLE_DEVICES=all"]),
            "state": make_bundle(work, runc, busybox, "state", []),
        }
        originals: dict[str, bytes] = {}
        for key, bundle in bundles.items():
            with open(os.path.join(bundle, "config.json"), "rb") as spec_file:
                originals[key] = spec_file.read()
        # The same 8-card spec, pre-edited, run by plain runc: separates runc's own extra work
        # (mknod and cgroup rules for 9 nodes) from the wrapper's.
        # stdio on /dev/null: a created container holds its stdio open until it runs.
        subprocess.run(
            [wrapper, "--root", state, "create", "--bundle", bundles["all"], "pre-edit"],
            env=env,
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        subprocess.run([runc, "--root", state, "delete", "-f", "pre-edit"], check=True)
        with open(os.path.join(bundles["all"], "config.json"), "rb") as spec_file:
            edited_all = spec_file.read()

        def run(binary: str, key: str, spec_bytes: bytes, call_env: dict[str, str] = env) -> float:
            with open(os.path.join(bundles[key], "config.json"), "wb") as handle:
                handle.write(spec_bytes)
            cid = f"bench-{uuid.uuid4().hex[:10]}"
            argv = [binary, "--root", state, "run", "--bundle", bundles[key], cid]
            return timed(argv, call_env)

        variants: dict[str, Any] = {
            "runc_run": lambda: run(runc, "none", originals["none"]),
            "runc_run_8_cards_pre_edited": lambda: run(runc, "all", edited_all),
            "launcher_run_no_cards": lambda: run(wrapper, "none", originals["none"]),
            "launcher_run_8_cards_prepared": lambda: run(wrapper, "all", originals["all"]),
            "launcher_run_8_cards_discovery": lambda: run(
                wrapper_discovery, "all", originals["all"], env_discovery
            ),
            "python_only_run_no_cards": lambda: run(python_only, "none", originals["none"]),
            "python_only_run_8_cards_prepared": lambda: run(python_only, "all", originals["all"]),
            "console_script_run_no_cards": lambda: run(CONSOLE_SCRIPT, "none", originals["none"]),
            "console_script_run_8_cards_prepared": lambda: run(
                CONSOLE_SCRIPT, "all", originals["all"]
            ),
        }
        # A container left in "created" for the pass-through state calls.
        subprocess.run(
            [runc, "--root", state, "create", "--bundle", bundles["state"], "bench-state"],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        state_args = ["--root", state, "state", "bench-state"]
        for name, binary in (
            ("runc_state", runc),
            ("launcher_state", wrapper),
            ("python_only_state", python_only),
            ("console_script_state", CONSOLE_SCRIPT),
        ):
            variants[name] = functools.partial(timed, [binary, *state_args], env, name)
        in_process = in_process_create_ms(node, prepared, work)
        focused_binaries = {"runc": runc, "front": wrapper, "python_only": python_only}
        if BASELINE_SRC:
            focused_binaries["front_baseline"] = baseline_front(work)
        focused = pass_through_focused(focused_binaries, work, env)
        for call in variants.values():  # warm caches (pyc, page cache) once
            call()
        CPU_MS.clear()
        samples: dict[str, list[float]] = {name: [] for name in variants}
        order = list(variants)
        shuffle = random.Random(42).shuffle  # noqa: S311 - ordering, not security
        for _ in range(RUNS):
            shuffle(order)  # no variant always runs first (or right after a heavy one)
            for name in order:
                samples[name].append(variants[name]())
        subprocess.run([runc, "--root", state, "delete", "-f", "bench-state"], check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: median(values) for name, values in samples.items()}
    base = medians["runc_run"]
    result = {
        "benchmark": "container-runtime",
        "runs": RUNS,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "median_ms": medians,
        "in_process_median_ms": in_process,
        "ratios_vs_runc_run": {
            "launcher_no_cards": round(medians["launcher_run_no_cards"] / base, 2),
            "launcher_8_cards_prepared": round(medians["launcher_run_8_cards_prepared"] / base, 2),
            "launcher_8_cards_discovery": round(
                medians["launcher_run_8_cards_discovery"] / base, 2
            ),
            "python_only_no_cards": round(medians["python_only_run_no_cards"] / base, 2),
            "python_only_8_cards_prepared": round(
                medians["python_only_run_8_cards_prepared"] / base, 2
            ),
            "console_script_no_cards": round(medians["console_script_run_no_cards"] / base, 2),
            "console_script_8_cards": round(
                medians["console_script_run_8_cards_prepared"] / base, 2
            ),
            "runc_8_cards_pre_edited": round(medians["runc_run_8_cards_pre_edited"] / base, 2),
        },
        "pass_through_added_ms": {
            "launcher_state": round(medians["launcher_state"] - medians["runc_state"], 2),
            "python_only_state": round(medians["python_only_state"] - medians["runc_state"], 2),
            "console_script_state": round(
                medians["console_script_state"] - medians["runc_state"], 2
            ),
        },
        "pass_through_focused": focused,
        "pass_through_cpu_ms": {name: median(values) for name, values in CPU_MS.items()},
        "pass_through_cpu_added_ms": {
            name: round(median(values) - median(CPU_MS["runc_state"]), 2)
            for name, values in CPU_MS.items()
            if name != "runc_state"
        },
        "loadavg_at_end": os.getloadavg()[0],
        "targets": {"no_cards_ratio": 1.8, "8_cards_ratio": 2.0, "pass_through_added_ms": 1.5},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
