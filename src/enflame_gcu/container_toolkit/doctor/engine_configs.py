"""What docker's, containerd's and CRI-O's configs on a node say about the enflame runtime.

Read with the parsers the engine editors use (``engines/``), so doctor sees a config the way
``runtime configure`` wrote it; containerd imports and CRI-O drop-ins are merged as the engines do.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from enflame_gcu import fileio
from enflame_gcu.container_toolkit.engines import base, containerd, crio, formats, hosts, storage
from enflame_gcu.errors import EnflameError


@dataclass(frozen=True, slots=True)
class EngineView:
    """What an engine's config says about the enflame runtime."""

    engine: str
    runtime_path: str | None
    is_default: bool
    systemd_cgroup: bool | None
    problem: str | None = None
    # containerd: what our runtime entry passes on, and whether the CRI plugin resolves CDI.
    pod_annotations: tuple[str, ...] = ()
    container_annotations: tuple[str, ...] = ()
    cdi_enabled: bool | None = None
    cri_disabled: bool = False  # containerd: its CRI plugin is in disabled_plugins (docker's)


def _ours(runtimes: Any, path_of: Callable[[Any], Any]) -> tuple[str | None, str | None]:
    """(name, binary) of the runtime entry that runs enflame-container-runtime, if any."""
    if not isinstance(runtimes, dict):
        return None, None
    for name, entry in runtimes.items():
        binary = path_of(entry) if isinstance(entry, dict) else None
        if isinstance(binary, str) and binary.endswith("enflame-container-runtime"):
            return name, binary
    return None, None


def _toml(path: str, root: str) -> dict[str, Any]:
    text = fileio.read_text(storage.target(path, root))
    return dict(formats.plain(formats.FORMATS["toml"].parse(text, path)))


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _docker_view(root: str) -> EngineView:
    path = storage.target(hosts.default_config_path("docker", root), root)
    data = fileio.read_json(path)
    name, binary = _ours(data.get("runtimes"), lambda entry: entry.get("path"))
    options = " ".join(str(o) for o in data.get("exec-opts") or [])
    systemd = "cgroupdriver=systemd" in options or None
    default = name is not None and data.get("default-runtime") == name
    return EngineView("docker", binary, default, systemd)


def containerd_config(site: hosts.ContainerdSite | None) -> str:
    """The config containerd loads (host path): k3s/RKE2 render config.toml from the template."""
    site = site or hosts.ContainerdSite()
    if site.template:
        return os.path.join(os.path.dirname(site.config), "config.toml")
    return site.config


RENDER_PENDING = "not rendered yet"


def _not_rendered(root: str, site: hosts.ContainerdSite | None) -> str | None:
    """k3s/RKE2: why the rendered config lacks the runtime when the template has it."""
    if site is None or not site.template:
        return None
    try:
        template = hosts.choose_template(root, site.config)
    except EnflameError:
        return None
    if template.seed:
        return None
    try:
        text = fileio.read_text(fileio.resolve(root, template.template))
    except (OSError, EnflameError):
        return None
    if "enflame-container-runtime" not in text:
        return None
    return (
        f"{template.template} has the enflame runtime, {template.rendered} does not: "
        f"{RENDER_PENDING} ({site.preset or 'the distribution'} renders it when it restarts)"
    )


# The CRI plugin's names in containerd's disabled_plugins (docker's containerd.io lists "cri").
CRI_PLUGINS = {"cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"}


def _containerd_view(root: str, site: hosts.ContainerdSite | None = None) -> EngineView:
    path = fileio.resolve(root, containerd_config(site), follow=False)
    document = _toml(path, root)
    for pattern in document.get("imports") or []:
        # containerd merges imported files over the main config (drop-ins of version 3).
        directory = fileio.resolve(root, os.path.dirname(pattern))
        for imported in sorted(glob.glob(os.path.join(directory, os.path.basename(pattern)))):
            _merge(document, _toml(imported, root))
    version = containerd.config_version(document, path)
    table = base.lookup(document, (*containerd.CRI_TABLE[version], "containerd")) or {}
    runtimes = table.get("runtimes") or {}
    name, binary = _ours(runtimes, lambda entry: (entry.get("options") or {}).get("BinaryName"))
    runc = base.lookup(runtimes, ("runc", "options", "SystemdCgroup"))
    problem = _not_rendered(root, site) if name is None else None
    ours = base.lookup(runtimes, (name, "options", "SystemdCgroup")) if name else None
    if name is not None and runc is True and ours is not True:
        problem = (
            f"runc uses SystemdCgroup = true but runtime {name!r} does not: its pods "
            "crash-loop on systemd hosts"
        )
    default = name is not None and table.get("default_runtime_name") == name
    ours_entry = runtimes.get(name) if name else None
    ours_entry = ours_entry if isinstance(ours_entry, dict) else {}
    cri = base.lookup(document, containerd.CRI_TABLE[version]) or {}
    return EngineView(
        "containerd",
        binary,
        default,
        runc if runc is not None else None,
        problem,
        tuple(str(p) for p in ours_entry.get("pod_annotations") or ()),
        tuple(str(p) for p in ours_entry.get("container_annotations") or ()),
        cri.get("enable_cdi") is True,
        cri_disabled=bool(set(map(str, document.get("disabled_plugins") or ())) & CRI_PLUGINS),
    )


def _crio_view(root: str) -> EngineView:
    config = hosts.default_config_path("crio", root)
    runtime = crio.effective_runtime_config(config, skip="", host_root=root)
    name, binary = _ours(runtime.get("runtimes"), lambda entry: entry.get("runtime_path"))
    default = name is not None and runtime.get("default_runtime") == name
    # CRI-O's cgroup_manager defaults to systemd.
    systemd = runtime.get("cgroup_manager", "systemd") == "systemd"
    return EngineView("crio", binary, default, systemd)


VIEWS: dict[str, Callable[[str], EngineView]] = {  # containerd's: _containerd_view(root, site)
    "docker": _docker_view,
    "containerd": _containerd_view,
    "crio": _crio_view,
}


def read_engines(
    root: str, containerd: hosts.ContainerdSite | None = None
) -> tuple[EngineView, ...]:
    """What each engine found under ``root`` has configured for the enflame runtime.

    ``containerd``: where its config is (k3s/RKE2: the config.toml rendered from the
    template, which is what containerd runs with); None: the stock path.
    """
    views = []
    for engine in hosts.detect(root, containerd):
        config = hosts.DEFAULT_CONFIGS[engine]
        if engine == "containerd":
            config = containerd_config(containerd)
        try:
            if engine == "containerd":
                views.append(_containerd_view(root, containerd))
            else:
                views.append(VIEWS[engine](root))
        except FileNotFoundError:
            views.append(EngineView(engine, None, False, None, f"{config} does not exist"))
        except (OSError, ValueError, EnflameError) as exc:
            views.append(EngineView(engine, None, False, None, f"cannot read {config}: {exc}"))
    return tuple(views)
