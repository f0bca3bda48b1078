"""The prepared-edits fast path writes exactly what discovery writes, and falls back when stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from enflame_gcu import devices, naming
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import create, launcher, oci
from enflame_gcu.simulation import simulate
from tests.conftest import MakeNode
from tests.shim.conftest import MakeBundle, plugin_mount

ENV = naming.VISIBLE_DEVICES_ENV
MOUNT_DIR = naming.VOLUME_MOUNT_DIR
FAST = "used prepared edits"
FELL_BACK = "prepared edits not used"


class RecordingLog:
    """Keeps every line the create path logs, with its level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def _add(self, level: str, message: str, *args: object) -> None:
        self.lines.append((level, message % args if args else message))

    def debug(self, message: str, /, *args: object) -> None:
        self._add("debug", message, *args)

    def info(self, message: str, /, *args: object) -> None:
        self._add("info", message, *args)

    def warning(self, message: str, /, *args: object) -> None:
        self._add("warning", message, *args)

    def error(self, message: str, /, *args: object) -> None:
        self._add("error", message, *args)

    def text(self) -> str:
        return "\n".join(f"{level} {line}" for level, line in self.lines)


def prepare(root: str, directory: str) -> str:
    """Write the node's prepared edits file as the installer does; returns its path."""
    path = os.path.join(directory, "prepared-edits.json")
    assert cdi.refresh_prepared_edits(path, devices.discover(root))
    return path


def config_for(root: str, prepared: str, **extra: Any) -> runtime_config.RuntimeConfig:
    return runtime_config.RuntimeConfig(root=root, prepared_edits=prepared, log_file="", **extra)


def run_create(bundle: str, config: runtime_config.RuntimeConfig) -> tuple[str, bytes, str]:
    """(outcome or error text, the spec's bytes afterwards, the log)."""
    log = RecordingLog()
    try:
        outcome = create.edit_bundle(bundle, config, log)
    except create.StepError as exc:
        outcome = f"error: {exc}"
    with open(oci.spec_path(bundle), "rb") as handle:
        return outcome, handle.read(), log.text()


def both_paths(
    make_bundle: MakeBundle, root: str, prepared: str, spec: dict[str, Any], **extra: Any
) -> tuple[tuple[str, bytes, str], tuple[str, bytes, str]]:
    """The same request through the fast path and through discovery alone."""
    fast = run_create(make_bundle(**spec), config_for(root, prepared, **extra))
    with pytest.MonkeyPatch.context() as patch:
        # Discovery alone: the fast lane answers nothing (it would answer "none" without a file).
        patch.setattr(create, "_from_prepared", lambda *args: None)
        slow = run_create(make_bundle(**spec), config_for(root, "", **extra))
    return fast, slow


ANNOTATION = "cdi.k8s.io/enflame-gcu"
VENDOR_REQUESTS: dict[str, dict[str, Any]] = {
    "minor": {"env": [f"{ENV}=0"]},
    "two minors": {"env": [f"{ENV}=0,1"]},
    "name, spaces, repeats": {"env": [f"{ENV}= 5 , gcu3,5 "]},
    "gcu3": {"env": [f"{ENV}=gcu3"]},
    "all": {"env": [f"{ENV}=ALL"]},
    "none": {"env": [f"{ENV}=none"]},
    "later env wins": {"env": [f"{ENV}=all", f"{ENV}=6"]},
    "volume mounts": {
        "env": [f"{ENV}={MOUNT_DIR}"],
        "mounts": [plugin_mount(f"gcu{n}") for n in (4, 2)],
    },
    "annotations": {"annotations": {ANNOTATION: "enflame.com/gcu=1,enflame.com/gcu=7"}},
    "annotation all": {"annotations": {"cdi.k8s.io/x": "vendor.com/x=1,enflame.com/gcu=all"}},
    "env plus annotation": {"env": [f"{ENV}=0"], "annotations": {ANNOTATION: "enflame.com/gcu=2"}},
    "privileged": {"env": [f"{ENV}=all"], "privileged": True},
}
VGCU_REQUESTS: dict[str, dict[str, Any]] = {
    "vgcu": {"env": [f"{ENV}=vgcu3"]},
    "vgcus and a card": {"env": [f"{ENV}=vgcu5,0,vgcu1"]},
    "vgcu annotation": {"annotations": {ANNOTATION: "enflame.com/vgcu=2,enflame.com/vgcu=6"}},
    "all cards": {"env": [f"{ENV}=all"]},
    "vgcu volume mount": {
        "env": [f"{ENV}={MOUNT_DIR}"],
        "mounts": [plugin_mount("vgcu4")],
    },
}
UNTOUCHED: dict[str, dict[str, Any]] = {
    "unset": {},
    "void": {"env": [f"{ENV}=void"]},
    "empty": {"env": [f"{ENV}="]},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "driver mounts and env": {
        "mounts": (("/usr/bin/efsmi", "/usr/bin/efsmi"), ("/opt/lib/libefml.so", "/usr/lib/x.so")),
        "env": (("EF_LOG", "1"), ("PATH", "/opt/enflame/bin")),
    },
    "envvar not accepted": {"accept_envvar_when_unprivileged": False},
}
CASES = [
    pytest.param((node, requests[name], config), id=f"{node}-{name}-{config}")
    for node, requests in (("vendor-8card", VENDOR_REQUESTS), ("vgcu-2card", VGCU_REQUESTS))
    for name in requests
    for config in CONFIGS
]


