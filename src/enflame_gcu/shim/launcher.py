"""A minimal-start launcher for the runtime: ``python -IS``, no site scan, no ``.pth`` files.

The console script pip generates starts Python normally (site-packages scan, ``.pth`` files),
which costs tens of milliseconds on every runc call. The launcher puts only the directory that
holds the ``enflame_gcu`` package on ``sys.path`` and calls the runtime's ``main``.
"""

from __future__ import annotations

import os
import sys

import enflame_gcu
from enflame_gcu import fileio

TEMPLATE = """\
#!{python} -IS
# enflame-container-runtime launcher, written by `enflame-ctk system install-runtime-launcher`.
# -I -S: no user site, no site-packages scan, no .pth files; only the package dir below.
import sys
sys.path.insert(0, {package_dir!r})
from enflame_gcu.shim.main import main
sys.exit(main())
"""


def default_package_dir() -> str:
    """The directory that contains the installed ``enflame_gcu`` package."""
    return os.path.dirname(os.path.dirname(os.path.abspath(enflame_gcu.__file__)))


def render(python: str, package_dir: str) -> str:
    """The launcher script's text."""
    if not os.path.isabs(python) or any(c.isspace() for c in python):
        raise ValueError(f"python must be an absolute path without spaces, got {python!r}")
    return TEMPLATE.format(python=python, package_dir=package_dir)


def write_launcher(path: str, python: str | None = None, package_dir: str | None = None) -> str:
    """Write the launcher atomically with mode 0755; return its text."""
    text = render(python or sys.executable, package_dir or default_package_dir())
    fileio.atomic_write_text(path, text, mode=0o755)
    return text
