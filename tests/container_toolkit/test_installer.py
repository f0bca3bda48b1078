"""The containerized installer (`enflame-ctk install|uninstall`) against fake host roots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tomlkit

from enflame_gcu.container_toolkit import host_python, installer
from enflame_gcu.container_toolkit.cli import main
from enflame_gcu.container_toolkit.commands.install import READY_LINE
from enflame_gcu.simulation import simulate, topofile
from tests.container_toolkit import installer_fixtures as fx

RUNTIME = "/opt/enflame-gcu/bin/enflame-container-runtime"
CTK = [sys.executable, "-m", "enflame_gcu.container_toolkit.cli"]


@pytest.fixture
def host(tmp_path: object) -> str:
    return fx.fake_host(str(tmp_path))


def topofile_vendor() -> topofile.SimTopology:
    return topofile.load("vendor-8card")


def _local(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _read(root: str, path: str) -> str:
    with open(_local(root, path), encoding="utf-8") as handle:
        return handle.read()


def test_install_copies_runtime_and_configures_every_detected_engine(host: str) -> None:
    outcome = installer.install(installer.InstallOptions(host_root=host, set_as_default=True))

    assert outcome.engines == ("docker", "containerd")
    daemon = json.loads(_read(host, "/etc/docker/daemon.json"))
    assert daemon["runtimes"]["enflame"]["path"] == RUNTIME
    assert daemon["default-runtime"] == "enflame"
    assert daemon["features"] == {"buildkit": True} and daemon["log-driver"] == "json-file"
    text = _read(host, "/etc/containerd/config.toml")
    assert text.startswith("# containerd config written by the node's provisioning")
    cri = tomlkit.parse(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "enflame"
    options = cri["runtimes"]["enflame"]["options"]
    assert options["BinaryName"] == RUNTIME and options["SystemdCgroup"] is True
    backups = [n for n in os.listdir(_local(host, "/etc/docker")) if ".enflame-backup-" in n]
    assert len(backups) == 1
    launcher = _read(host, RUNTIME)
    assert launcher.startswith("#!/bin/sh\n")  # the sh front, over the host's python3
    assert "exec /usr/bin/python3 -IS -c " in launcher
    assert 'sys.path.insert(0, "/opt/enflame-gcu/lib")' in launcher
    assert os.access(_local(host, RUNTIME), os.X_OK)
    assert os.path.isfile(_local(host, "/opt/enflame-gcu/lib/enflame_gcu/shim/main.py"))
    assert "log-file" in _read(host, "/etc/enflame-container-runtime/config.toml")
    assert os.path.isdir(_local(host, "/var/log/enflame"))


def test_copied_package_imports_with_bare_host_python(host: str) -> None:
    """The host's python3 runs the copy with -IS: no site-packages, so stdlib only."""
    installer.install(installer.InstallOptions(host_root=host))
    lib = _local(host, "/opt/enflame-gcu/lib")
    code = (
        f"import sys; sys.path.insert(0, {lib!r}); "
        "import enflame_gcu.shim.main as r, enflame_gcu.shim.create; "
        "print(r.__file__)"
    )
    python = os.path.realpath(_local(host, "/usr/bin/python3"))
    result = subprocess.run([python, "-IS", "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(lib)


def test_second_install_changes_nothing(host: str) -> None:
    options = installer.InstallOptions(host_root=host, set_as_default=True)
    installer.install(options)
    first = fx.snapshot(host)
    outcome = installer.install(options)
    assert fx.diff(first, fx.snapshot(host)) == []
    assert any("already up to date" in line for line in outcome.lines)


def test_uninstall_restores_the_host_tree_exactly(host: str) -> None:
    before = fx.snapshot(host)
    installer.install(installer.InstallOptions(host_root=host, set_as_default=True))
    assert fx.diff(before, fx.snapshot(host)) != []
    installer.uninstall(host)
    assert fx.diff(before, fx.snapshot(host)) == []


def test_install_prepares_the_runtime_fast_path_for_the_nodes_cards(tmp_path: object) -> None:
    host = fx.fake_host(str(tmp_path))
    simulate.create(host, topofile_vendor())
    before = fx.snapshot(host)
    outcome = installer.install(installer.InstallOptions(host_root=host))
    prepared = "/var/run/enflame/prepared-edits.json"
    assert f"{prepared} written (8 usable GCUs)" in outcome.lines
    document = json.loads(_read(host, prepared))
    assert document["enflamePreparedEdits"] == "v2"
    assert document["root"] == "/"  # as the runtime on the host sees it
    (spec,) = [s for s in document["specs"] if s["kind"] == "enflame.com/gcu"]
    # By minor, PCI address and all (the addresses sort before the minors: "0000:..." < "1").
    assert sorted(d["name"] for d in spec["devices"]) == sorted(
        [
            *(str(i) for i in range(8)),
            *(d["name"] for d in spec["devices"] if ":" in d["name"]),
            "all",
        ]
    )
    assert sum(":" in d["name"] for d in spec["devices"]) == 8
    installer.uninstall(host)
    assert fx.diff(before, fx.snapshot(host)) == []


def test_install_on_a_node_without_gcus_writes_no_prepared_edits(host: str) -> None:
    outcome = installer.install(installer.InstallOptions(host_root=host))
    assert any("no usable GCU on this node, none written" in line for line in outcome.lines)
    assert not os.path.exists(_local(host, "/var/run/enflame/prepared-edits.json"))


def test_crio_drop_in_and_its_directory_are_removed_again(tmp_path: object) -> None:
    root = fx.fake_host(str(tmp_path), docker=False, containerd=False, crio=True)
    before = fx.snapshot(root)
    outcome = installer.install(installer.InstallOptions(host_root=root))
    assert outcome.engines == ("crio",)
    drop_in = tomlkit.parse(_read(root, "/etc/crio/crio.conf.d/99-enflame.toml"))
    assert drop_in["crio"]["runtime"]["runtimes"]["enflame"]["runtime_path"] == RUNTIME
    installer.uninstall(root)
    assert fx.diff(before, fx.snapshot(root)) == []


def test_existing_runtime_config_is_never_overwritten_or_removed(host: str) -> None:
    fx.write(host, "/etc/enflame-container-runtime/config.toml", 'log-level = "debug"\n')
    before = fx.snapshot(host)
    outcome = installer.install(installer.InstallOptions(host_root=host))
    assert "/etc/enflame-container-runtime/config.toml: exists, kept as it is" in outcome.lines
    installer.uninstall(host)
    assert fx.diff(before, fx.snapshot(host)) == []


def test_config_edited_after_install_is_kept_on_uninstall(host: str) -> None:
    installer.install(installer.InstallOptions(host_root=host))
    fx.write(host, "/etc/enflame-container-runtime/config.toml", 'log-level = "debug"\n')
    outcome = installer.uninstall(host)
    assert "kept /etc/enflame-container-runtime/config.toml: edited since it was installed" in (
        outcome.lines
    )
    assert _read(host, "/etc/enflame-container-runtime/config.toml") == 'log-level = "debug"\n'
    assert not os.path.exists(_local(host, "/opt/enflame-gcu"))


def test_someone_elses_daemon_json_edit_survives_uninstall(host: str) -> None:
    installer.install(installer.InstallOptions(host_root=host, set_as_default=True))
    path = _local(host, "/etc/docker/daemon.json")
    daemon = json.loads(_read(host, "/etc/docker/daemon.json"))
    daemon["debug"] = True
    fx.write(host, "/etc/docker/daemon.json", json.dumps(daemon))
    installer.uninstall(host)
    with open(path, encoding="utf-8") as handle:
        after = json.load(handle)
    assert after["debug"] is True and "runtimes" not in after and "default-runtime" not in after


def test_missing_host_python_is_refused_before_any_change(host: str) -> None:
    os.unlink(_local(host, "/usr/bin/python3"))
    before = fx.snapshot(host)
    with pytest.raises(
        installer.InstallError, match=r"/usr/bin/python3 does not exist on the host"
    ):
        installer.install(installer.InstallOptions(host_root=host))
    assert fx.diff(before, fx.snapshot(host)) == []


def test_foreign_runtime_binary_is_never_replaced(host: str) -> None:
    vendor = fx.write(host, "/usr/bin/enflame-container-runtime", "vendor binary", 0o755)
    before = fx.snapshot(host)
    with pytest.raises(installer.InstallError, match="was not installed by enflame-ctk install"):
        installer.install(installer.InstallOptions(host_root=host, bin_dir="/usr/bin"))
    with open(vendor, encoding="utf-8") as handle:
        assert handle.read() == "vendor binary"
    installer.uninstall(host)  # the partial install was recorded, so it undoes cleanly
    assert fx.diff(before, fx.snapshot(host)) == []


def test_dry_run_changes_nothing_and_says_what_it_would_do(host: str) -> None:
    before = fx.snapshot(host)
    outcome = installer.install(
        installer.InstallOptions(host_root=host, set_as_default=True, dry_run=True)
    )
    assert fx.diff(before, fx.snapshot(host)) == []
    assert "/opt/enflame-gcu/ would be created" in outcome.lines
    assert any(
        line.startswith("+") and "enflame-container-runtime" in line for line in outcome.lines
    )


def test_runtime_none_leaves_engines_alone(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    daemon = _read(host, "/etc/docker/daemon.json")
    assert main(["install", "--host-root", host, "--runtime", "none"]) == 0
    assert _read(host, "/etc/docker/daemon.json") == daemon
    assert "enflame-ctk: no container engine configured" in capsys.readouterr().err


def test_uninstall_without_a_manifest_has_nothing_to_undo(host: str) -> None:
    outcome = installer.uninstall(host)
    assert outcome.lines[0].startswith("nothing to undo:")


def _start_waiting(host: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CTK, "install", "--host-root", host, "--wait", "--set-as-default", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(process: subprocess.Popen[str]) -> list[str]:
    assert process.stderr is not None  # progress, the ready line included, is on stderr
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(READY_LINE):
            return lines
    process.kill()
    raise AssertionError(f"never ready: {lines} {process.communicate()}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_wait_mode_undoes_everything_on_signal_and_exits_0(host: str, signum: int) -> None:
    before = fx.snapshot(host)
    ready = os.path.join(os.path.dirname(host), f"ready-{signum}")
    process = _start_waiting(host, "--ready-file", ready)
    try:
        _wait_ready(process)
        assert os.path.exists(ready)
        assert "enflame" in json.loads(_read(host, "/etc/docker/daemon.json"))["runtimes"]
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert out == ""  # a real run's result is the node's new state: nothing on stdout
    assert "enflame-ctk: /opt/enflame-gcu/ removed" in err
    assert not os.path.exists(ready)
    assert fx.diff(before, fx.snapshot(host)) == []


def test_failed_install_in_wait_mode_leaves_nothing_behind(host: str) -> None:
    fx.write(host, "/etc/docker/daemon.json", "{not json")
    before = fx.snapshot(host)
    process = _start_waiting(host)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "daemon.json" in err
    assert fx.diff(before, fx.snapshot(host)) == []


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ({"/usr/bin/python3.9": "file", "/usr/bin/python3": "python3.9"}, "is Python 3.9"),
        ({"/usr/bin/python3": "file"}, "cannot tell which Python /usr/bin/python3"),
        (
            {"/opt/py/bin/python3": "file", "/opt/py/lib/python3.8/os.py": "file"},
            "is Python 3.8",
        ),
    ],
    ids=["old-versioned-name", "unversioned", "old-stdlib-beside-it"],
)
def test_an_unsupported_host_python_is_refused_before_anything_changes(
    tmp_path: os.PathLike[str], layout: dict[str, str], expected: str
) -> None:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"))
    os.unlink(os.path.join(host, "usr/bin/python3"))
    for path, what in layout.items():
        if what == "file":
            fx.write(host, path, "#!/bin/sh\n", 0o755)
        else:
            os.symlink(what, os.path.join(host, path.lstrip("/")))
    python = next(iter(layout)) if "/opt/py/bin/python3" in layout else "/usr/bin/python3"
    before = fx.snapshot(host)
    with pytest.raises(installer.InstallError, match=expected):
        installer.install(installer.InstallOptions(host_root=host, python=python))
    assert fx.diff(before, fx.snapshot(host)) == []


def test_the_host_python_version_comes_from_its_stdlib_when_its_name_has_none(
    tmp_path: os.PathLike[str],
) -> None:
    host = str(tmp_path)
    fx.write(host, "/opt/py/bin/python3", "#!/bin/sh\n", 0o755)
    fx.write(host, "/opt/py/lib/python3.12/os.py", "")
    assert host_python.version(host, "/opt/py/bin/python3") == (3, 12)
    assert host_python.problem(host, "/opt/py/bin/python3") is None
