"""Typed plugin settings: every flag has an env var; precedence CLI > env > file > defaults.

The options table below is the single source for the CLI flags, the env var names, the config
file's ``flags`` keys (camelCase), the ``--help`` text and validation. Layers are plain mappings
of option name to value; the config file (:mod:`.config_file`) is one more layer between the
environment and the defaults, and the only source of the sharing settings.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from enflame_gcu import allocation, edits, naming, node_modes, sharing
from enflame_gcu.errors import ConfigError
from enflame_gcu.support import daemon_cli, env_vars

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_RESOURCE = "enflame.com/gcu"
SOCKET_NAME = "enflame.sock"
LOG_LEVELS = daemon_cli.LOG_LEVELS
LOG_FORMATS = daemon_cli.LOG_FORMATS
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The node label that chooses one of the named configs of --config-dir (named_configs).
CONFIG_LABEL = "enflame.com/device-plugin.config"
# A config's name is a label value (the label chooses it) and a ConfigMap key (the chart's).
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The resources one process can serve, each on its own socket (kinds as --resources names them).
GCU, VGCU, SHARED_GCU, DRS_GCU = "gcu", "vgcu", "shared-gcu", "drs-gcu"
RESOURCE_KINDS = (GCU, VGCU, SHARED_GCU, DRS_GCU)
KIND_SOCKETS = {
    VGCU: "enflame-vgcu.sock",
    SHARED_GCU: "enflame-shared-gcu.sock",
    DRS_GCU: "enflame-drs-gcu.sock",
}
# Settings only the config file can give (not flags): filled by the file layer.
FILE_ONLY = ("sharing", "shared_cards")


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """The effective settings of one plugin process."""

    plugin_dir: str = DEFAULT_PLUGIN_DIR
    host_root: str = "/"
    config_file: str | None = None
    resources: tuple[str, ...] = (GCU,)
    resource_name: str = DEFAULT_RESOURCE
    vgcu_resource_name: str = "enflame.com/vgcu"
    shared_resource_name: str = "enflame.com/shared-gcu"
    drs_resource_name: str = "enflame.com/drs-gcu"
    efsmi: str = "efsmi"
    drs: str = "all"  # the cards drs-gcu partitions, as enflame-dra-plugin --drs selects them
    drs_release_grace: float = 30.0
    socket_name: str = SOCKET_NAME
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    health_interval: float = 5.0
    disable_healthchecks: bool = False
    fail_on_init_error: bool = False
    allocation_policy: str = "topology"
    log_level: str = "info"
    log_format: str = "text"
    # --http-address HOST:PORT ("" = off); when given it sets the two below, which stay the
    # settings the server reads (their flags are its old spellings; file and env still read).
    http_address: str = ""
    metrics_port: int = 0
    # "" = every address (IPv6 and IPv4 where the host has both), as a DaemonSet's probes need.
    metrics_bind_address: str = ""
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    pod_resources_interval: float = 5.0
    feature_file: str | None = None
    # Card telemetry through libefml (on the metrics port): seconds between collection passes
    # (0 = off), the deadline of one card's pass, and a libefml path tried before the usual ones.
    telemetry_interval: float = 10.0
    telemetry_timeout: float = 5.0
    efml_library: str | None = None
    # "thread": libefml in this process; "process": in a child whose snapshots this reads.
    telemetry_isolation: str = "thread"
    # The node-state annotation for the scheduler extender (node_annotation); needs node_name.
    node_state: bool = False
    node_name: str = ""
    kubeconfig: str = ""
    # Named configs for node pools (named_configs): the directory, the one used without a
    # label, the label, and seconds between reads of it (0 = at start only).
    config_dir: str | None = None
    config_default: str = ""
    config_label: str = CONFIG_LABEL
    config_label_interval: float = 30.0
    # The named config in effect ("" = none); set by the plugin, not an option.
    config_name: str = ""
    sharing: sharing.SharingSettings = field(default_factory=sharing.SharingSettings)
    # Cards to share as slices (``gcuN`` or PCI bus ids); None = every card.
    shared_cards: tuple[str, ...] | None = None
    # The node mode asked for ("" = none: the flags alone decide) and where the effective one
    # came from; the mode fills pass_device_specs and device_list_strategy unless they were set.
    node_mode: str = ""
    node_mode_source: str = ""

    @property
    def socket_path(self) -> str:
        """Where the plugin serves: ``<plugin dir>/<socket name>``."""
        return os.path.join(self.plugin_dir, self.socket_name)

    def resource_names(self) -> dict[str, str]:
        """``{kind: extended resource name}`` for every kind served, in --resources order."""
        names = {
            GCU: self.resource_name,
            VGCU: self.vgcu_resource_name,
            SHARED_GCU: self.shared_resource_name,
            DRS_GCU: self.drs_resource_name,
        }
        return {kind: names[kind] for kind in self.resources}

    def socket_for(self, kind: str) -> str:
        """Socket file name of a kind: ``enflame.sock`` for whole cards, own names otherwise."""
        return KIND_SOCKETS.get(kind, self.socket_name)

    def describe(self) -> str:
        """One line with every setting, for the start-up log."""
        return " ".join(
            f"{f.name}={_show(getattr(self, f.name))}" for f in dataclasses.fields(self)
        )


def _show(value: Any) -> str:
    # Nested settings use ':' so that every setting shows exactly one '=' in the log line.
    if isinstance(value, sharing.SharingSettings):
        parts = [f"{f.name}:{getattr(value, f.name)!r}" for f in dataclasses.fields(value)]
        return "{" + ", ".join(parts).replace("=", ":") + "}"
    return repr(value)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false, 1/0, yes/no, on/off)")


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 3600:
        raise ValueError(f"{text} is outside 0.05..3600 seconds")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a port number (0..65535; 0 turns metrics off)") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"{text} is outside 0..65535 (0 turns metrics off)")
    return value


def _http_address(text: str) -> str:
    if not text.strip():
        return ""
    host, _port_number = daemon_cli.split_address(text)  # ValueError: not HOST:PORT
    _address(host)  # an IP address or empty, as --metrics-bind-address took
    return text.strip()


def _resource(text: str) -> str:
    domain, sep, name = text.partition("/")
    if not sep or not domain or not name or "." not in domain or domain == "kubernetes.io":
        raise ValueError(f"{text!r} needs a domain prefix such as enflame.com/gcu")
    return text


def _healthchecks(text: str) -> bool:
    value = text.strip().lower()
    if value in ("all", "true", "1"):
        return True
    if value in ("", "none", "false", "0"):
        return False
    raise ValueError(f"{text!r} is not supported; use 'all' to disable checks or leave it unset")


class _OneOf:
    """Parse one of ``valid`` (any case); ``valid`` is what --help lists."""

    def __init__(self, valid: Sequence[str]) -> None:
        self.valid = tuple(valid)

    def __call__(self, text: str) -> str:
        if text.lower() not in self.valid:
            raise ValueError(f"{text!r} is not one of {', '.join(self.valid)}")
        return text.lower()


class _ListOf(_OneOf):
    """Parse a comma list of ``valid`` names (at least one, repeats dropped)."""

    def __init__(self, valid: Sequence[str], what: str, lower: bool = False) -> None:
        super().__init__(valid)
        self.what = what
        self.lower = lower

    def __call__(self, text: str) -> tuple[str, ...]:  # type: ignore[override]
        parts = (part.strip() for part in text.split(","))
        chosen = tuple(dict.fromkeys(p.lower() if self.lower else p for p in parts if p))
        bad = [name for name in chosen if name not in self.valid]
        if bad or not chosen:
            raise ValueError(
                f"unknown {self.what} {', '.join(bad) or '(none)'}; valid: {', '.join(self.valid)}"
            )
        return chosen


def _address(text: str) -> str:
    value = text.strip()
    if value in ("", "*", "all"):
        return ""
    try:
        ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address (or empty for all addresses)") from None
    return value.strip("[]")


def _poll(text: str) -> float:
    value = float(text)
    if value != 0 and not 0.1 <= value <= 3600:
        raise ValueError(f"{text} is outside 0.1..3600 seconds (0 = never ask)")
    return value


def _seconds_or_off(off: str) -> Callable[[str], float]:
    """A parser of 0.1..3600 seconds, where 0 means ``off`` (said in the error)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number of seconds") from None
        if value != 0 and not 0.1 <= value <= 3600:
            raise ValueError(f"{text} is outside 0.1..3600 seconds (0 {off})")
        return value

    return parse


