"""Put the GCU runtime on a host and take it off again: the work of install.sh and the DaemonSet.

Every step is recorded in ``<toolkit-dir>/install-manifest.json`` *before* it is made, so a crash
at any point leaves a record that :func:`uninstall` can undo, and a second install adds only what
is missing. What the host gets:

- ``<toolkit-dir>/bin/enflame-container-runtime``: a ``python -IS`` launcher (see ``launcher``).
  The host's own interpreter runs it, because the engine execs the runtime on the host, outside
  any container. Without ``package_dir`` the pure-Python package is copied to
  ``<toolkit-dir>/lib`` (the runtime imports only the standard library), so the host needs
  nothing but ``python3`` >= 3.10; install.sh instead points it at its virtualenv.
- optional links in ``bin_dir`` (install.sh: ``/usr/bin``), the runtime config (never
  overwriting one), the log directory, and the engine configs (via ``engines``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import enflame_gcu
from enflame_gcu import fileio
from enflame_gcu.container_toolkit import engines, launcher
from enflame_gcu.container_toolkit.engines import hosts
from enflame_gcu.errors import EnflameError, InstallError

MANIFEST_NAME = "install-manifest.json"
MANIFEST_VERSION = 1
RUNTIME_NAME = "enflame-container-runtime"
DEFAULT_TOOLKIT_DIR = "/usr/local/enflame"
CONFIG_PATH = "/etc/enflame-container-runtime/config.toml"
LOG_DIR = "/var/log/enflame"
# Used only if the package was installed without its data file; the runtime's defaults apply.
FALLBACK_CONFIG = "# enflame-container-runtime config; an empty file means every default.\n"

Action = dict[str, Any]


@dataclass(frozen=True, slots=True)
class InstallOptions:
    """What :func:`install` puts on the host; every path is as the host sees it."""

    host_root: str = "/"
    toolkit_dir: str = DEFAULT_TOOLKIT_DIR
    engines: tuple[str, ...] | None = None  # None: the engines detected on the host
    set_as_default: bool = False
    restart_engine: bool = False
    python: str = "/usr/bin/python3"
    package_dir: str | None = None  # None: copy the package to <toolkit_dir>/lib
    bin_dir: str | None = None
    ctk: str | None = None  # an enflame-ctk to link into bin_dir
    created: tuple[str, ...] = ()  # "dir:PATH" / "tree:PATH" made by the caller (install.sh)
    dry_run: bool = False

    @property
    def runtime_path(self) -> str:
        """The path engines are told to exec."""
        if self.bin_dir:
            return os.path.join(self.bin_dir, RUNTIME_NAME)
        return os.path.join(self.toolkit_dir, "bin", RUNTIME_NAME)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an install or uninstall did (or, in a dry run, would do), one line per change."""

    lines: tuple[str, ...]
    engines: tuple[str, ...] = ()


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


