"""`enflame-ctk doctor` on healthy and broken simulated nodes: each check's pass and fail paths."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator

import pytest

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import dev_char, doctor, engines
from enflame_gcu.container_toolkit.cli import main
from enflame_gcu.shim import launcher
from enflame_gcu.simulation import simulate
from enflame_gcu.support import socket_lock
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx

RUNC = '#!/bin/sh\necho "runc version {version}"\necho "spec: 1.0.2-dev"\n'


def _serve(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    return server


def _stale(path: str) -> None:
    """A socket file nobody listens on, as a crashed plugin leaves it."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.close()


@pytest.fixture
def healthy(make_node: MakeNode) -> Iterator[str]:
    """A vendor 8-card node with everything the FAQ asks for set up right."""
    root = make_node("vendor-8card")
    fx.fake_host(root)
    fx.write(root, "/usr/bin/sh", "stands in for the host's shell", 0o755)
    fx.write(root, "/usr/bin/enflame-container-runtime", "#!/usr/bin/sh\n", 0o755)
    options = engines.RuntimeOptions(set_as_default=True)
    for engine in ("docker", "containerd"):
        engines.configure(engine, None, options, host_root=root)
    fx.write(root, "/usr/bin/runc", RUNC.format(version="1.1.12"), 0o755)
    plugin_dir = os.path.join(root, "var/lib/kubelet/device-plugins")
    os.makedirs(plugin_dir)
    fx.write(root, "/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n")
    fx.write(root, "/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n")
    record = node_modes.Record("default-runtime", "containerd", "1.6", "explicit", "vendor way")
    fx.write(root, node_modes.MODE_FILE, record.to_json())
    # As our plugin does: lock, bind a private name, rename it into place (a listener bound at
    # enflame.sock itself is another program's: topscloud's).
    lock = socket_lock.SocketLock(os.path.join(plugin_dir, "enflame.sock"))
    assert lock.try_acquire()
    private = os.path.join(plugin_dir, ".enflame.sock.private")
    servers = [_serve(os.path.join(plugin_dir, "kubelet.sock")), _serve(private)]
    os.rename(private, os.path.join(plugin_dir, "enflame.sock"))
    yield root
    for server in servers:
        server.close()
    lock.release()


def _result(root: str, name: str) -> doctor.Result:
    results = [r for r in doctor.run(root) if r.name == name]
    assert len(results) == 1, results
    return results[0]


def test_healthy_node_passes_every_check(healthy: str, capsys: pytest.CaptureFixture[str]) -> None:
    results = doctor.run(healthy)
    assert [r for r in results if r.status != "pass"] == []
    assert {r.name for r in results} >= {
        "driver",
        "devices",
        "runtime-binary",
        "runtime-config",
        "engine-docker",
        "engine-containerd",
        "runc",
        "kubelet",
        "plugin-socket",
        "swap",
        "cpu-manager",
    }
    assert main(["doctor", "--host-root", healthy]) == 0
    out = capsys.readouterr().out
    assert "PASS  driver" in out and "enflame driver 1.0.20230110 loaded" in out


def test_unloaded_driver_fails_driver_and_devices(healthy: str) -> None:
    simulate.unload_driver(healthy)
    driver = _result(healthy, "driver")
    assert driver.status == "fail" and "modprobe enflame" in driver.fix
    assert _result(healthy, "devices").status == "fail"


def test_missing_device_node_names_the_card(healthy: str) -> None:
    os.unlink(os.path.join(healthy, "dev/gcu3"))
    result = _result(healthy, "devices")
    assert result.status == "fail"
    assert "gcu3: /dev/gcu3 is missing" in result.detail
    assert "modprobe enflame" in result.fix


def test_missing_control_node_fails(healthy: str) -> None:
    os.unlink(os.path.join(healthy, "dev/gcuctl"))
    result = _result(healthy, "devices")
    assert result.status == "fail" and "/dev/gcuctl is missing" in result.detail


def test_runtime_binary_missing_or_without_interpreter(healthy: str) -> None:
    os.unlink(os.path.join(healthy, "usr/bin/sh"))
    result = _result(healthy, "runtime-binary")
    assert result.status == "fail" and "needs /usr/bin/sh, which does not exist" in result.detail
    os.unlink(os.path.join(healthy, "usr/bin/enflame-container-runtime"))
    result = _result(healthy, "runtime-binary")
    assert result.status == "fail" and "does not exist" in result.detail
    assert "install.sh" in result.fix


