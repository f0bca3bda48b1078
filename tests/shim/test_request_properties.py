"""Property tests of the device-request grammar: a container gets only what it asked for.

Whatever env value, device-list mounts and CDI annotations a spec carries, the runtime either
refuses the request (InvalidRequestError, or a create StepError with the spec untouched) or
grants exactly what the spec legitimately requested, which is always a subset of what was
requested AND of what exists and is usable on the node. The generator keeps its own account
of what each spec asks for (the oracle), independent of the grammar's code. Bounded and
deterministic: a fixed number of derandomized examples, no example database.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enflame_gcu import devices, naming
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.errors import InvalidRequestError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import create, oci
from enflame_gcu.shim import request as device_request
from enflame_gcu.simulation import simulate, topofile
from tests.shim.conftest import make_spec, plugin_mount

ENV = naming.VISIBLE_DEVICES_ENV
PROPERTY_SETTINGS = settings(
    max_examples=300,
    derandomize=True,  # the same examples on every run: CI stays deterministic
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CARD_NUMBERS = st.integers(min_value=0, max_value=9)  # the node had gcu0..gcu7
SPELLINGS = st.sampled_from(["minor", "name", "upper", "zeros", "bus"])
# Characters that make any list item invalid: digits of other scripts (str.isdigit() says
# yes to all of them), control and separator characters the grammar must not skip.
POISON = "²³¹٠١٢٣۴५৬๗໘០１２\x00\x1c\u00a0\u2028"
FILLER = "gcuvGCU:.-+_0123 \t"


@st.composite
def garbage(draw: st.DrawFn) -> str:
    """A device id that can never be valid: some filler around at least one poison char."""
    before = draw(st.text(alphabet=FILLER, max_size=4))
    after = draw(st.text(alphabet=FILLER, max_size=4))
    return before + draw(st.sampled_from(POISON)) + after


@dataclass(frozen=True)
class Node:
    """The simulated node: what discovery deems usable, and the cards' bus ids."""

    root: str
    prepared: str
    usable: frozenset[str]
    bus_ids: dict[str, str]
    inventory: devices.Inventory  # discovered once: the node does not change during the tests


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    """Vendor 8-card node, prepared edits written first; then gcu5 gets a garbage numa_node
    (known, unusable), gcu6 is unbound and gcu7 unplugged, both keeping their /dev node."""
    root = str(tmp_path_factory.mktemp("property-node"))
    simulate.create(root, topofile.load("vendor-8card"))
    inventory = devices.discover(root)
    prepared = os.path.join(str(tmp_path_factory.mktemp("prepared")), "prepared-edits.json")
    assert cdi.refresh_prepared_edits(prepared, inventory)
    cards = inventory.card_by_name()

    def function(name: str) -> str:
        return os.path.realpath(os.path.join(root, naming.PCI_DEVICES[1:], cards[name].bdf))

    with open(os.path.join(function("gcu5"), "numa_node"), "w", encoding="utf-8") as handle:
        handle.write("garbage\n")
    shutil.rmtree(os.path.join(function("gcu6"), cards["gcu6"].driver_dir))
    shutil.rmtree(function("gcu7"))
    os.unlink(os.path.join(root, naming.PCI_DEVICES[1:], cards["gcu7"].bdf))
    damaged = devices.discover(root)
    usable = frozenset(card.name for card in damaged.usable_cards())
    assert usable == {f"gcu{n}" for n in range(5)}
    assert all(os.path.exists(os.path.join(root, "dev", f"gcu{n}")) for n in range(8))
    bus_ids = {name: card.bdf for name, card in cards.items()}
    return Node(root, prepared, usable, bus_ids, damaged)


@dataclass
class Request:
    """A generated spec plus what it legitimately asks for (the oracle)."""

    spec: dict[str, Any]
    accept_env: bool
    asked: set[str] = field(default_factory=set)  # cards a counting source names
    asked_all: bool = False  # a counting source says "all"
    malformed: bool = False  # a counting source is malformed: the request must be refused

    def expected(self, usable: frozenset[str]) -> list[str] | None:
        """The cards the runtime must grant, or None when it must refuse."""
        if self.malformed or not self.asked <= usable:
            return None
        cards = self.asked | (usable if self.asked_all else set())
        return sorted(cards, key=lambda name: int(name[len("gcu") :]))  # index order


def _spell(number: int, style: str, bus_ids: dict[str, str]) -> str:
    if style == "bus" and f"gcu{number}" in bus_ids:
        return bus_ids[f"gcu{number}"]
    return {"name": f"gcu{number}", "upper": f"GCU{number}", "zeros": f"{number:03d}"}.get(
        style, str(number)
    )


def _env(draw: st.DrawFn, request: Request, counts: bool, bus_ids: dict[str, str]) -> None:
    kind = draw(st.sampled_from(["unset", "void", "none", "all", "list", "garbage", "mounts"]))
    if kind == "unset":
        return
    if kind == "list":
        items = draw(st.lists(st.tuples(CARD_NUMBERS, SPELLINGS), min_size=1, max_size=4))
        pad = draw(st.sampled_from(["", " ", "\t"]))
        value = ",".join(f"{pad}{_spell(n, style, bus_ids)}{pad}" for n, style in items)
        if counts:
            request.asked |= {f"gcu{n}" for n, _ in items}
    elif kind == "garbage":
        good = [str(n) for n in draw(st.lists(CARD_NUMBERS, max_size=2))]
        value = ",".join([*good, draw(garbage())])
        request.malformed |= counts
    else:
        value = {"void": "void", "none": "none", "all": "ALL"}.get(kind, naming.VOLUME_MOUNT_DIR)
        request.asked_all |= kind == "all" and counts
    request.spec["process"]["env"].append(f"{ENV}={value}")


