"""Keep the node's CDI specs current (node mode ``cdi``): at start, and within a second of a change.

Who owns the specs: the toolkit's long-running installer (``enflame-ctk install --wait``, the
toolkit DaemonSet), or ``enflame-ctk cdi watch`` where no DaemonSet runs. Not the device plugin:
it is unprivileged with /dev and /sys mounted read-only, and CDI specs are engine configuration
that podman also reads where no kubelet (and so no plugin) runs. The installer already holds
the host's root, records every file it writes and removes them when it is stopped, which is
what "removed on uninstall" needs.

Always current: inotify on /dev (card, vGCU and gcuctl nodes), the PCI bus (hotplug, unbind)
and /sys/module (driver unload, reload, upgrade) wakes :func:`keep` at once; a rescan every
few seconds catches what events miss. Each spec is rewritten only when its text changes, by
``fileio.atomic_write_text`` (a hidden temporary name that no CDI reader loads, then
``rename``), so an engine reads the old spec or the new one, never a partial or missing one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING

from enflame_gcu import devices, fileio, naming
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.errors import EnflameError

if TYPE_CHECKING:
    from enflame_gcu.support import inotify

log = logging.getLogger(__name__)

KINDS = ("gcu", "vgcu")
FORMAT = "yaml"
RESCAN_SECONDS = 5.0
# The names of the files written here (spec_paths), for their temp files.
TEMP_PREFIXES = tuple(f"enflame.com-{kind}.{FORMAT}" for kind in KINDS)
# The first line of every spec the keeper writes: what it may rewrite or remove. A spec file
# without it at one of our names is someone else's (an operator's own enflame.com-vgcu.yaml)
# and is never replaced or deleted.
MARKER = "# Written by enflame-ctk (CDI keeper): rewritten as the node's GCUs change.\n"


def spec_paths(output_dir: str) -> list[str]:
    """Every spec file the keeper may write in ``output_dir`` (one per device kind)."""
    return [os.path.join(output_dir, f"enflame.com-{kind}.{FORMAT}") for kind in KINDS]


def _read(path: str) -> str | None:
    try:
        return fileio.read_regular(path).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # missing, not a file or not text: rewritten


def ours(path: str, owned: Collection[str] = ()) -> bool:
    """Whether the spec at ``path`` is the keeper's to rewrite or remove (or is absent)."""
    if path in owned or not os.path.lexists(path):
        return True
    mode = os.lstat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        return True  # a FIFO or device planted there is no one's spec: no engine could read it
    text = _read(path)
    return text is not None and text.startswith(MARKER)


def refresh(root: str, output_dir: str, owned: Collection[str] = ()) -> list[str]:
    """Make ``output_dir`` hold exactly the specs of the GCUs under ``root``; return what changed.

    A kind with no usable device has its file removed (an engine then refuses the name with a
    clear error instead of injecting nodes that are gone). PathOutsideRootError when ``root``'s
    /sys or /dev leads out of it (discovery would read this process's own), as for generate.
    Only files the keeper wrote (its :data:`MARKER`) or the caller says are ours (``owned``,
    paths as seen here) are touched.
    """
    fileio.require_confined(root, devices.DISCOVERY_PATHS)
    # A keeper or installer killed mid-write left a temp file: nothing else would remove it.
    changed = [
        f"{path} removed (left by an interrupted write)"
        for path in fileio.remove_stale_temps(output_dir, TEMP_PREFIXES)
    ]
    inventory = devices.discover(root)
    try:
        specs = cdi.build_specs(inventory)
    except EnflameError as exc:
        log.info("no CDI spec for this node: %s", exc)
        specs = []
    wanted = {
        os.path.join(output_dir, f"{named.file_name}.{FORMAT}"): MARKER
        + cdi.render(named.spec, FORMAT)
        for named in specs
    }
    if wanted:
        os.makedirs(output_dir, exist_ok=True)
    for path, text in wanted.items():
        if not ours(path, owned):
            changed.append(f"{path}: not written by enflame-ctk, left as it is (move it away)")
        elif _read(path) != text:
            fileio.atomic_write_text(path, text, mode=0o644)
            changed.append(f"{path} written")
    for path in spec_paths(output_dir):
        if path not in wanted and os.path.lexists(path) and ours(path, owned):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            changed.append(f"{path} removed")
    return changed


def watched_directories(root: str) -> list[str]:
    """Where a change of the node's GCUs shows up first."""
    paths = ["/dev", naming.PCI_DEVICES, "/sys/module", "/sys/module/enflame"]
    return [fileio.host_path(root, path) for path in paths]


async def keep(
    root: str, output_dir: str, stop: threading.Event, interval: float = RESCAN_SECONDS
) -> None:
    """Refresh at start, then on every change under ``root`` until ``stop`` is set."""
    # Poll ``stop`` often: it is set from a signal handler outside the event loop.
    tick = min(interval, 0.25)
    watcher: inotify.ChangeWatcher | None
    try:
        # Imported here: an install without asyncinotify (a hand-made one; the .deb, .rpm and
        # bundle carry it) still works, the specs then following the periodic rescan only.
        from enflame_gcu.support import inotify  # noqa: PLC0415

        watcher = inotify.ChangeWatcher(watched_directories(root)).__enter__()
    except (OSError, ImportError) as exc:
        log.warning("inotify unavailable (%s): CDI specs follow %ss rescans only", exc, interval)
        watcher = None
    loop = asyncio.get_running_loop()
    since = loop.time() - interval
    try:
        while not stop.is_set():
            woke = False
            if watcher is not None:
                # A directory watched only now (the driver's, back after a reload) may have
                # changed before its watch: look once, as for an event.
                woke = watcher.refresh()
                woke = bool(await watcher.wait(0 if woke else tick)) or woke
            else:
                await asyncio.sleep(tick)
            if woke or loop.time() - since >= interval:
                since = loop.time()
                try:
                    for line in refresh(root, output_dir):
                        log.info("%s", line)
                except (OSError, EnflameError) as exc:  # retried on the next change or rescan
                    log.warning("refreshing the CDI specs failed: %s", exc)
    finally:
        if watcher is not None:
            watcher.__exit__(None, None, None)


def run_until(root: str, output_dir: str, stop: threading.Event) -> None:
    """:func:`keep` in its own event loop (the installer's ``--wait`` and ``cdi watch``)."""
    asyncio.run(keep(root, output_dir, stop))
