"""Which container engines a host has and where their configs live (reloading: :mod:`reload`)."""

from __future__ import annotations

import dataclasses
import os

from enflame_gcu import fileio
from enflame_gcu.errors import EngineConfigError

DEFAULT_CONFIGS = {
    "docker": "/etc/docker/daemon.json",
    "containerd": "/etc/containerd/config.toml",
    "crio": "/etc/crio/crio.conf",
}

# Any one of these under the host root means the engine is installed or running.
MARKERS = {
    "docker": (
        "/usr/bin/dockerd",
        "/usr/local/bin/dockerd",
        "/etc/docker",
        "/var/run/docker.sock",
        "/run/docker.sock",
    ),
    "containerd": (
        "/usr/bin/containerd",
        "/usr/local/bin/containerd",
        "/etc/containerd",
        "/run/containerd/containerd.sock",
    ),
    "crio": (
        "/usr/bin/crio",
        "/usr/local/bin/crio",
        "/etc/crio",
        "/var/run/crio/crio.sock",
        "/run/crio/crio.sock",
    ),
}


CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
TEMPLATE_SUFFIX = ".tmpl"
# k3s and RKE2 with containerd 2.x read a version 3 template under this name instead.
V3_TEMPLATE = "config-v3.toml.tmpl"


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerdSite:
    """Where a node's containerd keeps its config and socket, and the unit that runs it.

    Stock containerd: ``/etc/containerd/config.toml``, ``/run/containerd/containerd.sock``,
    ``containerd.service``. k3s and RKE2 run their own containerd: its config is rendered from
    a template (``*.tmpl``) on every start, its socket is ``/run/k3s/containerd/``, and the
    unit to restart is the distribution's (server or agent: the first one active).
    """

    config: str = DEFAULT_CONFIGS["containerd"]
    socket: str = CONTAINERD_SOCKET
    services: tuple[str, ...] = ("containerd",)
    preset: str = ""

    @property
    def stock(self) -> bool:
        """True when every path is the stock containerd's."""
        return self == ContainerdSite()

    @property
    def template(self) -> bool:
        """True when the config is a k3s/RKE2 template the distribution renders on start."""
        return self.config.endswith(TEMPLATE_SUFFIX)


_RANCHER = "/var/lib/rancher/{}/agent/etc/containerd/config.toml.tmpl"
_K3S_SOCKET = "/run/k3s/containerd/containerd.sock"
# Documented layouts (docs.k3s.io and docs.rke2.io, "Configuring containerd"); untested here
# against the real distributions.
PRESETS = {
    "k3s": ContainerdSite(_RANCHER.format("k3s"), _K3S_SOCKET, ("k3s", "k3s-agent"), "k3s"),
    "rke2": ContainerdSite(
        _RANCHER.format("rke2"), _K3S_SOCKET, ("rke2-server", "rke2-agent"), "rke2"
    ),
}
_UNIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@:\\")


def containerd_site(
    preset: str | None = None,
    config: str | None = None,
    socket: str | None = None,
    service: str | None = None,
) -> ContainerdSite:
    """The containerd paths a preset gives, each overridden by an explicit value.

    Paths are host paths (absolute); ``service`` is one systemd unit or a comma-separated
    list (the first one active is restarted). Raises EngineConfigError naming a bad value.
    """
    if preset and preset not in PRESETS:
        raise EngineConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    site = PRESETS[preset] if preset else ContainerdSite()
    for name, value in (("containerd config", config), ("containerd socket", socket)):
        if value is not None and (not value.startswith("/") or "\0" in value):
            raise EngineConfigError(f"the {name} must be an absolute host path, got {value!r}")
    units = site.services
    if service:
        units = tuple(u.strip() for u in service.split(",") if u.strip())
        bad = [u for u in units if not set(u) <= _UNIT_CHARS or u.startswith("-")]
        if bad or not units:
            raise EngineConfigError(f"not a systemd unit name: {service!r}")
    return ContainerdSite(config or site.config, socket or site.socket, units, site.preset)


def detect(host_root: str = "/", containerd: ContainerdSite | None = None) -> list[str]:
    """Names of the engines found under ``host_root``, in the order docker, containerd, crio.

    With ``containerd`` paths other than the stock ones, its socket or its config's directory
    also count as containerd (k3s and RKE2 have no /etc/containerd or containerd binary there).
    """
    markers = dict(MARKERS)
    if containerd is not None and not containerd.stock:
        extra = (containerd.socket, os.path.dirname(containerd.config))
        markers["containerd"] = (*MARKERS["containerd"], *extra)
    return [
        engine
        for engine, paths in markers.items()
        if any(os.path.lexists(fileio.resolve(host_root, m, follow=False)) for m in paths)
    ]


def default_config_path(engine: str, host_root: str = "/") -> str:
    """The engine's main config file under ``host_root``: its directories resolved in the jail.

    The file itself may be a symlink: the editors follow it (inside the jail) when they read
    and write, so the link stays a link.
    """
    if engine not in DEFAULT_CONFIGS:
        raise EngineConfigError(f"unknown engine {engine!r}; known: {', '.join(DEFAULT_CONFIGS)}")
    return fileio.resolve(host_root, DEFAULT_CONFIGS[engine], follow=False)


@dataclasses.dataclass(frozen=True, slots=True)
class TemplateChoice:
    """Which k3s/RKE2 template to edit, and what to seed it from when it does not exist."""

    template: str  # host path
    rendered: str  # the config.toml the distribution renders from it (host path)
    seed: bool  # True: the template is missing and is created from ``rendered``


def _version_of(text: str) -> int:
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version":
            return int(value.strip()) if value.strip().isdigit() else 0
    return 1


def choose_template(host_root: str, config: str) -> TemplateChoice:
    """The template for a k3s/RKE2 ``config`` (``.../config.toml.tmpl``).

    k3s and RKE2 render ``config.toml`` from ``config.toml.tmpl`` (containerd 1.7, version 2)
    or ``config-v3.toml.tmpl`` (containerd 2.x, version 3) on every start, so an edit of
    ``config.toml`` itself would be lost. An existing template is edited (``config-v3`` first
    when both exist); a missing one is seeded from the ``config.toml`` last rendered, under the
    name its version calls for. Raises EngineConfigError when there is nothing to seed from.
    """
    directory = os.path.dirname(config)
    rendered = os.path.join(directory, "config.toml")

    def exists(path: str) -> bool:
        return os.path.lexists(fileio.resolve(host_root, path, follow=False))

    candidates = [config]
    if os.path.basename(config) == "config.toml.tmpl":
        candidates.insert(0, os.path.join(directory, V3_TEMPLATE))
    for candidate in candidates:
        if exists(candidate):
            return TemplateChoice(candidate, rendered, False)
    local = fileio.resolve(host_root, rendered)
    try:
        text = fileio.read_regular(local).decode("utf-8")
    except FileNotFoundError:
        raise EngineConfigError(
            f"cannot configure containerd: neither {config} nor {rendered} exists (k3s and "
            "RKE2 write config.toml when they first start: start the node's k3s or RKE2 once, "
            "or give the config with --containerd-config); nothing was changed"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineConfigError(f"cannot read {rendered}: {exc}; nothing was changed") from exc
    if "{{" in text:
        raise EngineConfigError(
            f"cannot seed {config} from {rendered}: it holds '{{{{', which the template "
            "would read as a Go template action; nothing was changed"
        )
    template = config
    if os.path.basename(config) == "config.toml.tmpl" and _version_of(text) >= 3:
        template = os.path.join(directory, V3_TEMPLATE)
    return TemplateChoice(template, rendered, True)
