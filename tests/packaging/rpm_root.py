"""Install, use and erase the .rpm in a throwaway root; run inside ``unshare -m`` (tests only).

``python -m tests.packaging.rpm_root RPM WORK [el]`` prints a JSON report for test_dist.py. The
root is ``WORK/root``: its ``/usr`` is an overlay of this machine's ``/usr`` (writes go to
``WORK/upper``, the real ``/usr`` is never written), so the scriptlets find a ``/bin/sh`` and
the ``python3``, ``python3-yaml`` and ``python3-tomlkit`` they run with, as on an RPM
distribution; ``/etc`` and ``/var`` are empty directories of the throwaway root. The mounts
belong to the private mount namespace and go with it.

With ``el`` the root is laid out as EL8/EL9 are for us: ``/usr/bin/python3`` is too old (a
stand-in that reports Python 3.9 and runs nothing), a newer ``python3.11`` sits beside it, and
that interpreter has no PyYAML or tomlkit of its own (this machine's are hidden by overlay
whiteouts), as EL9's python3.11 without python3.11-pyyaml.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from enflame_gcu.simulation import simulate, topofile
from tests.packaging import node_commands

PACKAGE = "enflame-container-toolkit"
CONFIG = "/etc/enflame-container-runtime/config.toml"
CONTAINERD = "/etc/containerd/config.toml"
ORIGINAL = 'version = 2\n# keep me\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
OLD_PYTHON3 = """#!/bin/sh
# EL9's python3 for these tests: Python 3.9, too old for enflame-gcu; it runs nothing.
case "$1" in -V|--version) echo "Python 3.9.18"; exit 0 ;; esac
echo "python3 (3.9 stand-in) cannot run: $*" >&2
exit 1
"""
HIDDEN = ("lib/python3/dist-packages/yaml", "lib/python3/dist-packages/tomlkit")


def _run(*argv: str) -> dict[str, object]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}


def _entry(path: str) -> list[object] | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    kind = "dir" if stat.S_ISDIR(info.st_mode) else "link" if stat.S_ISLNK(info.st_mode) else "file"
    return [kind, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _el_layout(upper: str) -> None:
    """EL's interpreters, in the overlay's upper layer (so over this machine's /usr)."""
    with open(os.path.join(upper, "bin", "python3"), "w", encoding="utf-8") as handle:
        handle.write(OLD_PYTHON3)
    os.chmod(os.path.join(upper, "bin", "python3"), 0o755)  # noqa: S103 - an interpreter
    for hidden in HIDDEN:  # an overlay whiteout: a 0/0 character device
        os.makedirs(os.path.dirname(os.path.join(upper, hidden)), exist_ok=True)
        os.mknod(os.path.join(upper, hidden), stat.S_IFCHR | 0o000, os.makedev(0, 0))


def main(rpm: str, work: str, el: bool = False) -> dict[str, object]:
    root = os.path.join(work, "root")
    made = ("upper", "upper/bin", "overlay-work", "root/usr", "root/etc", "root/var/tmp",
            "root/tmp", "root/dev", "root/proc", "root/etc/containerd", "root/out")  # fmt: skip
    for name in made:
        os.makedirs(os.path.join(work, name), exist_ok=True)
    if el:
        _el_layout(os.path.join(work, "upper"))
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir=/usr,upperdir={work}/upper,workdir={work}/overlay-work", f"{root}/usr"],
        check=True,
    )  # fmt: skip
    subprocess.run(["mount", "-t", "proc", "proc", f"{root}/proc"], check=True)
    for link in ("bin", "sbin", "lib", "lib64"):  # merged /usr, as Debian 12 and RPM distros
        os.symlink(f"usr/{link}", os.path.join(root, link))
    os.mknod(os.path.join(root, "dev/null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(os.path.join(root, "dev/null"), 0o666)  # noqa: S103 - /dev/null is world-writable
    with open(os.path.join(root, "etc/passwd"), "w", encoding="utf-8") as handle:
        handle.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(root, "etc/group"), "w", encoding="utf-8") as handle:
        handle.write("root:x:0:\n")
    with open(os.path.join(root, CONTAINERD.lstrip("/")), "w", encoding="utf-8") as handle:
        handle.write(ORIGINAL)
    rpm_in = ["rpm", "--root", root, "--dbpath", "/var/lib/rpm"]
    report: dict[str, object] = {"initdb": _run(*rpm_in, "--initdb")}
    report["install"] = _run(*rpm_in, "-i", "--nodeps", rpm)
    files = _run(*rpm_in, "-ql", PACKAGE)
    report["files"] = files
    paths = str(files["out"]).split()
    report["configs"] = str(_run(*rpm_in, "-qc", PACKAGE)["out"]).split()
    # Sizes, digests, modes and owners against the rpm (dependencies are not in this root).
    report["verify"] = _run(*rpm_in, "-V", "--nodeps", PACKAGE)
    report["installed"] = {p: _entry(root + p) for p in paths}
    pycache = os.path.join(root, "usr/lib/enflame-gcu/python/enflame_gcu/__pycache__")
    report["compiled_by_post"] = os.path.isdir(pycache)
    ctk = ["chroot", root, "/usr/bin/enflame-ctk"]
    report["ctk_version"] = _run(*ctk, "--version")
    report["runtime_version"] = _run("chroot", root, "/usr/bin/enflame-container-runtime",
                                     "--version")  # fmt: skip
    link = os.path.join(root, "usr/lib/enflame-gcu/python3")
    report["python_link"] = os.readlink(link) if os.path.islink(link) else None
    report["python3_says"] = _run("chroot", root, "/usr/bin/python3", "-V")
    report["imports"] = _run(
        "chroot", root, "/usr/lib/enflame-gcu/python3", "-I", "-c",
        "import sys; sys.path.append('/usr/lib/enflame-gcu/vendor'); import yaml, tomlkit;"
        "print(yaml.__file__); print(tomlkit.__file__)",
    )  # fmt: skip
    simulate.create(os.path.join(root, "node"), topofile.load("flat-4card"))
    report["node_commands"] = node_commands.run_all(
        ["chroot", root, "/usr/bin/enflame-ctk"], "/node", "/out", make_out=False
    )
    report["configure"] = _run(*ctk, "runtime", "configure", "--runtime", "containerd")
    report["containerd_configured"] = _read(os.path.join(root, CONTAINERD.lstrip("/")))
    with open(os.path.join(root, CONFIG.lstrip("/")), "a", encoding="utf-8") as handle:
        handle.write("# an operator's edit\n")
    report["erase"] = _run(*rpm_in, "-e", PACKAGE)
    report["after"] = {p: _entry(root + p) for p in paths}
    report["rpmsave"] = _read(os.path.join(root, CONFIG.lstrip("/") + ".rpmsave"))
    report["containerd_after"] = _read(os.path.join(root, CONTAINERD.lstrip("/")))
    report["package_dir_after"] = _entry(os.path.join(root, "usr/lib/enflame-gcu"))
    report["query_after"] = _run(*rpm_in, "-q", PACKAGE)
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], el=sys.argv[3:] == ["el"])))