_telemetry = _seconds_or_off("turns card telemetry off")


def _deadline(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 60:
        raise ValueError(f"{text} is outside 0.05..60 seconds")
    return value


def _node_name(text: str) -> str:
    value = text.strip()
    if len(value) > 253 or not all(c.isalnum() or c in "-." for c in value):
        raise ValueError(f"{text!r} is not a node name")
    return value


def _path(text: str) -> str:
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute path")
    return text


def config_name(text: str) -> str:
    """A named config's name: what a label value may be (63 characters, letters, digits, -_.)."""
    value = text.strip()
    if value and not _LABEL_VALUE.match(value):
        raise ValueError(
            f"{text!r} is not a config name (a label value: up to 63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit)"
        )
    return value


def _label_key(text: str) -> str:
    value = text.strip()
    prefix, _, name = value.rpartition("/")
    if not _LABEL_VALUE.match(name) or (
        prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))
    ):
        raise ValueError(f"{text!r} is not a label key (such as {CONFIG_LABEL})")
    return value


_label_poll = _seconds_or_off("= read at start only")


def _drs_selection(text: str) -> str:
    from enflame_gcu import drs  # noqa: PLC0415 - efsmi and resourceslices, for drs-gcu only

    items = drs.selection_items(text)  # ValueError naming a bad item
    if not items:
        raise ValueError("an empty selection: give all, or cards, models or families")
    return ",".join(items)


