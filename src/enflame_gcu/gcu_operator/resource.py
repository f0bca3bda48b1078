"""The GcuResource's spec read into typed values: our components, the vendor's keys, what we skip.

Both API groups are read here (``topscloud.enflame.com/v1``, the vendor's 2.4.6 and our storage
group, and ``topsops.enflame.com/v1`` of operator 2.0-2.1): the older keys (``toolkit``,
``plugin``, ``exporter``) are converted to the newer ones on read, so the rest of the operator
sees one model. Every field this operator cannot honour becomes an :class:`Unsupported` entry
that the status reports; nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from enflame_gcu import __version__, drs
from enflame_gcu.gcu_operator import names

GROUP = "topscloud.enflame.com"
LEGACY_GROUP = "topsops.enflame.com"
VERSION = "v1"
KIND = "GcuResource"
PLURAL = "gcuresources"
# The vendor's finalizer name (OPERATOR.md §1), kept so a migrated resource looks the same.
FINALIZER = "topsops.enflame.com/v1"

# Canonical component keys, in deploy order; removal runs in reverse.
TOOLKIT = "containerToolkit"
DEVICE_PLUGIN = "devicePlugin"
DRA = "dra"
EXPORTER = "gcuExporter"
GFD = "gfd"
VALIDATOR = "validator"
ORDER = (TOOLKIT, DEVICE_PLUGIN, DRA, EXPORTER, GFD, VALIDATOR)

# Operator 2.0 spellings -> the 2.4.6 key (the 2.0 example itself already says devicePlugin).
ALIASES = {"toolkit": TOOLKIT, "plugin": DEVICE_PLUGIN, "exporter": EXPORTER}

# Vendor components this toolkit has no counterpart for, and why (reported when deployed).
NOT_OURS = {
    "nfd": "node-feature-discovery is not part of this toolkit: install it from its own chart "
    "(the device plugin writes its enflame.com/gcu.* labels through NFD's features.d)",
    "driver": "the kernel driver (KMD) is installed on the host, not from a container here",
    "nodeExporter": "install prometheus-node-exporter from its own chart",
    "nightingale": "Nightingale monitoring is not part of this toolkit",
    "volcano": "Volcano is not part of this toolkit",
    "k8sDriverManager": "driver management is not part of this toolkit",
    "gcusharePlugin": "GCU sharing is served by the device plugin itself (time slices, "
    "enflame.com/shared-gcu), not by a memory-unit plugin; see docs/user-guide.md",
    "gcushareScheduler": "the gcushare scheduler extender is not deployed by this operator",
    "gcushareConfigManager": "the gcushare config manager is not part of this toolkit",
}

NODE_MODES = ("auto", "device-specs", "cdi", "runtimeclass", "default-runtime")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_REPOSITORY = "ghcr.io/enflame-gcu"
DEFAULT_VERSION = __version__


@dataclasses.dataclass(frozen=True, slots=True)
class ImageDefaults:
    """Where the components' images are when the resource names no repository or version: the
    chart's one image reference (global.image.registry and .tag, the operator's --image-registry
    and --image-tag)."""

    registry: str = DEFAULT_REPOSITORY
    tag: str = DEFAULT_VERSION


# Set once at start from the operator's command line (main.py); every parse fills in from it.
_image_defaults = ImageDefaults()


def set_image_defaults(defaults: ImageDefaults) -> ImageDefaults:
    """Use ``defaults`` from now on; returns the ones they replace."""
    global _image_defaults  # one process-wide setting, read by every parse
    previous, _image_defaults = _image_defaults, defaults
    return previous


def image_defaults() -> ImageDefaults:
    """The image defaults in force."""
    return _image_defaults


# Our image and default workload name per component (2.4.6's names, OPERATOR.md §1.1).
IMAGES = {
    TOOLKIT: "enflame-gcu-container-toolkit",
    DEVICE_PLUGIN: "enflame-gcu-device-plugin",
    DRA: "enflame-gcu-device-plugin",
    VALIDATOR: "enflame-gcu-device-plugin",
}
DEFAULT_NAMES = {
    TOOLKIT: "enflame-container-toolkit",
    DEVICE_PLUGIN: "enflame-k8s-device-plugin",
    DRA: "enflame-dra-plugin",
    EXPORTER: "enflame-gcu-exporter",
    GFD: "enflame-gcu-feature-discovery",
    VALIDATOR: "enflame-gcu-validator",
}
# The vendor's image names: a vendor resource names them, and they are not our programs.
VENDOR_IMAGES = frozenset(
    {
        "gcu-runtime",
        "container-toolkit",
        "gcu-plugin",
        "k8s-device-plugin",
        "gcu-exporter",
        "gcu-gfd",
        "gcu-feature-discovery",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Unsupported:
    """A field set in the resource that this operator does not honour, and why."""

    field: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Component:
    """One component as the resource asks for it (BaseFields with our defaults filled in)."""

    key: str
    name: str
    namespace: str
    image: str
    pull_policy: str
    env: tuple[tuple[str, str], ...]
    node_selector: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    # Added to the operator's own tolerations (the pods tolerate these taints too).
    tolerations: tuple[Mapping[str, Any], ...] = ()
    # The pods' affinity as given (its required node affinity narrows where they run).
    affinity: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class UpgradePolicy:
    """How a changed component rolls over the nodes."""

    max_unavailable: int | str = 1
    pod_ready_timeout: int = 300
    drain: bool = False
    drain_timeout: int = 300


@dataclasses.dataclass(frozen=True, slots=True)
class Telemetry:
    """Card telemetry of the device plugin (the chart's metrics.telemetry, same defaults)."""

    interval: int = 10
    timeout: int = 5
    isolation: str = "thread"
    library_dir: str = "/usr/lib"
    efsmi_dir: str = "/usr/local/efsmi"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginOptions:
    """What the device plugin publishes: node state for the scheduler extender (off unless
    ``spec.devicePlugin.nodeState: true``: it lets every GCU node's plugin patch Nodes, which
    only an extender needs), card telemetry (off unless ``spec.devicePlugin.telemetry.enabled``)."""

    node_state: bool = False
    telemetry: Telemetry | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DraOptions:
    """The DRA driver's DRS partitions (the chart's dra.drs and dra.efsmi, same defaults)."""

    drs: str = ""
    efsmi: str = "/usr/local/efsmi/efsmi"
    # spec.dra.webhook: enflame-dra-webhook (docs/dra.md, "Unmodified pods"), off by default;
    # the namespaces whose pods it rewrites (the chart's dra.webhook.namespaceSelector).
    webhook: bool = False
    webhook_namespaces: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {"matchLabels": {WEBHOOK_OPT_IN: "true"}}
    )