@pytest.mark.parametrize("case", CASES)
def test_fast_and_discovery_paths_write_byte_identical_specs(
    make_node: MakeNode,
    make_bundle: MakeBundle,
    tmp_path: os.PathLike[str],
    case: tuple[str, dict[str, Any], str],
) -> None:
    topology, spec, config = case
    root = make_node(topology)
    prepared = prepare(root, str(tmp_path))
    fast, slow = both_paths(make_bundle, root, prepared, spec, **CONFIGS[config])
    assert fast[:2] == slow[:2]
    assert fast[0].startswith("gave ") or fast[0] == "no GCU requested; spec left untouched"
    if fast[0].startswith("gave ") and fast[0] != f"gave no cards (requested by {ENV}=none)":
        assert f"debug {FAST}" in fast[2]  # the fast path really answered
    assert FELL_BACK not in fast[2]


@pytest.mark.parametrize("spec", list(UNTOUCHED.values()), ids=list(UNTOUCHED))
def test_void_and_unset_stay_byte_identical_either_way(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str], spec: dict[str, Any]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    bundle = make_bundle(**spec)
    with open(oci.spec_path(bundle), "rb") as handle:
        before = handle.read()
    outcome, after, _ = run_create(bundle, config_for(vendor_node, prepared))
    assert outcome == "no GCU requested; spec left untouched"
    assert after == before


def test_none_needs_no_prepared_file(vendor_node: str, make_bundle: MakeBundle) -> None:
    fast, slow = both_paths(
        make_bundle, vendor_node, "/nonexistent/prepared.json", {"env": [f"{ENV}=none"]}
    )
    assert fast[:2] == slow[:2]
    assert FELL_BACK not in fast[2]


def assert_falls_back(
    make_bundle: MakeBundle, root: str, prepared: str, spec: dict[str, Any], reason: str
) -> str:
    """The fast path declines with ``reason`` in the log; the result equals discovery's."""
    fast, slow = both_paths(make_bundle, root, prepared, spec)
    assert fast[:2] == slow[:2]
    assert FAST not in fast[2]
    assert FELL_BACK in fast[2] and reason in fast[2], fast[2]
    return fast[0]


def test_unplugged_card_falls_back_to_discovery_and_its_error(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    simulate.unplug(vendor_node, 3)
    outcome = assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}=3"]}, "gcu3: sysfs changed"
    )
    assert outcome.startswith("error: resolving the requested GCUs")
    assert (
        "info prepared edits not used"
        in both_paths(make_bundle, vendor_node, prepared, {"env": [f"{ENV}=3"]})[0][2]
    )
    outcome = assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}=all"]}, "/dev/gcuN nodes differ"
    )
    assert outcome.startswith("gave gcu0, gcu1, gcu2, gcu4,")
    # Cards whose nodes did not change are still answered from the file.
    fast, slow = both_paths(make_bundle, vendor_node, prepared, {"env": [f"{ENV}=0,1"]})
    assert fast[:2] == slow[:2] and FAST in fast[2]