def _program(text: str) -> str:
    # A name looked up on PATH, or an absolute path: never relative to the working directory.
    if text.startswith("/") or (text and "/" not in text):
        return text
    raise ValueError(f"{text!r} is neither a program name nor an absolute path")


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its field, env var, parser and help text."""

    field: str
    # The 0.1 name of its environment variable (DP_*, or NVIDIA's unprefixed names), still read;
    # None for an option that 0.1 did not have.
    old_env: str | None
    parse: Callable[[str], Any]
    help: str
    flag: bool = False
    # A name Kubernetes manifests already use (NODE_NAME, KUBECONFIG, as the DRA driver reads
    # them) instead of ``ENFLAME_`` and the flag's name.
    env_name: str | None = None

    @property
    def env(self) -> str:
        """Its environment variable: ``ENFLAME_`` and the flag's name, unless it has its own."""
        return self.env_name or env_vars.for_option(self.field)

    @property
    def choices(self) -> tuple[str, ...]:
        """The values it accepts when they are a fixed list (empty otherwise)."""
        return self.parse.valid if isinstance(self.parse, _OneOf) else ()

    @property
    def many(self) -> bool:
        """Whether it takes a comma list (repeatable on the command line)."""
        return isinstance(self.parse, _ListOf)


OPTIONS: tuple[Option, ...] = (
    Option("plugin_dir", "DP_PLUGIN_DIR", _path, "kubelet device plugin directory"),
    Option("host_root", "DP_HOST_ROOT", _path, "where the host's / is mounted (sysfs, /dev)"),
    Option(
        "config_file",
        "CONFIG_FILE",
        _path,
        "versioned YAML config file: flags (camelCase) and sharing settings",
    ),
    Option(
        "resources",
        "DP_RESOURCES",
        _ListOf(RESOURCE_KINDS, "resource", lower=True),
        f"resources to serve, comma list of {', '.join(RESOURCE_KINDS)} (one socket each)",
    ),
    Option("resource_name", "DP_RESOURCE_NAME", _resource, "extended resource for whole cards"),
    Option("vgcu_resource_name", "DP_VGCU_RESOURCE_NAME", _resource, "extended resource for vGCUs"),
    Option(
        "shared_resource_name",
        "DP_SHARED_RESOURCE_NAME",
        _resource,
        "extended resource for time-shared slices",
    ),
    Option(
        "drs_resource_name",
        None,
        _resource,
        "extended resource for DRS slices (hard partitions made at Allocate)",
    ),
    Option("efsmi", None, _program, "the efsmi program, a name on PATH or a path (drs-gcu)"),
    Option(
        "drs",
        None,
        _drs_selection,
        "cards drs-gcu partitions: all, or a comma list of cards (gcu3), models (S60) or "
        "families (S), as enflame-dra-plugin --drs; the others stay whole cards",
    ),
    Option(
        "drs_release_grace",
        None,
        _interval,
        "seconds a new DRS instance waits for the kubelet to list its container before an "
        "instance no container holds is destroyed",
    ),
    Option(
        "pass_device_specs",
        "PASS_DEVICE_SPECS",
        _bool,
        "return DeviceSpecs from Allocate (needed with cpuManagerPolicy: static)",
        flag=True,
    ),
    Option(
        "device_list_strategy",
        "DEVICE_LIST_STRATEGY",
        _ListOf(edits.STRATEGIES, "strategy"),
        f"how Allocate names the devices, comma list of {', '.join(edits.STRATEGIES)}",
    ),
    Option(
        "node_mode",
        "DP_NODE_MODE",
        _OneOf(("", node_modes.AUTO, *node_modes.NAMES)),
        "answer as the node mode needs (auto = as the installer recorded in "
        f"{node_modes.MODE_FILE}, else {node_modes.FALLBACK}); fills --pass-device-specs and "
        "--device-list-strategy unless they are given",
    ),
    Option("health_interval", "DP_HEALTH_INTERVAL", _interval, "seconds between health rescans"),
    Option(
        "disable_healthchecks",
        naming.OLD_DISABLE_HEALTHCHECKS_ENV,
        _healthchecks,
        "'all' reports every card healthy as discovered (env var only)",
    ),
    Option(
        "fail_on_init_error",
        "FAIL_ON_INIT_ERROR",
        _bool,
        "exit 1 when no usable GCU is found at start instead of waiting for one",
        flag=True,
    ),
    Option(
        "allocation_policy",
        "DP_ALLOCATION_POLICY",
        _OneOf(sorted(allocation.POLICIES)),
        f"how GetPreferredAllocation chooses cards: {', '.join(sorted(allocation.POLICIES))}",
    ),
    Option(
        "log_level", "DP_LOG_LEVEL", _OneOf(LOG_LEVELS), f"log verbosity: {', '.join(LOG_LEVELS)}"
    ),
    Option(
        "log_format",
        "DP_LOG_FORMAT",
        _OneOf(LOG_FORMATS),
        "text, or json: one JSON object per line with a UTC timestamp",
    ),
    Option(
        "http_address",
        None,
        _http_address,
        "serve /metrics, /healthz and /readyz here (an empty host: every address, IPv6 and "
        "IPv4); empty or port 0 = off",
    ),
    Option(
        "metrics_port",
        "DP_METRICS_PORT",
        _port,
        "port of /metrics, /healthz and /readyz; 0 = off (old spelling of --http-address)",
    ),
    Option(
        "metrics_bind_address",
        "DP_METRICS_BIND_ADDRESS",
        _address,
        "address the metrics port listens on; empty = all addresses (old spelling of "
        "--http-address)",
    ),
    Option(
        "pod_resources_socket",
        "DP_POD_RESOURCES_SOCKET",
        _path,
        "the kubelet's PodResources socket: who holds each card (metrics)",
    ),
    Option(
        "pod_resources_interval",
        "DP_POD_RESOURCES_INTERVAL",
        _poll,
        "seconds between PodResources reads while metrics are on; 0 = never",
    ),
    Option(
        "feature_file",
        "DP_FEATURE_FILE",
        _path,
        "NFD feature file kept current with the node's enflame.com/gcu.* labels; unset = none",
    ),
    Option(
        "telemetry_interval",
        None,
        _telemetry,
        "seconds between card telemetry passes through libefml (metrics port); 0 = off",
    ),
    Option(
        "telemetry_timeout",
        None,
        _deadline,
        "seconds one card's libefml calls may take before the card is left out as hung",
    ),
    Option(
        "telemetry_isolation",
        None,
        _OneOf(("thread", "process")),
        "where libefml runs: thread (in this process) or process (a child whose snapshots the "
        "plugin reads, so a libefml crash cannot take allocation down)",
    ),
    Option(
        "efml_library",
        None,
        _path,
        "libefml to load before the usual names and directories (host root first); unset = search",
    ),
    Option(
        "node_state",
        None,
        _bool,
        "keep this node's enflame.com/gcu-node-state annotation current for the scheduler "
        "extender (needs --node-name and a PodResources interval above 0)",
        flag=True,
    ),
    Option(
        "node_name",
        None,
        _node_name,
        "this node's name (the downward API's spec.nodeName), for --node-state",
        env_name="NODE_NAME",
    ),
    Option(
        "kubeconfig",
        None,
        _path,
        "kubeconfig for --node-state; unset = the pod's service account",
        env_name="KUBECONFIG",
    ),
    Option(
        "config_dir",
        None,
        _path,
        "directory of named config files, one per name (a mounted ConfigMap); the node label "
        "--config-label chooses one; instead of --config-file; needs --node-name",
    ),
    Option(
        "config_default",
        None,
        config_name,
        "the named config used when the node's label is absent or names no config there; "
        "unset = none (flags and environment alone)",
    ),
    Option(
        "config_label",
        None,
        _label_key,
        "the node label whose value names the config of --config-dir",
    ),
    Option(
        "config_label_interval",
        None,
        _label_poll,
        "seconds between reads of the node's label (a change reloads as SIGHUP does); "
        "0 = read at start only",
    ),
)


