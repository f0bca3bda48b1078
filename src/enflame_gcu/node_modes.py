"""Node modes: how a GCU node puts the kubelet's cards into containers, and what that costs.

One table, used by the installer (what to put on the node), the device plugin (what to answer
in Allocate), doctor (whether the two agree) and the docs::

    mode             engines                      plugin answers          installed
    device-specs     any CRI engine               DeviceSpecs + env       nothing
    cdi              containerd>=1.7 (enable_cdi),  CDI names + env         CDI specs, kept current
                     containerd 2.x, CRI-O, podman
    runtimeclass     containerd, CRI-O, docker    env                     wrapper as handler enflame
    default-runtime  docker, containerd, CRI-O    env                     wrapper as default runtime

:func:`choose` picks the mode for a node from its engine and version; an explicit choice is
checked by :func:`refuse` (fail closed: a mode the engine cannot honour is named, not installed).
The chosen mode is recorded in :data:`MODE_FILE` so the device plugin (``--node-mode auto``)
and doctor read what the installer decided.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from enflame_gcu import fileio
from enflame_gcu.errors import EnflameError

MODE_FILE = "/etc/enflame-gcu/node-mode.json"
# An operator's choice for one node: the mode's name on one line. ``auto`` honours it, so one
# cluster-wide DaemonSet or chart can still give single nodes another mode.
CHOICE_FILE = "/etc/enflame-gcu/mode"
FORMAT_VERSION = "v1"
AUTO = "auto"
# When no installer recorded a mode: the one that works on every CRI engine and adds nothing.
FALLBACK = "device-specs"
# What tells the installer a kubelet runs (or will run) here; node_mode.detect looks for it.
KUBELET_EVIDENCE = "/var/lib/kubelet"


@dataclass(frozen=True, slots=True)
class NodeMode:
    """One row of the node-mode matrix."""

    name: str
    strategies: tuple[str, ...]  # the device plugin's --device-list-strategy
    pass_device_specs: bool  # the device plugin's --pass-device-specs
    wrapper: str  # "none", "handler" (extra runtime named enflame) or "default"
    cdi_specs: bool  # CDI specs must exist and stay current on the node
    summary: str


MODES: dict[str, NodeMode] = {
    mode.name: mode
    for mode in (
        NodeMode(
            "device-specs",
            ("envvar",),
            True,
            "none",
            False,
            "the kubelet hands the plugin's DeviceSpecs to the engine; nothing of ours runs",
        ),
        NodeMode(
            "cdi",
            ("envvar", "cdi-cri"),
            False,
            "none",
            True,
            "the engine injects the CDI devices the plugin names; nothing of ours runs",
        ),
        NodeMode(
            "runtimeclass",
            ("envvar",),
            False,
            "handler",
            False,
            "the wrapper runs only for pods with runtimeClassName: enflame",
        ),
        NodeMode(
            "default-runtime",
            ("envvar",),
            False,
            "default",
            False,
            "the wrapper is the engine's default runtime and runs for every container",
        ),
    )
}
NAMES = tuple(MODES)


@dataclass(frozen=True, slots=True)
class Engine:
    """A node's container engine as detected: name, (major, minor) version, CDI switched on."""

    name: str  # docker, containerd, crio, podman; "" when none was found
    version: tuple[int, int] | None = None
    cdi_enabled: bool | None = None  # containerd: enable_cdi in its CRI config
    kubelet: bool = True  # the node runs a kubelet

    def describe(self) -> str:
        """``containerd 1.6`` / ``no engine``."""
        if not self.name:
            return "no engine"
        shown = ".".join(map(str, self.version)) if self.version else "(version unknown)"
        return f"{self.name} {shown}"


def native_cdi(engine: Engine) -> bool:
    """Whether the engine resolves CDI device names itself (SPEC §5)."""
    if engine.name in ("crio", "podman"):
        return True
    if engine.name == "containerd" and engine.version is not None:
        if engine.version >= (2, 0):
            return engine.cdi_enabled is not False  # on by default in 2.x
        return engine.version >= (1, 7) and engine.cdi_enabled is True
    if engine.name == "docker" and engine.version is not None:
        return engine.version >= (25, 0) and engine.cdi_enabled is True
    return False


def choose(engine: Engine) -> tuple[str, str]:
    """The mode for a node whose engine is ``engine``, and why.

    A Kubernetes node gets ``device-specs`` on every CRI engine: it is tested here against the
    real containerd 1.6, needs no engine change and keeps working under the static CPU manager.
    docker keeps the vendor's ``default-runtime`` (docker run has no kubelet to pass devices);
    a host without a kubelet gets ``cdi`` when its engine resolves CDI itself (podman), and a
    containerd with no kubelet configured yet ``device-specs``: missing evidence never buys the
    wrapper for every container (an explicit ``default-runtime`` does).
    """
    described = engine.describe()
    if engine.name == "docker":
        return "default-runtime", f"{described}: docker runs containers outside the CRI"
    if engine.name == "podman":
        # A kubelet directory beside podman is no CRI engine to hand DeviceSpecs to.
        return "cdi", (
            f"{described} is no CRI engine (no kubelet hands it DeviceSpecs) and resolves CDI "
            "names itself"
        )
    if not engine.kubelet and native_cdi(engine):
        return "cdi", f"{described} resolves CDI names itself and no kubelet runs here"
    if not engine.kubelet and engine.name in ("containerd", "crio"):
        # A CRI engine with no kubelet configured yet is most often a node being built (an
        # image being baked, before `kubeadm join`): no evidence for the wrapper that every
        # container would then pay for. The mode that installs nothing, and how to revisit it.
        return FALLBACK, (
            f"{described} and no kubelet configured yet ({KUBELET_EVIDENCE} is missing): "
            "the mode that changes nothing; run the install with --mode auto again once the "
            "kubelet is set up (the toolkit DaemonSet decides then by itself), or choose "
            "--mode default-runtime for a host that runs containers without Kubernetes"
        )
    if not engine.kubelet:
        return "default-runtime", f"{described} without a kubelet: only the wrapper selects cards"
    if engine.name in ("containerd", "crio"):
        return "device-specs", f"{described}: the kubelet passes DeviceSpecs through the CRI"
    return FALLBACK, f"{described}: nothing to configure, the kubelet passes DeviceSpecs"


