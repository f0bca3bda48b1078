"""``enflame-ctk install --mode``: each node mode installs exactly what it needs, and undoes it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import tomlkit
import yaml

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import cdi_keeper, installer, node_mode
from enflame_gcu.errors import InstallError
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx
from tests.shim.schemas import assert_valid_cdi

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
SPEC = "/var/run/cdi/enflame.com-gcu.yaml"


def _kube_host(root: str, **engines: bool) -> str:
    fx.fake_host(root, **engines)
    os.makedirs(os.path.join(root, "var/lib/kubelet"), exist_ok=True)
    return root


def _local(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _cri(root: str) -> dict[str, object]:
    with open(_local(root, CONTAINERD_CONFIG), encoding="utf-8") as handle:
        document = tomlkit.parse(handle.read()).unwrap()
    cri: dict[str, object] = document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    return cri


def test_auto_on_a_kubernetes_containerd_node_is_device_specs_and_changes_no_engine(
    make_node: MakeNode,
) -> None:
    root = _kube_host(make_node(), docker=False)
    before = fx.snapshot(root)
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "device-specs"
    assert outcome.engines == ()
    record = node_modes.read(root)
    assert record is not None and record.mode == "device-specs" and record.chosen_by == "auto"
    assert record.engine == "containerd"
    after = fx.snapshot(root)
    added = sorted(set(after) - set(before))
    assert not [p for p in added if "enflame-container-runtime" in p], added
    changed = [p for p in before if before[p] != after.get(p)]
    assert changed == [], changed  # the engine config (and everything else) untouched
    installer.uninstall(root)
    assert node_modes.read(root) is None
    assert fx.snapshot(root) == before


def test_runtimeclass_adds_a_non_default_handler_named_enflame(make_node: MakeNode) -> None:
    root = _kube_host(make_node(), docker=False)
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="runtimeclass"))
    assert outcome.mode == "runtimeclass" and outcome.engines == ("containerd",)
    cri = _cri(root)
    assert cri["default_runtime_name"] == "runc"
    runtimes = cri["runtimes"]
    assert isinstance(runtimes, dict) and "enflame" in runtimes
    assert runtimes["enflame"]["options"]["BinaryName"].endswith("enflame-container-runtime")
    record = node_modes.read(root)
    assert record is not None and record.chosen_by == "explicit"


def test_default_runtime_makes_enflame_the_default(make_node: MakeNode) -> None:
    root = _kube_host(make_node(), docker=False)
    installer.install(installer.InstallOptions(host_root=root, mode="default-runtime"))
    assert _cri(root)["default_runtime_name"] == "enflame"


def test_auto_on_a_docker_host_keeps_the_vendor_default(make_node: MakeNode) -> None:
    root = fx.fake_host(make_node(), containerd=False)
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "default-runtime" and outcome.engines == ("docker",)
    with open(_local(root, "/etc/docker/daemon.json"), encoding="utf-8") as handle:
        assert json.load(handle)["default-runtime"] == "enflame"


def test_cdi_on_containerd_of_unknown_version_is_refused_and_changes_nothing(
    make_node: MakeNode,
) -> None:
    root = _kube_host(make_node(), docker=False)
    before = fx.snapshot(root)
    with pytest.raises(InstallError, match="node mode cdi needs an engine that resolves CDI"):
        installer.install(installer.InstallOptions(host_root=root, mode="cdi"))
    assert fx.snapshot(root) == before


def test_cdi_writes_valid_specs_and_uninstall_removes_them(make_node: MakeNode) -> None:
    root = _kube_host(make_node(), docker=False, containerd=False, crio=True)
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="cdi"))
    assert outcome.mode == "cdi" and outcome.engines == ()
    with open(_local(root, SPEC), encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    assert spec["kind"] == "enflame.com/gcu"
    names = [d["name"] for d in spec["devices"]]
    assert [n for n in names if ":" not in n] == [*map(str, range(8)), "all"]
    assert len([n for n in names if ":" in n]) == 8  # and by PCI address
    assert_valid_cdi(spec)
    # No wrapper, no engine change in this mode.
    assert not os.path.exists(_local(root, "/etc/crio/crio.conf.d/99-enflame.toml"))
    installer.uninstall(root)
    assert not os.path.exists(_local(root, SPEC))
    assert node_modes.read(root) is None


def test_set_as_default_with_a_mode_is_refused_by_the_cli(make_node: MakeNode) -> None:
    from enflame_gcu.container_toolkit.cli import main

    root = _kube_host(make_node(), docker=False)
    code = main(["install", "--host-root", root, "--mode", "auto", "--set-as-default"])
    assert code == 2  # a usage error
    assert node_modes.read(root) is None


def test_the_kubelets_endpoint_names_the_engine(tmp_path: os.PathLike[str]) -> None:
    root = _kube_host(str(tmp_path), docker=True, containerd=True, crio=True)
    fx.write(
        root,
        "/var/lib/kubelet/config.yaml",
        "containerRuntimeEndpoint: unix:///run/crio/crio.sock\n",
    )
    assert node_mode.detect(root).name == "crio"
    fx.write(root, "/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n")
    assert node_mode.detect(root).name == "containerd"  # the first CRI engine found
    flags = 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/crio/crio.sock"\n'
    fx.write(root, "/var/lib/kubelet/kubeadm-flags.env", flags)
    assert node_mode.detect(root).name == "crio"  # an older kubelet's flag, as kubeadm writes it
    os.remove(_local(root, "/var/lib/kubelet/kubeadm-flags.env"))
    os.remove(_local(root, "/var/lib/kubelet/config.yaml"))
    os.rmdir(_local(root, "/var/lib/kubelet"))
    assert node_mode.detect(root).name == "docker"  # no kubelet: docker first


def test_engine_versions_come_from_the_binary(tmp_path: os.PathLike[str]) -> None:
    binary = _local(str(tmp_path), "/usr/bin/containerd")
    os.makedirs(os.path.dirname(binary))
    with open(binary, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\necho 'containerd github.com/containerd/containerd v1.7.13 abc'\n")
    os.chmod(binary, 0o755)  # noqa: S103 - a fake engine binary must be executable
    # Under a root other than / the host's binary runs chrooted (with the host's libc): a fake
    # root without /bin/sh cannot run it, which reads as "version unknown", never a guess.
    assert node_mode.engine_version(str(tmp_path), "containerd") is None
    real = node_mode.engine_version("/", "containerd")
    assert real is not None and real >= (1, 6)


# The keeper's periodic rescan is switched off (an hour), so only its inotify events can explain
# a rewrite; the bound is then generous for a loaded machine (a correctness check, not a timing).
EVENT_BOUND = 3.0


def test_the_keeper_rewrites_specs_on_a_change_event_and_never_leaves_a_gap(
    make_node: MakeNode, tmp_path: os.PathLike[str]
) -> None:
    root = make_node()
    output = os.path.join(str(tmp_path), "cdi")
    spec = os.path.join(output, "enflame.com-gcu.yaml")
    stop = threading.Event()

    def keep() -> None:
        asyncio.run(cdi_keeper.keep(root, output, stop, interval=3600))

    keeper = threading.Thread(target=keep)
    keeper.start()
    seen: list[str] = []
    problems: list[str] = []
    gone_on_purpose = threading.Event()  # the driver is unloaded: no spec is the right answer

    def reader() -> None:
        # An engine's view: every read finds a whole spec, from the first write on.
        while not stop.is_set():
            try:
                with open(spec, encoding="utf-8") as handle:
                    text = handle.read()
            except FileNotFoundError:
                if seen and not gone_on_purpose.is_set():
                    problems.append("spec missing during a rewrite")
                continue
            try:
                # libyaml's loader: a pure-Python parse in a busy loop would hold the GIL
                # against the keeper's thread (an engine reads from another process).
                names = [d["name"] for d in yaml.load(text, Loader=yaml.CSafeLoader)["devices"]]
                # Minors and all tell the changes apart (a card's PCI-address name goes and
                # comes with its minor's).
                names = [n for n in names if ":" not in n]
            except (yaml.YAMLError, TypeError, KeyError) as exc:
                problems.append(f"partial spec: {exc}")
                continue
            if not seen or seen[-1] != ",".join(names):
                seen.append(",".join(names))
            time.sleep(0.001)  # let the keeper's thread run (one interpreter, one GIL)

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen and seen[0] == "0,1,2,3,4,5,6,7,all"
        steps: list[tuple[Callable[[], object], str]] = [
            (lambda: simulate.unplug(root, 3), "0,1,2,4,5,6,7,all"),
            (lambda: simulate.replug(root, 3), "0,1,2,3,4,5,6,7,all"),
        ]
        for step, (change, expected) in enumerate(steps):
            change()
            started = time.monotonic()
            while seen[-1] != expected and time.monotonic() - started < EVENT_BOUND:
                time.sleep(0.005)
            assert seen[-1] == expected, (step, seen)
        gone_on_purpose.set()
        simulate.unload_driver(root)
        started = time.monotonic()
        while os.path.exists(spec) and time.monotonic() - started < EVENT_BOUND:
            time.sleep(0.005)
        assert not os.path.exists(spec), "driver unloaded: the spec must go"
        seen.clear()
        simulate.load_driver(root)
        started = time.monotonic()
        while not seen and time.monotonic() - started < EVENT_BOUND:
            time.sleep(0.005)
        assert seen == ["0,1,2,3,4,5,6,7,all"]
    finally:
        stop.set()
        keeper.join(10)
        watcher.join(10)
    assert problems == []
    assert not [n for n in os.listdir(output) if n.endswith(".tmp")]


def test_a_new_record_makes_the_plugins_that_read_it_reload_and_no_others() -> None:
    async def scenario() -> None:
        async with (
            plugin_process.running_node("vendor-8card", ["--node-mode=auto"]) as ours,
            plugin_process.running_node("vendor-8card", ["--node-mode=auto"]) as other,
        ):
            for node in (ours, other):
                assert "node_mode='device-specs'" in node.plugin.log_text()
            _kube_host(ours.root, docker=False)
            options = installer.InstallOptions(host_root=ours.root, mode="runtimeclass")
            outcome = await asyncio.to_thread(installer.install, options)
            told = [line for line in outcome.lines if line.startswith("told the device plugin")]
            assert told == [
                f"told the device plugin (pid {ours.plugin.process.pid}) to reload "  # type: ignore[union-attr]
                "its node mode"
            ]
            deadline = time.monotonic() + 10
            while "node_mode='runtimeclass'" not in ours.plugin.log_text():
                assert time.monotonic() < deadline, ours.plugin.log_text()
                await asyncio.sleep(0.05)
            reloaded = ours.plugin.log_text().split("SIGHUP: config reloaded:", 1)[1]
            assert "pass_device_specs=False" in reloaded.splitlines()[0]
            assert "SIGHUP" not in other.plugin.log_text()

    asyncio.run(scenario())


def test_auto_honours_the_operators_choice_for_this_node(make_node: MakeNode) -> None:
    root = _kube_host(make_node(), docker=False)
    fx.write(
        root,
        node_modes.CHOICE_FILE,
        "# GCU pods here need the wrapper's driver mounts\nruntimeclass\n",
    )
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "runtimeclass" and outcome.engines == ("containerd",)
    record = node_modes.read(root)
    assert record is not None and record.chosen_by == f"this node's {node_modes.CHOICE_FILE}"
    assert _cri(root)["default_runtime_name"] == "runc"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("cdi\n", "node mode cdi needs an engine"), ("fast\n", "must hold one node mode")],
)
def test_a_choice_the_node_cannot_take_is_refused(
    make_node: MakeNode, text: str, fragment: str
) -> None:
    root = _kube_host(make_node(), docker=False)
    fx.write(root, node_modes.CHOICE_FILE, text)
    before = fx.snapshot(root)
    with pytest.raises(InstallError, match=fragment):
        installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert fx.snapshot(root) == before


def test_cdi_without_a_daemonset_installs_the_watch_service_and_uninstall_removes_it(
    make_node: MakeNode,
) -> None:
    root = _kube_host(make_node(), docker=False, containerd=False, crio=True)
    before = fx.snapshot(root)
    options = installer.InstallOptions(
        host_root=root,
        mode="cdi",
        cdi_service=True,
        bin_dir="/usr/bin",
        ctk="/opt/e/bin/enflame-ctk",
    )
    outcome = installer.install(options)
    unit = _local(root, "/etc/systemd/system/enflame-cdi-watch.service")
    with open(unit, encoding="utf-8") as handle:
        text = handle.read()
    assert "ExecStart=/usr/bin/enflame-ctk cdi watch --output /var/run/cdi\n" in text
    assert "Restart=always" in text
    assert any("systemd is not running here" in line for line in outcome.lines)
    installer.uninstall(root)
    assert fx.snapshot(root) == before


STARTING_PLUGIN = """\
import os, signal, sys, time
time.sleep(float(sys.argv[-1]))  # "imports": SIGHUP still has its default action (terminate)
signal.signal(signal.SIGHUP, lambda *_: open(os.environ["MARK"], "w").close())
time.sleep(30)
"""


def test_a_plugin_still_starting_is_waited_for_not_killed(tmp_path: Path) -> None:
    """Issue 22 item 9: the installer's SIGHUP killed a plugin that had no handler yet."""
    root = tmp_path / "root"
    record = root / "etc/enflame-gcu/node-mode.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    script = tmp_path / "enflame-device-plugin"
    script.write_text(STARTING_PLUGIN)
    mark = tmp_path / "reloaded"
    args = [sys.executable, str(script), "--node-mode=auto", f"--host-root={root}"]
    plugin = subprocess.Popen([*args, "1.0"], env={**os.environ, "MARK": str(mark)})
    try:
        time.sleep(0.2)  # started, not yet handling SIGHUP
        told = node_mode.notify_plugins(str(root))
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert plugin.poll() is None, "the plugin was killed by SIGHUP"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert told == [(plugin.pid, True)]
        # One that never sets a handler up is left alone, and said so.
        never = subprocess.Popen([*args, "60"], env={**os.environ, "MARK": str(mark)})
        try:
            time.sleep(0.2)
            found = dict(node_mode.notify_plugins(str(root), wait=0.5))
            assert found[never.pid] is False and never.poll() is None
        finally:
            never.kill()
            never.wait()
    finally:
        plugin.kill()
        plugin.wait()


