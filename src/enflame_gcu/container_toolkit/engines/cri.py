"""Which container engine this node's kubelet runs: its CRI endpoint, else the first socket found.

One answer for every tool: ``enflame-ctk doctor`` checks that engine, the installer chooses a
node mode for it, and ``deploy/k8s-config.sh`` configures it (through ``enflame-ctk runtime
detect``; its shell fallback follows the same rules, and a test holds the two to one table).

The kubelet's endpoint, as the kubelet itself would take it (the last word wins):

1. a running kubelet (``HOST_ROOT/proc/*/cmdline``): its ``--container-runtime-endpoint``, else
   ``containerRuntimeEndpoint`` in the config file its ``--config`` names;
2. no kubelet running: ``--container-runtime-endpoint`` in the files its unit passes as flags
   (``/etc/default/kubelet`` and ``/etc/sysconfig/kubelet``, whose ``KUBELET_EXTRA_ARGS`` come
   last, then kubeadm's ``/var/lib/kubelet/kubeadm-flags.env``), else ``containerRuntimeEndpoint``
   in ``/var/lib/kubelet/config.yaml``.

An endpoint naming cri-dockerd or dockershim is docker, one naming crio is CRI-O, one naming
containerd is containerd. Without one (or when it names none of them): the first socket found,
containerd, then CRI-O, then docker.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import yaml

from enflame_gcu import fileio
from enflame_gcu.errors import EnflameError

KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
# Later files win: the kubelet unit passes KUBELET_KUBEADM_ARGS, then KUBELET_EXTRA_ARGS.
FLAG_FILES = (
    "/var/lib/kubelet/kubeadm-flags.env",
    "/etc/default/kubelet",
    "/etc/sysconfig/kubelet",
)
FLAG = "--container-runtime-endpoint"
# Which engine an endpoint names, first match wins (cri-dockerd puts docker behind the CRI).
ENDPOINT_ENGINES = (
    ("cri-dockerd", "docker"),
    ("dockershim", "docker"),
    ("crio", "crio"),
    ("containerd", "containerd"),
)
SOCKETS = (
    ("containerd", ("/run/containerd/containerd.sock",)),
    ("crio", ("/var/run/crio/crio.sock", "/run/crio/crio.sock")),
    ("docker", ("/var/run/docker.sock", "/run/docker.sock")),
)
_IN_FILE = re.compile(FLAG + r"""[= ]+["']?([^"'\s]+)""")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The kubelet's CRI endpoint and where it was read."""

    value: str
    where: str

    @property
    def engine(self) -> str | None:
        """The engine the endpoint names, None when it names none we know."""
        return next((engine for key, engine in ENDPOINT_ENGINES if key in self.value), None)


@dataclass(frozen=True, slots=True)
class Detection:
    """The engine found and why; ``engine`` is empty when none was found."""

    engine: str
    source: str  # "kubelet", "socket" or "" (none found)
    reason: str
    endpoint: str = ""

    def describe(self) -> str:
        """One line: ``engine: why`` (the form ``enflame-ctk runtime detect`` prints)."""
        return f"{self.engine or 'none'}: {self.reason}"


def _read(root: str, path: str) -> str:
    """A host file's text; empty when it is missing, unreadable or not a regular file (a FIFO
    planted in a hostile host root would block the reader)."""
    try:
        return fileio.read_regular(fileio.resolve(root, path), 1 << 20).decode("utf-8", "replace")
    except (OSError, EnflameError):
        return ""


def running_kubelet(root: str) -> tuple[str, ...] | None:
    """The command line of the kubelet running under ``root``/proc (the oldest), or None."""
    found: list[tuple[int, tuple[str, ...]]] = []
    with contextlib.suppress(OSError, EnflameError):
        for entry in os.listdir(fileio.resolve(root, "/proc")):
            if entry.isdigit():
                words = _read(root, f"/proc/{entry}/cmdline").split("\0")
                if os.path.basename(words[0]) == "kubelet":
                    found.append((int(entry), tuple(w for w in words if w)))
    return min(found)[1] if found else None


def _flag(words: tuple[str, ...], flag: str) -> str | None:
    """The value of the last ``flag=V`` or ``flag V`` among ``words``."""
    value = None
    for index, word in enumerate(words):
        if word == flag and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith(flag + "="):
            value = word[len(flag) + 1 :]
    return value


def _from_config(root: str, path: str) -> Endpoint | None:
    try:
        config = fileio.parse_bounded(yaml.safe_load, _read(root, path), path)
    except (yaml.YAMLError, ValueError):
        return None
    value = config.get("containerRuntimeEndpoint") if isinstance(config, dict) else None
    if isinstance(value, str) and value:
        return Endpoint(value, f"containerRuntimeEndpoint in {path}")
    return None


def kubelet_endpoint(root: str) -> Endpoint | None:
    """The CRI endpoint the kubelet uses, as far as the node tells; None when it does not."""
    argv = running_kubelet(root)
    if argv is not None:
        value = _flag(argv, FLAG)
        if value:
            return Endpoint(value, f"{FLAG} of the running kubelet")
        return _from_config(root, _flag(argv, "--config") or KUBELET_CONFIG)
    found = None
    for path in FLAG_FILES:
        lines = (ln for ln in _read(root, path).splitlines() if not ln.lstrip().startswith("#"))
        values = _IN_FILE.findall("\n".join(lines))
        if values:
            found = Endpoint(values[-1], f"{FLAG} in {path}")
    return found or _from_config(root, KUBELET_CONFIG)


def detect(root: str = "/", containerd_socket: str | None = None) -> Detection:
    """The engine the kubelet runs, else the first engine socket found (see the module doc).

    ``containerd_socket``: containerd's socket where it is not the stock one (k3s, RKE2).
    """
    endpoint = kubelet_endpoint(root)
    if endpoint is not None and endpoint.engine:
        reason = f"the kubelet's CRI endpoint {endpoint.value} ({endpoint.where})"
        return Detection(endpoint.engine, "kubelet", reason, endpoint.value)
    why = (
        f"the kubelet's CRI endpoint {endpoint.value} ({endpoint.where}) names no engine we know"
        if endpoint is not None
        else "the kubelet's CRI endpoint is not set"
    )
    extra = (containerd_socket,) if containerd_socket else ()
    for engine, sockets in SOCKETS:
        for path in (*extra, *sockets) if engine == "containerd" else sockets:
            if os.path.lexists(fileio.resolve(root, path, follow=False)):
                return Detection(engine, "socket", f"socket {path} ({why})")
    return Detection("", "", f"no containerd, CRI-O or docker socket ({why})")
