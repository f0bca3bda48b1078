"""Changing a node's mode takes back what the earlier mode installed, and never what others wrote.

Issue 22 items 1 and 11, issue 23 items 3 and 4: a mode change leaves no wrapper behind as the
default runtime and no CDI specs behind; doctor's fixes work when followed and name the host
root; ``--mode auto`` without a kubelet makes no expensive choice; ``runtime configure
--set-as-default`` refuses a missing binary or a node whose mode says otherwise.
"""

from __future__ import annotations

import os
import shlex

import tomlkit

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import cdi_keeper, doctor, engines, installer
from enflame_gcu.container_toolkit.cli import main
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx

CONTAINERD = "/etc/containerd/config.toml"
CDI_DIR = "/var/run/cdi"
GCU_SPEC = f"{CDI_DIR}/enflame.com-gcu.yaml"
VGCU_SPEC = f"{CDI_DIR}/enflame.com-vgcu.yaml"
OPERATORS_VGCU = """\
# The operator's own spec: hand-written, not ours.
cdiVersion: 0.6.0
kind: enflame.com/vgcu
devices:
- name: team-a
  containerEdits:
    deviceNodes:
    - path: /dev/gcu0vid1
"""


def _kube_host(make_node: MakeNode, **engines_found: bool) -> str:
    root = fx.fake_host(make_node(), **engines_found)
    os.makedirs(os.path.join(root, "var/lib/kubelet"), exist_ok=True)
    return root