BECOMES_ANOTHER = """\
import os, sys, time
time.sleep(0.3)  # found as a plugin, no SIGHUP handler yet
# The PID now runs another program that handles SIGHUP (as a reused PID would).
os.execv(sys.executable, [sys.executable, "-c", os.environ["OTHER"]])
"""
OTHER = """\
import os, signal, time
signal.signal(signal.SIGHUP, lambda *_: open(os.environ["MARK"], "w").close())
time.sleep(30)
"""


def test_a_pid_that_stops_being_the_plugin_before_the_signal_is_not_signalled(
    tmp_path: Path,
) -> None:
    """Issue 40 item 4: the installer signalled by PID after waiting up to 10 s, so whatever
    ran under that PID by then got the SIGHUP."""
    root = tmp_path / "root"
    record = root / "etc/enflame-gcu/node-mode.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    script = tmp_path / "enflame-device-plugin"
    script.write_text(BECOMES_ANOTHER)
    mark = tmp_path / "signalled"
    args = [sys.executable, str(script), "--node-mode=auto", f"--host-root={root}"]
    env = {**os.environ, "MARK": str(mark), "OTHER": OTHER}
    process = subprocess.Popen(args, env=env)
    try:
        time.sleep(0.1)
        told = node_mode.notify_plugins(str(root), wait=5.0)
        time.sleep(0.3)
        assert told == []
        assert not mark.exists(), "the process now under the plugin's PID got SIGHUP"
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def _podman_host(root: str, *, kubelet: bool) -> str:
    fx.fake_host(root, docker=False, containerd=False)
    fx.write(root, "/usr/bin/podman", "#!/bin/sh\n", 0o755)
    if kubelet:  # a leftover kubelet directory: still nothing that talks CRI to podman
        os.makedirs(os.path.join(root, "var/lib/kubelet"))
    return root


