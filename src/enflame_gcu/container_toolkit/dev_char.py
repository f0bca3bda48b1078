"""``/dev/char/<major>:<minor>`` links for GCU nodes, so runc keeps device access (runc #3671).

runc 1.1.3-1.1.6 with the systemd cgroup driver looks device nodes up through ``/dev/char`` when
systemd reloads; without a link it drops the allow rule and the container loses its GCUs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from enflame_gcu import devices, fileio

_NODE = re.compile(r"^(gcuctl|gcu\d+|vgcu\d+)$")


@dataclass(frozen=True, slots=True)
class LinkAction:
    """What was (or would be) done for one device node."""

    link: str
    target: str
    action: str  # "created", "replaced", "unchanged", "skipped: <why>"


def plan(root: str) -> list[tuple[str, str]]:
    """(link path, relative target) for every GCU character device under ``root``'s /dev."""
    try:
        names = sorted(os.listdir(fileio.resolve(root, "/dev")))
    except OSError:
        return []
    links = []
    for name in names:
        if not _NODE.match(name):
            continue
        node, problem = devices.stat_node(root, f"/dev/{name}", simulated=False)
        if problem is None and node.is_char:
            links.append((f"/dev/char/{node.major}:{node.minor}", f"../{name}"))
    return links


def create_links(root: str, dry_run: bool = False) -> list[LinkAction]:
    """Create the links idempotently; a regular file in the way is reported, never removed."""
    actions = []
    for link, target in plan(root):
        full = fileio.resolve(root, link, follow=False)
        if os.path.islink(full):
            if os.readlink(full) == target:
                actions.append(LinkAction(link, target, "unchanged"))
                continue
            action = "replaced"
        elif os.path.lexists(full):
            actions.append(LinkAction(link, target, "skipped: a non-link file is in the way"))
            continue
        else:
            action = "created"
        if not dry_run:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            fileio.replace_symlink(target, full)
        actions.append(LinkAction(link, target, action if not dry_run else f"would be {action}"))
    return actions