def _local(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _read(root: str, path: str) -> str:
    with open(_local(root, path), encoding="utf-8") as handle:
        return handle.read()


def _containerd(root: str) -> dict[str, object]:
    document = tomlkit.parse(_read(root, CONTAINERD)).unwrap()
    section: dict[str, object] = document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    return section


def _install(root: str, mode: str) -> installer.Outcome:
    return installer.install(installer.InstallOptions(host_root=root, mode=mode))


def _mode_result(root: str) -> doctor.Result:
    (result,) = [r for r in doctor.run(root) if r.name == "node-mode"]
    return result


def test_default_runtime_then_auto_takes_the_wrapper_out_of_containerd(
    make_node: MakeNode,
) -> None:
    root = _kube_host(make_node, docker=False)
    original = _read(root, CONTAINERD)
    _install(root, "default-runtime")
    assert _containerd(root)["default_runtime_name"] == "enflame"
    outcome = _install(root, "auto")
    assert outcome.mode == "device-specs"
    # device-specs promises that ENFLAME_VISIBLE_DEVICES=all reaches no card: no wrapper left.
    assert _read(root, CONTAINERD) == original
    assert any("taking back the runtime entries node mode default-runtime" in line
               for line in outcome.lines), outcome.lines  # fmt: skip
    assert _mode_result(root).status == "pass", _mode_result(root)
    before_uninstall_record = node_modes.read(root)
    assert before_uninstall_record is not None and before_uninstall_record.mode == "device-specs"
    installer.uninstall(root)
    assert _read(root, CONTAINERD) == original


def test_default_runtime_then_runtimeclass_keeps_only_the_handler(make_node: MakeNode) -> None:
    root = _kube_host(make_node, docker=False)
    _install(root, "default-runtime")
    _install(root, "runtimeclass")
    section = _containerd(root)
    assert section["default_runtime_name"] == "runc"
    runtimes = section["runtimes"]
    assert isinstance(runtimes, dict) and "enflame" in runtimes
    assert _mode_result(root).status == "pass"
    # And back: the handler becomes the default again, and uninstall restores the original.
    _install(root, "default-runtime")
    assert _containerd(root)["default_runtime_name"] == "enflame"
    installer.uninstall(root)
    assert "enflame" not in _read(root, CONTAINERD)


def test_cdi_then_device_specs_removes_the_cdi_specs(make_node: MakeNode) -> None:
    root = _kube_host(make_node, docker=False, containerd=False, crio=True)
    before = fx.snapshot(root)
    _install(root, "cdi")
    assert os.path.exists(_local(root, GCU_SPEC))
    outcome = _install(root, "device-specs")
    assert outcome.mode == "device-specs"
    assert not os.path.exists(_local(root, GCU_SPEC)), outcome.lines
    installer.uninstall(root)
    assert fx.diff(before, fx.snapshot(root)) == []


def test_cdi_install_sets_an_operators_own_spec_aside_and_uninstall_puts_it_back(
    make_node: MakeNode,
) -> None:
    # The simulated node has no vGCU, so the keeper wants no enflame.com-vgcu.yaml of its own:
    # today that deleted the operator's file, and uninstall did not bring it back.
    root = _kube_host(make_node, docker=False, containerd=False, crio=True)
    fx.write(root, VGCU_SPEC, OPERATORS_VGCU)
    outcome = _install(root, "cdi")
    assert any("not written by enflame-ctk" in line for line in outcome.lines), outcome.lines
    assert os.path.exists(_local(root, GCU_SPEC))
    saved = _local(root, VGCU_SPEC + installer.SET_ASIDE)
    with open(saved, encoding="utf-8") as handle:
        assert handle.read() == OPERATORS_VGCU  # set aside, byte for byte
    installer.uninstall(root)
    assert _read(root, VGCU_SPEC) == OPERATORS_VGCU
    assert not os.path.exists(saved)
    assert not os.path.exists(_local(root, GCU_SPEC))


def test_the_cdi_keeper_never_rewrites_or_removes_a_spec_it_did_not_write(
    make_node: MakeNode,
) -> None:
    root = make_node()
    output = _local(root, CDI_DIR)
    vgcu = fx.write(root, VGCU_SPEC, OPERATORS_VGCU)
    gcu = fx.write(root, GCU_SPEC, "# someone else's gcu spec\n")
    changed = cdi_keeper.refresh(root, output)
    assert _read(root, VGCU_SPEC) == OPERATORS_VGCU, changed
    assert _read(root, GCU_SPEC) == "# someone else's gcu spec\n"
    assert any(line.startswith(gcu) and "left as it is" in line for line in changed), changed
    os.unlink(gcu)
    cdi_keeper.refresh(root, output)
    assert _read(root, GCU_SPEC).startswith(cdi_keeper.MARKER)  # ours: kept current from now
    assert os.path.exists(vgcu)


def test_doctors_fix_for_a_leftover_default_wrapper_works_when_followed(
    make_node: MakeNode,
) -> None:
    # A node recorded as device-specs whose containerd still has the wrapper as its default
    # (set by hand, or by an earlier install of another tool dir).
    root = _kube_host(make_node, docker=False)
    _install(root, "device-specs")
    engines.configure(
        "containerd",
        None,
        engines.RuntimeOptions(runtime_path="/usr/bin/enflame-container-runtime",
                               set_as_default=True),
        host_root=root,
    )  # fmt: skip
    result = _mode_result(root)
    assert result.status == "fail"
    assert f"--host-root {root}" in result.fix, result.fix
    assert "--host-root / " not in result.fix
    for step in result.fix.split("&&"):
        words = shlex.split(step, comments=True)
        assert words[0] == "enflame-ctk", result.fix
        assert main(words[1:]) == 0, step
    assert _mode_result(root).status == "pass", _mode_result(root)


def test_auto_on_containerd_with_no_kubelet_yet_chooses_nothing_expensive(
    make_node: MakeNode,
) -> None:
    root = fx.fake_host(make_node(), docker=False)  # no /var/lib/kubelet: before kubeadm join
    original = _read(root, CONTAINERD)
    outcome = _install(root, "auto")
    assert outcome.mode == "device-specs"
    assert _read(root, CONTAINERD) == original  # every container would have paid for it
    record = node_modes.read(root)
    assert record is not None and "no kubelet configured yet" in record.reason
    assert "--mode auto again" in record.reason


def test_doctor_warns_when_the_mode_auto_chose_no_longer_fits_the_node(
    make_node: MakeNode,
) -> None:
    # An earlier auto chose default-runtime on a containerd host with no kubelet; the kubelet
    # came later. (The record is what an older installer wrote.)
    root = _kube_host(make_node, docker=False)
    record = node_modes.Record("default-runtime", "containerd", "", "auto", "no kubelet")
    fx.write(root, node_modes.MODE_FILE, record.to_json())
    engines.configure(
        "containerd",
        None,
        engines.RuntimeOptions(runtime_path="/usr/bin/enflame-container-runtime",
                               set_as_default=True),
        host_root=root,
    )  # fmt: skip
    result = _mode_result(root)
    assert result.status == "warn", result
    assert "auto would now choose device-specs" in result.detail
    assert f"--host-root {root} --mode auto" in result.fix


def test_set_as_default_refuses_a_missing_runtime_binary(make_node: MakeNode) -> None:
    root = _kube_host(make_node, docker=False)
    original = _read(root, CONTAINERD)
    argv = ["runtime", "configure", "--runtime", "containerd", "--host-root", root]
    assert main([*argv, "--set-as-default"]) == 1
    assert _read(root, CONTAINERD) == original
    assert main([*argv, "--set-as-default", "--force"]) == 0
    assert _containerd(root)["default_runtime_name"] == "enflame"


def test_set_as_default_refuses_a_node_whose_mode_wants_no_wrapper(
    make_node: MakeNode, capsys: object
) -> None:
    root = _kube_host(make_node, docker=False)
    fx.write(root, "/usr/bin/enflame-container-runtime", "#!/bin/sh\n", 0o755)
    _install(root, "device-specs")
    original = _read(root, CONTAINERD)
    argv = ["runtime", "configure", "--runtime", "containerd", "--host-root", root]
    assert main([*argv, "--set-as-default"]) == 1
    assert _read(root, CONTAINERD) == original
    assert main(argv) == 0  # a handler only is what runtimeclass pods use: allowed
    assert _containerd(root)["default_runtime_name"] == "runc"
