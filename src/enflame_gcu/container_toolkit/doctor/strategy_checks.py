"""Doctor check: can the node's engine honour the device plugin's device-list strategy?

``cdi-cri`` needs containerd >= 1.7 with ``enable_cdi``; ``cdi-annotations`` needs either that,
or (containerd 1.x) a runtime entry that passes the container annotations ``cdi.k8s.io/*`` on.
Whatever the strategy, a ``pod_annotations`` pattern that passes device annotations lets any
pod name devices, so it always fails.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess

from enflame_gcu import naming
from enflame_gcu.container_toolkit.doctor import processes
from enflame_gcu.container_toolkit.doctor.model import Node, Result
from enflame_gcu.container_toolkit.engines import containerd

CONTAINERD_PATHS = ("/usr/bin/containerd", "/usr/local/bin/containerd")
FIX_ANNOTATIONS = (
    "enflame-ctk runtime configure --runtime containerd --cdi-annotations --restart-engine"
)


def containerd_version(node: Node) -> tuple[int, int] | None:
    """(major, minor) of the node's containerd binary, None when it cannot be told."""
    found = next((p for p in CONTAINERD_PATHS if os.path.isfile(node.path(p))), None)
    if found is None:
        return None
    try:
        result = subprocess.run(
            [node.path(found), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\sv?(\d+)\.(\d+)\.\d+", result.stdout)
    return (int(match[1]), int(match[2])) if match else None


def strategies(node: Node) -> tuple[str, ...] | None:
    """The strategies named to doctor, else those of a running enflame-device-plugin."""
    if node.strategies is not None:
        return node.strategies
    found = [
        part.strip()
        for name, value in processes.flags(node, "enflame-device-plugin")
        if name == "--device-list-strategy"
        for part in value.split(",")
    ]
    return tuple(p for p in found if p) or None


def check_device_list_strategy(node: Node) -> list[Result]:
    """The engine passes on what the plugin's strategy uses, and pods cannot forge it."""
    views = [v for v in node.checked_engines if v.engine == "containerd" and v.runtime_path]
    if not views:
        return []
    view = views[0]
    forged = [p for p in view.pod_annotations if containerd.passes_device_annotations(p)]
    if forged:
        detail = (
            f"containerd passes the pod annotations {forged} to the GCU runtime: any pod author "
            "can name devices with them; only container annotations (set by the kubelet from "
            "the device plugin's answer) may"
        )
        fix = "enflame-ctk runtime configure --runtime containerd --restart-engine   # drops them"
        return [Result("device-list-strategy", "fail", detail, fix)]
    wanted = strategies(node)
    if not wanted:
        detail = "strategy not known (no running enflame-device-plugin seen): not checked"
        return [Result("device-list-strategy", "pass", detail)]
    version = containerd_version(node)
    resolves_cdi = view.cdi_enabled is True and version is not None and version >= (1, 7)
    shown = ".".join(map(str, version)) if version else "of unknown version"
    problems = []
    if "cdi-cri" in wanted and not resolves_cdi:
        problems.append(
            f"cdi-cri needs containerd >= 1.7 with enable_cdi = true (containerd {shown}, "
            f"enable_cdi {view.cdi_enabled}): pods get no GCU"
        )
    passes = any(
        fnmatch.fnmatchcase(naming.CDI_ANNOTATION_KEY, p) for p in view.container_annotations
    )
    if "cdi-annotations" in wanted and not resolves_cdi and not passes:
        problems.append(
            f"cdi-annotations: containerd {shown} drops the kubelet's cdi.k8s.io/* container "
            "annotations unless the enflame runtime lists them in container_annotations: "
            "pods get no GCU"
        )
    if problems:
        fix = FIX_ANNOTATIONS if "cdi-annotations" in wanted else "upgrade containerd to 1.7+"
        return [Result("device-list-strategy", "fail", "; ".join(problems), fix)]
    detail = f"containerd {shown} honours the device-list strategy {','.join(wanted)}"
    return [Result("device-list-strategy", "pass", detail)]
