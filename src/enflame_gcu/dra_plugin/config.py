"""Settings of ``enflame-dra-plugin``: flags, then ``ENFLAME_DRA_*`` and downward-API env."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu import devices, drs, naming, resourceslices
from enflame_gcu.errors import ConfigError
from enflame_gcu.support import cli_options, daemon_cli, env_vars

REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
CDI_DIR = "/var/run/cdi"
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
UNHEALTHY_MODES = ("taint", "omit")
LOG_LEVELS = daemon_cli.LOG_LEVELS
PROG = "enflame-dra-plugin"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


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
    device_order: str = "topology"  # resourceslices.ORDERS
    health_interval: float = 5.0
    health_disabled: bool = False
    kubeconfig: str = ""
    publish: bool = True
    log_level: str = "info"
    log_format: str = "text"
    # Warnings for the deprecated environment variable names used (logged at start).
    deprecated_env: tuple[str, ...] = ()
    drs: str = ""  # "", "all", or comma-separated cards (gcu3) and models/families (S60, S)
    efsmi: str = "efsmi"
    efsmi_timeout: float = 10.0
    http_address: str = ""  # host:port of /healthz, /readyz and /metrics; "" = off
    # The kubelet's PodResources socket: cards device-plugin pods hold are withheld; "" = off.
    pod_resources_socket: str = ""

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ConfigError(
                "the node name is unknown: pass --node-name or set NODE_NAME (the DaemonSet "
                "sets it from spec.nodeName)"
            )
        if not 0 <= self.shared_slices <= 64:
            raise ConfigError(f"--shared-slices must be 0..64, got {self.shared_slices}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        if self.log_format not in daemon_cli.LOG_FORMATS:
            raise ConfigError(
                f"--log-format must be one of {', '.join(daemon_cli.LOG_FORMATS)}, "
                f"got {self.log_format!r}"
            )
        if self.unhealthy not in UNHEALTHY_MODES:
            raise ConfigError(
                f"--unhealthy must be one of {', '.join(UNHEALTHY_MODES)}, got {self.unhealthy!r}"
            )
        if self.device_order not in resourceslices.ORDERS:
            raise ConfigError(
                f"--device-order must be one of {', '.join(resourceslices.ORDERS)}, "
                f"got {self.device_order!r}"
            )
        try:
            drs.selection_items(self.drs)
        except ValueError as exc:
            raise ConfigError(f"--drs: {exc}") from None
        for flag, value in (
            ("--host-root", self.root),
            ("--registry-dir", self.registry_dir),
            ("--plugin-dir", self.plugin_dir or self.data_dir),
            ("--cdi-dir", self.cdi_dir),
        ):
            # As the device plugin: a relative path would follow the working directory, and
            # the kubelet needs absolute socket paths.
            if not os.path.isabs(value):
                raise ConfigError(f"{flag} must be an absolute path, got {value!r}")
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

    def drs_items(self) -> list[str]:
        """The ``--drs`` selection, one item each."""
        return [item.strip() for item in self.drs.split(",") if item.strip()]

    def drs_selects(self, card: devices.Card) -> bool:
        """The card is to be partitioned with DRS (by name, model, family, or ``all``)."""
        return drs.selects(self.drs_items(), card)

    def publish_options(self) -> resourceslices.PublishOptions:
        """How devices are published."""
        return resourceslices.PublishOptions(
            shared_slices=self.shared_slices, unhealthy=self.unhealthy
        )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is outside 0.05..3600 seconds")
    return value


def _slices(text: str) -> int:
    try:
        return int(text or "0")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0..64)") from None


def _choice(valid: Sequence[str]) -> Callable[[str], str]:
    # Case-insensitive, as the environment variables have always been read.
    def parse(text: str) -> str:
        if text.lower() not in valid:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(valid)}")
        return text.lower()

    return parse


def _given(env: str, default: str) -> str:
    return f"[env {env}; default {default}]"


def _env(
    env: Mapping[str, str], deprecated: list[str], option: str, old_name: str, default: str
) -> str:
    """The default of ``--option`` from ``ENFLAME_<OPTION>``, else its 0.1 name (noted)."""
    value, warning = env_vars.lookup(env, env_vars.for_option(option), (old_name,))
    if warning is not None:
        deprecated.append(warning)
    return default if value is None else value


def build_parser(
    environ: Mapping[str, str] | None = None, prog: str = PROG, description: str = ""
) -> argparse.ArgumentParser:
    """The driver's options; each default comes from its environment variable when set."""
    env = os.environ if environ is None else environ
    # Deprecated variable names seen; main logs them once logging is set up.
    deprecated: list[str] = []
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description
        or "DRA driver gcu.enflame.com: publishes GCUs as ResourceSlices and prepares claims "
        "for the kubelet. 'enflame-dra-plugin cleanup --help': delete the driver's slices.",
        epilog=f"Precedence: command line > environment > defaults. "
        f"{naming.DISABLE_HEALTHCHECKS_ENV}=all reports every card healthy as discovered.",
    )
    daemon_cli.add_version(parser)
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        default=env.get("NODE_NAME", ""),
        help="this node's name, as its ResourceSlices and claims name it; required "
        "[env NODE_NAME, which the DaemonSet sets from spec.nodeName]",
    )
    parser.add_argument(
        "--host-root",
        dest="root",
        metavar="DIR",
        default=_env(env, deprecated, "host-root", "ENFLAME_DRA_ROOT", "/"),
        help="the host's / as seen from here (sysfs, /dev; e.g. /host in a DaemonSet) "
        + _given("ENFLAME_HOST_ROOT", "/"),
    )
    cli_options.add_deprecated(parser, "--root", "--host-root", "root", prog=PROG)
    parser.add_argument(
        "--registry-dir",
        metavar="DIR",
        default=_env(env, deprecated, "registry-dir", "ENFLAME_DRA_REGISTRY_DIR", REGISTRY_DIR),
        help="the kubelet's plugin registration directory, where the registration socket "
        "goes " + _given("ENFLAME_REGISTRY_DIR", REGISTRY_DIR),
    )
    parser.add_argument(
        "--plugin-dir",
        metavar="DIR",
        default=_env(env, deprecated, "plugin-dir", "ENFLAME_DRA_PLUGIN_DIR", ""),
        help="the driver's own directory: DRA service socket and checkpoint "
        + _given("ENFLAME_PLUGIN_DIR", f"{PLUGINS_DIR}/<driver name>"),
    )
    parser.add_argument(
        "--cdi-dir",
        metavar="DIR",
        default=_env(env, deprecated, "cdi-dir", "ENFLAME_DRA_CDI_DIR", CDI_DIR),
        help="where the CDI spec of each prepared claim is written (the container engine "
        "reads it) " + _given("ENFLAME_CDI_DIR", CDI_DIR),
    )
    parser.add_argument(
        "--pod-uid",
        metavar="UID",
        default=env.get("POD_UID", ""),
        help="this pod's UID: puts it in the socket names so two instances can run side by "
        "side during a rolling update [env POD_UID, from the downward API; default none]",
    )
    parser.add_argument(
        "--shared-slices",
        metavar="N",
        type=_slices,
        default=_env(env, deprecated, "shared-slices", "ENFLAME_DRA_SHARED_SLICES", "0"),
        help="0: cards are exclusive; N (1..64): cards can be time-shared in N slices (needs "
        "consumable capacity on the cluster) " + _given("ENFLAME_SHARED_SLICES", "0"),
    )
    parser.add_argument(
        "--unhealthy",
        metavar="{" + ",".join(UNHEALTHY_MODES) + "}",
        type=_choice(UNHEALTHY_MODES),
        default=_env(env, deprecated, "unhealthy", "ENFLAME_DRA_UNHEALTHY", "taint"),
        help="taint: unhealthy devices get a NoSchedule taint; omit: they are not published "
        + _given("ENFLAME_UNHEALTHY", "taint"),
    )
    parser.add_argument(
        "--device-order",
        metavar="{" + ",".join(resourceslices.ORDERS) + "}",
        type=_choice(resourceslices.ORDERS),
        default=env.get("ENFLAME_DEVICE_ORDER", "topology"),
        help="topology: publish devices busiest PCIe switch, root port, NUMA node first, "
        "re-ordered as claims are prepared and unprepared (the scheduler's first fit is then "
        "the device plugin's best fit for claims with matchAttribute, as the webhook makes); "
        "index: minor order, slices written only when devices change (keeps more locality "
        "for multi-card claims without constraints) " + _given("ENFLAME_DEVICE_ORDER", "topology"),
    )
    parser.add_argument(
        "--health-interval",
        metavar="SECONDS",
        type=_seconds,
        default=_env(env, deprecated, "health-interval", "ENFLAME_DRA_HEALTH_INTERVAL", "5"),
        help="seconds between health rescans (0.05..3600) "
        + _given("ENFLAME_HEALTH_INTERVAL", "5"),
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        default=env.get("KUBECONFIG", ""),
        help="kubeconfig file [env KUBECONFIG; default: the in-cluster service account]",
    )
    parser.add_argument(
        "--no-publish",
        action="store_true",
        help="serve the kubelet only, do not publish ResourceSlices (testing)",
    )
    parser.add_argument(
        "--drs",
        metavar="CARDS",
        default=env.get("ENFLAME_DRS", ""),
        help="publish these cards as DRS partitions (partitionable devices; needs efsmi and "
        "Kubernetes >= 1.36): 'all', or a comma-separated list of cards (gcu3), models (S60) "
        "or families (S) " + _given("ENFLAME_DRS", "none"),
    )
    parser.add_argument(
        "--efsmi",
        metavar="PATH",
        default=env.get("ENFLAME_EFSMI", "efsmi"),
        help="the efsmi program (DRS only) " + _given("ENFLAME_EFSMI", "efsmi on PATH"),
    )
    daemon_cli.add_http_address(
        parser,
        serves="serve /healthz, /readyz and /metrics here; empty: off",
        default="",
        environ=env,
    )
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default=env.get("ENFLAME_POD_RESOURCES_SOCKET", POD_RESOURCES_SOCKET),
        help="the kubelet's PodResources socket: cards that device-plugin pods (enflame.com/*) "
        "hold are not offered to DRA until released; empty: off "
        + _given("ENFLAME_POD_RESOURCES_SOCKET", POD_RESOURCES_SOCKET),
    )
    daemon_cli.add_logging(parser, env, deprecated, old_level_env="ENFLAME_DRA_LOG_LEVEL")
    parser.set_defaults(deprecated_env=deprecated)
    return parser


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> DraConfig:
    """The settings a parsed command line gives; ConfigError when they are invalid."""
    env = os.environ if environ is None else environ
    disabled, warning = env_vars.lookup(
        env, naming.DISABLE_HEALTHCHECKS_ENV, (naming.OLD_DISABLE_HEALTHCHECKS_ENV,)
    )
    return DraConfig(
        node_name=args.node_name,
        root=args.root,
        registry_dir=args.registry_dir,
        plugin_dir=args.plugin_dir,
        cdi_dir=args.cdi_dir,
        pod_uid=args.pod_uid,
        shared_slices=args.shared_slices,
        unhealthy=args.unhealthy,
        device_order=args.device_order,
        health_interval=args.health_interval,
        health_disabled=(disabled or "") not in ("", "false", "0"),
        kubeconfig=args.kubeconfig,
        publish=not args.no_publish,
        log_level=args.log_level,
        log_format=args.log_format,
        deprecated_env=(*getattr(args, "deprecated_env", ()), *([warning] if warning else [])),
        drs=args.drs,
        efsmi=args.efsmi,
        http_address=args.http_address,
        pod_resources_socket=args.pod_resources_socket,
    )


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """argparse's result; a usage error (printed by argparse) becomes a ConfigError."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:
            raise
        raise ConfigError("invalid command line (see the message above)") from None


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> DraConfig:
    """Settings from flags and environment; ConfigError names what is wrong."""
    return from_args(parse_args(build_parser(environ), argv), environ)
