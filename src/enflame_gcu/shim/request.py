"""Which GCUs a container asks for: env var, volume mounts and CDI annotations in its spec.

Grammar of ``ENFLAME_VISIBLE_DEVICES`` (SPEC §4, whitespace around items ignored, keywords in
any case): unset, empty or ``void`` = leave the container alone; ``none`` = no cards (the
configured driver mounts and env are still added); ``all`` = every usable card; otherwise a
comma list of card minors (``0,1``), device names (``gcu3``, ``vgcu5``) or PCI bus ids
(``0000:11:00.0`` or ``11:00.0``). The value ``/var/run/enflame-container-devices`` means "the
list is in the volume mounts" (the device plugin's ``volume-mounts`` strategy).
"""

from __future__ import annotations

from enflame_gcu import claim_specs, naming
from enflame_gcu.errors import InvalidRequestError

# Annotation-only imports: the runtime's create path imports this module, and typing,
# dataclasses and the discovery model cost milliseconds there (mypy reads this block).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from enflame_gcu import devices

CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
# The only source a device-list volume mount may have (what the device plugin sends).
NULL_DEVICE = "/dev/null"
_HEX = frozenset("0123456789abcdef")
# Whitespace the grammar ignores around items: ASCII only (str.strip() would also drop
# Unicode separators such as U+001C or U+00A0).
ASCII_SPACE = " \t\r\n\v\f"
SYNTAX_HELP = (
    "use void, none, all, or a comma list of card minors (0,1), device names (gcu0, vgcu3) "
    "or PCI bus ids (0000:11:00.0)"
)


class Source:
    """One place in the spec that names devices, e.g. the env var or one volume mount."""

    __slots__ = ("description", "tokens")

    def __init__(self, description: str, tokens: tuple[str, ...]) -> None:
        self.description = description
        self.tokens = tokens

    def __repr__(self) -> str:
        return f"Source(description={self.description!r}, tokens={self.tokens!r})"


class DeviceRequest:
    """Everything a spec asks for; ``wants_edits`` is False when the container is left alone.

    Plain slotted classes rather than dataclasses: see the import block above.
    """

    __slots__ = ("ignored", "none_requested", "sources")

    def __init__(
        self,
        sources: tuple[Source, ...] = (),
        none_requested: bool = False,
        ignored: tuple[str, ...] = (),
    ) -> None:
        self.sources = sources
        self.none_requested = none_requested
        self.ignored = ignored

    @property
    def wants_edits(self) -> bool:
        """True when some source names devices or says ``none``."""
        return bool(self.sources) or self.none_requested

    def __repr__(self) -> str:
        return (
            f"DeviceRequest(sources={self.sources!r}, none_requested={self.none_requested!r}, "
            f"ignored={self.ignored!r})"
        )


def _is_bus_id(token: str) -> bool:
    parts = token.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return False
    bus_dev, function = parts[2].split(".", 1)
    fields = (parts[0], 4), (parts[1], 2), (bus_dev, 2)
    return all(len(text) == size and set(text) <= _HEX for text, size in fields) and (
        len(function) == 1 and function in "01234567"
    )


def normalise_token(token: str, where: str) -> str:
    """Check one list item; return it canonical (``all``, ``gcuN``, ``vgcuN``, bus id).

    The grammar is ASCII: only ``0``-``9`` are digits (``²`` or ``٣`` are not an index).
    """
    item = token.strip(ASCII_SPACE).lower()
    if item.isascii():
        if item == "all":
            return "all"
        number = naming.index(item)
        if number is not None:
            return f"gcu{number}"
        parsed = naming.device_index(item)
        if parsed is not None:
            return f"{parsed[0]}{parsed[1]}"
        if _is_bus_id(item):
            return item if item.count(":") == 2 else f"0000:{item}"
    raise InvalidRequestError(
        f"{where}: {token.strip(ASCII_SPACE)!r} is not a device id; {SYNTAX_HELP}"
    )


def classify_visible_devices(value: str) -> str:
    """The kind of an env value without checking its ids: void, none, mounts or list."""
    text = value.strip(ASCII_SPACE)
    keyword = text.lower()
    if keyword in ("", "void"):
        return "void"
    if keyword == "none":
        return "none"
    if text.rstrip("/") == naming.VOLUME_MOUNT_DIR:
        return "mounts"
    return "list"


