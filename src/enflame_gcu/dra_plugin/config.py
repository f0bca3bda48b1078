"""Settings of ``enflame-dra-plugin``: flags, then ``ENFLAME_DRA_*`` and downward-API env."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu import __version__, naming, resourceslices
from enflame_gcu.errors import ConfigError

REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
CDI_DIR = "/var/run/cdi"
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
UNHEALTHY_MODES = ("taint", "omit")


@dataclass(frozen=True, slots=True)
class DraConfig:
    """Everything the driver needs to run on one node."""

    node_name: str
    root: str = "/"
    driver_name: str = resourceslices.DRIVER
    registry_dir: str = REGISTRY_DIR
    plugin_dir: str = ""  # default: <PLUGINS_DIR>/<driver name>
    cdi_dir: str = CDI_DIR
    pod_uid: str = ""
    shared_slices: int = 0
    unhealthy: str = "taint"
    health_interval: float = 5.0
    health_disabled: bool = False
    kubeconfig: str = ""
    publish: bool = True
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ConfigError(
                "the node name is unknown: pass --node-name or set NODE_NAME (the DaemonSet "
                "sets it from spec.nodeName)"
            )
        if not 0 <= self.shared_slices <= 64:
            raise ConfigError(f"--shared-slices must be 0..64, got {self.shared_slices}")
        if self.unhealthy not in UNHEALTHY_MODES:
            raise ConfigError(
                f"--unhealthy must be one of {', '.join(UNHEALTHY_MODES)}, got {self.unhealthy!r}"
            )
        for path in (self.registration_socket, self.endpoint):
            if len(path.encode()) > MAX_SOCKET_PATH:
                raise ConfigError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes")

    @property
    def data_dir(self) -> str:
        """The driver's directory under the kubelet's plugins dir (service socket, checkpoint)."""
        return self.plugin_dir or os.path.join(PLUGINS_DIR, self.driver_name)

    def _instance(self, room: int) -> str:
        # With rolling updates that surge, two instances run side by side: their sockets
        # carry the pod UID, shortened to what the 108-byte limit leaves room for.
        return f"-{self.pod_uid[: max(8, room)]}" if self.pod_uid else ""

    @property
    def registration_socket(self) -> str:
        """``<registry>/<driver>[-<pod uid>]-reg.sock``."""
        fixed = os.path.join(self.registry_dir, f"{self.driver_name}-reg.sock")
        return os.path.join(
            self.registry_dir,
            f"{self.driver_name}{self._instance(MAX_SOCKET_PATH - len(fixed) - 1)}-reg.sock",
        )

    @property
    def endpoint(self) -> str:
        """The DRA service socket: ``<data dir>/dra[-<pod uid>].sock``."""
        fixed = os.path.join(self.data_dir, "dra.sock")
        return os.path.join(
            self.data_dir, f"dra{self._instance(MAX_SOCKET_PATH - len(fixed) - 1)}.sock"
        )

    def publish_options(self) -> resourceslices.PublishOptions:
        """How devices are published."""
        return resourceslices.PublishOptions(
            shared_slices=self.shared_slices, unhealthy=self.unhealthy
        )


def _flag(environ: Mapping[str, str], name: str, default: str) -> str:
    return environ.get(name, default)


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> DraConfig:
    """Settings from flags and environment; ConfigError names what is wrong."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="enflame-dra-plugin",
        description="DRA driver gcu.enflame.com: publishes GCUs as ResourceSlices and "
        "prepares claims for the kubelet.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--node-name", default=env.get("NODE_NAME", ""))
    parser.add_argument(
        "--host-root",
        "--root",  # the old spelling, kept for existing manifests
        dest="root",
        metavar="DIR",
        default=_flag(env, "ENFLAME_DRA_ROOT", "/"),
        help="the host's / as seen from here (sysfs, /dev) [env ENFLAME_DRA_ROOT; default /]",
    )
    parser.add_argument(
        "--registry-dir", default=_flag(env, "ENFLAME_DRA_REGISTRY_DIR", REGISTRY_DIR)
    )
    parser.add_argument("--plugin-dir", default=_flag(env, "ENFLAME_DRA_PLUGIN_DIR", ""))
    parser.add_argument("--cdi-dir", default=_flag(env, "ENFLAME_DRA_CDI_DIR", CDI_DIR))
    parser.add_argument("--pod-uid", default=env.get("POD_UID", ""))
    parser.add_argument(
        "--shared-slices",
        type=int,
        default=int(_flag(env, "ENFLAME_DRA_SHARED_SLICES", "0") or 0),
        help="0: cards are exclusive; N: cards can be time-shared in N slices (needs "
        "consumable capacity on the cluster)",
    )
    parser.add_argument(
        "--unhealthy",
        default=_flag(env, "ENFLAME_DRA_UNHEALTHY", "taint"),
        help="taint: unhealthy devices get a NoSchedule taint; omit: they are not published",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=float(_flag(env, "ENFLAME_DRA_HEALTH_INTERVAL", "5")),
    )
    parser.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG", ""),
        help="kubeconfig file; default: the in-cluster service account",
    )
    parser.add_argument(
        "--no-publish",
        action="store_true",
        help="serve the kubelet only, do not publish ResourceSlices (testing)",
    )
    parser.add_argument("--log-level", default=_flag(env, "ENFLAME_DRA_LOG_LEVEL", "info"))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:
            raise
        raise ConfigError("invalid command line (see the message above)") from None
    return DraConfig(
        node_name=args.node_name,
        root=args.root,
        registry_dir=args.registry_dir,
        plugin_dir=args.plugin_dir,
        cdi_dir=args.cdi_dir,
        pod_uid=args.pod_uid,
        shared_slices=args.shared_slices,
        unhealthy=args.unhealthy,
        health_interval=args.health_interval,
        health_disabled=env.get(naming.DISABLE_HEALTHCHECKS_ENV, "") not in ("", "false", "0"),
        kubeconfig=args.kubeconfig,
        publish=not args.no_publish,
        log_level=args.log_level,
    )
