"""``--telemetry-isolation process``: libefml in a child process, the plugin reads its snapshots.

In the default (thread) mode the closed library runs inside the process that answers the kubelet:
a crash in it (a segfault, an abort) ends the plugin, and allocation with it. Here a child process
(``python -m enflame_gcu.device_plugin.telemetry_child``) runs the
:class:`~enflame_gcu.device_plugin.telemetry.TelemetryCollector` and writes each pass's
:class:`~enflame_gcu.device_plugin.telemetry.Snapshot` to its stdout, length-prefixed and pickled;
:class:`ChildCollector` reads them on a thread and offers the same ``snapshot`` / ``start`` /
``stop`` as the in-process collector. A child that exits is reported (exporter_up 0,
reason ``child_exited``) and started again after ``RESTART_AFTER`` seconds.

The pickles come from our own code in a child we started, which in thread mode would run inside
the plugin anyway; still, only classes of this package and plain builtins are unpickled.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

from enflame_gcu.device_plugin import telemetry

log = logging.getLogger(__name__)
RESTART_AFTER = 5.0
MAX_FRAME = 64 << 20  # a snapshot of 128 cards is far below this
_HEADER = struct.Struct("!I")
_BUILTINS = {"tuple", "list", "dict", "set", "frozenset", "str", "int", "float", "bool"}


class _Unpickler(pickle.Unpickler):
    """Only this package's classes and plain builtins."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("enflame_gcu.") or (module == "builtins" and name in _BUILTINS):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"telemetry child sent {module}.{name}: not allowed")


def write_frame(stream: IO[bytes], snap: telemetry.Snapshot) -> None:
    """One snapshot: a 4-byte length, then the pickle."""
    data = pickle.dumps(snap, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> telemetry.Snapshot | None:
    """The next snapshot; None at the end of the stream."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"telemetry child sent a {size}-byte frame (limit {MAX_FRAME})")
    data = stream.read(size)
    if len(data) < size:
        return None
    found = _Unpickler(io.BytesIO(data)).load()
    if not isinstance(found, telemetry.Snapshot):
        raise ValueError(f"telemetry child sent a {type(found).__name__}, not a Snapshot")
    return found


class ChildCollector:
    """The collector in a child process; :attr:`snapshot` is the child's last pass."""

    def __init__(
        self, host_root: str, interval: float, timeout: float, library_path: str | None = None
    ) -> None:
        self.args = [
            sys.executable, "-m", "enflame_gcu.device_plugin.telemetry_child",
            f"--host-root={host_root}", f"--interval={interval}", f"--timeout={timeout}",
        ]  # fmt: skip
        if library_path:
            self.args.append(f"--efml-library={library_path}")
        self.snapshot = telemetry.Snapshot(
            up=False, reason="not collected yet", cause="not_collected_yet"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the child and the thread that reads it."""
        self._thread = threading.Thread(target=self._run, name="telemetry-child", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after 5 s) and the reader."""
        self._stop.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.process = process = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
            )
            stdout = process.stdout
            if stdout is None:  # never with stdout=PIPE
                raise RuntimeError("the telemetry child has no stdout")
            try:
                while (snap := read_frame(stdout)) is not None:
                    self.snapshot = snap
            except (ValueError, pickle.UnpicklingError, EOFError) as exc:
                log.warning("telemetry child: %s; restarting it", exc)
                process.kill()
            code = process.wait()
            stdout.close()
            if self._stop.is_set():
                return
            self.restarts += 1
            reason = (
                f"the telemetry child process exited ({code}); restarting in {RESTART_AFTER:g} s"
            )
            log.warning("%s", reason)
            self.snapshot = telemetry.Snapshot(up=False, reason=reason, cause="child_exited")
            self._stop.wait(RESTART_AFTER)


def main(argv: list[str] | None = None) -> int:
    """The child: collect every interval and write each snapshot to stdout until it closes or
    the parent goes."""
    parser = argparse.ArgumentParser(prog="telemetry_child")
    parser.add_argument("--host-root", default="/")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--efml-library", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from enflame_gcu.efml import library  # noqa: PLC0415 (ctypes only in the child)

    library.ignore_user_signals()
    parent = os.getppid()
    collector = telemetry.TelemetryCollector(
        args.host_root, args.interval, args.timeout, args.efml_library
    )
    out = sys.stdout.buffer
    try:
        while os.getppid() == parent:
            started = time.monotonic()
            collector.snapshot = collector.collect_once()
            write_frame(out, collector.snapshot)
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