def refuse(mode: str, engine: Engine) -> str | None:
    """Why ``mode`` cannot work with ``engine``; None when it can."""
    if mode not in MODES:
        return f"unknown node mode {mode!r}; valid: {AUTO}, {', '.join(NAMES)}"
    described = engine.describe()
    if mode == "cdi" and not native_cdi(engine):
        return (
            f"node mode cdi needs an engine that resolves CDI itself (containerd >= 1.7 with "
            f"enable_cdi = true, containerd 2.x, CRI-O, podman, docker >= 25 with CDI on); "
            f"this node has {described}"
        )
    if mode == "device-specs" and engine.name == "docker":
        return (
            "node mode device-specs needs a CRI engine the kubelet talks to (containerd, CRI-O); "
            "docker itself never sees the plugin's DeviceSpecs: use default-runtime"
        )
    if mode == "device-specs" and engine.name == "podman":
        return (
            f"node mode device-specs needs a CRI engine the kubelet talks to; {described} is "
            "none, and nothing would hand it the plugin's DeviceSpecs: use cdi "
            "(podman run --device enflame.com/gcu=N)"
        )
    if mode == "device-specs" and not engine.kubelet and engine.name not in ("containerd", "crio"):
        return (
            f"node mode device-specs needs a kubelet and a CRI engine to deliver the cards; this "
            f"host has no kubelet ({KUBELET_EVIDENCE} is missing) and {described}: install "
            "containerd or CRI-O with the kubelet first, or podman and use cdi"
        )
    if mode in ("runtimeclass", "default-runtime") and engine.name == "podman":
        return (
            f"node mode {mode} configures docker, containerd or CRI-O; podman has no runtime "
            "config of ours: use cdi (podman run --device enflame.com/gcu=N)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Record:
    """What the installer decided for this node (the content of :data:`MODE_FILE`)."""

    mode: str
    engine: str
    engine_version: str
    chosen_by: str  # "auto" or "explicit"
    reason: str

    def to_json(self) -> str:
        """The file's text."""
        document = {
            "version": FORMAT_VERSION,
            "mode": self.mode,
            "engine": self.engine,
            "engineVersion": self.engine_version,
            "chosenBy": self.chosen_by,
            "reason": self.reason,
        }
        return json.dumps(document, indent=2) + "\n"


def parse(text: str, where: str) -> Record:
    """A :class:`Record` from the file's text; ValueError naming what is wrong."""
    try:
        document = fileio.parse_json(text, where)
    except fileio.NestingError as exc:
        raise ValueError(str(exc)) from exc
    except ValueError as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise ValueError(f"{where}: expected a JSON object with version {FORMAT_VERSION!r}")
    mode = document.get("mode")
    if mode not in MODES:
        raise ValueError(f"{where}: unknown mode {mode!r}; valid: {', '.join(NAMES)}")
    fields = ("engine", "engineVersion", "chosenBy", "reason")
    values = [document.get(key, "") for key in fields]
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: {', '.join(fields)} must be strings")
    return Record(mode, *values)


def read(root: str = "/") -> Record | None:
    """The node's recorded mode under ``root``; None when no installer recorded one.

    ValueError when the file exists but cannot be used (the caller must fail closed).
    """
    try:
        path = fileio.resolve(root, MODE_FILE)
    except EnflameError as exc:
        raise ValueError(str(exc)) from exc
    try:
        text = fileio.read_text(path, 65536)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {MODE_FILE}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{MODE_FILE} is not UTF-8 text: {exc}") from exc
    return parse(text, MODE_FILE)


def local_path(root: str) -> str:
    """Where :data:`MODE_FILE` is under ``root`` (its directory resolved in the jail)."""
    return os.path.join(fileio.resolve(root, os.path.dirname(MODE_FILE)), "node-mode.json")


def read_choice(root: str = "/") -> str | None:
    """The operator's per-node choice (:data:`CHOICE_FILE`), None when there is none.

    ValueError naming the file when it holds anything but one known mode.
    """
    try:
        text = fileio.read_text(fileio.resolve(root, CHOICE_FILE), 4096)
    except FileNotFoundError:
        return None
    except (OSError, EnflameError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {CHOICE_FILE}: {exc}") from exc
    words = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    chosen = [word for word in words if word]
    if len(chosen) != 1 or chosen[0] not in MODES:
        raise ValueError(
            f"{CHOICE_FILE} must hold one node mode ({', '.join(NAMES)}), found {text.strip()!r}"
        )
    return chosen[0]