def test_auto_on_a_podman_host_with_a_kubelet_directory_is_cdi_not_device_specs(
    make_node: MakeNode,
) -> None:
    """Issue 40 item 3: podman got device-specs, where nothing hands it the DeviceSpecs."""
    root = _podman_host(make_node(), kubelet=True)
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "cdi"
    record = node_modes.read(root)
    assert record is not None and "is no CRI engine" in record.reason


@pytest.mark.parametrize(
    ("engines", "mode", "fragment"),
    [
        ("podman", "device-specs", "use cdi"),
        ("none", "device-specs", "no kubelet"),
    ],
)
def test_device_specs_where_no_kubelet_and_cri_engine_deliver_it_is_refused(
    make_node: MakeNode, engines: str, mode: str, fragment: str
) -> None:
    root = make_node()
    if engines == "podman":
        _podman_host(root, kubelet=False)
    else:
        fx.fake_host(root, docker=False, containerd=False)
    before = fx.snapshot(root)
    with pytest.raises(InstallError, match=fragment) as caught:
        installer.install(installer.InstallOptions(host_root=root, mode=mode))
    assert "nothing was changed" in str(caught.value)
    assert fx.snapshot(root) == before


DOCKERS_CONTAINERD = 'disabled_plugins = ["cri"]\n'


def test_auto_on_a_docker_host_with_a_kubelet_directory_is_not_device_specs(
    make_node: MakeNode,
) -> None:
    """Issue 40 item 3: docker's own containerd (CRI plugin disabled) was taken for the
    kubelet's engine, so a docker host got device-specs, which nothing there delivers."""
    root = _kube_host(make_node(), docker=True, containerd=True)
    fx.write(root, CONTAINERD_CONFIG, DOCKERS_CONTAINERD)
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "default-runtime"
    record = node_modes.read(root)
    assert record is not None and record.engine == "docker"
    assert "docker runs containers outside the CRI" in record.reason