# The namespace label that opts a namespace's pods in to the switch-local rewrite.
WEBHOOK_OPT_IN = "gcu.enflame.com/switch-local"
TELEMETRY_ISOLATION = ("thread", "process")
# Seconds: at most a day between passes, at most a minute per card (the CRD says the same).
TELEMETRY_MAX_INTERVAL = 86400
TELEMETRY_MAX_TIMEOUT = 60


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceSpec:
    """The whole spec: components to deploy by key, node mode, upgrade policy, what we skip."""

    components: Mapping[str, Component]
    node_mode: str
    upgrade: UpgradePolicy
    unsupported: tuple[Unsupported, ...]
    plugin: PluginOptions = PluginOptions()
    dra: DraOptions = DraOptions()

    def wants(self, key: str) -> bool:
        """Whether the component ``key`` is to be deployed."""
        return key in self.components


def _fields(raw: Any) -> dict[str, Any]:
    return dict(raw) if isinstance(raw, Mapping) else {}


def _pairs(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def _env(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return ()
    return tuple(
        (str(item["name"]), str(item.get("value", "")))
        for item in raw
        if isinstance(item, Mapping) and "name" in item
    )


TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def _toleration(item: Any) -> Mapping[str, Any] | None:
    """One toleration as Kubernetes accepts it (None when it is not one)."""
    if not isinstance(item, Mapping) or set(item) - _TOLERATION_FIELDS:
        return None
    operator = item.get("operator", "Equal")
    effect = item.get("effect", "")
    seconds = item.get("tolerationSeconds")
    if operator not in TOLERATION_OPERATORS or (effect and effect not in TAINT_EFFECTS):
        return None
    if not all(isinstance(item.get(k, ""), str) for k in ("key", "value")):
        return None
    if operator == "Exists" and item.get("value"):
        return None  # the API server refuses a value with Exists
    if not item.get("key") and operator != "Exists":
        return None  # an empty key tolerates everything only with Exists
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        return None
    return dict(item)


def _tolerations(raw: Any, path: str, out: list[Unsupported]) -> tuple[Mapping[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        out.append(Unsupported(path, "must be a list of tolerations; ignored"))
        return ()
    kept = []
    for index, item in enumerate(raw):
        toleration = _toleration(item)
        if toleration is None:
            out.append(Unsupported(f"{path}[{index}]", "not a valid toleration; ignored"))
        else:
            kept.append(toleration)
    return tuple(kept)


def _affinity(raw: Any, path: str, out: list[Unsupported]) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    known = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    if not isinstance(raw, Mapping) or set(raw) - known:
        out.append(Unsupported(path, "must be a pod affinity (nodeAffinity, podAffinity, ...)"))
        return None
    return dict(raw)


def _component(
    key: str, raw: dict[str, Any], out: list[Unsupported], spelled: str = ""
) -> Component:
    path = f"spec.{spelled or key}"
    defaults = _image_defaults
    image = str(raw.get("image") or IMAGES.get(key, ""))
    repository = str(raw.get("repository") or defaults.registry)
    version = str(raw.get("version") or defaults.tag)
    if image in VENDOR_IMAGES:
        out.append(
            Unsupported(
                f"{path}.image",
                f"{repository}/{image}:{version} is the vendor's image; this operator runs "
                f"{defaults.registry}/{IMAGES.get(key, image)}:{defaults.tag}",
            )
        )
        image, repository, version = IMAGES.get(key, image), defaults.registry, defaults.tag
    elif version in ("latest", "default"):
        # The vendor's "default" is the bundled tag; "latest" is not a tag we publish.
        version = defaults.tag
    if raw.get("command"):
        out.append(Unsupported(f"{path}.command", "our images have their own entry point"))
    selector = _pairs(raw.get("nodeSelector"))
    ours_only = tuple(
        k
        for k, _ in selector
        if k.startswith((names.DEPLOY_LABEL_PREFIX, names.OWNER_LABEL_PREFIX))
    )
    for k in ours_only:
        out.append(
            Unsupported(
                f"{path}.nodeSelector.{k}",
                "the operator sets enflame.com/gcu.deploy.* and enflame.com/gcu.owner.* labels "
                "itself (they decide where each component runs and when); ignored",
            )
        )
    selector = tuple((k, v) for k, v in selector if k not in ours_only)
    return Component(
        key=key,
        name=str(raw.get("name") or DEFAULT_NAMES[key]),
        namespace=str(raw.get("namespace") or "kube-system"),
        image=f"{repository}/{image}:{version}" if image else "",
        pull_policy=str(raw.get("imagePullPolicy") or "IfNotPresent"),
        env=_env(raw.get("env")),
        node_selector=selector,
        args=tuple(str(a) for a in raw.get("args") or ()),
        tolerations=_tolerations(raw.get("tolerations"), f"{path}.tolerations", out),
        affinity=_affinity(raw.get("affinity"), f"{path}.affinity", out),
    )


def _upgrade(raw: dict[str, Any]) -> UpgradePolicy:
    drain = _fields(raw.get("drain"))
    max_unavailable = raw.get("maxUnavailable", 1)
    return UpgradePolicy(
        max_unavailable=max_unavailable if isinstance(max_unavailable, int | str) else 1,
        pod_ready_timeout=int(raw.get("podReadyTimeoutSeconds", 300)),
        drain=bool(drain.get("enable", False)),
        drain_timeout=int(drain.get("timeoutSeconds", 300)),
    )


def _host_dir(value: Any, empty_ok: bool) -> str | None:
    """An absolute, normalised host directory (or "" where allowed); None when it is not."""
    if not isinstance(value, str):
        return None
    if value == "":
        return value if empty_ok else None
    if not value.startswith("/") or len(value) > 4096 or value == "/":
        return None
    if any(c in value for c in ("\x00", "\n", "\r")):
        return None
    if any(part in ("", ".", "..") for part in value.split("/")[1:]):
        return None
    return value


def _seconds(value: Any, most: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return None
    return value


def _telemetry(raw: Any, path: str, out: list[Unsupported]) -> Telemetry | None:
    """``spec.devicePlugin.telemetry`` read; any bad field leaves telemetry off, said so."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        out.append(Unsupported(path, "must be an object; card telemetry stays off"))
        return None
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        out.append(Unsupported(f"{path}.enabled", "must be true or false; telemetry stays off"))
        return None
    default = Telemetry()
    interval = _seconds(raw.get("interval", default.interval), TELEMETRY_MAX_INTERVAL)
    timeout = _seconds(raw.get("timeout", default.timeout), TELEMETRY_MAX_TIMEOUT)
    isolation = raw.get("isolation", default.isolation)
    library = _host_dir(raw.get("libraryDir", default.library_dir), empty_ok=False)
    efsmi = _host_dir(raw.get("efsmiDir", default.efsmi_dir), empty_ok=True)
    bad = [
        (f"{path}.interval", f"must be whole seconds from 1 to {TELEMETRY_MAX_INTERVAL}")
        if interval is None
        else None,
        (f"{path}.timeout", f"must be whole seconds from 1 to {TELEMETRY_MAX_TIMEOUT}")
        if timeout is None
        else None,
        (f"{path}.isolation", "must be thread or process")
        if isolation not in TELEMETRY_ISOLATION
        else None,
        (f"{path}.libraryDir", "must be an absolute, normalised host directory")
        if library is None
        else None,
        (f"{path}.efsmiDir", "must be empty or an absolute, normalised host directory")
        if efsmi is None
        else None,
    ]
    problems = [b for b in bad if b is not None]
    for field, reason in problems:
        out.append(Unsupported(field, f"{reason}; card telemetry stays off"))
    if problems or not enabled or interval is None or timeout is None:
        return None
    if library is None or efsmi is None:
        return None
    return Telemetry(interval, timeout, str(isolation), library, efsmi)


def _plugin_options(raw: dict[str, Any], path: str, out: list[Unsupported]) -> PluginOptions:
    node_state = raw.get("nodeState", False)
    if not isinstance(node_state, bool):
        out.append(Unsupported(f"{path}.nodeState", "must be true or false; left off"))
        node_state = False
    return PluginOptions(node_state, _telemetry(raw.get("telemetry"), f"{path}.telemetry", out))


def _dra_options(raw: dict[str, Any], out: list[Unsupported]) -> DraOptions:
    """``spec.dra.drs`` / ``.efsmi`` / ``.webhook`` read; a bad value leaves it off, said so."""
    options = _drs_options(raw, out)
    webhook = _fields(raw.get("webhook"))
    enabled = webhook.get("enabled", False)
    if not isinstance(enabled, bool):
        out.append(Unsupported("spec.dra.webhook.enabled", "must be true or false; left off"))
        return options
    selector = webhook.get("namespaceSelector", options.webhook_namespaces)
    if not isinstance(selector, Mapping):
        out.append(
            Unsupported("spec.dra.webhook.namespaceSelector", "must be a label selector; left off")
        )
        return options
    return dataclasses.replace(options, webhook=enabled, webhook_namespaces=dict(selector))


def _drs_options(raw: dict[str, Any], out: list[Unsupported]) -> DraOptions:
    """``spec.dra.drs`` / ``.efsmi`` read; a bad value leaves DRS off, said so."""
    selection = raw.get("drs", "")
    efsmi = raw.get("efsmi", DraOptions().efsmi)
    if selection in ("", None):
        return DraOptions()
    if not isinstance(selection, str):
        out.append(Unsupported("spec.dra.drs", "must be a string; DRS stays off"))
        return DraOptions()
    try:
        items = drs.selection_items(selection)
    except ValueError as exc:
        out.append(Unsupported("spec.dra.drs", f"{exc}; DRS stays off"))
        return DraOptions()
    if _host_dir(efsmi, empty_ok=False) is None:
        out.append(
            Unsupported("spec.dra.efsmi", "must be an absolute, normalised path; DRS stays off")
        )
        return DraOptions()
    return DraOptions(",".join(items), str(efsmi)) if items else DraOptions()


def parse(spec: Mapping[str, Any] | None) -> ResourceSpec:
    """The resource's spec as a :class:`ResourceSpec` (both groups' keys; defaults filled in)."""
    raw = {ALIASES.get(k, k): v for k, v in (spec or {}).items()}
    # Status names a field as the resource spells it (operator 2.0's spec.toolkit stays so).
    spelled = {ALIASES.get(k, k): str(k) for k in spec or {}}
    unsupported: list[Unsupported] = []
    components: dict[str, Component] = {}
    deployed = {
        key: _fields(value)
        for key, value in raw.items()
        if isinstance(value, Mapping) and not value.get("notDeploy", False)
    }
    for key in sorted(deployed.keys() & NOT_OURS.keys()):
        unsupported.append(Unsupported(f"spec.{key}", NOT_OURS[key]))
    for key in (TOOLKIT, DEVICE_PLUGIN, DRA, EXPORTER, GFD):
        if key in deployed:
            components[key] = _component(key, deployed[key], unsupported, spelled.get(key, ""))
    # The validator runs unless turned off, since it is what proves a node serves GCUs.
    validator = _fields(raw.get(VALIDATOR))
    if (DEVICE_PLUGIN in components or DRA in components) and not validator.get("notDeploy"):
        components[VALIDATOR] = _component(VALIDATOR, validator, unsupported)
    for key in (EXPORTER, GFD):
        if key in components and DEVICE_PLUGIN not in components:
            unsupported.append(
                Unsupported(f"spec.{key}", "served by the device plugin, which is not deployed")
            )
            del components[key]
    plugin = PluginOptions()
    if DEVICE_PLUGIN in components:
        spelled_plugin = f"spec.{spelled.get(DEVICE_PLUGIN) or DEVICE_PLUGIN}"
        plugin = _plugin_options(deployed[DEVICE_PLUGIN], spelled_plugin, unsupported)
    dra = _dra_options(deployed[DRA], unsupported) if DRA in components else DraOptions()
    node_mode = str(raw.get("nodeMode") or "auto")
    return ResourceSpec(
        dra=dra,
        components=components,
        node_mode=node_mode if node_mode in NODE_MODES else "auto",
        upgrade=_upgrade(_fields(raw.get("upgradePolicy"))),
        unsupported=tuple(unsupported),
        plugin=plugin,
    )
