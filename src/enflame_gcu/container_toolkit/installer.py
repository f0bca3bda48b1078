"""Put the GCU runtime on a host: the work of install.sh and the DaemonSet.

Every step is recorded in the install manifest (``install_manifest``) *before* it is made, so
:func:`uninstall` can undo it after a crash at any point, and a second install adds only what
is missing. What the host gets:

- ``<toolkit-dir>/bin/enflame-container-runtime``: the ``sh`` front that runs the Python wrapper
  (``python -IS``) only for GCU requests (see ``launcher``).
  The host's own interpreter runs it, because the engine execs the runtime on the host, outside
  any container. Without ``package_dir`` the pure-Python package is copied to
  ``<toolkit-dir>/lib`` (the runtime imports only the standard library), so the host needs
  nothing but ``python3`` >= 3.10; install.sh instead points it at its virtualenv.
- optional links in ``bin_dir`` (install.sh: ``/usr/bin``), the runtime config (never
  overwriting one), the log directory, and the engine configs (via ``engines``).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from importlib import resources

import enflame_gcu
from enflame_gcu import devices, fileio, node_modes
from enflame_gcu.container_toolkit import (
    cdi,
    cdi_keeper,
    cdi_service,
    engines,
    host_python,
    install_manifest,
    migrate_engines,
    migrate_plugin,
    node_mode,
)
from enflame_gcu.container_toolkit.engines import containerd_api, hosts, storage
from enflame_gcu.container_toolkit.engines import reload as engine_reload
from enflame_gcu.container_toolkit.install_manifest import (
    DEFAULT_TOOLKIT_DIR,
    InstallRun,
    Outcome,
    undo_run,
    uninstall,
)
from enflame_gcu.errors import EnflameError, InstallError, SpecError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import launcher

__all__ = [
    "DEFAULT_TOOLKIT_DIR",
    "InstallError",
    "InstallOptions",
    "InstallRun",
    "Outcome",
    "begin",
    "install",
    "undo_run",
    "uninstall",
]

RUNTIME_NAME = "enflame-container-runtime"
CONFIG_PATH = runtime_config.DEFAULT_PATH
LOG_DIR = os.path.dirname(runtime_config.DEFAULT_LOG_FILE)
LOGROTATE_PATH = "/etc/logrotate.d/enflame-container-runtime"
# Used only if the package was installed without its data file; the runtime's defaults apply.
FALLBACK_CONFIG = "# enflame-container-runtime config; an empty file means every default.\n"


STOCK_CONTAINERD = hosts.ContainerdSite()


@dataclass(frozen=True, slots=True)
class InstallOptions:
    """What :func:`install` puts on the host; every path is as the host sees it."""

    host_root: str = "/"
    toolkit_dir: str = DEFAULT_TOOLKIT_DIR
    engines: tuple[str, ...] | None = None  # None: the engines detected on the host
    set_as_default: bool = False
    cdi_annotations: bool = False  # the plugin's cdi-annotations strategy (containerd 1.x)
    restart_engine: bool = False
    python: str = "/usr/bin/python3"
    package_dir: str | None = None  # None: copy the package to <toolkit_dir>/lib
    bin_dir: str | None = None
    ctk: str | None = None  # an enflame-ctk to link into bin_dir
    # install.sh --migrate: a runtime at bin_dir's name that is not ours (topscloud's binary)
    # is set aside as *.topscloud instead of refused; uninstall puts it back.
    set_aside_vendor_runtime: bool = False
    created: tuple[str, ...] = ()  # "dir:PATH" / "tree:PATH" made by the caller (install.sh)
    dry_run: bool = False
    # None: install the wrapper as the flags above say (before node modes). Otherwise "auto" or
    # a node mode: the node gets what that mode needs and its mode file (node_modes.MODE_FILE).
    mode: str | None = None
    # Node mode cdi without a waiting installer (install.sh): a systemd service keeps the specs.
    cdi_service: bool = False
    # Where containerd keeps its config and socket, and its unit (k3s and RKE2: elsewhere).
    containerd: hosts.ContainerdSite = STOCK_CONTAINERD

    @property
    def runtime_path(self) -> str:
        """The path engines are told to exec."""
        if self.bin_dir:
            return os.path.join(self.bin_dir, RUNTIME_NAME)
        return os.path.join(self.toolkit_dir, "bin", RUNTIME_NAME)


def _copy_package(run: InstallRun) -> str:
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

        def put_back() -> None:
            shutil.rmtree(local, ignore_errors=True)
            os.rename(old, local)

        # Kept until the run is committed: undoing this run puts the earlier package back.
        run.journal.append((target, put_back))
        run.on_commit.append(lambda: shutil.rmtree(old, ignore_errors=True))
    os.rename(staging, local)
    return lib


def _write_launcher(run: InstallRun, options: InstallOptions, package_dir: str) -> None:
    bin_dir = os.path.join(run.toolkit_dir, "bin")
    run.make_dirs(bin_dir)
    path = os.path.join(bin_dir, RUNTIME_NAME)
    run.refuse_foreign("file", path, "remove it or choose another --toolkit-dir")
    text = launcher.render(options.python, package_dir)
    local = run.local(path)
    current = run.local(path, follow=True)
    if os.path.isfile(current) and os.access(current, os.X_OK) and _read(current) == text:
        run.lines.append(f"{path}: up to date")
        return
    run.record({"kind": "file", "path": path})
    run.remember(path)
    if not run.dry_run:
        fileio.atomic_write_text(local, text, 0o755)
    run.lines.append(
        f"{path} {run.verb}written (sh front; runs {options.python} -IS, package {package_dir}, "
        "for GCU requests)"
    )


def _read(path: str) -> str | None:
    try:
        return fileio.read_regular(path).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _link(run: InstallRun, link: str, target: str) -> None:
    local = run.local(link)
    if os.path.islink(local) and os.readlink(local) == target:
        run.lines.append(f"{link} -> {target}: up to date")
        return
    if run.find("moved", link) is None:  # a vendor's file set aside (or to be, in a dry run)
        run.refuse_foreign("symlink", link, "move it away or pass another --bin-dir")
    previous = run.find("symlink", link)
    if previous is not None:
        run.actions.remove(previous)
    run.record({"kind": "symlink", "path": link, "target": target})
    run.remember(link)
    if not run.dry_run:
        fileio.replace_symlink(target, local)
    run.lines.append(f"{link} -> {target} {run.verb}linked")


def _write_config(run: InstallRun) -> None:
    run.make_dirs(os.path.dirname(CONFIG_PATH))
    local = run.local(CONFIG_PATH)
    if os.path.lexists(local):
        run.lines.append(f"{CONFIG_PATH}: exists, kept as it is")
        return
    try:
        text = resources.files(enflame_gcu).joinpath("data/config.toml").read_text("utf-8")
    except OSError:
        text = FALLBACK_CONFIG
    digest = storage.sha256(text)
    run.record({"kind": "file", "path": CONFIG_PATH, "sha256": digest, "keep_if_edited": True})
    run.remember(CONFIG_PATH)
    if not run.dry_run:
        fileio.atomic_write_text(local, text, 0o644)
    run.lines.append(f"{CONFIG_PATH} {run.verb}written from the template")


def _prepare_edits(run: InstallRun) -> None:
    """Write the runtime's prepared edits for this node's cards (the create fast path).

    A cache, not configuration: the runtime checks it against /dev on every create and falls
    back to discovery when it is missing or stale, so rewriting it is always safe.
    """
    path = runtime_config.DEFAULT_PREPARED_EDITS
    run.make_dirs(os.path.dirname(path))
    run.record({"kind": "file", "path": path})
    run.remember(path)
    fileio.require_confined(run.root, devices.DISCOVERY_PATHS)
    inventory = devices.discover(run.root)
    if run.dry_run:  # discovery only reads: the plan says what the real run will find
        try:
            cdi.build_specs(inventory)
        except SpecError:
            run.lines.append(
                f"{path}: no usable GCU on this node, none would be written (the runtime "
                "discovers on create)"
            )
        else:
            count = len(inventory.usable_cards())
            run.lines.append(f"{path} would be written ({count} usable GCUs)")
        return
    # The document describes the host as the runtime sees it there: root "/".
    if cdi.refresh_prepared_edits(run.local(path), inventory, root="/"):
        run.lines.append(f"{path} written ({len(inventory.usable_cards())} usable GCUs)")
    else:
        run.lines.append(
            f"{path}: no usable GCU on this node, none written (the runtime discovers on create)"
        )


SEED_HEADER = (
    "# Seeded from {rendered} by enflame-ctk install, which removes it on uninstall\n"
    "# (unless edited since). {name} renders config.toml from this file when it starts.\n"
)


def _seed_template(
    run: InstallRun, choice: hosts.TemplateChoice, site: hosts.ContainerdSite
) -> None:
    """k3s/RKE2 without a template yet: create it from the config.toml last rendered.

    Recorded (with its digest) before it is written, so uninstall removes it again once the
    runtime entry is taken out (and keeps it, reporting so, when someone edited it since).
    """
    path, name = choice.template, site.preset or "k3s/RKE2"
    local = run.local(path)
    text = SEED_HEADER.format(rendered=choice.rendered, name=name)
    text += fileio.read_regular(run.local(choice.rendered, follow=True)).decode("utf-8")
    action = {"kind": "file", "path": path, "sha256": storage.sha256(text), "keep_if_edited": True}
    # Not remembered for undo_run's put-back: the file goes as this action's undo, after the
    # engine step's undo (which restarts the distribution while the template still exists).
    run.record(action)
    if not run.dry_run:
        info = os.stat(run.local(choice.rendered, follow=True))
        fileio.atomic_write_text(local, text, info.st_mode & 0o777)
    run.lines.append(f"{path} {run.verb}created from {choice.rendered} (the {name} template)")


def _containerd_config(run: InstallRun, site: hosts.ContainerdSite) -> tuple[str, str | None]:
    """(config to record, file to plan a dry run on): the template for k3s/RKE2, seeded."""
    if not site.template:
        stock = hosts.DEFAULT_CONFIGS["containerd"]
        if site.config != stock and not os.path.lexists(run.local(site.config)):
            # A file containerd never reads would be written without effect: refuse instead.
            raise InstallError(
                f"cannot configure containerd: {site.config} (the containerd config given) does "
                "not exist; nothing was changed"
            )
        return site.config, None
    choice = hosts.choose_template(run.root, site.config)
    local = run.local(choice.template, follow=True)
    if not choice.seed and "{{" in (_read(local) or ""):
        raise InstallError(
            f"cannot configure containerd: {choice.template} holds Go template actions "
            "({{ ... }}), which enflame-ctk does not edit; add the enflame runtime to it by "
            "hand (docs/user-guide.md, 'k3s and RKE2') or pass --containerd-config with a "
            "plain TOML template; nothing was changed"
        )
    if choice.seed:
        run.make_dirs(os.path.dirname(choice.template))
        _seed_template(run, choice, site)
        if run.dry_run:  # nothing written: plan the edit on what the template would hold
            return choice.template, choice.rendered
    return choice.template, None


def _configure_engine(
    run: InstallRun, name: str, options: InstallOptions, set_as_default: bool
) -> None:
    site = options.containerd
    planned_on = None
    if name == "containerd":
        config, planned_on = _containerd_config(run, site)
    else:
        config = hosts.DEFAULT_CONFIGS[name]
    # Directories the engine editor would create are ours to remove again.
    run.make_dirs(os.path.dirname(config))
    if name == "crio":
        run.make_dirs(os.path.join(os.path.dirname(config), "crio.conf.d"))
    # Recorded with the name of the step configure will write, so undoing this install
    # takes back that step only (another install's step in the same config stays).
    action: install_manifest.Action = {
        "kind": "engine",
        "path": config,
        "engine": name,
        "step": uuid.uuid4().hex[:16],
    }
    units = site.services if name == "containerd" and not site.stock else None
    if units:
        action["services"] = list(units)  # the units to restart (undo restarts them too)
    run.record(action)
    runtime = engines.RuntimeOptions(
        runtime_path=options.runtime_path,
        set_as_default=set_as_default,
        cdi_annotations=options.cdi_annotations,
    )
    path = None if config == hosts.DEFAULT_CONFIGS[name] else run.local(planned_on or config)
    change = engines.configure(
        name, path, runtime, host_root=run.root, dry_run=run.dry_run, step=action["step"]
    )
    if not change.changed and not run.dry_run:
        run.actions.remove(action)  # nothing written: nothing of ours to undo
        run.save()
    if run.dry_run and change.diff:
        run.lines.extend(run.host_view(change.diff).rstrip("\n").splitlines())
    run.lines.extend(run.host_view(change.describe()).splitlines())
    if options.restart_engine and change.changed:
        run.lines.append(
            f"{name}: would be reloaded or restarted"
            if run.dry_run
            else engine_reload.reload_or_warn(change, run.root, units)
        )
    elif change.changed:
        # Only an engine whose config changed needs a restart (device-specs changes none); a
        # dry run's plan says the same, so the plan and the real run's report match.
        unit = " or ".join(f"systemctl restart {u}" for u in units or (name,))
        run.lines.append(
            f"{name}: restart it so it loads the runtime ({unit}), "
            "or run again with --restart-engine"
        )


def begin(options: InstallOptions) -> InstallRun:
    """A run for :func:`install`: it reads the manifest as found, for :func:`undo_run`."""
    return InstallRun(options.host_root, options.toolkit_dir, options.dry_run)


def install(
    options: InstallOptions, run: InstallRun | None = None, *, keep_undo: bool = False
) -> Outcome:
    """Install the runtime, its config and the engine configs; idempotent, recorded, undoable.

    A step that fails takes back what this run changed, and only that: an install that was
    there before is left as it was. ``keep_undo`` (the DaemonSet's ``--wait``) keeps what
    :func:`undo_run` needs to take the run back later, instead of committing it.
    """
    run = run or begin(options)
    try:
        outcome = _install(options, run)
    except BaseException as exc:
        undone = undo_run(run, options.restart_engine)
        if isinstance(exc, EnflameError):
            lines = "\n  ".join(undone.lines) or "nothing had been changed yet"
            raise InstallError(
                f"{exc}\nthis run's changes were taken back (an earlier install is kept):\n  "
                + lines
            ) from exc
        raise
    if not keep_undo:
        run.commit()
    return outcome


def _record_mode(run: InstallRun, record: node_modes.Record) -> None:
    path = node_modes.MODE_FILE
    run.make_dirs(os.path.dirname(path))
    text = record.to_json()
    if _read(run.local(path, follow=True)) == text:
        run.lines.append(f"{path}: up to date (node mode {record.mode})")
        return
    run.record({"kind": "file", "path": path})
    run.remember(path)
    if not run.dry_run:
        fileio.atomic_write_text(run.local(path), text, 0o644)
    run.lines.append(f"{path} {run.verb}written (node mode {record.mode})")
    if not run.dry_run:
        # Plugins in --node-mode=auto that read this very file answer for the new mode at once.
        for pid, told in node_mode.notify_plugins(run.root):
            if told:
                run.lines.append(f"told the device plugin (pid {pid}) to reload its node mode")
            else:
                run.lines.append(
                    f"did not signal the device plugin (pid {pid}): it is still starting (no "
                    f"reload handler after {node_mode.HANDLER_WAIT_SECONDS:.0f} s) and SIGHUP "
                    "would kill it; restart it if it does not answer for the new mode"
                )


SET_ASIDE = ".enflame-set-aside"  # no CDI reader loads it (*.yaml and *.json only)


def _write_cdi_specs(run: InstallRun) -> None:
    """Node mode cdi: the node's CDI specs, recorded so uninstall removes them.

    A spec file at one of our names that we did not write (an operator's own
    ``enflame.com-vgcu.yaml``) is set aside, never deleted, and put back by uninstall.
    """
    directory = cdi.DEFAULT_OUTPUT_DIR
    run.make_dirs(directory)
    owned = []
    for path in cdi_keeper.spec_paths(directory):
        local = run.local(path)
        if run.find("file", path) is None and not cdi_keeper.ours(local):
            _set_aside(run, path)
        run.record({"kind": "file", "path": path})
        run.remember(path)
        owned.append(run.local(path))
    if run.dry_run:
        run.lines.append(f"{directory}/enflame.com-*.yaml {run.verb}written from the node's GCUs")
        return
    fileio.require_confined(run.root, devices.DISCOVERY_PATHS)
    output = run.local(directory, follow=True)
    owned = [os.path.join(output, os.path.basename(p)) for p in owned]
    changed = cdi_keeper.refresh(run.root, output, owned)
    run.lines.extend(changed or [f"{directory}/enflame.com-*.yaml: up to date"])


VENDOR_ASIDE = ".topscloud"  # as migrate sets the vendor's runtime config aside


def _set_aside_vendor_runtime(run: InstallRun, path: str) -> None:
    """Rename a runtime at ``path`` that no install of ours made (topscloud's binary) aside,
    recorded so that uninstall puts it back; ours (a recorded link, a front of ours from the
    packages) is never moved."""
    local = run.local(path)
    if not os.path.lexists(local) or run.find("symlink", path) or run.find("moved", path):
        return
    if os.path.islink(local) or launcher.front_python(_read(local) or "") is not None:
        return  # a link, or our packages' front: refused by _link as before, never moved
    saved = path + VENDOR_ASIDE
    if os.path.lexists(run.local(saved)):
        raise InstallError(
            f"cannot set the vendor's {path} aside: {saved} exists already; compare the two "
            "and move one of them away (nothing was changed)"
        )
    run.record({"kind": "moved", "path": path, "saved": saved})
    run.lines.append(
        f"{path}: topscloud's runtime, not ours; {run.verb}set aside as {saved} (put back by "
        "uninstall)"
    )
    if not run.dry_run:
        os.rename(local, run.local(saved))


def _set_aside(run: InstallRun, path: str) -> None:
    saved = path + SET_ASIDE
    if os.path.lexists(run.local(saved)):
        raise InstallError(
            f"cannot install node mode cdi: {path} was not written by enflame-ctk and "
            f"{saved} (where it would be set aside) exists too; move one of them away"
        )
    run.record({"kind": "moved", "path": path, "saved": saved})
    run.lines.append(
        f"{path}: not written by enflame-ctk; {run.verb}set aside as {saved} "
        "(put back by uninstall)"
    )
    if not run.dry_run:
        # Undoing this run (or uninstall) removes ours, then the "moved" record puts it back.
        os.rename(run.local(path), run.local(saved))


def _install_units(run: InstallRun, options: InstallOptions, cdi_watch: bool) -> None:
    """The toolkit's systemd units (cdi_service), recorded so uninstall stops and removes them.

    The boot units (/dev/char links, prepared edits) on every node install.sh sets up; the CDI
    keeper in node mode cdi. Only with an enflame-ctk linked on the host for them to run.
    """
    if not (options.bin_dir and options.ctk):
        if cdi_watch:
            run.lines.append(
                "the CDI specs are kept current only while something runs `enflame-ctk cdi "
                "watch` (no enflame-ctk linked on the host for a service: pass --bin-dir and "
                "--link-ctk)"
            )
        return
    ctk = os.path.join(options.bin_dir, "enflame-ctk")
    by = "# Installed by enflame-ctk install (deploy/install.sh); removed by uninstall."
    units = cdi_service.render_boot(ctk, by)
    if cdi_watch:
        units[cdi_service.UNIT_NAME] = cdi_service.render(ctk, cdi.DEFAULT_OUTPUT_DIR)
    run.make_dirs(cdi_service.UNIT_DIR)
    for name, text in units.items():
        path = f"{cdi_service.UNIT_DIR}/{name}"
        if _read(run.local(path, follow=True)) != text:
            run.refuse_foreign("unit", path, "remove it (or rename the unit) first")
            run.record({"kind": "unit", "path": path, "unit": name})
            run.remember(path)
            if not run.dry_run:
                fileio.atomic_write_text(run.local(path), text, 0o644)
            run.lines.append(f"{path} {run.verb}written")
    start = f"systemctl daemon-reload && systemctl enable --now {' '.join(units)}"
    if not cdi_service.usable(run.root):
        run.lines.append(f"systemd is not running here: start the services yourself ({start})")
        return
    if run.dry_run:
        run.lines.append(f"{', '.join(units)} would be enabled and started")
        return
    problem = cdi_service.systemctl(run.root, "daemon-reload") or cdi_service.systemctl(
        run.root, "enable", "--now", *units
    )
    if problem:
        raise InstallError(f"cannot start {', '.join(units)}: {problem}")
    run.lines.append(f"{', '.join(units)} enabled and started")


def _write_logrotate(run: InstallRun) -> None:
    """/etc/logrotate.d/enflame-container-runtime, as the .deb and .rpm ship it."""
    path = LOGROTATE_PATH
    run.make_dirs(os.path.dirname(path))
    if os.path.lexists(run.local(path)):
        run.lines.append(f"{path}: exists, kept as it is")
        return
    text = resources.files(enflame_gcu).joinpath("data/logrotate").read_text("utf-8")
    digest = storage.sha256(text)
    run.record({"kind": "file", "path": path, "sha256": digest, "keep_if_edited": True})
    run.remember(path)
    if not run.dry_run:
        fileio.atomic_write_text(run.local(path), text, 0o644)
    run.lines.append(f"{path} {run.verb}written (weekly rotation of {LOG_DIR}/*.log)")


def _check_containerd(run: InstallRun, site: hosts.ContainerdSite) -> None:
    """Refuse, before anything changes, containerd paths that lead out of the host root
    (PathOutsideRootError) or a socket path holding something that is no socket."""
    if site.stock:
        return
    for path in (site.config, site.socket):
        run.local(path, follow=True)
    containerd_api.local_socket(run.root, site.socket)


def _install(options: InstallOptions, run: InstallRun) -> Outcome:
    _check_containerd(run, options.containerd)
    if options.mode is None:
        return _install_wrapper(options, run, options.engines, options.set_as_default)
    engine = node_mode.detect(run.root, options.engines, options.containerd)
    record = node_mode.decide(run.root, options.mode, engine)
    mode = node_modes.MODES[record.mode]
    run.lines.append(f"node mode {record.mode} ({record.chosen_by}): {record.reason}")
    _retire_earlier_mode(run, options, mode)
    if mode.wrapper != "none":
        # Like an install without a mode: every engine found (or named) gets the runtime entry.
        outcome = _install_wrapper(options, run, options.engines, mode.wrapper == "default")
    else:
        # No wrapper, but install.sh's venv (a tree it created) still goes on uninstall.
        _record_created(run, options)
        run.make_toolkit_dir()
        run.save()
        if options.bin_dir and options.ctk:
            run.make_dirs(options.bin_dir)
            _link(run, os.path.join(options.bin_dir, "enflame-ctk"), options.ctk)
        run.lines.append(
            f"no runtime wrapper and no engine change: {engine.describe()} "
            + ("injects the CDI devices itself" if mode.cdi_specs else "receives DeviceSpecs")
        )
        outcome = Outcome((), ())
    if mode.cdi_specs:
        _write_cdi_specs(run)
    if options.cdi_service:  # no installer stays running (install.sh): systemd does the rest
        _install_units(run, options, cdi_watch=mode.cdi_specs)
    _record_mode(run, record)
    return Outcome(tuple(run.lines), outcome.engines, record.mode)


def _retire_earlier_mode(
    run: InstallRun, options: InstallOptions, mode: node_modes.NodeMode
) -> None:
    """Take back what an earlier install (another mode, or none) did that ``mode`` must not keep.

    The wrapper's engine entries go when the new mode wants no wrapper or wants it in another
    role (default vs handler): they are then written anew. The CDI specs, their service and
    any file set aside for them go when the new mode is not cdi.
    """
    if mode.wrapper != "default":
        _retire_adopted(run, options, mode)
    try:
        earlier = node_modes.read(run.root)
    except ValueError:
        earlier = None  # unreadable: treat as unknown, so the wrapper entries are redone
    engine_steps = [a for a in run.actions if a["kind"] == "engine"]
    same_wrapper = earlier is not None and node_modes.MODES[earlier.mode].wrapper == mode.wrapper
    if engine_steps and not same_wrapper:
        shown = f"node mode {earlier.mode}" if earlier else "an install without a node mode"
        run.lines.append(
            f"taking back the runtime entries {shown} wrote "
            + ("(this mode needs no wrapper)" if mode.wrapper == "none" else "(written anew)")
        )
        for action in reversed(engine_steps):
            install_manifest.retire(run, action, options.restart_engine)
        # A k3s/RKE2 template seeded for those entries goes with them (kept when edited since).
        templates = {a["path"] for a in engine_steps if a["path"].endswith(hosts.TEMPLATE_SUFFIX)}
        for action in [a for a in run.actions if a["kind"] == "file" and a["path"] in templates]:
            install_manifest.retire(run, action, options.restart_engine)
    if mode.cdi_specs:
        return
    cdi_dir = cdi.DEFAULT_OUTPUT_DIR + "/"
    specs = [
        a
        for a in run.actions
        if (a["kind"] == "unit" and a.get("unit") == cdi_service.UNIT_NAME)
        or (a["kind"] in ("file", "moved") and a["path"].startswith(cdi_dir))
    ]
    if specs:
        run.lines.append(f"taking back the CDI specs node mode cdi wrote (node mode {mode.name})")
    for action in reversed(specs):
        install_manifest.retire(run, action, options.restart_engine)


def _retire_adopted(run: InstallRun, options: InstallOptions, mode: node_modes.NodeMode) -> None:
    """Take out topscloud's engine entries that ``enflame-ctk migrate`` adopted: a mode that
    wants no wrapper as the default must not keep the vendor's (exactly: the adopted step)."""
    site = options.containerd
    for name in engines.detect(run.root, site):
        config = migrate_engines.adopted(run.root, name, site)
        if config is None:
            continue
        # A container the vendor's plugin gave cards by environment alone gets that same answer
        # from the kubelet when it restarts: it needs the adopted `enflame` default until then.
        holders = migrate_plugin.env_only_holders(run.root)
        if holders:
            run.lines.append(
                f"kept topscloud's {name} entries that migrate adopted (node mode {mode.name} "
                f"takes them out): the kubelet holds cards for {', '.join(holders)} with "
                "topscloud's answer (ENFLAME_VISIBLE_DEVICES only), which a restarted container "
                "gets again and only the `enflame` default runtime turns into /dev/gcu*; run "
                "this install again once those pods are gone"
            )
            continue
        change = engines.unconfigure(
            name, config, host_root=run.root, dry_run=run.dry_run, step=migrate_engines.STEP
        )
        run.lines.append(
            f"taking back topscloud's {name} entries that migrate adopted (node mode {mode.name})"
        )
        run.lines.extend(run.host_view(change.describe()).splitlines())
        if change.changed and options.restart_engine:
            units = site.services if name == "containerd" and not site.stock else None
            run.lines.append(
                f"{name}: would be reloaded or restarted"
                if run.dry_run
                else engine_reload.reload_or_warn(change, run.root, units)
            )
        elif change.changed:
            run.lines.append(f"{name}: restart it for the change to take effect")


def _record_created(run: InstallRun, options: InstallOptions) -> None:
    """What the caller (install.sh) made for this install, so uninstall removes it too."""
    for item in options.created:
        kind, _, path = item.partition(":")
        if kind not in ("dir", "tree") or not path.startswith("/"):
            raise InstallError(f"--created wants dir:/ABS/PATH or tree:/ABS/PATH, got {item!r}")
        run.record({"kind": kind, "path": path})


def _install_wrapper(
    options: InstallOptions,
    run: InstallRun,
    engine_names: tuple[str, ...] | None,
    set_as_default: bool,
) -> Outcome:
    if options.package_dir is None and not os.path.exists(run.local(options.python, follow=True)):
        raise InstallError(
            f"cannot install: {options.python} does not exist on the host, and the runtime "
            "launcher runs there with the host's python3 (>= 3.10); install python3 on the node "
            "or pass --python with the host path of one"
        )
    if options.package_dir is None and (why := host_python.problem(run.root, options.python)):
        raise InstallError(f"cannot install: {why}")  # checked before anything is changed
    _record_created(run, options)
    run.make_toolkit_dir()
    run.save()
    package_dir = options.package_dir or _copy_package(run)
    _write_launcher(run, options, package_dir)
    if options.bin_dir:
        run.make_dirs(options.bin_dir)
        if options.set_aside_vendor_runtime:
            _set_aside_vendor_runtime(run, options.runtime_path)
        _link(run, options.runtime_path, os.path.join(options.toolkit_dir, "bin", RUNTIME_NAME))
        if options.ctk:
            _link(run, os.path.join(options.bin_dir, "enflame-ctk"), options.ctk)
    _write_config(run)
    run.make_dirs(LOG_DIR)
    _write_logrotate(run)
    _prepare_edits(run)
    detected = engines.detect(run.root, options.containerd)
    names = engine_names if engine_names is not None else tuple(detected)
    for name in names:
        _configure_engine(run, name, options, set_as_default)
    if not names:
        run.lines.append(
            f"no container engine configured: none found under {run.root} (docker, containerd, "
            "CRI-O); later run `enflame-ctk runtime configure --runtime NAME`"
        )
    return Outcome(tuple(run.lines), tuple(names))