def resolve(layers: Sequence[Mapping[str, Any]]) -> PluginConfig:
    """Build the config from layers, highest precedence first; raw strings are parsed.

    ConfigError names the setting, where its value came from and what is valid.
    """
    values: dict[str, Any] = {}
    for option in OPTIONS:
        for layer in layers:
            if option.field not in layer or layer[option.field] is None:
                continue
            raw = layer[option.field]
            try:
                values[option.field] = option.parse(raw) if isinstance(raw, str) else raw
            except ValueError as exc:
                raise ConfigError(f"invalid {option.field.replace('_', '-')}: {exc}") from exc
            break
    for name in FILE_ONLY:
        for layer in layers:
            if layer.get(name) is not None:
                values[name] = layer[name]
                break
    if values.get("node_mode"):
        _apply_node_mode(values)
    if values.get("http_address"):
        # Given anywhere, it wins over the old halves given anywhere (one address, one place).
        host, port = daemon_cli.split_address(values["http_address"])
        values["metrics_bind_address"], values["metrics_port"] = _address(host), port
    if values.get("node_state") and not values.get("node_name"):
        raise ConfigError("invalid node-state: it needs node-name (env NODE_NAME, downward API)")
    if values.get("config_dir") and values.get("config_file"):
        raise ConfigError(
            "invalid config-dir: give either config-file (one config) or config-dir (named "
            "configs chosen by a node label), not both"
        )
    if values.get("config_dir") and not values.get("node_name"):
        raise ConfigError(
            "invalid config-dir: the node label needs node-name (env NODE_NAME, downward API)"
        )
    if values.get("node_state") and values.get("pod_resources_interval") == 0:
        raise ConfigError("invalid node-state: it needs pod-resources-interval above 0")
    return PluginConfig(**values)


