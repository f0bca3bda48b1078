"""Configure docker, containerd and CRI-O to run the GCU runtime, and undo it exactly.

The library API the CLI and the installers call::

    change = engines.configure("containerd", None, RuntimeOptions(set_as_default=True),
                               host_root="/host")
    print(change.describe())
    engines.unconfigure("containerd", None, host_root="/host")
    engines.detect("/host")  # -> ["containerd"]
"""

from __future__ import annotations

from enflame_gcu import fileio
from enflame_gcu.container_toolkit.engines import base, hosts, transaction
from enflame_gcu.container_toolkit.engines.base import Change, FileChange, RuntimeOptions
from enflame_gcu.container_toolkit.engines.containerd import ContainerdEditor
from enflame_gcu.container_toolkit.engines.crio import CrioEditor
from enflame_gcu.container_toolkit.engines.docker import DockerEditor
from enflame_gcu.container_toolkit.engines.hosts import PRESETS, ContainerdSite, containerd_site
from enflame_gcu.errors import EngineConfigError

__all__ = [
    "ENGINES",
    "PRESETS",
    "Change",
    "ContainerdSite",
    "FileChange",
    "RuntimeOptions",
    "configure",
    "containerd_site",
    "default_config_path",
    "default_config_path_of",
    "detect",
    "editor",
    "unconfigure",
]

ENGINES: dict[str, base.RuntimeConfigEditor] = {
    "docker": DockerEditor(),
    "containerd": ContainerdEditor(),
    "crio": CrioEditor(),
}

detect = hosts.detect
default_config_path = hosts.default_config_path


def editor(engine: str) -> base.RuntimeConfigEditor:
    """The config editor for ``engine`` (docker, containerd or crio)."""
    try:
        return ENGINES[engine]
    except KeyError:
        raise EngineConfigError(
            f"unknown container engine {engine!r}; known: {', '.join(ENGINES)}"
        ) from None


def default_config_path_of(engine: str) -> str | None:
    """The stock config path of ``engine`` as the host sees it (None for an unknown engine)."""
    return hosts.DEFAULT_CONFIGS.get(engine)


def _config(engine: str, config_path: str | None, host_root: str) -> str:
    if config_path is None:
        return hosts.default_config_path(engine, host_root)
    # Its directories resolved (inside the jail when under it): state, lock and backups go
    # where the config really is; the file itself may stay a link (its target is edited).
    return fileio.confine(host_root, config_path, follow=False)


def configure(
    engine: str,
    config_path: str | None = None,
    options: RuntimeOptions | None = None,
    *,
    host_root: str = "/",
    dry_run: bool = False,
    step: str | None = None,
) -> Change:
    """Add the GCU runtime to ``engine``'s config (default path under ``host_root``).

    ``config_path`` is the path as this process sees it. ``host_root`` is a jail: a path under
    it has its symlinks followed inside it (never out into this process's own files), and
    paths written into configs (containerd ``imports``) are turned into paths the host sees.
    A config that is a symlink stays one: its target is edited.
    """
    path = _config(engine, config_path, host_root)
    return transaction.configure(
        editor(engine), path, options or RuntimeOptions(), host_root, dry_run, step=step
    )


def unconfigure(
    engine: str,
    config_path: str | None = None,
    *,
    host_root: str = "/",
    dry_run: bool = False,
    step: str | None = None,
) -> Change:
    """Remove exactly what :func:`configure` added to ``engine``'s config (only ``step``'s)."""
    editor(engine)
    path = _config(engine, config_path, host_root)
    return transaction.unconfigure(engine, path, dry_run, host_root, step=step)
