"""Topology descriptions (``*.topo``) of simulated GCU nodes: parse, render and the built-ins.

Description format (``*.topo``, see docs/topology-format.md): ``key: value`` header lines, then
one line per card in the vendor manual's own notation, leaf first::

    driver-version: 1.0.20230110
    gcu0 0000:11:00.0 <- 0000:10:00.0 <- 0000:0f:00.0 <- 0000:0c:02.0 <- cpu  numa=0

Headers: ``name``, ``description``, ``driver-version``, ``major`` (default 238),
``control-minor`` (255), ``vgcu-major`` (239), ``device`` (default PCI device id, 0x0021).
Card options: ``numa=N`` (-1 = unknown), ``device=0xNNNN``, ``dir=enflame|zixiao``,
``vgcus=A,B`` (vGCU minors on this card). ``#`` starts a comment.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from importlib import resources

from enflame_gcu import naming
from enflame_gcu.errors import TopologyError

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_CARD = re.compile(r"^gcu(\d+)$")


@dataclass(frozen=True, slots=True)
class SimCard:
    """One card of a description: minor, BDF, bridges from the root port down, options."""

    minor: int
    bdf: str
    bridges: tuple[str, ...]
    numa: int | None = None
    device_id: int = 0x0021
    driver_dir: str = "enflame"
    vgcus: tuple[int, ...] = ()

    @property
    def root_complex(self) -> str:
        """``pci<domain>:<bus>`` of the root port (or of the card on a root bus)."""
        top = self.bridges[0] if self.bridges else self.bdf
        return f"pci{top[:7]}"


@dataclass(frozen=True, slots=True)
class SimTopology:
    """A parsed description: the node-wide settings and its cards."""

    name: str
    description: str
    driver_version: str
    cards: tuple[SimCard, ...]
    major: int = 238
    control_minor: int = 255
    vgcu_major: int = 239


def _int(value: str, what: str, line_no: int) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise TopologyError(f"line {line_no}: {what} must be a number, got {value!r}") from None


def _parse_card(tokens: list[str], default_device: int, line_no: int) -> SimCard:
    match = _CARD.match(tokens[0])
    if not match:
        raise TopologyError(f"line {line_no}: a card line starts with gcuN, got {tokens[0]!r}")
    chain: list[str] = []
    options: dict[str, str] = {}
    rest = tokens[1:]
    for position, token in enumerate(rest):
        if "=" in token:
            key, _, value = token.partition("=")
            options[key] = value
        elif token == "<-":  # noqa: S105 (an arrow, not a password)
            continue
        elif token == "cpu":  # noqa: S105 (the root complex, not a password)
            if any("=" not in t for t in rest[position + 1 :]):
                raise TopologyError(f"line {line_no}: nothing but options may follow 'cpu'")
        elif _BDF.match(token):
            chain.append(token)
        else:
            raise TopologyError(f"line {line_no}: {token!r} is not a PCI address like 0000:11:00.0")
    if not chain or "cpu" not in rest:
        raise TopologyError(f"line {line_no}: want 'gcuN <BDF> <- <bridge> ... <- cpu'")
    unknown = set(options) - {"numa", "device", "dir", "vgcus"}
    if unknown:
        raise TopologyError(
            f"line {line_no}: unknown option(s) {', '.join(sorted(unknown))}; "
            "valid: numa, device, dir, vgcus"
        )
    numa = _int(options.get("numa", "-1"), "numa", line_no)
    driver_dir = options.get("dir", "enflame")
    if driver_dir not in naming.DRIVER_DIRS:
        raise TopologyError(f"line {line_no}: dir must be enflame or zixiao, got {driver_dir!r}")
    vgcus = tuple(_int(v, "vgcus", line_no) for v in options.get("vgcus", "").split(",") if v)
    return SimCard(
        minor=int(match.group(1)),
        bdf=chain[0],
        bridges=tuple(reversed(chain[1:])),
        numa=None if numa < 0 else numa,
        device_id=_int(options["device"], "device", line_no)
        if "device" in options
        else default_device,
        driver_dir=driver_dir,
        vgcus=vgcus,
    )


def parse(text: str, name: str = "custom") -> SimTopology:
    """Parse a description; TopologyError names the line and what was wrong."""
    headers: dict[str, str] = {}
    cards: list[SimCard] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        if sep and " " not in key and not _CARD.match(key.strip()):
            headers[key.strip()] = value.strip()
            continue
        default_device = _int(headers.get("device", "0x0021"), "device", line_no)
        cards.append(_parse_card(line.split(), default_device, line_no))
    known = {
        "name",
        "description",
        "driver-version",
        "major",
        "control-minor",
        "vgcu-major",
        "device",
    }
    if set(headers) - known:
        raise TopologyError(
            f"unknown header(s) {', '.join(sorted(set(headers) - known))}; "
            f"valid: {', '.join(sorted(known))}"
        )
    _check_consistent(cards)
    return SimTopology(
        name=headers.get("name", name),
        description=headers.get("description", ""),
        driver_version=headers.get("driver-version", "1.0.20230110"),
        cards=tuple(sorted(cards, key=lambda c: c.minor)),
        major=_int(headers.get("major", "238"), "major", 0),
        control_minor=_int(headers.get("control-minor", "255"), "control-minor", 0),
        vgcu_major=_int(headers.get("vgcu-major", "239"), "vgcu-major", 0),
    )


def _check_consistent(cards: list[SimCard]) -> None:
    minors = [c.minor for c in cards]
    if len(set(minors)) != len(minors):
        raise TopologyError(f"card minors repeat: {sorted(minors)}")
    parent: dict[str, str] = {}
    for card in cards:
        path = (card.root_complex, *card.bridges, card.bdf)
        for upper, lower in itertools.pairwise(path):
            if parent.setdefault(lower, upper) != upper:
                raise TopologyError(
                    f"{lower} has two parents ({parent[lower]} and {upper}); the PCI tree "
                    "must be a tree"
                )
    if len({c.bdf for c in cards}) != len(cards):
        raise TopologyError("two cards share a PCI address")


def builtin_names() -> list[str]:
    """Names of the topologies shipped with the package."""
    folder = resources.files("enflame_gcu.simulation") / "topologies"
    return sorted(p.name[: -len(".topo")] for p in folder.iterdir() if p.name.endswith(".topo"))


def load(name_or_path: str) -> SimTopology:
    """A built-in topology by name, or a description file by path."""
    if os.path.sep in name_or_path or name_or_path.endswith(".topo"):
        try:
            with open(name_or_path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise TopologyError(f"cannot read topology file {name_or_path}: {exc}") from exc
        return parse(text, os.path.basename(name_or_path).removesuffix(".topo"))
    if name_or_path not in builtin_names():
        raise TopologyError(
            f"no built-in topology {name_or_path!r}; built-in: {', '.join(builtin_names())} "
            "(or give a path to a .topo file)"
        )
    resource = resources.files("enflame_gcu.simulation") / "topologies" / f"{name_or_path}.topo"
    return parse(resource.read_text(encoding="utf-8"), name_or_path)


def render(topo: SimTopology) -> str:
    """A description text that parses back to ``topo``."""
    lines = [f"name: {topo.name}"]
    if topo.description:
        lines.append(f"description: {topo.description}")
    lines += [
        f"driver-version: {topo.driver_version}",
        f"major: {topo.major}",
        f"control-minor: {topo.control_minor}",
        f"vgcu-major: {topo.vgcu_major}",
    ]
    for card in topo.cards:
        chain = " <- ".join([card.bdf, *reversed(card.bridges), "cpu"])
        opts = [f"numa={-1 if card.numa is None else card.numa}", f"device=0x{card.device_id:04x}"]
        if card.driver_dir != "enflame":
            opts.append(f"dir={card.driver_dir}")
        if card.vgcus:
            opts.append("vgcus=" + ",".join(str(v) for v in card.vgcus))
        lines.append(f"gcu{card.minor} {chain} {' '.join(opts)}")
    return "\n".join(lines) + "\n"