def test_runtime_front_without_its_python_fails(healthy: str) -> None:
    # The installed runtime is the sh front: /bin/sh is there, the python it starts is not.
    text = launcher.render("/opt/gone/bin/python3", "/opt/enflame-gcu/lib")
    fx.write(
        healthy,
        "/usr/bin/enflame-container-runtime",
        text.replace("#!/bin/sh", "#!/usr/bin/sh"),
        0o755,
    )
    result = _result(healthy, "runtime-binary")
    assert result.status == "fail"
    assert "needs /opt/gone/bin/python3, which does not exist" in result.detail
    fx.write(healthy, "/opt/gone/bin/python3", "stands in for the host's python", 0o755)
    assert _result(healthy, "runtime-binary").status == "pass"


def test_malformed_runtime_config_fails(healthy: str) -> None:
    fx.write(healthy, "/etc/enflame-container-runtime/config.toml", "[table]\n")
    result = _result(healthy, "runtime-config")
    assert result.status == "fail" and "config.toml" in result.fix


def test_docker_without_enflame_fails_and_not_default_warns(healthy: str) -> None:
    engines.unconfigure("docker", None, host_root=healthy)
    result = _result(healthy, "engine-docker")
    assert result.status == "fail"
    # The fix keeps the --host-root doctor was given: it works as printed.
    assert result.fix == (
        "enflame-ctk runtime configure --runtime docker --set-as-default --restart-engine"
        f" --host-root {healthy}"
    )
    engines.configure("docker", None, engines.RuntimeOptions(), host_root=healthy)
    assert _result(healthy, "engine-docker").status == "warn"


def test_containerd_entry_without_systemd_cgroup_fails(healthy: str) -> None:
    path = os.path.join(healthy, "etc/containerd/config.toml")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    fx.write(
        healthy,
        "/etc/containerd/config.toml",
        "SystemdCgroup = false".join(text.rsplit("SystemdCgroup = true", 1)),
    )
    result = _result(healthy, "engine-containerd")
    assert result.status == "fail" and "crash-loop" in result.detail


def test_no_engine_at_all_warns(make_node: MakeNode) -> None:
    root = make_node("flat-4card")
    result = _result(root, "engine")
    assert result.status == "warn"


def test_affected_runc_with_systemd_needs_dev_char_links(healthy: str) -> None:
    fx.write(healthy, "/usr/bin/runc", RUNC.format(version="1.1.5"), 0o755)
    result = _result(healthy, "runc")
    assert result.status == "fail"  # containerd's runc uses SystemdCgroup = true
    assert "/dev/char/" in result.detail
    assert result.fix.startswith("enflame-ctk system create-dev-char-symlinks")
    dev_char.create_links(healthy)
    assert _result(healthy, "runc").status == "pass"


def test_affected_runc_without_known_systemd_driver_only_warns(make_node: MakeNode) -> None:
    root = make_node("flat-4card")
    fx.write(root, "/usr/bin/runc", RUNC.format(version="1.1.3"), 0o755)
    assert _result(root, "runc").status == "warn"


def test_missing_runc_warns(make_node: MakeNode) -> None:
    result = _result(make_node("flat-4card"), "runc")
    assert result.status == "warn" and "no runc" in result.detail


def test_kubelet_not_running_fails(healthy: str) -> None:
    os.unlink(os.path.join(healthy, "var/lib/kubelet/device-plugins/kubelet.sock"))
    result = _result(healthy, "kubelet")
    assert result.status == "fail" and "kubelet.sock is missing" in result.detail
    _stale(os.path.join(healthy, "var/lib/kubelet/device-plugins/kubelet.sock"))
    assert "is stale" in _result(healthy, "kubelet").detail


def test_not_a_kubernetes_node_warns(make_node: MakeNode) -> None:
    root = make_node("flat-4card")
    assert _result(root, "kubelet").status == "warn"
    assert [r for r in doctor.run(root) if r.name == "plugin-socket"] == []


def test_stale_enflame_sock_fails_with_the_faq_fix(healthy: str) -> None:
    path = os.path.join(healthy, "var/lib/kubelet/device-plugins/enflame.sock")
    os.unlink(path)
    assert _result(healthy, "plugin-socket").status == "warn"
    _stale(path)
    result = _result(healthy, "plugin-socket")
    assert result.status == "fail"
    assert result.fix.startswith("rm /var/lib/kubelet/device-plugins/enflame.sock")


def test_swap_on_fails_unless_kubelet_tolerates_it(healthy: str) -> None:
    fx.write(healthy, "/proc/swaps", "Filename\tType\n/dev/dm-1  partition  8388604  0  -2\n")
    result = _result(healthy, "swap")
    assert result.status == "fail" and "/dev/dm-1" in result.detail
    assert result.fix.startswith("swapoff -a")
    fx.write(healthy, "/var/lib/kubelet/config.yaml", "failSwapOn: false\n")
    assert _result(healthy, "swap").status == "warn"


