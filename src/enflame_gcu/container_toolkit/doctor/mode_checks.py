"""Doctor check: the node's mode, whether the node is set up for it, and whether the plugin agrees.

The mode is what the installer recorded (``node_modes.MODE_FILE``); without a record it is read
off the engines (the wrapper as default runtime, as an extra handler, or absent). The device
plugin's answer is read from its command line (``--node-mode``, ``--pass-device-specs``,
``--device-list-strategy``), the same way the plugin itself resolves them.
"""

from __future__ import annotations

import os
import shlex

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import cdi, cdi_service, migrate_engines
from enflame_gcu.container_toolkit.doctor import processes
from enflame_gcu.container_toolkit.doctor.model import Node, Result, Status
from enflame_gcu.errors import EnflameError

NAME = "node-mode"


def _reinstall(node: Node, mode: str = node_modes.AUTO) -> str:
    """The install that records ``mode`` (and takes back what another mode installed)."""
    root = shlex.quote(node.root)
    return (
        f"enflame-ctk install --host-root {root} --mode {mode}   "
        f"# or: deploy/install.sh --host-root {root} --mode {mode}"
    )


def _fixes(node: Node, mode: str) -> str:
    """Commands that, run in order, make the node match ``mode`` (doctor's fix)."""
    root = shlex.quote(node.root)
    ours = [view for view in node.checked_engines if view.runtime_path]
    steps = []
    if mode in ("device-specs", "cdi"):
        defaults = [v.engine for v in ours if v.is_default]
        try:  # topscloud's entries: unconfigure undoes only what our state records
            foreign = {f.engine for f in migrate_engines.find(node.root, node.containerd)}
        except (EnflameError, OSError, ValueError):
            foreign = set()
        if foreign & set(defaults):
            steps.append(f"enflame-ctk migrate --host-root {root}")
        steps += [
            f"enflame-ctk runtime unconfigure --runtime {engine} --host-root {root}"
            for engine in defaults
        ]
    elif mode in ("runtimeclass", "default-runtime"):
        default = " --set-as-default" if mode == "default-runtime" else ""
        steps += [
            f"enflame-ctk runtime configure --runtime {v.engine} --host-root {root}{default}"
            for v in node.checked_engines
            if not v.runtime_path or (mode == "default-runtime") != v.is_default
        ]
    if mode == "cdi":
        steps.append(
            f"enflame-ctk cdi generate --host-root {root} --output {cdi.DEFAULT_OUTPUT_DIR}"
            f"   # and keep them current: systemctl enable --now {cdi_service.UNIT_NAME}"
        )
    return " && ".join(steps) if steps else _reinstall(node, mode)


def _from_engines(node: Node) -> str:
    ours = [view for view in node.checked_engines if view.runtime_path]
    if any(view.is_default for view in ours):
        return "default-runtime"
    return "runtimeclass" if ours else node_modes.FALLBACK


def _plugin_settings(node: Node, recorded: str) -> tuple[str, bool, tuple[str, ...]] | None:
    """(mode, pass_device_specs, strategies) the running plugin uses; None if none runs."""
    flags = list(processes.flags(node, "enflame-device-plugin"))
    if not flags and not any(
        "enflame-device-plugin" in map(os.path.basename, words[:2]) for words in node.processes
    ):
        return None
    asked = next((value for name, value in flags if name == "--node-mode"), "")
    mode = recorded if asked == node_modes.AUTO else asked
    row = node_modes.MODES.get(mode)
    specs: bool | None = None
    strategies: list[str] = []
    for name, value in flags:
        if name == "--pass-device-specs":
            specs = True
        elif name == "--no-pass-device-specs":
            specs = False
        elif name == "--device-list-strategy":
            strategies.extend(p.strip() for p in value.split(",") if p.strip())
    if specs is None:
        specs = row.pass_device_specs if row else False
    if not strategies:
        strategies = list(row.strategies if row else ("envvar",))
    return mode, specs, tuple(strategies)


def _plugin_problem(mode: str, settings: tuple[str, bool, tuple[str, ...]]) -> str | None:
    plugin_mode, specs, strategies = settings
    shown = (
        f"--pass-device-specs={str(specs).lower()} --device-list-strategy={','.join(strategies)}"
    )
    if plugin_mode and plugin_mode != mode:
        return (
            f"the device plugin answers for node mode {plugin_mode}, the node is {mode} ({shown})"
        )
    if mode == "device-specs" and not specs:
        return f"node mode device-specs needs the plugin's DeviceSpecs; it runs {shown}"
    if mode == "cdi" and not {"cdi-cri", "cdi-annotations"} & set(strategies):
        return f"node mode cdi needs CDI names from the plugin; it runs {shown}: pods get no GCU"
    if mode in ("runtimeclass", "default-runtime") and not set(strategies) - {"cdi-cri"}:
        return f"node mode {mode}: the wrapper reads env, mounts or annotations; plugin: {shown}"
    return None


