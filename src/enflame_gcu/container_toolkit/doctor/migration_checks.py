"""Doctor check: what topscloud left on the node, and a migration that did not finish.

A node still carrying the vendor's runtime entries (unrecorded by us), a runtime config ours
cannot read, or the vendor's plugin on ``enflame.sock`` is pending migration. Next to anything
of ours (a recorded node mode, an adopted entry, a config set aside) it is half migrated: a
failure whose fix is the one command that finishes it. Alone, it is a topscloud node: a warning.
"""

from __future__ import annotations

import os

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import migrate, migrate_engines
from enflame_gcu.container_toolkit.doctor.model import Node, Result
from enflame_gcu.container_toolkit.engines import hosts
from enflame_gcu.errors import EnflameError

NAME = "topscloud"


def _ours_present(node: Node) -> bool:
    if os.path.lexists(node.path(node_modes.MODE_FILE)):
        return True
    if os.path.lexists(node.path(migrate.VENDOR_CONFIG + migrate.ASIDE_SUFFIX)):
        return True
    return any(
        migrate_engines.adopted(node.root, engine, node.containerd)
        for engine in hosts.detect(node.root, node.containerd)
    )


def check_migration(node: Node) -> list[Result]:
    """Pass when nothing of topscloud's is left; fail on a half-migrated node."""
    try:
        found = migrate.survey(node.root, node.containerd)
    except (EnflameError, OSError, ValueError) as exc:
        return [Result(NAME, "fail", f"cannot tell what topscloud left: {exc}")]
    if not found.pending and found.plugin.state == "unknown":
        detail = (
            f"cannot tell who serves {found.plugin.path} ({found.plugin.listener}): the "
            "listener's process is not visible from here"
        )
        return [Result(NAME, "warn", detail, "run enflame-ctk doctor in the host's PID namespace")]
    if not found.pending and found.plugin.state == "foreign":
        detail = (
            f"{found.plugin.path} is served by a process that is not the vendor's device plugin "
            f"nor ours: {found.plugin.listener}"
        )
        fix = "stop that process (a pod with a hostPath of the kubelet's directory?)"
        return [Result(NAME, "warn", detail, fix)]
    if not found.pending:
        return [Result(NAME, "pass", "nothing of topscloud's is left to migrate")]
    left = [line for line in migrate.plan(found) if not line.startswith(("  ", "keep "))]
    if _ours_present(node):
        detail = "half migrated from topscloud: " + "; ".join(left)
        return [Result(NAME, "fail", detail, migrate.COMMAND)]
    detail = "a topscloud node: " + "; ".join(left)
    return [Result(NAME, "warn", detail, f"{migrate.COMMAND} --dry-run   # then without it")]
