"""Which Python a host interpreter is, told before an install changes anything.

The runtime launcher runs with the host's own ``python3`` (``-IS``, standard library only), so
the host interpreter must be one the package supports. From a DaemonSet the host's binary
cannot simply be run (its libraries are the host's), so the version is read from what the
interpreter is: the versioned name its links lead to (``python3 -> python3.11``), else the one
standard library next to it (``<prefix>/lib/python3.11/os.py``); on the host itself (root
``/``) it is asked.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

from enflame_gcu import fileio

# The oldest and newest interpreters the package is tested with (pyproject requires-python).
MINIMUM = (3, 10)
TESTED_UP_TO = (3, 13)
_VERSIONED = re.compile(r"^python(\d+)\.(\d+)$")
_LIBRARY = re.compile(r"/lib/python(\d+)\.(\d+)/os\.py$")


def version(root: str, python: str) -> tuple[int, int] | None:
    """``(major, minor)`` of the host interpreter ``python`` (a host path), or None if unknown."""
    local = fileio.resolve(root, python, follow=True)
    if not os.path.isfile(local):
        return None
    named = _VERSIONED.match(os.path.basename(local))
    if named:
        return int(named.group(1)), int(named.group(2))
    prefix = os.path.dirname(os.path.dirname(local))
    libraries = {
        (int(m.group(1)), int(m.group(2)))
        for path in glob.glob(os.path.join(glob.escape(prefix), "lib", "python3.*", "os.py"))
        if (m := _LIBRARY.search(path))
    }
    if len(libraries) == 1:
        return libraries.pop()
    if root in ("", "/"):
        try:
            answer = subprocess.run(
                [local, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=20, check=True,
            )  # fmt: skip
            major, minor = answer.stdout.split()
            return int(major), int(minor)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    return None


def problem(root: str, python: str) -> str | None:
    """Why ``python`` cannot run the runtime launcher, or None when it can."""
    found = version(root, python)
    wanted = f"CPython {MINIMUM[0]}.{MINIMUM[1]} or newer"
    if found is None:
        return (
            f"cannot tell which Python {python} on the host is (no versioned name such as "
            f"python3.11 behind it, no single lib/python3.X beside it); the runtime needs "
            f"{wanted}: pass --python with the host path of a versioned interpreter"
        )
    if found < MINIMUM:
        return (
            f"{python} on the host is Python {found[0]}.{found[1]}; the runtime needs {wanted} "
            "(install a newer python3 on the node, or pass --python with one)"
        )
    return None
