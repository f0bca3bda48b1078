"""The extender's HTTPS context, whose certificate, key and client CA follow their files.

Certificates rotate (cert-manager, a Secret's files swapped under a mounted volume) while the
extender runs for months. The context the server listens with picks, at each handshake (its
``sni_callback``, which OpenSSL calls with or without a server name), the newest context built
from the files: when a file's inode, size or modification time moved (checked at most every
``check_every`` seconds), a fresh context is built and used for the handshakes that follow;
connections already open keep theirs. Files that cannot be used (half written, a key that does
not match) keep the previous context: one WARNING per new set of files, and the extender goes
on answering with what worked.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable

from enflame_gcu import bounded_http
from enflame_gcu.errors import ConfigError

log = logging.getLogger(__name__)
Stamp = tuple[tuple[int, int, int] | None, ...]


class ReloadingTLS:
    """The listening context (:attr:`context`) and the newest good one built from the files."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        client_ca_file: str = "",
        *,
        check_every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = (cert_file, key_file, client_ca_file)
        self.check_every = check_every
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._read_stamp()
        self._refused: Stamp | None = None
        self._checked = clock()
        # ConfigError here, at start, when the files cannot be used at all.
        self._current = bounded_http.tls_context(cert_file, key_file, client_ca_file)
        self.context = bounded_http.tls_context(cert_file, key_file, client_ca_file)
        self.context.sni_callback = self._pick
        self.reloads = 0

    def _read_stamp(self) -> Stamp:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self.files:
            try:
                found = os.stat(path) if path else None
            except OSError:
                found = None
            stamps.append((found.st_ino, found.st_size, found.st_mtime_ns) if found else None)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        """The context new handshakes use, reading the files again when they changed."""
        now = self._clock()
        with self._lock:
            if now - self._checked < self.check_every:
                return self._current
            self._checked = now
            stamp = self._read_stamp()
            if stamp in (self._stamp, self._refused):
                return self._current
            try:
                fresh = bounded_http.tls_context(*self.files)
            except ConfigError as exc:
                self._refused = stamp
                log.warning("TLS files changed but cannot be used (%s); keeping the previous", exc)
                return self._current
            self._current, self._stamp, self._refused = fresh, stamp, None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.files[0])
            return fresh

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
        try:
            connection.context = self.current()
        except Exception:  # a reload must never fail a handshake the old context can serve
            log.exception("choosing the TLS context failed; using the one at hand")
