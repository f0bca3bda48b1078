"""Property: discovery, health and the plugin's device list survive any damage to sysfs and /dev.

Each example builds a small simulated node (three cards, one in vGCU mode), applies a random
list of damages (bytes written, entries deleted, renamed to odd names, replaced by a directory,
a FIFO or a symlink that loops or leaves the root) and checks that nothing raises, every card
name is exactly gcu + ASCII digits, and every problem text is one printable line.
Bounded and derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import hypothesis
import pytest
from hypothesis import strategies as st

from enflame_gcu import devices, health, sysfs
from enflame_gcu.device_plugin import config, resources, service, state
from enflame_gcu.simulation import simulate, topofile

SETTINGS = hypothesis.settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    # The fixture's directory is rebuilt by every example, so sharing it is intended.
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)
NODE = """\
name: damaged
gcu0 0000:11:00.0 <- 0000:10:00.0 <- 0000:0f:00.0 <- 0000:0e:00.0 <- cpu  numa=0
gcu1 0000:12:00.0 <- 0000:10:10.0 <- 0000:0f:00.0 <- 0000:0e:00.0 <- cpu  numa=0
gcu2 0000:9c:00.0 <- 0000:9b:00.0 <- 0000:9a:00.0 <- cpu  numa=1  vgcus=4,5
"""
ODD_NAMES = st.sampled_from(
    ["gcu2\n", "gcu\u0661\u0662", "gcu02", "gcu9", "vgcu\u00b2", "gcu", "0000:11:00.0\n", "x"]
)
CONTENT = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(
        [b"-1", b"99999999999999999999999", b"238:4294967296", b"0x1e36", b"\xff\xfe", b""]
    ),
    st.text(max_size=24).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
ACTIONS = st.sampled_from(["write", "delete", "rename", "directory", "fifo", "loop", "escape"])
DAMAGE = st.lists(
    st.tuples(ACTIONS, st.integers(min_value=0), CONTENT, ODD_NAMES), min_size=1, max_size=6
)


@pytest.fixture
def work() -> Iterator[str]:
    """A scratch directory for the examples' nodes."""
    path = tempfile.mkdtemp(prefix="gcud-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def targets(root: str) -> list[str]:
    """Every path under the node's /sys and /dev, in a stable order."""
    found: list[str] = []
    for top in ("sys", "dev"):
        for directory, dirs, files in os.walk(os.path.join(root, top)):
            found.extend(os.path.join(directory, name) for name in sorted(dirs + files))
            dirs.sort()
    return found


def remove(path: str) -> None:
    """Delete whatever is at ``path`` (a symlink itself, not its target)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def damage(root: str, action: str, pick: int, content: bytes, name: str) -> None:
    """Apply one damage to the ``pick``-th path (modulo how many there are now)."""
    paths = targets(root)
    if not paths:
        return
    path = paths[pick % len(paths)]
    if action == "write":
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "wb") as handle:
                handle.write(content)
        return
    if action == "rename":
        renamed = os.path.join(os.path.dirname(path), name)
        if not os.path.lexists(renamed):
            os.rename(path, renamed)
        return
    remove(path)
    if action == "directory":
        os.mkdir(path)
    elif action == "fifo":
        os.mkfifo(path)
    elif action == "loop":
        os.symlink(os.path.basename(path), path)
    elif action == "escape":
        os.symlink("/proc/self/root/etc", path)


def assert_one_line(text: str) -> None:
    """A message is one printable line (no newline, no escape sequence, no lone surrogate)."""
    assert text.isprintable(), repr(text)


@SETTINGS
@hypothesis.given(damages=DAMAGE)
def test_discovery_health_and_the_device_list_never_raise_on_a_damaged_tree(
    work: str, damages: list[tuple[str, int, bytes, str]]
) -> None:
    root = os.path.join(work, "n")
    shutil.rmtree(root, ignore_errors=True)
    simulate.create(root, topofile.parse(NODE))
    for one in damages:
        damage(root, *one)

    inventory = devices.discover(root)
    for card in inventory.cards:
        assert sysfs.node_name(card.name) == ("gcu", card.minor)
        assert card.numa_node is None or 0 <= card.numa_node <= sysfs.MAX_NUMA_NODE
        for problem in card.problems:
            assert_one_line(problem)
    for vgcu in inventory.vgcus:
        assert sysfs.node_name(vgcu.name) == ("vgcu", vgcu.minor)
    for problem in inventory.problems:
        assert_one_line(problem)
    report = health.check(root, inventory.cards)
    for reason in report.reasons().values():
        assert_one_line(reason)
    # What the kubelet would be sent: every kind, through the protobuf messages.
    cfg = config.PluginConfig(host_root=root, resources=("gcu", "vgcu"))
    kinds, _ = resources.build(inventory, cfg)
    for kind in kinds.values():
        snapshot = state.Snapshot(kind, resources.health_of(kind, report))
        service.device_list(snapshot)
