"""``enflame-container-runtime``: an OCI runtime wrapper that edits the spec on create, then runc.

Every call other than ``create``/``run`` execs the low-level runtime at once with the same
arguments; that path imports only the standard library (and the stdlib-only config reader),
because engines call the runtime for every ``state``, ``start``, ``kill``, ``delete`` and
``exec`` probe. The spec-editing machinery is imported lazily, after the decision.
Nothing is ever written to stdout: CRI-O parses runc's stdout.
"""

from __future__ import annotations

import os
import stat
import sys

from enflame_gcu import __version__
from enflame_gcu.errors import EnflameError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import invocation as runtime_invocation


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_low_level_runtime(names: tuple[str, ...], self_path: str) -> str:
    """First configured runtime found (absolute path, or searched on PATH) that is not us."""
    me = os.path.realpath(self_path)
    tried = []
    search = os.environ.get("PATH") or os.defpath
    for name in names:
        if os.sep in name:
            candidates = [name] if os.path.isabs(name) else []
        else:
            candidates = [os.path.join(d or ".", name) for d in search.split(os.pathsep)]
        for candidate in candidates:
            if _is_executable(candidate):
                if os.path.realpath(candidate) == me:
                    tried.append(f"{candidate} (is this wrapper itself)")
                    continue
                return candidate
        tried.append(name if os.sep in name else f"{name} (not on PATH)")
    raise EnflameError(
        f"no low-level runtime found: tried {', '.join(tried)}; set 'runtimes' in the config "
        f"({runtime_config.DEFAULT_PATH}) to runc's absolute path"
    )


def _self_path(argv: list[str]) -> str:
    """The path this wrapper was started as (argv[0] resolved on PATH when it has no slash)."""
    name = argv[0] if argv else runtime_invocation.PROG
    if os.sep in name:
        return name
    for directory in (os.environ.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if _is_executable(candidate):
            return candidate
    return name


# Every way a spec can ask for GCUs contains one of these byte strings (engines write JSON
# without escaping ASCII letters), so a spec with none of them is passed on without parsing.
REQUEST_MARKERS = (b"ENFLAME_VISIBLE_DEVICES", b"enflame-container-devices", b"cdi.k8s.io/")


def may_request_devices(bundle: str) -> bool:
    """Cheap pre-check before the edit machinery is imported: could this spec ask for GCUs?

    Unreadable specs return True so that the create path reports the problem properly.
    """
    try:
        # Not blocking, regular files only: a FIFO must not hang the call (the create path's
        # reader, fileio.read_regular, then names it).
        path = os.path.join(bundle, "config.json")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        raw = b"".join(chunks)
    except OSError:
        return True
    finally:
        os.close(fd)
    return any(marker in raw for marker in REQUEST_MARKERS)


def _leave_verdict(front: str | None, config: runtime_config.RuntimeConfig | None) -> None:
    """Tell the sh front what this config says (or that it cannot be trusted)."""
    if front is None:
        return
    from enflame_gcu.shim import front as runtime_front

    if config is None:
        runtime_front.discard(front)
    else:
        runtime_front.update(front, config)


def main(argv: list[str] | None = None, front: str | None = None) -> int:
    """Entry point: parse, edit the spec for create/run, then exec the low-level runtime.

    ``front``: the verdict file of the ``sh`` front that started us (see :mod:`launcher`).
    """
    argv = list(sys.argv if argv is None else argv)
    invocation = runtime_invocation.parse_argv(argv)
    try:
        if invocation.edits_spec:
            # create/run must not start a container on a config it cannot read.
            config = runtime_config.load()
            _leave_verdict(front, config)
        else:
            # Anything else (state, kill, delete, start, ...) only needs runc found: a
            # malformed or newer config must not stop the engine from managing containers.
            config, problem = runtime_config.load_for_passthrough()
            if problem:
                runtime_invocation.warn(problem)
            _leave_verdict(front, None if problem else config)
        runtime = find_low_level_runtime(config.runtimes, _self_path(argv))
    except EnflameError as exc:
        _leave_verdict(front, None)
        runtime_invocation.report_error(invocation, str(exc))
        return 1
    if invocation.version:
        # Ours first, then the low-level runtime's own lines (it execs and prints them).
        sys.stdout.write(
            f"{runtime_invocation.PROG} version {__version__}\nlow-level runtime: {runtime}\n"
        )
        sys.stdout.flush()
    if invocation.edits_spec and may_request_devices(invocation.bundle or "."):
        try:
            from enflame_gcu.shim import create

            ready = create.prepare(invocation, config)
        except Exception as exc:  # never a traceback; runc is not run
            runtime_invocation.report_error(
                invocation,
                f"{invocation.command} failed unexpectedly ({type(exc).__name__}: {exc}); "
                "runc was not run",
            )
            return 1
        if not ready:
            return 1
    try:
        os.execv(runtime, [runtime, *argv[1:]])  # noqa: S606 - exec runc as given, no shell
    except OSError as exc:
        runtime_invocation.report_error(
            invocation, f"cannot run the low-level runtime {runtime}: {exc}"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
