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
import stat

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit import migrate_engines, migrate_plugin
from enflame_gcu.container_toolkit.engines import base, hosts
from enflame_gcu.errors import EnflameError, InstallError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import log as runtime_log

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
    log_problem: str | None = None  # why our runtime would not log in the vendor's log dir
    log_fixable: bool = False  # the directory itself is at fault: made ours, 0755

    @property
    def pending(self) -> bool:
        """Whether anything is left for :func:`run` to do."""
        return bool(
            self.foreign
            or self.vendor_config
            or self.log_problem
            or self.plugin.state.startswith("vendor")
        )


def _log_file_problem(local: str) -> str | None:
    """Why the runtime would refuse the log file in the log directory ``local``; None if fine."""
    name = os.path.join(local, os.path.basename(runtime_config.DEFAULT_LOG_FILE))
    try:
        info = os.lstat(name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot check {name}: {exc.strerror or exc}"
    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.geteuid():
        return None
    return (
        f"{name} is not a regular file of uid {os.geteuid()} with one link (mode "
        f"{info.st_mode:o}, uid {info.st_uid}, {info.st_nlink} links): move it away"
    )


def _log_dir_problem(local: str) -> tuple[str | None, bool]:
    """(why the runtime would refuse the log directory ``local``, whether migrate can fix it).

    Fixable: a real directory whose own owner or mode is wrong, below a chain the runtime
    accepts; a link, an unsafe ancestor or a bad log file in it is refused (docs: user guide).
    """
    try:
        os.close(runtime_log.open_directory(local))
    except FileNotFoundError:
        return None, False
    except runtime_log.UnsafePath as exc:
        problem: str | None = str(exc)
    except OSError as exc:
        return f"cannot check {local}: {exc.strerror or exc}", False
    else:
        problem = None
    fixable = False
    if problem is not None:
        try:
            os.close(runtime_log.open_directory(os.path.dirname(local)))
            fixable = stat.S_ISDIR(os.lstat(local).st_mode)
        except (OSError, runtime_log.UnsafePath):
            return problem, False
    if not fixable and problem is not None:
        return problem, False
    bad_file = _log_file_problem(local)
    if bad_file is not None:
        return (f"{problem}; {bad_file}" if problem else bad_file), False
    return problem, fixable


def _repair_log_dir(local: str) -> None:
    """Make the log directory ours and writable by us alone (by fd: no link is followed)."""
    fd = os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, os.fstat(fd).st_mode & 0o755)
    finally:
        os.close(fd)


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
    local_log = fileio.resolve(root, VENDOR_LOG_DIR, follow=False)
    log_dir = os.path.isdir(local_log)
    log_problem, log_fixable = _log_dir_problem(local_log)
    plugin = migrate_plugin.inspect(root, plugin_dir)
    id_problem = None
    if plugin.state.startswith("vendor"):
        ours = {card.name for card in devices.discover(root).cards}
        id_problem = migrate_plugin.check_ids(root, ours, plugin_dir)
    return Survey(root, foreign, problem, log_dir, plugin, id_problem, log_problem, log_fixable)


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
    if found.log_problem and found.log_fixable:
        lines.append(
            f"make {VENDOR_LOG_DIR} root's and writable by root alone (our runtime would not log "
            f"there: {found.log_problem})"
        )
    elif found.log_problem:
        lines.append(f"refused: our runtime would not log in {VENDOR_LOG_DIR}: {found.log_problem}")
    elif found.log_dir:
        lines.append(f"keep {VENDOR_LOG_DIR}: our runtime logs there too")
    state = found.plugin.state
    if state == "vendor":
        lines.append(
            f"the vendor's device plugin serves {shown(found.plugin.path)}: start ours first "
            "(it stands by while another serves that socket), then run migrate again"
        )
    elif state == "unknown":
        lines.append(
            f"cannot tell who serves {shown(found.plugin.path)} ({found.plugin.listener}): "
            "nothing is moved; run this in the host's PID namespace"
        )
    elif state == "foreign":
        lines.append(
            f"not the vendor's device plugin: {found.plugin.listener}; it serves "
            f"{shown(found.plugin.path)} as no plugin of the kubelet's node would: nothing is "
            "moved; find and stop that process (a pod with a hostPath of the kubelet's "
            "directory?)"
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
    if found.log_problem and not found.log_fixable:
        raise InstallError(
            f"our runtime would not log in {VENDOR_LOG_DIR} ({found.log_problem}); fix that "
            "first: nothing was changed"
        )
    done = []
    now = datetime.datetime.now()
    if found.log_problem:
        _repair_log_dir(fileio.resolve(root, VENDOR_LOG_DIR, follow=False))
        done.append(f"made {VENDOR_LOG_DIR} root's, mode 0755 (was: {found.log_problem})")
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
    if found.plugin.state == "foreign":
        done.append(
            f"left as is: {base.host_view(found.plugin.path, root)} is not served by the "
            f"vendor's device plugin ({found.plugin.listener}); nothing was moved: stop that "
            "process"
        )
    if found.plugin.state == "vendor-ours-waiting":
        if found.id_problem:
            raise InstallError(found.id_problem)
        migrate_plugin.hand_over(found.plugin, handover_timeout)
        done.append(
            f"handed {base.host_view(found.plugin.path, root)} over to our device plugin; delete "
            "topscloud's device-plugin DaemonSet now (find it with `kubectl get daemonsets -A`; "
            "its manifest shares our manifest's file name, enflame-device-plugin.yaml: delete "
            "it by the DaemonSet's namespace and name, not with our file)"
        )
    return done or ["nothing of topscloud's left to migrate"]