class _Run:
    """One install or uninstall: the host root, the manifest and the report lines."""

    def __init__(self, host_root: str, toolkit_dir: str, dry_run: bool) -> None:
        self.root, self.toolkit_dir, self.dry_run = host_root, toolkit_dir, dry_run
        self.manifest_path = self.local(os.path.join(toolkit_dir, MANIFEST_NAME))
        self.actions: list[Action] = []
        self.lines: list[str] = []
        self.verb = "would be " if dry_run else ""
        try:
            with open(self.manifest_path, encoding="utf-8") as handle:
                manifest = json.load(handle)
            self.actions = list(manifest["actions"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InstallError(
                f"cannot read {self.manifest_path} (the record of a previous install): {exc}; "
                "fix or remove it by hand after checking what it lists"
            ) from exc

    def local(self, host_path: str) -> str:
        return fileio.host_path(self.root, host_path)

    def record(self, action: Action) -> None:
        """Add ``action`` to the manifest and save it before the change is made."""
        if action not in self.actions:
            self.actions.append(action)
        self.save()

    def save(self) -> None:
        """Write the manifest (once its directory exists; until then it is kept in memory)."""
        if self.dry_run or not os.path.isdir(os.path.dirname(self.manifest_path)):
            return
        manifest = {"version": MANIFEST_VERSION, "toolkit_dir": self.toolkit_dir}
        manifest["actions"] = self.actions
        fileio.atomic_write_text(self.manifest_path, json.dumps(manifest, indent=2) + "\n", 0o644)

    def make_dirs(self, host_path: str) -> None:
        """Create ``host_path`` and missing parents, recording each one we create."""
        missing = []
        path = host_path
        while path != "/" and not os.path.isdir(self.local(path)):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            self.record({"kind": "dir", "path": path})
            if not self.dry_run:
                os.mkdir(self.local(path), 0o755)
            self.lines.append(f"{path}/ {self.verb}created")

    def find(self, kind: str, path: str) -> Action | None:
        """The recorded action of ``kind`` for ``path``, if this tool made it."""
        return next((a for a in self.actions if a["kind"] == kind and a["path"] == path), None)

    def refuse_foreign(self, kind: str, path: str, hint: str) -> None:
        """Never replace a file this tool did not make: say what is there instead."""
        local = self.local(path)
        if os.path.lexists(local) and self.find(kind, path) is None:
            what = f"a link to {os.readlink(local)}" if os.path.islink(local) else "a file"
            raise InstallError(
                f"cannot install {path}: {what} is already there and was not installed by "
                f"enflame-ctk install (no entry in {self.manifest_path}); {hint}"
            )


def _copy_package(run: _Run) -> str:
    """Copy the pure-Python package to ``<toolkit_dir>/lib``; return that dir (host view)."""
    lib = os.path.join(run.toolkit_dir, "lib")
    run.make_dirs(lib)
    target = os.path.join(lib, "enflame_gcu")
    run.refuse_foreign("tree", target, "remove it or choose another --toolkit-dir")
    run.record({"kind": "tree", "path": target})
    source = os.path.dirname(os.path.abspath(enflame_gcu.__file__))
    run.lines.append(f"{target}/ {run.verb}copied from {source}")
    if run.dry_run:
        return lib
    local = run.local(target)
    staging, old = local + ".new", local + ".old"
    for leftover in (staging, old):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # Swap whole trees so a runtime starting meanwhile sees the old or the new package.
    if os.path.lexists(local):
        os.rename(local, old)
    os.rename(staging, local)
    shutil.rmtree(old, ignore_errors=True)
    return lib


def _write_launcher(run: _Run, options: InstallOptions, package_dir: str) -> None:
    bin_dir = os.path.join(run.toolkit_dir, "bin")
    run.make_dirs(bin_dir)
    path = os.path.join(bin_dir, RUNTIME_NAME)
    run.refuse_foreign("file", path, "remove it or choose another --toolkit-dir")
    text = launcher.render(options.python, package_dir)
    local = run.local(path)
    if os.path.isfile(local) and os.access(local, os.X_OK) and _read(local) == text:
        run.lines.append(f"{path}: up to date")
        return
    run.record({"kind": "file", "path": path})
    if not run.dry_run:
        fileio.atomic_write_text(local, text, 0o755)
    run.lines.append(f"{path} {run.verb}written (runs {options.python} -IS, package {package_dir})")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def _link(run: _Run, link: str, target: str) -> None:
    local = run.local(link)
    if os.path.islink(local) and os.readlink(local) == target:
        run.lines.append(f"{link} -> {target}: up to date")
        return
    run.refuse_foreign("symlink", link, "move it away or pass another --bin-dir")
    previous = run.find("symlink", link)
    if previous is not None:
        run.actions.remove(previous)
    run.record({"kind": "symlink", "path": link, "target": target})
    if not run.dry_run:
        temporary = local + ".enflame-tmp"
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(target, temporary)
        os.replace(temporary, local)
    run.lines.append(f"{link} -> {target} {run.verb}linked")


def _write_config(run: _Run) -> None:
    run.make_dirs(os.path.dirname(CONFIG_PATH))
    local = run.local(CONFIG_PATH)
    if os.path.lexists(local):
        run.lines.append(f"{CONFIG_PATH}: exists, kept as it is")
        return
    try:
        text = resources.files(enflame_gcu).joinpath("data/config.toml").read_text("utf-8")
    except OSError:
        text = FALLBACK_CONFIG
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    run.record({"kind": "file", "path": CONFIG_PATH, "sha256": digest, "keep_if_edited": True})
    if not run.dry_run:
        fileio.atomic_write_text(local, text, 0o644)
    run.lines.append(f"{CONFIG_PATH} {run.verb}written from the template")


def reload_engine(change: engines.Change, host_root: str) -> str:
    """Signal or restart the engine; from a container, systemctl runs chrooted into the host."""
    if host_root in ("", "/"):
        return engines.reload(change, host_root)
    runtimes_only = all(path.startswith("runtimes.") for path in change.paths)

    def chrooted(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["chroot", host_root, *command],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def which(name: str) -> str | None:
        found = (f"{d}/{name}" for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"))
        return next((p for p in found if os.access(fileio.host_path(host_root, p), os.X_OK)), None)

    return hosts.reload_engine(
        change.engine, runtimes_only, host_root, runner=chrooted, which=which
    )


def _configure_engine(run: _Run, name: str, options: InstallOptions) -> None:
    config = hosts.DEFAULT_CONFIGS[name]
    # Directories the engine editor would create are ours to remove again.
    run.make_dirs(os.path.dirname(config))
    if name == "crio":
        run.make_dirs(os.path.join(os.path.dirname(config), "crio.conf.d"))
    run.record({"kind": "engine", "path": config, "engine": name})
    runtime = engines.RuntimeOptions(
        runtime_path=options.runtime_path, set_as_default=options.set_as_default
    )
    change = engines.configure(name, None, runtime, host_root=run.root, dry_run=run.dry_run)
    if run.dry_run and change.diff:
        run.lines.extend(change.diff.rstrip("\n").splitlines())
    run.lines.extend(change.describe().splitlines())
    if options.restart_engine and change.changed and not run.dry_run:
        _reload(run, change)


def _reload(run: _Run, change: engines.Change) -> None:
    try:
        run.lines.append(reload_engine(change, run.root))
    except EnflameError as exc:
        run.lines.append(f"warning: {exc}")


def install(options: InstallOptions) -> Outcome:
    """Install the runtime, its config and the engine configs; idempotent, recorded, undoable."""
    run = _Run(options.host_root, options.toolkit_dir, options.dry_run)
    if options.package_dir is None and not os.path.exists(run.local(options.python)):
        raise InstallError(
            f"cannot install: {options.python} does not exist on the host, and the runtime "
            "launcher runs there with the host's python3 (>= 3.10); install python3 on the node "
            "or pass --python with the host path of one"
        )
    for item in options.created:
        kind, _, path = item.partition(":")
        if kind not in ("dir", "tree") or not path.startswith("/"):
            raise InstallError(f"--created wants dir:/ABS/PATH or tree:/ABS/PATH, got {item!r}")
        run.record({"kind": kind, "path": path})
    run.make_dirs(options.toolkit_dir)
    run.save()
    package_dir = options.package_dir or _copy_package(run)
    _write_launcher(run, options, package_dir)
    if options.bin_dir:
        run.make_dirs(options.bin_dir)
        _link(run, options.runtime_path, os.path.join(options.toolkit_dir, "bin", RUNTIME_NAME))
        if options.ctk:
            _link(run, os.path.join(options.bin_dir, "enflame-ctk"), options.ctk)
    _write_config(run)
    run.make_dirs(LOG_DIR)
    names = options.engines if options.engines is not None else tuple(engines.detect(run.root))
    for name in names:
        _configure_engine(run, name, options)
    if not names:
        run.lines.append(
            f"no container engine configured: none found under {run.root} (docker, containerd, "
            "CRI-O); later run `enflame-ctk runtime configure --runtime NAME`"
        )
    return Outcome(tuple(run.lines), tuple(names))


def _undo(run: _Run, action: Action, restart_engine: bool) -> None:
    """Undo one recorded action; anything changed by others since is kept and reported."""
    kind, path = action["kind"], action["path"]
    local = run.local(path)
    if kind == "engine":
        change = engines.unconfigure(
            action["engine"], None, host_root=run.root, dry_run=run.dry_run
        )
        run.lines.extend(change.describe().splitlines())
        if restart_engine and change.changed and not run.dry_run:
            _reload(run, change)
    elif kind == "symlink":
        if os.path.islink(local) and os.readlink(local) == action["target"]:
            _remove(run, path, os.unlink)
        elif os.path.lexists(local):
            run.lines.append(f"kept {path}: it no longer links to {action['target']}")
    elif kind == "file":
        if not os.path.lexists(local):
            return
        if action.get("keep_if_edited") and _sha256(local) != action.get("sha256"):
            run.lines.append(f"kept {path}: edited since it was installed")
        else:
            _remove(run, path, os.unlink)
    elif kind == "tree":
        for leftover in (local + ".new", local + ".old"):
            if not run.dry_run:
                shutil.rmtree(leftover, ignore_errors=True)
        if os.path.lexists(local):
            _remove(run, path + "/", shutil.rmtree)
    elif kind == "dir":
        if not os.path.isdir(local):
            return
        entries = os.listdir(local)
        if entries:
            run.lines.append(f"kept {path}/: not empty ({', '.join(sorted(entries)[:5])})")
        else:
            _remove(run, path + "/", os.rmdir)
    else:
        raise InstallError(f"{run.manifest_path} lists an unknown action kind {kind!r}")


def _remove(run: _Run, shown: str, remover: Callable[[str], object]) -> None:
    if not run.dry_run:
        remover(run.local(shown.rstrip("/") or "/"))
    run.lines.append(f"{shown} {run.verb}removed")


def uninstall(
    host_root: str = "/",
    toolkit_dir: str = DEFAULT_TOOLKIT_DIR,
    *,
    restart_engine: bool = False,
    dry_run: bool = False,
) -> Outcome:
    """Undo everything the manifest in ``toolkit_dir`` records, newest first; dirs go last."""
    run = _Run(host_root, toolkit_dir, dry_run)
    if not os.path.exists(run.manifest_path):
        return Outcome((f"nothing to undo: {run.manifest_path} does not exist",))
    undone_engines = tuple(a["engine"] for a in run.actions if a["kind"] == "engine")
    failed: list[Action] = []
    for action in reversed([a for a in run.actions if a["kind"] != "dir"]):
        try:
            _undo(run, action, restart_engine)
        except (OSError, EnflameError) as exc:
            failed.insert(0, action)
            run.lines.append(f"could not undo {action['kind']} {action['path']}: {exc}")
    dirs = [a for a in run.actions if a["kind"] == "dir"]
    if failed:
        # Keep what is left on record so a second uninstall can finish the job.
        run.actions = dirs + failed
        run.save()
        raise InstallError(
            "uninstall was incomplete:\n  "
            + "\n  ".join(run.lines)
            + f"\nthe rest is still recorded in {run.manifest_path}; fix the cause and re-run"
        )
    if not dry_run:
        os.unlink(run.manifest_path)
    for action in reversed(dirs):
        try:
            _undo(run, action, restart_engine)
        except OSError as exc:
            run.lines.append(f"kept {action['path']}/: {exc.strerror or exc}")
    return Outcome(tuple(run.lines), undone_engines)
