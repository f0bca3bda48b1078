"""Make a container engine load its new config, from the host or from the installer's pod."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from enflame_gcu import fileio
from enflame_gcu.container_toolkit import engines
from enflame_gcu.container_toolkit.engines import hosts
from enflame_gcu.errors import EnflameError


def reload_engine(change: engines.Change, host_root: str) -> str:
    """Signal or restart the engine; from a container, systemctl runs chrooted into the host."""
    if host_root in ("", "/"):
        return engines.reload(change, host_root)
    runtimes_only = all(path.startswith("runtimes.") for path in change.paths)

    def chrooted(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["chroot", host_root, *command],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def which(name: str) -> str | None:
        found = (f"{d}/{name}" for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"))
        return next((p for p in found if os.access(fileio.resolve(host_root, p), os.X_OK)), None)

    return hosts.reload_engine(
        change.engine, runtimes_only, host_root, runner=chrooted, which=which
    )


def reload_or_warn(change: engines.Change, host_root: str) -> str:
    """What reloading did, or a warning line: the config change stands either way."""
    try:
        return reload_engine(change, host_root)
    except EnflameError as exc:
        return f"warning: {exc}"
