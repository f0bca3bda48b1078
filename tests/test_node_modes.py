"""The node-mode matrix: which mode a node gets from its engine, and which it must refuse."""

from __future__ import annotations

import os

import pytest

from enflame_gcu import node_modes
from enflame_gcu.node_modes import Engine

CHOICES = [
    # engine, version, enable_cdi, kubelet -> mode
    ("containerd", (1, 6), None, True, "device-specs"),
    ("containerd", (1, 7), True, True, "device-specs"),
    ("containerd", (2, 0), None, True, "device-specs"),
    ("crio", (1, 28), None, True, "device-specs"),
    ("docker", (24, 0), None, True, "default-runtime"),
    ("docker", (24, 0), None, False, "default-runtime"),
    ("podman", (4, 3), None, False, "cdi"),
    ("crio", (1, 28), None, False, "cdi"),
    # No kubelet configured yet (a node being built): missing evidence buys no wrapper.
    ("containerd", (1, 6), None, False, "device-specs"),
    ("containerd", (1, 7), True, False, "cdi"),
    ("", None, None, True, "device-specs"),
    # podman is no CRI engine: a kubelet directory beside it does not make device-specs work.
    ("podman", (4, 3), None, True, "cdi"),
]


@pytest.mark.parametrize(("name", "version", "cdi", "kubelet", "expected"), CHOICES)
def test_auto_chooses_by_engine_version_and_kubelet(
    name: str, version: tuple[int, int] | None, cdi: bool | None, kubelet: bool, expected: str
) -> None:
    mode, reason = node_modes.choose(Engine(name, version, cdi, kubelet))
    assert mode == expected
    assert reason


def test_a_kubernetes_node_default_puts_nothing_in_the_container_path() -> None:
    for engine in ("containerd", "crio"):
        mode = node_modes.MODES[node_modes.choose(Engine(engine, (1, 6)))[0]]
        assert mode.wrapper == "none"
        assert mode.pass_device_specs


@pytest.mark.parametrize(
    ("mode", "engine", "fragment"),
    [
        ("cdi", Engine("containerd", (1, 6)), "containerd 1.6"),
        ("cdi", Engine("containerd", (1, 7), cdi_enabled=False), "enable_cdi"),
        ("cdi", Engine("containerd", None), "version unknown"),
        ("device-specs", Engine("docker", (24, 0)), "default-runtime"),
        ("runtimeclass", Engine("podman", (4, 3)), "use cdi"),
        ("device-specs", Engine("podman", (4, 3)), "use cdi"),
        ("device-specs", Engine("podman", (4, 3), kubelet=False), "use cdi"),
        ("device-specs", Engine("", None, kubelet=False), "no kubelet"),
        ("default-runtime", Engine("podman", (4, 3)), "podman has no runtime config"),
        ("strict", Engine("containerd", (1, 6)), "valid: auto, device-specs"),
    ],
)
def test_an_explicit_mode_the_engine_cannot_honour_is_refused_by_name(
    mode: str, engine: Engine, fragment: str
) -> None:
    problem = node_modes.refuse(mode, engine)
    assert problem is not None
    assert fragment in problem


@pytest.mark.parametrize(
    "engine",
    [Engine("containerd", (1, 7), True), Engine("containerd", (2, 1)), Engine("crio", (1, 30))],
)
def test_cdi_is_accepted_where_the_engine_resolves_cdi(engine: Engine) -> None:
    assert node_modes.refuse("cdi", engine) is None


def test_every_mode_row_is_complete_and_plugin_answers_differ_as_documented() -> None:
    assert node_modes.NAMES == ("device-specs", "cdi", "runtimeclass", "default-runtime")
    assert node_modes.MODES["cdi"].strategies == ("envvar", "cdi-cri")
    assert node_modes.MODES["cdi"].cdi_specs
    assert node_modes.MODES["runtimeclass"].wrapper == "handler"
    assert node_modes.MODES["default-runtime"].wrapper == "default"
    assert not node_modes.MODES["runtimeclass"].pass_device_specs


def test_the_record_round_trips_and_is_read_under_a_root(tmp_path: os.PathLike[str]) -> None:
    root = str(tmp_path)
    assert node_modes.read(root) is None
    record = node_modes.Record("cdi", "crio", "1.28", "explicit", "because")
    path = node_modes.local_path(root)
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(record.to_json())
    assert node_modes.read(root) == record


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "is not JSON"),
        ('{"version": "v2", "mode": "cdi"}', "version 'v1'"),
        ('{"version": "v1", "mode": "all-the-things"}', "unknown mode"),
        ('{"version": "v1", "mode": "cdi", "engine": 3}', "must be strings"),
    ],
)
def test_a_broken_record_is_an_error_naming_the_file(
    tmp_path: os.PathLike[str], text: str, fragment: str
) -> None:
    path = node_modes.local_path(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    with pytest.raises(ValueError, match=fragment) as caught:
        node_modes.read(str(tmp_path))
    assert node_modes.MODE_FILE in str(caught.value)
