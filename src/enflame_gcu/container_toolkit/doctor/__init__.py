"""``enflame-ctk doctor``: the vendor manual's FAQ as checks, each with the exact fix.

Every path is read under a host root, so the same checks run on ``/``, on ``/host`` in a pod
and on a simulated node. A check never raises for what it finds; it returns Results.
The checks live by what they look at: ``gcu_checks`` (driver, device nodes),
``runtime_checks`` (runtime binary and config, engines, runc) and ``kubelet_checks``
(device-plugin dir and sockets, swap, CPU manager); ``model`` holds Result and Node.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable

from enflame_gcu import devices, fileio, node_modes
from enflame_gcu.container_toolkit.doctor import (
    engine_configs,
    gcu_checks,
    kubelet_checks,
    migration_checks,
    mode_checks,
    processes,
    runtime_checks,
    strategy_checks,
)
from enflame_gcu.container_toolkit.doctor.model import RANK, Node, Result, Status
from enflame_gcu.container_toolkit.engines import cri, hosts
from enflame_gcu.errors import EnflameError

__all__ = ["CHECKS", "Node", "Result", "Status", "inspect", "run", "worst"]

CHECKS: tuple[Callable[[Node], list[Result]], ...] = (
    gcu_checks.check_driver,
    gcu_checks.check_devices,
    runtime_checks.check_runtime_binary,
    runtime_checks.check_runtime_config,
    runtime_checks.check_engines,
    runtime_checks.check_runc,
    strategy_checks.check_device_list_strategy,
    mode_checks.check_node_mode,
    migration_checks.check_migration,
    kubelet_checks.check_kubelet,
    kubelet_checks.check_plugin_socket,
    kubelet_checks.check_swap,
    kubelet_checks.check_cpu_manager,
)


def inspect(
    root: str = "/",
    strategies: tuple[str, ...] | None = None,
    containerd: hosts.ContainerdSite | None = None,
) -> Node:
    """Read everything the checks need from the node under ``root``.

    ``containerd``: where the node's containerd keeps its config and socket (k3s, RKE2);
    None: the stock paths.

    Raises PathOutsideRootError when a path discovery reads would lead out of ``root``.
    """
    # Discovery reads these lexically (for speed): each must stay inside the root.
    fileio.require_confined(root, devices.DISCOVERY_PATHS)
    return Node(
        root,
        devices.discover(root),
        engine_configs.read_engines(root, containerd),
        processes.read_processes(root),
        strategies,
        cri.detect(root, containerd.socket if containerd is not None else None),
        containerd,
    )


def run(root: str = "/", strategies: tuple[str, ...] | None = None) -> list[Result]:
    """Every check's results for the node under ``root``, in FAQ order."""
    return run_checks(inspect(root, strategies))


def run_checks(node: Node) -> list[Result]:
    """Every check's results for ``node`` (from :func:`inspect`), in FAQ order."""
    root = node.root
    results = []
    for check in CHECKS:
        try:
            results.extend(check(node))
        except EnflameError as exc:  # e.g. a path that would leave the root: refused
            name = check.__name__.removeprefix("check_").replace("_", "-")
            results.append(Result(name, "fail", str(exc)))
    if node.containerd is not None and not node.containerd.stock:
        results = [dataclasses.replace(r, fix=for_containerd_site(r.fix, node)) for r in results]
    if root not in ("", "/"):
        results = [dataclasses.replace(r, fix=with_host_root(r.fix, root)) for r in results]
    return results


def for_containerd_site(fix: str, node: Node) -> str:
    """A fix that edits containerd's stock config, for a containerd that keeps it elsewhere.

    ``runtime configure|unconfigure --runtime containerd`` would edit /etc/containerd: the
    install with the same paths (and the recorded mode) edits the k3s/RKE2 template instead;
    a template the distribution has not rendered yet needs only its restart.
    """
    site = node.containerd
    if site is None or site.stock or "--runtime containerd" not in fix:
        return fix
    view = next((v for v in node.engines if v.engine == "containerd"), None)
    if view is not None and view.problem and engine_configs.RENDER_PENDING in view.problem:
        return f"systemctl restart {site.services[0]}" + "".join(
            f"   # or: systemctl restart {unit}" for unit in site.services[1:2]
        )
    try:
        record = node_modes.read(node.root)
    except ValueError:
        record = None
    mode = record.mode if record is not None else node_modes.AUTO
    if site.preset and site == hosts.PRESETS[site.preset]:
        where = f"--preset {site.preset}"
    else:
        where = f"--containerd-config {shlex.quote(site.config)} --containerd-socket " + (
            f"{shlex.quote(site.socket)} --containerd-service {','.join(site.services)}"
        )
    return f"enflame-ctk install --mode {mode} --restart-engine {where}"


_CTK = re.compile(r"(enflame-ctk [^;&|#]*?)(\s*(?:[;&|#]|$))")


def with_host_root(fix: str, root: str) -> str:
    """The fix's ``enflame-ctk`` commands with the ``--host-root`` doctor was given, kept."""
    if "enflame-ctk " not in fix or "--host-root" in fix:
        return fix
    return _CTK.sub(lambda m: f"{m.group(1)} --host-root {shlex.quote(root)}{m.group(2)}", fix)


def worst(results: list[Result]) -> Status:
    """The most severe status among ``results`` (pass when there are none)."""
    return max((r.status for r in results), key=RANK.__getitem__, default="pass")
