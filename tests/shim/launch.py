"""Start the runtime the way it is installed: the sh front, or pip's console script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import launcher

CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "enflame-container-runtime")


def write_launcher(directory: str, name: str = "enflame-container-runtime") -> str:
    """Write the installed front (``sh``, then ``python -IS``) for this interpreter and checkout,
    with its verdict file in ``directory``; returns its path."""
    path = os.path.join(directory, name)
    launcher.write_launcher(path, sys.executable, verdict=verdict_path(directory))
    return path


def verdict_path(directory: str) -> str:
    """Where the front written by :func:`write_launcher` in ``directory`` keeps its verdict."""
    return os.path.join(directory, "front-verdict", "verdict")


def run(
    wrapper: str,
    args: Sequence[str],
    config: str,
    *,
    cwd: str | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[bytes]:
    """Run the wrapper with runc-style ``args`` and the given runtime config; capture output."""
    env = dict(os.environ, **{runtime_config.PATH_ENV: config}, **(extra_env or {}))
    return subprocess.run(
        [wrapper, *args], capture_output=True, env=env, cwd=cwd, timeout=timeout, check=False
    )
