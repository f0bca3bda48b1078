"""Doctor checks of the runtime path: the binary and its config, each engine, and runc.

The engines run enflame-container-runtime as the node mode the installer recorded needs it: as
their default runtime (default-runtime, or no record: the vendor's way), as a handler for
RuntimeClass enflame (runtimeclass), or not at all (device-specs, cdi). An affected runc needs
the ``/dev/char`` links that ``dev_char`` plans, or a daemon-reload drops the GCUs (runc #3671).
"""

from __future__ import annotations

import os
import re
import subprocess

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import dev_char
from enflame_gcu.container_toolkit.doctor import engine_configs, processes
from enflame_gcu.container_toolkit.doctor.model import Node, Result
from enflame_gcu.container_toolkit.engines import base
from enflame_gcu.errors import EnflameError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import launcher

RUNTIME_PATH = base.DEFAULT_RUNTIME_PATH
RUNC_PATHS = ("/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc")
RELOAD_BUG = ((1, 1, 3), (1, 1, 6))  # runc versions that drop devices on daemon-reload (#3671)


def _configure_fix(engine: str) -> str:
    return f"enflame-ctk runtime configure --runtime {engine} --set-as-default --restart-engine"


def _recorded_mode(node: Node) -> node_modes.NodeMode | None:
    """The node mode the installer recorded; None without a readable record (the node-mode
    check reports a broken one), which keeps the vendor's way: the wrapper as the default."""
    try:
        record = node_modes.read(node.root)
    except ValueError:
        return None
    return node_modes.MODES.get(record.mode) if record is not None else None


def _engine_for_mode(view: engine_configs.EngineView, mode: node_modes.NodeMode) -> Result:
    """An engine on a node whose mode wants no wrapper, or the wrapper as a handler only."""
    name, where = f"engine-{view.engine}", f"node mode {mode.name}"
    if mode.wrapper == "none":
        if view.runtime_path is None:
            return Result(
                name, "pass", f"no enflame runtime entry, as {where} needs: {mode.summary}"
            )
        if view.is_default:
            detail = (
                f"enflame runtime {view.runtime_path} is the default runtime although {where} "
                "runs no wrapper: every container pays for it"
            )
            fix = f"enflame-ctk runtime unconfigure --runtime {view.engine} --restart-engine"
            return Result(name, "warn", detail, fix)
        detail = (
            f"an enflame runtime handler is configured ({view.runtime_path}); {where} uses none"
        )
        return Result(name, "pass", detail)
    fix = f"enflame-ctk runtime configure --runtime {view.engine} --restart-engine"
    if view.runtime_path is None:
        detail = view.problem or f"no runtime entry runs enflame-container-runtime ({where})"
        return Result(name, "fail", detail, fix)
    if view.problem:
        return Result(name, "fail", view.problem, fix)
    if view.is_default:
        detail = (
            f"enflame runtime {view.runtime_path} is the default runtime, but {where} wants it "
            "only as the handler of RuntimeClass enflame: every container pays for it"
        )
        return Result(name, "warn", detail, "enflame-ctk install --host-root / --mode runtimeclass")
    detail = f"enflame runtime {view.runtime_path} is the handler of RuntimeClass enflame ({where})"
    return Result(name, "pass", detail)


def _which_engine(node: Node) -> Result:
    """Which engine is checked and why: the kubelet's (as k8s-config.sh finds it), else all."""
    found = [view.engine for view in node.engines]
    detection = node.cri
    if detection is not None and detection.source == "kubelet":
        if detection.engine not in found:
            detail = (
                f"the kubelet runs {detection.engine} ({detection.reason}), but no "
                f"{detection.engine} is installed here (binary, /etc dir or socket)"
            )
            fix = "check the kubelet's --container-runtime-endpoint / containerRuntimeEndpoint"
            return Result("engine", "warn", detail, fix)
        others = [engine for engine in found if engine != detection.engine]
        detail = f"checking {detection.engine}, the engine the kubelet runs: {detection.reason}"
        if others:
            detail += f"; not checked, the kubelet does not use them: {', '.join(others)}"
        return Result("engine", "pass", detail)
    if not found:
        why = f" ({detection.reason})" if detection is not None else ""
        detail = f"no docker, containerd or CRI-O found (binaries, /etc dirs or sockets){why}"
        return Result(
            "engine", "warn", detail, "install a container engine, then: deploy/install.sh"
        )
    if detection is not None and detection.engine:
        why = f"{detection.engine} runs ({detection.reason})"
    else:
        why = detection.reason if detection is not None else "the kubelet's engine is unknown"
    detail = f"checking every engine found ({', '.join(found)}): {why}"
    return Result("engine", "pass", detail)


