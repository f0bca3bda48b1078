"""``enflame-ctk migrate``: move a node off topscloud without touching its running pods.

What topscloud leaves on a node (its manual, seeds 000/001): an ``enflame`` runtime in docker's
daemon.json (as default), in containerd's config.toml (maybe as ``default_runtime_name``) or in
a CRI-O drop-in; its runtime config in ``/etc/enflame-container-runtime`` and logs under
``/var/log/enflame``; its device plugin serving ``enflame.sock``. :func:`survey` finds them,
:func:`plan` says what :func:`run` will do, and :func:`run` backs up, adopts the engine entries
(:mod:`.migrate_engines`), sets aside a runtime config ours cannot read, and hands the plugin
socket over (:mod:`.migrate_plugin`). Each step is done once: a second run finds nothing left.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit import migrate_engines, migrate_plugin
from enflame_gcu.container_toolkit.engines import base, hosts
from enflame_gcu.errors import EnflameError, InstallError
from enflame_gcu.shim import config as runtime_config

VENDOR_CONFIG = runtime_config.DEFAULT_PATH  # the vendor's path, which ours keeps (SPEC §4)
VENDOR_LOG_DIR = os.path.dirname(runtime_config.DEFAULT_LOG_FILE)
ASIDE_SUFFIX = ".topscloud"
COMMAND = "enflame-ctk migrate"


@dataclasses.dataclass(frozen=True, slots=True)
class Survey:
    """What topscloud left under one root."""

    root: str
    foreign: tuple[migrate_engines.Foreign, ...]
    vendor_config: str | None  # why ours cannot read it; None: absent or readable
    log_dir: bool
    plugin: migrate_plugin.PluginSocket
    id_problem: str | None

    @property
    def pending(self) -> bool:
        """Whether anything is left for :func:`run` to do."""
        return bool(self.foreign or self.vendor_config or self.plugin.state.startswith("vendor"))


def survey(
    root: str,
    site: hosts.ContainerdSite | None = None,
    plugin_dir: str = migrate_plugin.PLUGIN_DIR,
) -> Survey:
    """Read what topscloud left (changes nothing)."""
    foreign = tuple(migrate_engines.find(root, site))
    problem = None
    local = fileio.resolve(root, VENDOR_CONFIG)
    if os.path.lexists(local):
        try:
            runtime_config.load(local)
        except (EnflameError, OSError, ValueError) as exc:
            problem = str(exc)
    log_dir = os.path.isdir(fileio.resolve(root, VENDOR_LOG_DIR))
    plugin = migrate_plugin.inspect(root, plugin_dir)
    id_problem = None
    if plugin.state.startswith("vendor"):
        ours = {card.name for card in devices.discover(root).cards}
        id_problem = migrate_plugin.check_ids(root, ours, plugin_dir)
    return Survey(root, foreign, problem, log_dir, plugin, id_problem)


def plan(found: Survey) -> list[str]:
    """What :func:`run` does for ``found``, one line each (host paths as the host sees them)."""

    def shown(path: str) -> str:
        return base.host_view(path, found.root)

    lines = []
    for item in found.foreign:
        lines.append(
            f"adopt {item.engine}'s topscloud entries in {shown(item.file)} (backed up first; "
            f"`enflame-ctk runtime unconfigure --runtime {item.engine}` then removes exactly "
            "these):"
        )
        lines += [f"  {entry}" for entry in item.describe()]
    if found.vendor_config:
        lines.append(
            f"set {VENDOR_CONFIG} aside as {VENDOR_CONFIG}{ASIDE_SUFFIX} (our runtime cannot "
            f"read it: {found.vendor_config}); the install writes ours"
        )
    if found.log_dir:
        lines.append(f"keep {VENDOR_LOG_DIR}: our runtime logs there too")
    state = found.plugin.state
    if state == "vendor":
        lines.append(
            f"the vendor's device plugin serves {shown(found.plugin.path)}: start ours first "
            "(it stands by while another serves that socket), then run migrate again"
        )
    elif state == "vendor-ours-waiting":
        lines.append(
            f"hand {shown(found.plugin.path)} over from the vendor's plugin to ours (standing "
            "by): the kubelet switches endpoints with no moment without GCUs"
            + (f"; refused: {found.id_problem}" if found.id_problem else "")
        )
    if not lines or not found.pending:
        lines.append("nothing of topscloud's left to migrate")
    return lines


def run(
    root: str,
    site: hosts.ContainerdSite | None = None,
    plugin_dir: str = migrate_plugin.PLUGIN_DIR,
    *,
    handover_timeout: float = 60.0,
) -> list[str]:
    """Migrate what :func:`survey` finds; the lines say what was done.

    Nothing is half done per item: an entry is adopted with its backup and record together, the
    socket handed over or put back. The plugin is handed over last, and only when no device ID
    the kubelet knows would be lost; InstallError names what stopped it.
    """
    found = survey(root, site, plugin_dir)
    done = []
    now = datetime.datetime.now()
    for item in found.foreign:
        backup = migrate_engines.adopt(item, root, now)
        done.append(
            f"adopted {item.engine}'s topscloud entries in {base.host_view(item.file, root)} "
            f"(backup: {base.host_view(backup, root)})"
        )
    if found.vendor_config:
        local = fileio.resolve(root, VENDOR_CONFIG)
        aside = local + ASIDE_SUFFIX
        if os.path.lexists(aside):
            raise InstallError(f"{VENDOR_CONFIG}{ASIDE_SUFFIX} exists already; left both as is")
        os.rename(local, aside)
        done.append(f"set {VENDOR_CONFIG} aside as {VENDOR_CONFIG}{ASIDE_SUFFIX}")
    if found.plugin.state == "vendor":
        # Not an error: the node's files are migrated; the socket waits for our plugin (the
        # toolkit is installed before the plugin is deployed), and doctor says what is left.
        done.append(
            f"left for later: the vendor's device plugin serves "
            f"{base.host_view(found.plugin.path, root)} and ours is not running: deploy ours (it "
            f"stands by), then run `{COMMAND}` again"
        )
    if found.plugin.state == "vendor-ours-waiting":
        if found.id_problem:
            raise InstallError(found.id_problem)
        migrate_plugin.hand_over(found.plugin, handover_timeout)
        done.append(
            f"handed {base.host_view(found.plugin.path, root)} over to our device plugin; remove "
            "the vendor's DaemonSet now (kubectl delete -f enflame-device-plugin.yaml)"
        )
    return done or ["nothing of topscloud's left to migrate"]