def test_static_cpu_manager_needs_pass_device_specs(healthy: str) -> None:
    fx.write(healthy, "/var/lib/kubelet/config.yaml", "cpuManagerPolicy: static\n")
    result = _result(healthy, "cpu-manager")
    assert result.status == "warn"
    assert "enflame-device-plugin-compat-with-cpumanager.yaml" in result.fix
    fx.write(healthy, "/proc/4242/cmdline", "/usr/bin/enflame-device-plugin\0--pass-device-specs\0")
    assert _result(healthy, "cpu-manager").status == "pass"


def test_kubelet_flag_wins_over_its_config_file(healthy: str) -> None:
    fx.write(healthy, "/proc/77/cmdline", "/usr/bin/kubelet\0--cpu-manager-policy=static\0")
    assert _result(healthy, "cpu-manager").status == "warn"


def test_exit_code_and_json_reflect_the_worst_result(
    healthy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    os.unlink(os.path.join(healthy, "var/lib/kubelet/device-plugins/enflame.sock"))
    assert main(["doctor", "--host-root", healthy]) == 3  # warnings only
    capsys.readouterr()
    simulate.unload_driver(healthy)
    assert main(["doctor", "--host-root", healthy, "--json"]) == 1  # a check failed
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "fail"
    driver = next(r for r in document["results"] if r["name"] == "driver")
    assert driver["status"] == "fail" and driver["fix"]


@pytest.mark.parametrize(
    ("cmdline", "environ", "config"),
    [
        (
            "/usr/local/bin/python3\0/usr/local/bin/enflame-device-plugin\0--pass-device-specs",
            "",
            "",
        ),
        ("python3\0-m\0enflame_gcu.device_plugin.main\0--pass-device-specs=true", "", ""),
        ("enflame-device-plugin\0--resources=gcu", "ENFLAME_PASS_DEVICE_SPECS=true", ""),
        ("enflame-device-plugin\0--resources=gcu", "PASS_DEVICE_SPECS=true", ""),
        (
            "enflame-device-plugin\0--config-file\0/etc/enflame-device-plugin/config.yaml",
            "",
            "version: v1\nflags:\n  passDeviceSpecs: true\n",
        ),
        (
            "enflame-device-plugin",
            "ENFLAME_CONFIG_FILE=/etc/enflame-device-plugin/config.yaml",
            "version: v1\nflags:\n  passDeviceSpecs: true\n",
        ),
    ],
    ids=["console-script-via-interpreter", "python-m", "env", "env-0.1", "config-file", "env-file"],
)
def test_the_plugin_is_recognised_however_it_was_started(
    healthy: str, cmdline: str, environ: str, config: str
) -> None:
    fx.write(healthy, "/var/lib/kubelet/config.yaml", "cpuManagerPolicy: static\n")
    fx.write(healthy, "/proc/4243/cmdline", cmdline + "\0")
    fx.write(healthy, "/proc/4243/environ", environ + "\0" if environ else "")
    if config:  # read through the plugin container's own root, /proc/PID/root
        fx.write(healthy, "/proc/4243/root/etc/enflame-device-plugin/config.yaml", config)
    assert _result(healthy, "cpu-manager").status == "pass"
    fx.write(healthy, "/proc/4243/cmdline", cmdline.replace("pass-device-specs", "x") + "\0")
    fx.write(healthy, "/proc/4243/environ", "")
    if config:
        fx.write(healthy, "/proc/4243/root/etc/enflame-device-plugin/config.yaml", "version: v1\n")
    assert _result(healthy, "cpu-manager").status == "warn"


def test_no_kubelet_settings_pass_without_a_kubelet(healthy: str, tmp_path: object) -> None:
    os.unlink(os.path.join(healthy, "var/lib/kubelet/config.yaml"))
    result = _result(healthy, "cpu-manager")
    assert result.status == "warn" and "cannot tell" in result.detail
    bare = os.path.join(str(tmp_path), "bare")
    fx.write(bare, "/proc/swaps", "Filename\tType\n")
    names = {r.name: r.status for r in doctor.run(bare)}
    assert names["kubelet"] == "warn"
    assert "cpu-manager" not in names and "swap" not in names  # nothing to pass


def test_fixes_keep_the_host_root_and_name_no_repository_paths(healthy: str) -> None:
    os.unlink(os.path.join(healthy, "var/lib/kubelet/device-plugins/enflame.sock"))
    fixes = [r.fix for r in doctor.run(healthy) if r.fix]
    assert not [f for f in fixes if "deploy/yaml" in f]
    assert doctor.with_host_root("enflame-ctk a --b && systemctl x", "/h") == (
        "enflame-ctk a --b --host-root /h && systemctl x"
    )
    assert doctor.with_host_root("enflame-ctk a  # why", "/my root") == (
        "enflame-ctk a --host-root '/my root'  # why"
    )
