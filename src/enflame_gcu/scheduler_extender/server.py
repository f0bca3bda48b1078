"""The extender's HTTP server: ``POST /filter``, ``POST /prioritize``, ``GET /healthz``,
``GET /readyz`` and ``GET /stats`` (call counts and latency percentiles, JSON).

Standard library ``http.server`` with HTTP/1.1 keep-alive (the scheduler reuses its
connections), bounded like a server facing a busy client: a fixed pool of worker threads, at
most ``4 x workers`` connections held (more are closed at once), an idle or slow connection
dropped after ``timeout`` seconds, request bodies over ``protocol.MAX_BODY`` refused with 413
before they are read. A handler that fails anyway answers the verb's neutral result with 200:
a 500 would only make the scheduler log an error per pod.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from http import server as http_server
from typing import Any

from enflame_gcu.scheduler_extender import decisions, protocol

log = logging.getLogger(__name__)
Verb = Callable[[bytes], bytes]
NEUTRAL = {
    "/filter": b'{"Error":"enflame-scheduler-extender: internal error"}',
    "/prioritize": b"[]",
}


class Stats:
    """Counts and the last ``keep`` durations of each verb (thread-safe)."""

    def __init__(self, keep: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._durations: dict[str, collections.deque[float]] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._keep = keep

    def observe(self, verb: str, seconds: float) -> None:
        """One call of ``verb`` took ``seconds``."""
        with self._lock:
            self._counts[verb] += 1
            self._durations.setdefault(verb, collections.deque(maxlen=self._keep)).append(seconds)

    def snapshot(self) -> dict[str, Any]:
        """``{verb: {calls, p50_ms, p99_ms, max_ms}}`` over the kept durations."""
        with self._lock:
            result = {}
            for verb, kept in self._durations.items():
                ordered = sorted(kept)
                result[verb] = {
                    "calls": self._counts[verb],
                    "p50_ms": round(_quantile(ordered, 0.50) * 1000, 3),
                    "p99_ms": round(_quantile(ordered, 0.99) * 1000, 3),
                    "max_ms": round(ordered[-1] * 1000, 3),
                }
            return result

    def reset(self) -> None:
        """Forget everything (between benchmark runs)."""
        with self._lock:
            self._durations.clear()
            self._counts.clear()


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class _Handler(http_server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ExtenderServer

    def log_message(self, format: str, *args: Any) -> None:
        """The scheduler calls twice per pod: an access log would drown everything else."""

    def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """Probes and stats."""
        if self.path == "/healthz":
            self._answer(200, b"ok\n", "text/plain")
        elif self.path == "/readyz":
            ok, reason = self.server.ready()
            self._answer(200 if ok else 503, f"{reason}\n".encode(), "text/plain")
        elif self.path == "/stats":
            document = {"verbs": self.server.stats.snapshot(), "cache": self.server.cache_counts()}
            self._answer(200, json.dumps(document).encode())
        else:
            self._answer(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        """A verb: read the bounded body, answer with the verb's result."""
        verb = self.server.verbs.get(self.path.rstrip("/") or "/")
        length_text = self.headers.get("Content-Length", "")
        if verb is None:
            self.close_connection = True
            self._answer(404, b"unknown verb; use /filter or /prioritize\n", "text/plain")
            return
        if not length_text.isdigit():
            log.warning("%s: request without a Content-Length; refused", self.path)
            self.close_connection = True
            self._answer(411, b"Content-Length required\n", "text/plain")
            return
        length = int(length_text)
        if length > protocol.MAX_BODY:
            log.warning(
                "%s: body of %d bytes is over %d; refused", self.path, length, protocol.MAX_BODY
            )
            self.close_connection = True
            self._answer(413, b"request body too large\n", "text/plain")
            return
        body = self.rfile.read(length)
        started = time.perf_counter()
        try:
            answer = verb(body)
        except Exception:
            log.exception("%s failed; answering neutrally", self.path)
            answer = NEUTRAL[self.path.rstrip("/")]
        self.server.stats.observe(self.path.strip("/"), time.perf_counter() - started)
        self._answer(200, answer)


class ExtenderServer(http_server.HTTPServer):
    """An HTTP server with a fixed worker pool and a cap on held connections."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        decide: decisions.Decisions,
        *,
        workers: int = 8,
        timeout: float = 30.0,
        ready: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.verbs: dict[str, Verb] = {"/filter": decide.filter, "/prioritize": decide.prioritize}
        self.decide = decide
        self.stats = Stats()
        self.idle_timeout = timeout
        self._ready = ready
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="extender")
        self._slots = threading.BoundedSemaphore(workers * 4)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def ready(self) -> tuple[bool, str]:
        """Ready when the cache has been filled once (or no check was given)."""
        return (True, "ok") if self._ready is None else self._ready()

    def cache_counts(self) -> dict[str, int]:
        """What the cache holds."""
        return self.decide.cache.counts()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand the connection to a worker, or close it when too many are held."""
        if not self._slots.acquire(blocking=False):
            log.warning("too many connections; closing one from %s", client_address)
            self.shutdown_request(request)
            return
        request.settimeout(self.idle_timeout)
        # Headers and body go out in two writes: without this, Nagle's algorithm holds the
        # body until the client's delayed ACK (40 ms on Linux) on every kept-alive call.
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._open_lock:
            self._open.add(request)
        self._pool.submit(self._work, request, client_address)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except (OSError, TimeoutError):
            pass  # the client went away or idled out
        except Exception:
            log.exception("connection from %s failed", client_address)
        finally:
            with self._open_lock:
                self._open.discard(request)
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        """Stop listening and end every connection: a worker waiting on a kept-alive one would
        otherwise hold the process for the idle timeout after SIGTERM."""
        super().server_close()
        with self._open_lock:
            for request in self._open:
                with contextlib.suppress(OSError):
                    request.shutdown(socket.SHUT_RDWR)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def start(self) -> threading.Thread:
        """Serve in a daemon thread; the thread."""
        thread = threading.Thread(target=self.serve_forever, name="extender-http", daemon=True)
        thread.start()
        return thread

    @property
    def port(self) -> int:
        """The port bound (useful with port 0)."""
        return int(self.server_address[1])