MOUNT_SHAPES = st.sampled_from(["plugin", "all", "emptyDir", "rw", "tmpfs", "garbage name"])


def _mounts(draw: st.DrawFn, request: Request) -> None:
    for number, shape in draw(st.lists(st.tuples(CARD_NUMBERS, MOUNT_SHAPES), max_size=3)):
        mount = plugin_mount("all" if shape == "all" else f"gcu{number}")
        if shape == "emptyDir":  # not the plugin's: ignored, whatever it names
            mount["source"] = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~empty-dir/v"
        elif shape == "rw":
            mount["options"] = ["rbind", "rw"]
        elif shape == "tmpfs":
            mount.update(type="tmpfs", source="tmpfs", options=["nosuid"])
        elif shape == "garbage name":
            mount["destination"] = f"{naming.VOLUME_MOUNT_DIR}/{draw(garbage())}"
            request.malformed = True
        elif shape == "plugin":
            request.asked.add(f"gcu{number}")
        else:
            request.asked_all = True
        request.spec["mounts"].append(mount)


CDI_KINDS = st.sampled_from(["ours", "all", "other vendor", "malformed"])


def _annotations(draw: st.DrawFn, request: Request) -> None:
    notes: dict[str, str] = {}
    for index in range(draw(st.integers(min_value=0, max_value=2))):
        parts = []
        for kind, number in draw(st.lists(st.tuples(CDI_KINDS, CARD_NUMBERS), min_size=1)):
            if kind == "ours":
                parts.append(f"enflame.com/gcu={number}")
                request.asked.add(f"gcu{number}")
            elif kind == "all":
                parts.append("enflame.com/gcu=all")
                request.asked_all = True
            elif kind == "other vendor":
                parts.append(f"vendor.example/gpu={number}")
            else:  # a leading zero or sign: not a name our CDI specs define
                parts.append(f"enflame.com/gcu={draw(st.sampled_from(['0', '+', '00']))}{number}")
                request.malformed = True
        notes[f"cdi.k8s.io/claim{index}"] = ",".join(parts)
    if notes:
        request.spec["annotations"] = notes


@st.composite
def requests(draw: st.DrawFn, bus_ids: dict[str, str]) -> Request:
    """A spec with any mix of env value, device-list mounts and CDI annotations."""
    privileged = draw(st.booleans())
    request = Request(make_spec(privileged=privileged), accept_env=draw(st.booleans()))
    _env(draw, request, request.accept_env or privileged, bus_ids)
    _mounts(draw, request)
    _annotations(draw, request)
    return request


@PROPERTY_SETTINGS
@given(data=st.data())
def test_resolution_grants_exactly_what_was_requested_and_is_usable(
    node: Node, data: st.DataObject
) -> None:
    request = data.draw(requests(node.bus_ids))
    try:
        parsed = device_request.from_spec(request.spec, request.accept_env)
        granted = device_request.resolve(parsed, node.inventory)
    except InvalidRequestError:
        assert request.expected(node.usable) is None, "a valid request was refused"
        return
    assert set(granted) <= node.usable
    assert granted == request.expected(node.usable)


class _NoLog:
    """The create path's log, discarding every line."""

    def debug(self, message: str, /, *args: object) -> None:
        """Drop the line."""

    info = warning = error = debug


def _create(request: Request, node: Node, prepared: str, bundle: str) -> bytes | None:
    """Run the create path on a fresh bundle; the spec written, or None when refused."""
    path = oci.spec_path(bundle)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(request.spec, handle)
    with open(path, "rb") as handle:
        before = handle.read()
    config = runtime_config.RuntimeConfig(
        root=node.root,
        prepared_edits=prepared,
        log_file="",
        accept_envvar_when_unprivileged=request.accept_env,
    )
    try:
        create.edit_bundle(bundle, config, _NoLog())
    except create.StepError:
        with open(path, "rb") as handle:
            assert handle.read() == before  # refused: the spec is untouched
        return None
    with open(path, "rb") as handle:
        return handle.read()


@settings(PROPERTY_SETTINGS, max_examples=60)
@given(data=st.data())
def test_created_specs_carry_exactly_the_granted_nodes_on_both_paths(
    node: Node, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    request = data.draw(requests(node.bus_ids))
    bundle = str(tmp_path_factory.mktemp("bundle"))
    fast = _create(request, node, node.prepared, bundle)
    slow = _create(request, node, "", bundle)
    assert fast == slow  # the prepared file never grants more (or other) than discovery
    expected = request.expected(node.usable)
    if fast is None:
        assert expected is None, "a valid request was refused"
        return
    assert expected is not None, "a request that must be refused was granted"
    if not (request.asked or request.asked_all):
        return  # nothing counting was asked: no device nodes (checked by the grammar test)
    spec = json.loads(fast)
    nodes = [entry["path"] for entry in spec["linux"]["devices"]]
    assert nodes == [f"/dev/{name}" for name in expected] + [naming.CONTROL_NODE]
    rules = spec["linux"]["resources"]["devices"][1:]  # after the spec's own deny-all
    assert len(rules) == len(nodes)
