"""``enflame-ctk doctor`` reports the node mode and whether the node and the plugin match it."""

from __future__ import annotations

import json
import os

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import cdi_keeper, doctor, engines
from enflame_gcu.container_toolkit.cli import main
from enflame_gcu.simulation import simulate
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx


def _node(make_node: MakeNode, mode: str | None) -> str:
    root = fx.fake_host(make_node(), docker=False)
    if mode is not None:
        # Explicit: a mode auto chose is also compared with what auto would choose now
        # (tests/container_toolkit/test_mode_changes.py), and this fake host has no kubelet.
        record = node_modes.Record(mode, "containerd", "1.7", "explicit", "test")
        fx.write(root, node_modes.MODE_FILE, record.to_json())
    return root


def _plugin(root: str, *args: str, pid: int = 4242) -> None:
    words = ["/usr/bin/enflame-device-plugin", "--host-root=/host", *args]
    fx.write(root, f"/proc/{pid}/cmdline", "\0".join(words) + "\0")


def _mode_result(root: str) -> doctor.Result:
    (result,) = [r for r in doctor.run(root) if r.name == "node-mode"]
    return result


def test_device_specs_with_a_plugin_in_auto_mode_passes(make_node: MakeNode) -> None:
    root = _node(make_node, "device-specs")
    _plugin(root, "--node-mode=auto")
    result = _mode_result(root)
    assert result.status == "pass", result
    assert "node mode device-specs, recorded by the installer" in result.detail
    assert "settings match" in result.detail


def test_a_plugin_run_as_a_console_script_is_recognised(make_node: MakeNode) -> None:
    root = _node(make_node, "device-specs")
    words = ["/usr/local/bin/python3", "/usr/local/bin/enflame-device-plugin", "--node-mode=cdi"]
    fx.write(root, "/proc/77/cmdline", "\0".join(words) + "\0")
    result = _mode_result(root)
    assert result.status == "fail"
    assert "answers for node mode cdi, the node is device-specs" in result.detail


def test_device_specs_with_a_plugin_that_passes_no_device_specs_fails(make_node: MakeNode) -> None:
    root = _node(make_node, "device-specs")
    _plugin(root, "--device-list-strategy=envvar")
    result = _mode_result(root)
    assert result.status == "fail"
    assert "needs the plugin's DeviceSpecs" in result.detail
    assert "--node-mode=auto" in result.fix


def test_a_plugin_told_another_mode_fails(make_node: MakeNode) -> None:
    root = _node(make_node, "device-specs")
    _plugin(root, "--node-mode=runtimeclass")
    result = _mode_result(root)
    assert result.status == "fail"
    assert "answers for node mode runtimeclass, the node is device-specs" in result.detail


def test_cdi_needs_current_specs(make_node: MakeNode) -> None:
    root = _node(make_node, "cdi")
    _plugin(root, "--node-mode=auto")
    result = _mode_result(root)
    assert result.status == "fail" and "no enflame.com-gcu CDI spec" in result.detail
    output = os.path.join(root, "var/run/cdi")
    cdi_keeper.refresh(root, output)
    assert _mode_result(root).status == "pass"
    simulate.unplug(root, 2)
    result = _mode_result(root)
    assert result.status == "fail" and "is stale" in result.detail
    cdi_keeper.refresh(root, output)
    assert _mode_result(root).status == "pass"


def test_a_wrapper_left_as_default_in_a_no_wrapper_mode_fails(make_node: MakeNode) -> None:
    root = _node(make_node, "device-specs")
    engines.configure(
        "containerd", None, engines.RuntimeOptions(set_as_default=True), host_root=root
    )
    result = _mode_result(root)
    assert result.status == "fail"
    assert "still the engine's default runtime" in result.detail


def test_default_runtime_without_the_default_fails(make_node: MakeNode) -> None:
    root = _node(make_node, "default-runtime")
    engines.configure("containerd", None, engines.RuntimeOptions(), host_root=root)
    result = _mode_result(root)
    assert result.status == "fail" and "is not the engine's default runtime" in result.detail


def test_without_a_record_the_mode_is_read_off_the_engines_and_warned(make_node: MakeNode) -> None:
    root = _node(make_node, None)
    engines.configure("containerd", None, engines.RuntimeOptions(), host_root=root)
    result = _mode_result(root)
    assert result.status == "warn"
    assert result.detail.startswith("node mode runtimeclass, not recorded")


def test_a_corrupt_record_fails_and_json_output_carries_the_check(
    make_node: MakeNode, capsys: object
) -> None:
    root = _node(make_node, None)
    fx.write(root, node_modes.MODE_FILE, "{broken")
    result = _mode_result(root)
    assert result.status == "fail" and node_modes.MODE_FILE in result.detail
    main(["doctor", "--root", root, "--json"])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    names = [r["name"] for r in json.loads(out)["results"]]
    assert "node-mode" in names


def test_static_cpu_manager_is_satisfied_by_node_mode_device_specs(make_node: MakeNode) -> None:
    root = _node(make_node, None)  # no record: auto answers as device-specs
    fx.write(root, "/var/lib/kubelet/config.yaml", "cpuManagerPolicy: static\n")
    _plugin(root, "--node-mode=auto")
    (result,) = [r for r in doctor.run(root) if r.name == "cpu-manager"]
    assert result.status == "pass" and "node mode device-specs" in result.detail
    _plugin(root, "--node-mode=runtimeclass")
    (result,) = [r for r in doctor.run(root) if r.name == "cpu-manager"]
    assert result.status == "warn"


def test_the_records_strings_are_printed_escaped(make_node: MakeNode, capsys: object) -> None:
    """Issue 22 item 12: a newline in the record made a fake PASS line; ANSI escapes passed."""
    root = _node(make_node, None)
    forged = "x\nPASS  engine-config  all good\x1b[2J\u202e"
    record = node_modes.Record("device-specs", forged, "1.7", "auto", forged)
    fx.write(root, node_modes.MODE_FILE, record.to_json())
    assert forged in _mode_result(root).detail  # the check itself keeps the text as read
    main(["doctor", "--root", root])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "\x1b" not in out and "\u202e" not in out
    assert not any(line.startswith("PASS  engine-config  all good") for line in out.splitlines())
    assert "x\\nPASS  engine-config  all good\\x1b[2J\\u202e" in out