def test_node_replaced_with_other_numbers_falls_back(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    node = os.path.join(vendor_node, "dev", "gcu2")
    info = os.stat(node)
    os.unlink(node)
    os.mknod(node, 0o666 | 0o020000, os.makedev(os.major(info.st_rdev), 42))
    outcome = assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}=2"]}, "/dev/gcu2 is "
    )
    assert outcome.startswith("error: ")


def test_card_added_after_preparing_makes_all_fall_back(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    simulate.unplug(vendor_node, 7)
    prepared = prepare(vendor_node, str(tmp_path))
    simulate.replug(vendor_node, 7)
    outcome = assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}=all"]}, "/dev/gcuN nodes differ"
    )
    assert outcome.startswith("gave gcu0, gcu1, gcu2, gcu3, gcu4, gcu5, gcu6, gcu7 ")
    assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}=7"]}, "gcu7 is not among"
    )


def test_driver_unloaded_falls_back(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    simulate.unload_driver(vendor_node)
    assert_falls_back(make_bundle, vendor_node, prepared, {"env": [f"{ENV}=0"]}, "not loaded")


def test_bus_ids_are_left_to_discovery(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    bdf = devices.discover(vendor_node).cards[1].bdf
    outcome = assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}={bdf}"]}, "bus id"
    )
    assert outcome.startswith("gave gcu1 ")


