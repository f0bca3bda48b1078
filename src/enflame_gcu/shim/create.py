"""The runtime's create path: load the spec, find the request, edit, save atomically.

Imported lazily by :mod:`main` only for ``create``/``run``. Requests are first answered from
the node's prepared edits (:mod:`prepared_edits`, standard library only); when those cannot
answer, or disagree with the node, discovery and the ``edits`` model do it (they import
``dataclasses``, which alone costs about as much as runc's own run). Both apply the same
rendering through :mod:`enflame_gcu.oci_edits`. Any failure leaves the bundle untouched and
is reported with the step that failed; the caller then does not run runc.
"""

from __future__ import annotations

import os

from enflame_gcu import fileio, naming, oci_edits
from enflame_gcu.errors import EnflameError
from enflame_gcu.shim import invocation as runtime_invocation
from enflame_gcu.shim import log as runtime_log
from enflame_gcu.shim import oci, prepared_edits
from enflame_gcu.shim import request as device_request

# typing costs milliseconds on this path; the names below are for mypy only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol, TypeVar

    from enflame_gcu.shim.config import RuntimeConfig

    T = TypeVar("T")

    class Log(Protocol):
        """What the create path logs through (a ``logging.Logger`` fits too)."""

        def debug(self, message: str, /, *args: object) -> None:
            """Log at debug level."""

        def info(self, message: str, /, *args: object) -> None:
            """Log at info level."""

        def warning(self, message: str, /, *args: object) -> None:
            """Log at warning level."""

        def error(self, message: str, /, *args: object) -> None:
            """Log at error level."""


class StepError(Exception):
    """A create step failed; the message says which step and what was wrong."""


def _step(what: str, action: Callable[[], T]) -> T:
    try:
        return action()
    except EnflameError as exc:
        raise StepError(f"{what}: {exc}") from exc
    except OSError as exc:
        raise StepError(f"{what}: {exc}") from exc


def _from_prepared(
    spec: oci.Spec, request: device_request.DeviceRequest, config: RuntimeConfig, log: Log
) -> list[str] | None:
    """Edit ``spec.data`` from the prepared edits; None (data untouched) when they cannot."""
    try:
        names, rendered = prepared_edits.resolve(request, config)
    except prepared_edits.Unavailable as exc:
        missing = not config.prepared_edits or not os.path.exists(config.prepared_edits)
        (log.debug if missing else log.info)("prepared edits not used (%s); discovering GCUs", exc)
        return None
    try:
        oci_edits.apply(spec.data, rendered)
    except (AttributeError, KeyError, TypeError, ValueError):
        # An odd spec shape: the discovery path's modifier chain names the step that fails.
        spec.data = spec.fresh_data()
        return None
    oci_edits.mark_processed(spec.data, naming.visible_value(names))
    if request.sources:  # "none" alone is answered without the file
        log.debug("used prepared edits %s", config.prepared_edits)
    return names


def _from_discovery(
    data: dict[str, Any], request: device_request.DeviceRequest, config: RuntimeConfig
) -> list[str]:
    """Edit ``data`` from a fresh discovery of the node; raises StepError with clear messages."""
    # Imported only when the prepared edits cannot answer: dataclasses and friends.
    from enflame_gcu import devices, edits  # noqa: PLC0415
    from enflame_gcu.shim import modifiers  # noqa: PLC0415

    root = config.root
    inventory = _step(f"discovering GCUs under {root}", lambda: devices.discover(root))
    names = _step(
        "resolving the requested GCUs", lambda: device_request.resolve(request, inventory)
    )
    mounts = tuple(edits.MountEdit(host, container) for host, container in config.mounts)
    container_edits = _step(
        "building the container edits",
        lambda: edits.for_devices(inventory, names, env=dict(config.env), mounts=mounts),
    )
    chain = modifiers.for_edits(container_edits, naming.visible_value(names))
    _step(chain.name, lambda: chain.modify(data))
    return names


def edit_bundle(bundle: str, config: RuntimeConfig, log: Log, container: str = "(no id)") -> str:
    """Give the container in ``bundle`` the GCUs its spec asks for; return what was done.

    Raises StepError; the spec file is only replaced (atomically) after every step succeeded.
    """
    spec = _step("reading the bundle's spec", lambda: oci.load(bundle))
    if oci_edits.is_processed(spec.data):
        return f"{spec.path} was already processed; left as is"
    request = _step(
        "reading the requested GCUs",
        lambda: device_request.from_spec(
            spec.data,
            config.accept_envvar_when_unprivileged,
            tuple(fileio.host_path(config.root, d) for d in config.cdi_spec_dirs),
        ),
    )
    for ignored in request.ignored:
        log.warning("container %s: ignoring %s", container, ignored)
    if not request.wants_edits:
        return "no GCU requested; spec left untouched"
    names = _from_prepared(spec, request, config, log)
    if names is None:
        names = _from_discovery(spec.data, request, config)
    _step("saving the spec", lambda: oci.save(spec, spec.data))
    sources = "; ".join(source.description for source in request.sources)
    if request.none_requested:
        sources = "; ".join(filter(None, (sources, f"{naming.VISIBLE_DEVICES_ENV}=none")))
    return f"gave {', '.join(names) or 'no cards'} (requested by {sources})"


def prepare(invocation: runtime_invocation.Invocation, config: RuntimeConfig) -> bool:
    """Run :func:`edit_bundle` for a create/run call; on failure report it and return False.

    Every failure, foreseen or not, is one message (never a traceback) on stderr, in runc's
    ``--log`` and in the runtime log; the bundle is untouched and runc is not run.
    """
    log = runtime_log.setup(config)
    bundle = invocation.bundle or "."
    container = invocation.container_id or "(no id)"
    try:
        outcome = edit_bundle(bundle, config, log, container)
    except StepError as exc:
        problem = f"aborted while {exc}"
    except Exception as exc:  # an unforeseen input must not become a traceback
        problem = f"failed unexpectedly ({type(exc).__name__}: {exc})"
    else:
        log.info("%s %s (bundle %s): %s", invocation.command, container, bundle, outcome)
        return True
    message = (
        f"{invocation.command} {container} {problem} "
        f"(runc was not run; {oci.spec_path(bundle)} is unchanged)"
    )
    log.error("%s", message)
    runtime_invocation.report_error(invocation, message)
    return False
