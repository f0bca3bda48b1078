"""The versioned config file (``--config-file``): YAML, ``version: v1``, strict keys.

Shape (every key optional except ``version``; see docs/user-guide.md, "Sharing GCUs")::

    version: v1
    flags:                      # any plugin flag, camelCase: passDeviceSpecs, healthInterval,
      resources: [gcu, shared-gcu]  # deviceListStrategy, resourceName, logLevel, ...
    sharing:
      cards: [gcu4, gcu5]       # or "all" (the default): which cards are served as slices
      slicesPerCard: 6
      slicesByModel: {S60-48GB: 8}
      slicesByCard: {gcu3: 4}
      policy: packed            # or distributed
      maxSlicesPerContainer: 0  # 0 = no cap

An unknown key is an error naming its dotted path and the valid keys, so a typo never silently
turns into a default. The result is a layer for :func:`config.resolve`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from enflame_gcu import fileio, sharing
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.errors import ConfigError

VERSION = "v1"
_CARD = re.compile(r"^gcu(\d+)$")
_BUS_ID = re.compile(r"^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def camel(name: str) -> str:
    """``pass_device_specs`` -> ``passDeviceSpecs``: how a flag is spelt in the file."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


# A file cannot name itself nor choose which named config it is; every other option is a flag.
NOT_IN_FILE = (
    "config_file",
    "config_dir",
    "config_default",
    "config_label",
    "config_label_interval",
)
FLAG_KEYS = {camel(o.field): o for o in plugin_config.OPTIONS if o.field not in NOT_IN_FILE}
SHARING_KEYS = (
    "cards",
    "slicesPerCard",
    "slicesByModel",
    "slicesByCard",
    "policy",
    "maxSlicesPerContainer",
)
TOP_KEYS = ("version", "flags", "sharing")


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: must be a mapping, got {type(value).__name__}")
    return value


def _check_keys(data: Mapping[str, Any], valid: Any, prefix: str) -> None:
    for key in data:
        if key not in valid:
            path = f"{prefix}{key}"
            raise ConfigError(f"{path}: unknown key; valid: {', '.join(sorted(valid))}")


def _flag_text(value: Any, option: plugin_config.Option, path: str) -> str:
    """A file value as the flag text its parser takes; YAML types checked against the flag's."""
    listed = isinstance(getattr(plugin_config.PluginConfig(), option.field), tuple)
    if isinstance(value, list) and listed:
        if not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{path}: every item must be a string, got {value!r}")
        return ",".join(value)
    if isinstance(value, bool):
        if not option.flag:
            raise ConfigError(f"{path}: expected {_kind(option)}, got a boolean")
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        if option.flag and not isinstance(value, str):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return str(value)
    raise ConfigError(f"{path}: expected {_kind(option)}, got {type(value).__name__}")


def _kind(option: plugin_config.Option) -> str:
    default = getattr(plugin_config.PluginConfig(), option.field)
    if option.flag:
        return "true or false"
    if isinstance(default, tuple):
        return "a list of strings"
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return "a number"
    return "a string"


def _flags(data: Mapping[str, Any]) -> dict[str, Any]:
    _check_keys(data, FLAG_KEYS, "flags.")
    layer: dict[str, Any] = {}
    for key, value in data.items():
        option = FLAG_KEYS[key]
        path = f"flags.{key}"
        if value is None:
            continue
        try:
            layer[option.field] = option.parse(_flag_text(value, option, path))
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    return layer


def card_ref(value: Any, path: str) -> str:
    """A card named in the file: ``gcuN``, a minor number, or a PCI bus id; canonical form."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"gcu{value}"
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return f"gcu{int(text)}"
        if match := _CARD.match(text):
            return f"gcu{int(match.group(1))}"
        if _BUS_ID.match(text):
            return text if text.count(":") == 2 else f"0000:{text}"
    raise ConfigError(
        f"{path}: {value!r} is not a card; name cards as gcuN, by minor number or by PCI bus id "
        "(0000:9c:00.0)"
    )


def _count(value: Any, path: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{path}: expected a whole number >= {low}, got {value!r}")
    return value


def _counts(value: Any, path: str, key_of: Any) -> dict[str, int]:
    return {
        key_of(key, f"{path}.{key}"): _count(count, f"{path}.{key}", 1)
        for key, count in _mapping(value, path).items()
    }


def _sharing(data: Mapping[str, Any]) -> dict[str, Any]:
    _check_keys(data, SHARING_KEYS, "sharing.")
    settings: dict[str, Any] = {}
    if "slicesPerCard" in data:
        settings["slices"] = _count(data["slicesPerCard"], "sharing.slicesPerCard", 1)
    if "slicesByModel" in data:
        settings["slices_by_model"] = _counts(
            data["slicesByModel"], "sharing.slicesByModel", lambda key, _path: str(key)
        )
    if "slicesByCard" in data:
        settings["slices_by_card"] = _counts(data["slicesByCard"], "sharing.slicesByCard", card_ref)
    if "policy" in data:
        policy = data["policy"]
        if policy not in sharing.SLICE_POLICIES:
            raise ConfigError(
                f"sharing.policy: {policy!r} is not a policy; valid: "
                f"{', '.join(sharing.SLICE_POLICIES)}"
            )
        settings["policy"] = policy
    if "maxSlicesPerContainer" in data:
        settings["max_slices_per_container"] = _count(
            data["maxSlicesPerContainer"], "sharing.maxSlicesPerContainer", 0
        )
    try:
        layer: dict[str, Any] = {"sharing": sharing.SharingSettings(**settings)}
    except ConfigError as exc:
        raise ConfigError(f"sharing: {exc}") from exc
    cards = data.get("cards", "all")
    if cards != "all":
        if not isinstance(cards, list) or not cards:
            raise ConfigError(
                f"sharing.cards: expected 'all' or a non-empty list of cards, got {cards!r}"
            )
        layer["shared_cards"] = tuple(
            dict.fromkeys(card_ref(card, f"sharing.cards[{i}]") for i, card in enumerate(cards))
        )
    return layer


def parse(text: str) -> dict[str, Any]:
    """The layer a config file's text gives; ConfigError names the bad key's path."""
    try:
        data = fileio.parse_bounded(yaml.safe_load, text, "the file")
    except fileio.NestingError as exc:
        raise ConfigError(str(exc)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}") from exc
    data = _mapping({} if data is None else data, "top level")
    _check_keys(data, TOP_KEYS, "")
    if data.get("version") != VERSION:
        found = "missing" if "version" not in data else repr(data["version"])
        raise ConfigError(f"version: {found}; this plugin reads version: {VERSION}")
    layer: dict[str, Any] = {}
    if data.get("flags") is not None:
        layer.update(_flags(_mapping(data["flags"], "flags")))
    if data.get("sharing") is not None:
        layer.update(_sharing(_mapping(data["sharing"], "sharing")))
    return layer


def load(path: str) -> dict[str, Any]:
    """Read and parse a config file; ConfigError starts with the file's path."""
    try:
        text = fileio.read_regular(path).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text ({exc})") from exc
    try:
        return parse(text)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
