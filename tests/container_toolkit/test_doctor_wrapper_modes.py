"""doctor holds the engines and the runtime binary to what the recorded node mode needs: no
wrapper (device-specs, cdi), the wrapper as RuntimeClass handler only (runtimeclass), or the
wrapper as the default runtime (default-runtime, and nodes without a record)."""

from __future__ import annotations

import pytest

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import doctor, engines
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx


def _node(make_node: MakeNode, mode: str | None, wrapper: str | None) -> str:
    """A containerd node in ``mode`` whose containerd has the wrapper as ``wrapper``."""
    root = make_node("vendor-8card")
    fx.fake_host(root, docker=False)
    if wrapper is not None:
        options = engines.RuntimeOptions(set_as_default=wrapper == "default")
        engines.configure("containerd", None, options, host_root=root)
        fx.write(root, "/usr/bin/enflame-container-runtime", "#!/usr/bin/python3\n", 0o755)
    if mode is not None:
        record = node_modes.Record(mode, "containerd", "1.7", "explicit", "test")
        fx.write(root, node_modes.MODE_FILE, record.to_json())
    return root


def _results(root: str) -> dict[str, doctor.Result]:
    return {result.name: result for result in doctor.run(root)}


@pytest.mark.parametrize(
    ("mode", "wrapper", "engine", "binary"),
    [
        ("device-specs", None, "pass", "pass"),
        ("cdi", None, "pass", "pass"),
        ("device-specs", "handler", "pass", "pass"),
        ("device-specs", "default", "warn", "pass"),
        ("runtimeclass", "handler", "pass", "pass"),
        ("runtimeclass", None, "fail", "fail"),
        ("runtimeclass", "default", "warn", "pass"),
        ("default-runtime", "default", "pass", "pass"),
        ("default-runtime", "handler", "warn", "pass"),
        ("default-runtime", None, "fail", "fail"),
        (None, None, "fail", "fail"),  # no record: the vendor's way, the wrapper as default
    ],
)
def test_engine_and_binary_checks_follow_the_node_mode(
    make_node: MakeNode, mode: str | None, wrapper: str | None, engine: str, binary: str
) -> None:
    results = _results(_node(make_node, mode, wrapper))
    assert results["engine-containerd"].status == engine, results["engine-containerd"]
    assert results["runtime-binary"].status == binary, results["runtime-binary"]


def test_a_device_specs_node_set_up_right_says_why_nothing_of_ours_is_needed(
    make_node: MakeNode,
) -> None:
    results = _results(_node(make_node, "device-specs", None))
    assert results["engine-containerd"].detail.startswith(
        "no enflame runtime entry, as node mode device-specs needs"
    )
    assert results["runtime-binary"].detail == (
        "not needed: node mode device-specs runs no wrapper and no engine points at one"
    )


def test_fixes_name_what_the_mode_needs(make_node: MakeNode) -> None:
    missing = _results(_node(make_node, "runtimeclass", None))["engine-containerd"]
    assert missing.fix.startswith("enflame-ctk runtime configure --runtime containerd")
    assert "--set-as-default" not in missing.fix  # runtimeclass wants a handler only
    extra = _results(_node(make_node, "device-specs", "default"))["engine-containerd"]
    assert extra.fix.startswith("enflame-ctk runtime unconfigure --runtime containerd")
