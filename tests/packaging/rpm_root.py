"""Install, use and erase the .rpm in a throwaway root; run inside ``unshare -m`` (tests only).

``python -m tests.packaging.rpm_root RPM WORK`` prints a JSON report for test_dist.py. The root
is ``WORK/root``: its ``/usr`` is an overlay of this machine's ``/usr`` (writes go to
``WORK/upper``, the real ``/usr`` is never written), so the scriptlets find a ``/bin/sh`` and
the ``python3``, ``python3-yaml`` and ``python3-tomlkit`` they run with, as on an RPM
distribution; ``/etc`` and ``/var`` are empty directories of the throwaway root. The mounts
belong to the private mount namespace and go with it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

PACKAGE = "enflame-container-toolkit"
CONFIG = "/etc/enflame-container-runtime/config.toml"
CONTAINERD = "/etc/containerd/config.toml"
ORIGINAL = 'version = 2\n# keep me\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'


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


def main(rpm: str, work: str) -> dict[str, object]:
    root = os.path.join(work, "root")
    for name in ("upper", "overlay-work", "root/usr", "root/etc", "root/var/tmp", "root/tmp",
                 "root/dev", "root/proc", "root/etc/containerd"):  # fmt: skip
        os.makedirs(os.path.join(work, name), exist_ok=True)
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
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