def parse_visible_devices(value: str, where: str) -> tuple[str, tuple[str, ...]]:
    """Classify an env value: ("void"|"none"|"mounts"|"list", canonical tokens)."""
    kind = classify_visible_devices(value)
    if kind != "list":
        return kind, ()
    items = [item for item in value.split(",") if item.strip(ASCII_SPACE)]
    tokens = tuple(normalise_token(item, where) for item in items)
    if "all" in tokens and len(tokens) > 1:
        raise InvalidRequestError(f"{where}: 'all' cannot be combined with other ids")
    return "list", tokens


def _env_value(env: Sequence[str]) -> str | None:
    # The last definition wins, as with engines that append overrides to the image's env.
    found = None
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key == naming.VISIBLE_DEVICES_ENV:
            found = value
    return found


def is_privileged(spec: Mapping[str, Any]) -> bool:
    """True when the container keeps CAP_SYS_ADMIN in its bounding set."""
    caps = spec.get("process", {}).get("capabilities", {}) or {}
    if not isinstance(caps, dict):
        raise InvalidRequestError("'process.capabilities' must be a JSON object")
    bounding = caps.get("bounding") or []
    return isinstance(bounding, list) and CAP_SYS_ADMIN in bounding


def from_spec(
    spec: Mapping[str, Any],
    accept_envvar_when_unprivileged: bool,
    claim_spec_dirs: Sequence[str] = (),
) -> DeviceRequest:
    """Read every device request out of an OCI spec (raises InvalidRequestError on bad syntax).

    ``claim_spec_dirs``: where the DRA driver's per-claim CDI specs are, for annotations that
    name ``k8s.gcu.enflame.com/claim`` devices (the kubelet's annotation path).
    """
    sources: list[Source] = []
    ignored: list[str] = []
    none_requested = False
    value = _env_value(spec.get("process", {}).get("env", []))
    if value is not None:
        where = f"{naming.VISIBLE_DEVICES_ENV}={value!r}"
        kind = classify_visible_devices(value)
        env_counts = accept_envvar_when_unprivileged or is_privileged(spec)
        if kind in ("none", "list") and not env_counts:
            # Ignored means not even parsed: an image's odd value cannot fail the container.
            ignored.append(
                f"{where} (accept-envvar-when-unprivileged is false and the container lacks "
                f"{CAP_SYS_ADMIN})"
            )
        elif kind == "none":
            none_requested = True
        elif kind == "list":
            sources.append(Source(where, parse_visible_devices(value, where)[1]))
    for mount in spec.get("mounts", []):
        destination = str(mount.get("destination", "")).rstrip("/")
        if destination.startswith(naming.VOLUME_MOUNT_DIR + "/"):
            name = destination[len(naming.VOLUME_MOUNT_DIR) + 1 :]
            where = f"volume mount {destination}"
            problem = _not_the_plugins_mount(mount)
            if problem:
                ignored.append(f"{where} ({problem}; only the device plugin's mount counts)")
                continue
            sources.append(Source(where, (normalise_token(name, where),)))
    for key, text in sorted(spec.get("annotations", {}).items()):
        if key.startswith(CDI_ANNOTATION_PREFIX):
            tokens = _cdi_tokens(str(text), f"annotation {key}", claim_spec_dirs)
            if tokens:
                sources.append(Source(f"annotation {key}={text!r}", tokens))
    return DeviceRequest(tuple(sources), none_requested, tuple(ignored))


def _not_the_plugins_mount(mount: Mapping[str, Any]) -> str | None:
    """Why a mount at the device-list dir is not the plugin's read-only /dev/null bind, or None.

    The source is compared as a string, exactly: the device plugin (through the kubelet and
    the engine) always writes ``/dev/null``, and runc binds exactly the path written, so any
    other spelling (a symlink, ``/dev/../dev/null``, another 1:3 node) is something the plugin
    never sends. A stat would add nothing: a pod cannot change the host's ``/dev/null``.
    """
    source = mount.get("source")
    if source != NULL_DEVICE:
        return f"its source is {source!r}, not {NULL_DEVICE}"
    options = mount.get("options") or []
    if not isinstance(options, list) or not all(isinstance(item, str) for item in options):
        return "its options are not a list of strings"
    kind = mount.get("type")
    # runc binds for type "bind", or for no/"none" type with a bind option (older engines).
    is_bind = kind == "bind" or (
        kind in (None, "none") and ("bind" in options or "rbind" in options)
    )
    if not is_bind:
        return f"it is a {kind!r} mount, not a bind"
    if "ro" not in options or "rw" in options:
        return "it is not read-only"
    return None