def _cdi_problem(node: Node) -> str | None:
    """None when a current enflame.com/gcu spec is in the CDI dirs."""
    try:
        wanted = {named.file_name: named.spec for named in cdi.build_specs(node.inventory)}
    except EnflameError:
        return None  # no usable GCU: nothing to describe (the gcu check says why)
    for name, spec in wanted.items():
        found = [
            path
            for directory in cdi.DEFAULT_SPEC_DIRS
            for path in (
                node.path(f"{directory}/{name}.yaml"),
                node.path(f"{directory}/{name}.json"),
            )
            if os.path.isfile(path)
        ]
        if not found:
            dirs = " or ".join(cdi.DEFAULT_SPEC_DIRS)
            return f"no {name} CDI spec in {dirs}: the engine cannot resolve {spec['kind']}=N"
        try:
            current = cdi.load_file(found[0])
        except (OSError, EnflameError, ValueError) as exc:
            return f"{found[0]} cannot be read: {exc}"
        if current.get("devices") != spec["devices"]:
            return f"{found[0]} is stale: it does not describe the node's GCUs as they are now"
    return None


def _engine_now(node: Node, record: node_modes.Record) -> node_modes.Engine:
    """The node's engine as the installer's ``auto`` would see it now (node_mode.detect's view,
    from what doctor already read; the version is the record's when the engine is the same)."""
    kubelet = os.path.isdir(node.path(node_modes.KUBELET_EVIDENCE))
    found = [view.engine for view in node.engines]
    if node.cri is not None and node.cri.source == "kubelet" and node.cri.engine in found:
        name = node.cri.engine
    elif kubelet and (cri_engines := [e for e in found if e in ("containerd", "crio")]):
        name = cri_engines[0]
    else:
        name = next((e for e in ("docker", "crio", "containerd") if e in found), "")
    version = None
    if name == record.engine and record.engine_version.count(".") >= 1:
        major, minor = record.engine_version.split(".")[:2]
        version = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
    cdi_enabled = next((v.cdi_enabled for v in node.engines if v.engine == name), None)
    return node_modes.Engine(name, version, cdi_enabled, kubelet)


def _drift(node: Node, record: node_modes.Record) -> str | None:
    """Why a mode ``auto`` chose no longer fits the node (None when it still does)."""
    if record.chosen_by != node_modes.AUTO:
        return None  # an operator's choice is theirs: it is checked, not second-guessed
    if record.engine not in ("docker", "containerd", "crio"):
        return None  # podman (or none): doctor reads no config of it to compare with
    chosen, why = node_modes.choose(_engine_now(node, record))
    if chosen == record.mode:
        return None
    return (
        f"auto chose {record.mode} for {record.engine or 'no engine'} "
        f"{record.engine_version}".rstrip()
        + f", but the node has changed: auto would now choose {chosen} ({why})"
    )


def check_node_mode(node: Node) -> list[Result]:
    """Report the node's mode; fail when the node or the device plugin does not match it."""
    try:
        record = node_modes.read(node.root)
    except ValueError as exc:
        return [Result(NAME, "fail", str(exc), _reinstall(node))]
    mode = record.mode if record else _from_engines(node)
    origin = (
        f"recorded by the installer ({record.chosen_by}: {record.reason})"
        if record
        else f"not recorded ({node_modes.MODE_FILE} is missing), read off the engines"
    )
    problems: list[str] = []
    ours = [view for view in node.checked_engines if view.runtime_path]
    if mode in ("device-specs", "cdi") and any(view.is_default for view in ours):
        problems.append(
            "enflame-container-runtime is still the engine's default runtime: every container "
            "pays for it although this mode needs no wrapper"
        )
    if mode == "runtimeclass" and not ours:
        problems.append("no engine has the enflame runtime handler that RuntimeClass enflame names")
    if mode == "default-runtime" and not any(view.is_default for view in ours):
        problems.append("enflame-container-runtime is not the engine's default runtime")
    if mode == "cdi":
        problem = _cdi_problem(node)
        if problem:
            problems.append(
                problem + " (is the toolkit DaemonSet or `enflame-ctk cdi watch` running?)"
            )
    settings = _plugin_settings(node, mode)
    plugin = "device plugin not seen running: its settings were not checked"
    plugin_problem = _plugin_problem(mode, settings) if settings is not None else None
    if settings is not None:
        if plugin_problem:
            problems.append(plugin_problem)
        plugin = "the device plugin's settings match"
    status: Status = "fail" if problems else "pass"
    fix = _fixes(node, mode) if problems else ""
    if not problems and record is None:
        status, fix = "warn", _reinstall(node)
    drift = _drift(node, record) if record is not None and not problems else None
    if drift:
        status, fix = "warn", _reinstall(node)
        problems.append(drift)
    detail = f"node mode {mode}, {origin}; " + ("; ".join(problems) if problems else plugin)
    if plugin_problem:
        fix = (
            "run the plugin with --node-mode=auto (as the chart and manifests do); restart its pod"
        )
    return [Result(NAME, status, detail, fix)]