def test_unknown_id_falls_back_to_the_clear_error(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    outcome = assert_falls_back(
        make_bundle, vendor_node, prepared, {"env": [f"{ENV}=9"]}, "gcu9 is not among"
    )
    assert "asks for '9', which is not on this node; cards on this node: 0 (" in outcome


def test_mode_and_owner_are_read_live_like_discovery(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    os.chmod(os.path.join(vendor_node, "dev", "gcu1"), 0o660)
    os.chown(os.path.join(vendor_node, "dev", "gcuctl"), 0, 44)
    fast, slow = both_paths(make_bundle, vendor_node, prepared, {"env": [f"{ENV}=1"]})
    assert fast[:2] == slow[:2] and FAST in fast[2]
    assert b'"fileMode":432' in fast[1]


CORRUPTIONS = {
    "garbage": b"\x00not json",
    "not an object": b"[1, 2]",
    "wrong version": b'{"enflamePreparedEdits": "v0", "root": "/", "specs": []}',
    "bad shape": b'{"enflamePreparedEdits": "v2", "root": "ROOT", "specs": [{"kind": 1}]}',
    "node without numbers": (
        b'{"enflamePreparedEdits": "v2", "root": "ROOT", "specs": [{"kind": "enflame.com/gcu",'
        b' "containerEdits": {}, "devices": [{"name": "0", "containerEdits": {"deviceNodes":'
        b' [{"path": "/dev/gcu0", "hostPath": "/dev/gcu0"}]}}]}]}'
    ),
}


@pytest.mark.parametrize("content", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupt_prepared_file_falls_back(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str], content: bytes
) -> None:
    prepared = os.path.join(str(tmp_path), "prepared-edits.json")
    with open(prepared, "wb") as handle:
        handle.write(content.replace(b"ROOT", vendor_node.encode()))
    outcome = assert_falls_back(make_bundle, vendor_node, prepared, {"env": [f"{ENV}=0"]}, "")
    assert outcome.startswith("gave gcu0 ")


def test_file_prepared_for_another_root_is_not_used(
    make_node: MakeNode, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    # Same device numbers on both simulated nodes: only the recorded root tells them apart.
    other = make_node("vendor-8card")
    prepared = prepare(other, str(tmp_path))
    node = make_node("vendor-8card")
    assert_falls_back(make_bundle, node, prepared, {"env": [f"{ENV}=0"]}, "describes root")


def test_missing_prepared_file_falls_back_with_a_debug_line_only(
    vendor_node: str, make_bundle: MakeBundle
) -> None:
    fast, slow = both_paths(make_bundle, vendor_node, "/nonexistent/p.json", {"env": [f"{ENV}=0"]})
    assert fast[:2] == slow[:2]
    assert [level for level, line in _lines(fast[2]) if FELL_BACK in line] == ["debug"]


def _lines(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split(" ", 1)) for line in text.splitlines()]  # type: ignore[misc]


FAST_CREATE = """
import sys
sys.path.insert(0, {package_dir!r})
from enflame_gcu.shim import config as runtime_config, invocation as runtime_invocation
invocation = runtime_invocation.parse_argv(["x", "create", "--bundle", {bundle!r}, "c1"])
from enflame_gcu.shim import create
assert create.prepare(invocation, runtime_config.load())
print(" ".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize("with_file", [True, False], ids=["prepared", "no-file"])
def test_fast_create_imports_no_dataclasses_or_typing(
    vendor_node: str,
    make_bundle: MakeBundle,
    tmp_path: os.PathLike[str],
    with_file: bool,
) -> None:
    # A fresh `python -IS`, like the installed launcher, running a whole create.
    prepared = prepare(vendor_node, str(tmp_path)) if with_file else "/nonexistent/p.json"
    config = os.path.join(str(tmp_path), "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(
            f"root = {json.dumps(vendor_node)}\nprepared-edits = {json.dumps(prepared)}\n"
            f"log-file = {json.dumps(os.path.join(str(tmp_path), 'rt.log'))}\n"
        )
    bundle = make_bundle(env=[f"{ENV}=all"])
    code = FAST_CREATE.format(package_dir=launcher.default_package_dir(), bundle=bundle)
    env = dict(os.environ, **{runtime_config.PATH_ENV: config})
    result = subprocess.run(
        [sys.executable, "-IS", "-c", code], capture_output=True, env=env, check=True
    )
    loaded = set(result.stdout.decode().split())
    heavy = {
        "dataclasses",
        "typing",
        "inspect",
        "logging",
        "tempfile",
        "contextlib",
        "enflame_gcu.devices",
    }
    if with_file:
        assert not loaded & heavy, loaded & heavy
    else:  # the same check sees discovery's imports, so it would catch a silent fallback
        assert {"dataclasses", "enflame_gcu.devices"} <= loaded
    with open(oci.spec_path(bundle), encoding="utf-8") as handle:
        assert len(json.load(handle)["linux"]["devices"]) == 9


# --- node states where discovery refuses a card whose /dev node is still there (issue 10) ----


def _function_dir(root: str, minor: int) -> tuple[str, str, str]:
    """(bus link, the card's PCI function dir, its driver dir) under ``root``."""
    card = devices.discover(root).card_by_name()[f"gcu{minor}"]
    link = os.path.join(root, naming.PCI_DEVICES.lstrip("/"), card.bdf)
    function = os.path.realpath(link)
    return link, function, os.path.join(function, card.driver_dir)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


def _unbind(root: str, minor: int) -> None:
    shutil.rmtree(_function_dir(root, minor)[2])


def _unplug(root: str, minor: int) -> None:
    link, function, _ = _function_dir(root, minor)
    shutil.rmtree(function)
    os.unlink(link)


def _unload_driver(root: str, minor: int) -> None:
    driver_dirs = [_function_dir(root, card.minor)[2] for card in devices.discover(root).cards]
    shutil.rmtree(os.path.join(root, "sys/module/enflame"))
    for directory in driver_dirs:
        shutil.rmtree(directory)


def _dev_file_differs(root: str, minor: int) -> None:
    _write(os.path.join(_function_dir(root, minor)[2], f"gcu{minor}", "dev"), f"238:{minor + 20}")


def _numa_garbage(root: str, minor: int) -> None:
    _write(os.path.join(_function_dir(root, minor)[1], "numa_node"), "zero")


def _device_id_garbage(root: str, minor: int) -> None:
    _write(os.path.join(_function_dir(root, minor)[1], "device"), "0xnope")


def _other_vendor(root: str, minor: int) -> None:
    _write(os.path.join(_function_dir(root, minor)[1], "vendor"), "0x8086")


def _link_outside_sys_devices(root: str, minor: int) -> None:
    link, function, _ = _function_dir(root, minor)
    moved = os.path.join(root, "elsewhere", os.path.basename(function))
    shutil.move(function, moved)
    os.unlink(link)
    os.symlink(moved, link)


def _zixiao_driver_dir(root: str, minor: int) -> None:
    # Some driver builds name the directory zixiao: discovery still uses the card.
    driver_dir = _function_dir(root, minor)[2]
    os.rename(driver_dir, os.path.join(os.path.dirname(driver_dir), "zixiao"))


def _numa_fifo(root: str, minor: int) -> None:
    # Discovery never opens a FIFO where an attribute belongs (it would block): unusable.
    path = os.path.join(_function_dir(root, minor)[1], "numa_node")
    os.unlink(path)
    os.mkfifo(path)


def _vendor_symlink(root: str, minor: int) -> None:
    # Same text, but through a symlink: discovery does not follow it, the card is unusable.
    function = _function_dir(root, minor)[1]
    os.rename(os.path.join(function, "vendor"), os.path.join(function, "vendor.real"))
    os.symlink("vendor.real", os.path.join(function, "vendor"))


NODE_STATES = {
    "unbound": _unbind,
    "unplugged": _unplug,
    "driver unloaded": _unload_driver,
    "sysfs dev differs": _dev_file_differs,
    "numa_node garbage": _numa_garbage,
    "device id garbage": _device_id_garbage,
    "other vendor": _other_vendor,
    "bus link leaves /sys/devices": _link_outside_sys_devices,
    "zixiao driver dir": _zixiao_driver_dir,
    "numa_node FIFO": _numa_fifo,
    "vendor symlink": _vendor_symlink,
}
STATE_REQUESTS: dict[str, dict[str, Any]] = {
    "the card": {"env": [f"{ENV}=2"]},
    "all": {"env": [f"{ENV}=all"]},
    "other cards": {"env": [f"{ENV}=0,1"]},
    "volume mount": {"env": [f"{ENV}={MOUNT_DIR}"], "mounts": [plugin_mount("gcu2")]},
    "annotation all": {"annotations": {ANNOTATION: "enflame.com/gcu=all"}},
}


@pytest.mark.parametrize("request_name", list(STATE_REQUESTS))
@pytest.mark.parametrize("state", list(NODE_STATES))
def test_fast_path_grants_what_discovery_grants_when_a_card_is_gone_but_its_node_stays(
    vendor_node: str,
    make_bundle: MakeBundle,
    tmp_path: os.PathLike[str],
    state: str,
    request_name: str,
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    NODE_STATES[state](vendor_node, 2)
    assert os.path.exists(os.path.join(vendor_node, "dev", "gcu2"))  # the node remains
    fast, slow = both_paths(make_bundle, vendor_node, prepared, STATE_REQUESTS[request_name])
    assert fast[:2] == slow[:2], (fast[0], slow[0])
    if request_name == "other cards" and state != "driver unloaded":
        assert FAST in fast[2]  # cards whose sysfs did not change are still answered fast


@pytest.mark.parametrize("state", ["unbound", "unplugged"])
def test_vgcus_of_a_card_that_is_gone_are_left_to_discovery(
    make_node: MakeNode, make_bundle: MakeBundle, tmp_path: os.PathLike[str], state: str
) -> None:
    root = make_node("vgcu-2card")
    prepared = prepare(root, str(tmp_path))
    inventory = devices.discover(root)
    [vgcu, *_] = [v for v in inventory.vgcus if v.parent_minor == inventory.cards[0].minor]
    NODE_STATES[state](root, inventory.cards[0].minor)
    # Whatever discovery decides about a /dev/vgcuN whose card left sysfs (today it counts it
    # as a loose vGCU), the file does not answer: the recorded sysfs state is gone.
    assert_falls_back(make_bundle, root, prepared, {"env": [f"{ENV}={vgcu.name}"]}, "sysfs changed")


def test_a_v1_file_without_sysfs_state_is_not_used(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    with open(prepared, encoding="utf-8") as handle:
        document = json.load(handle)
    document["enflamePreparedEdits"] = "v1"
    del document["sysfs"]
    with open(prepared, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    outcome = assert_falls_back(
        make_bundle,
        vendor_node,
        prepared,
        {"env": [f"{ENV}=0"]},
        "is not a enflamePreparedEdits v2",
    )
    assert outcome.startswith("gave gcu0 ")


def test_the_log_says_which_sysfs_input_changed(
    vendor_node: str, make_bundle: MakeBundle, tmp_path: os.PathLike[str]
) -> None:
    prepared = prepare(vendor_node, str(tmp_path))
    _unbind(vendor_node, 2)
    bdf = devices.discover(vendor_node).unbound[0]
    reason = f"gcu2: sysfs changed since the edits were prepared ({naming.PCI_DEVICES}/{bdf} dev)"
    assert_falls_back(make_bundle, vendor_node, prepared, {"env": [f"{ENV}=2"]}, reason)