def _claim_tokens(device: str, where: str, claim_spec_dirs: Sequence[str]) -> tuple[str, ...]:
    """The cards of one DRA per-claim CDI device: its spec's list, in our own grammar."""
    try:
        value = claim_specs.visible_devices(device, claim_spec_dirs)
    except claim_specs.ClaimSpecError as exc:
        raise InvalidRequestError(f"{where}: {exc}") from exc
    kind, tokens = parse_visible_devices(value, f"{where} ({claim_specs.CDI_KIND}={device})")
    if kind != "list" or "all" in tokens:
        raise InvalidRequestError(
            f"{where}: {claim_specs.CDI_KIND}={device} lists {value!r}, not the claim's cards"
        )
    return tokens


def _cdi_tokens(text: str, where: str, claim_spec_dirs: Sequence[str] = ()) -> tuple[str, ...]:
    """Our devices in a CDI annotation value; only names our CDI specs define are accepted.

    Those are ``enflame.com/gcu=<minor>`` (decimal, no leading zeros, ASCII digits),
    ``enflame.com/gcu=all`` and ``enflame.com/vgcu=<minor>``; a CDI-aware engine would
    refuse any other spelling as unresolvable, so the runtime refuses it too.
    """
    tokens: list[str] = []
    for name in (item.strip(ASCII_SPACE) for item in text.split(",")):
        kind, sep, device = name.partition("=")
        if sep and kind == claim_specs.CDI_KIND:
            tokens.extend(_claim_tokens(device, where, claim_spec_dirs))
            continue
        prefix = naming.CDI_KINDS.get(kind)
        if not sep or prefix is None:
            continue  # another vendor's device: not ours to inject
        number = naming.index(device)
        if device == "all" and prefix == "gcu":
            tokens.append("all")
        elif number is not None and str(number) == device:
            tokens.append(f"{prefix}{number}")
        else:
            raise InvalidRequestError(
                f"{where}: {name!r} names no {kind} device; devices are named by minor "
                f"({kind}=0){' or all' if prefix == 'gcu' else ''}"
            )
    return tuple(tokens)


def describe_devices(inventory: devices.Inventory) -> str:
    """``0 (0000:11:00.0), 1 (...)`` plus vGCUs: what the node has, for error messages."""
    cards = [
        f"{card.minor} ({card.bdf}{'' if card.usable else ', unusable'})"
        for card in inventory.cards
    ]
    vgcus = [vgcu.name for vgcu in inventory.vgcus]
    text = ", ".join(cards) if cards else "none"
    return f"{text}; vGCUs: {', '.join(vgcus)}" if vgcus else text


def resolve(request: DeviceRequest, inventory: devices.Inventory) -> list[str]:
    """Device names (``gcuN``/``vgcuN``) for a request, in index order, without duplicates.

    Every name is on the node and usable (InvalidRequestError naming the problem otherwise).
    """
    by_bus = {card.bdf: card.name for card in inventory.cards}
    known = {card.name for card in inventory.cards} | {v.name for v in inventory.vgcus}
    problems = {card.name: card.problems for card in inventory.cards if not card.usable}
    problems.update({v.name: v.problems for v in inventory.vgcus if not v.usable})
    names: list[str] = []
    for source in request.sources:
        for token in source.tokens:
            if token == "all":  # noqa: S105 - a keyword of the grammar, not a secret
                usable = [card.name for card in inventory.usable_cards()]
                if not usable:
                    raise InvalidRequestError(
                        f"{source.description} asks for all cards but none is usable under "
                        f"{inventory.root}: {'; '.join(inventory.problems) or 'no GCU found'}"
                    )
                names.extend(usable)
                continue
            name = by_bus.get(token, token)
            shown = token[3:] if token.startswith("gcu") else token
            if name not in known:
                raise InvalidRequestError(
                    f"{source.description} asks for {shown!r}, which is not on this node; "
                    f"cards on this node: {describe_devices(inventory)}"
                )
            if name in problems:
                raise InvalidRequestError(
                    f"{source.description} asks for {shown!r}, which is not usable "
                    f"({'; '.join(problems[name])}); cards on this node: "
                    f"{describe_devices(inventory)}"
                )
            names.append(name)
    return naming.index_order(names)