def check_engines(node: Node) -> list[Result]:
    """The engine the kubelet runs (else each engine) knows the enflame runtime, keeps
    SystemdCgroup and uses it by default; the first result says which engine and why."""
    results = [_which_engine(node)]
    if results[0].status != "pass":
        return results
    mode = _recorded_mode(node)
    for view in node.checked_engines:
        if mode is not None and mode.wrapper != "default":
            results.append(_engine_for_mode(view, mode))
            continue
        name, fix = f"engine-{view.engine}", _configure_fix(view.engine)
        if view.runtime_path is None:
            detail = view.problem or "no runtime entry runs enflame-container-runtime"
            results.append(Result(name, "fail", detail, fix))
        elif view.problem:
            results.append(Result(name, "fail", view.problem, fix))
        elif not view.is_default:
            detail = (
                f"enflame runtime ({view.runtime_path}) configured but not the default: pods get "
                "GCUs only through the default runtime or a RuntimeClass with handler enflame"
            )
            results.append(Result(name, "warn", detail, fix))
        else:
            detail = f"enflame runtime {view.runtime_path} is the default runtime"
            results.append(Result(name, "pass", detail))
    return results


def check_runtime_binary(node: Node) -> list[Result]:
    """The runtime the engines point at (default /usr/bin/...) exists, runs, has its interpreter."""
    configured = {v.runtime_path for v in node.engines if v.runtime_path}
    mode = _recorded_mode(node)
    if not configured and mode is not None and mode.wrapper == "none":
        detail = f"not needed: node mode {mode.name} runs no wrapper and no engine points at one"
        return [Result("runtime-binary", "pass", detail)]
    paths = sorted(configured or {RUNTIME_PATH})
    fix = "deploy/install.sh   # or the enflame-container-toolkit DaemonSet"
    problems = []
    for path in paths:
        local = node.path(path)
        if not os.path.isfile(local):
            problems.append(f"{path} does not exist")
        elif not os.access(local, os.X_OK):
            problems.append(f"{path} is not executable")
        else:
            with open(local, "rb") as handle:
                head = handle.read(1 << 16)
            first = head.split(b"\n", 1)[0]
            needed = []
            if first.startswith(b"#!"):
                needed.append(first[2:].split()[0].decode("utf-8", "replace"))
                # The sh front (shim.launcher) also needs the python it hands GCU requests to.
                python = launcher.front_python(head.decode("utf-8", "replace"))
                needed += [python] if python else []
            for interpreter in needed:
                if not os.path.exists(node.path(interpreter)):
                    problems.append(f"{path} needs {interpreter}, which does not exist")
    if problems:
        return [Result("runtime-binary", "fail", "; ".join(problems), fix)]
    return [Result("runtime-binary", "pass", f"{', '.join(paths)} installed")]


def check_runtime_config(node: Node) -> list[Result]:
    """The runtime's config file parses (a missing one means defaults)."""
    path = runtime_config.DEFAULT_PATH
    if not os.path.exists(node.path(path)):
        return [Result("runtime-config", "pass", f"{path} absent: built-in defaults apply")]
    try:
        runtime_config.load(node.path(path))
    except EnflameError as exc:
        return [Result("runtime-config", "fail", str(exc), f"fix or remove {path}")]
    return [Result("runtime-config", "pass", f"{path} is valid")]


def _runc_version(local: str) -> tuple[int, int, int] | None:
    try:
        result = subprocess.run(
            [local, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"runc version (\d+)\.(\d+)\.(\d+)", result.stdout)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def check_runc(node: Node) -> list[Result]:
    """runc 1.1.3-1.1.6 + systemd cgroups: devices need /dev/char links to survive daemon-reload."""
    found = next((p for p in RUNC_PATHS if os.path.isfile(node.path(p))), None)
    if found is None:
        return [
            Result("runc", "warn", f"no runc in {', '.join(RUNC_PATHS)}", "apt-get install runc")
        ]
    version = _runc_version(node.path(found))
    if version is None:
        return [Result("runc", "warn", f"cannot tell the version of {found}", f"{found} --version")]
    shown = ".".join(map(str, version))
    if not RELOAD_BUG[0] <= version <= RELOAD_BUG[1]:
        return [Result("runc", "pass", f"runc {shown}: not affected by runc issue 3671")]
    links = dev_char.plan(node.root)
    if not links:
        return [Result("runc", "pass", f"runc {shown}: no GCU device nodes to keep (issue 3671)")]
    missing = [
        f"{link} -> {target}"
        for link, target in links
        if not (
            os.path.islink(node.path(link, follow=False))
            and os.readlink(node.path(link, follow=False)) == target
        )
    ]
    if not missing:
        return [Result("runc", "pass", f"runc {shown} with /dev/char links for every GCU node")]
    systemd = (
        any(v.systemd_cgroup for v in node.engines)
        or processes.kubelet_setting(node, "cgroupDriver", "--cgroup-driver") == "systemd"
    )
    detail = (
        f"runc {shown} drops GCU access on `systemctl daemon-reload` (runc issue 3671) unless "
        f"/dev/char links exist; missing: {', '.join(missing)}"
    )
    if not systemd:
        detail += " (only with the systemd cgroup driver, which doctor could not confirm)"
    fix = "enflame-ctk system create-dev-char-symlinks   # or upgrade runc to 1.1.7+"
    return [Result("runc", "fail" if systemd else "warn", detail, fix)]