def _apply_node_mode(values: dict[str, Any]) -> None:
    """Fill what the node mode decides; settings given explicitly win (doctor reports it)."""
    asked = values["node_mode"]
    name, source = asked, "given explicitly"
    if asked == node_modes.AUTO:
        root = values.get("host_root", "/")
        try:
            record = node_modes.read(root)
        except ValueError as exc:
            raise ConfigError(f"node mode auto: {exc}; fix or remove the file") from exc
        if record is None:
            name = node_modes.FALLBACK
            source = f"auto: no {node_modes.MODE_FILE} under {root}, so the default"
        else:
            name = record.mode
            source = f"auto: {node_modes.MODE_FILE} ({record.chosen_by}, {record.engine})"
    mode = node_modes.MODES[name]
    values["node_mode"] = name
    values["node_mode_source"] = source
    values.setdefault("pass_device_specs", mode.pass_device_specs)
    values.setdefault("device_list_strategy", mode.strategies)


def env_layer(environ: Mapping[str, str], warnings: list[str] | None = None) -> dict[str, str]:
    """The settings given by environment variables; a warning per old name used."""
    layer = {}
    for option in OPTIONS:
        old = () if option.old_env is None else (option.old_env,)
        value, warning = env_vars.lookup(environ, option.env, old)
        if value is not None:
            layer[option.field] = value
        if warning is not None and warnings is not None:
            warnings.append(warning)
    return layer


def log_level(config: PluginConfig) -> int:
    """The logging module's level for the config."""
    return int(getattr(logging, config.log_level.upper()))
