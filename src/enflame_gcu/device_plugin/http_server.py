"""The metrics port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

Served by an asyncio loop of its own in one daemon thread, never the loop Allocate and
registration run on (a stuck plugin loop still gets ``/healthz`` answered with 503). Anyone who
reaches the port can open connections, so every one is bounded: a peer address opening more
than ``rate_per_client`` connections a second has the rest closed as they are accepted (nothing
is built for them, so a flood costs the process little CPU); at most ``per_client`` open
from one peer address and ``connections`` in all (when full, the oldest connection that has
not sent its whole request is dropped for the newcomer, the peer's own first: a flood of idle
or half-sent connections from one pod cannot lock out the kubelet's probe), a request head of
at most ``head_bytes`` that must arrive within ``head_timeout`` seconds *in total* (dripping a
byte at a time does not extend it), an answer that must be taken within ``write_timeout``, one
request per connection, GET and HEAD only. Memory and threads stay flat whatever arrives.

An empty bind address means every address: IPv6 and IPv4 on a dual-stack socket where the host
has IPv6, else every IPv4 address.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import socket
import threading
import time
from dataclasses import dataclass

from prometheus_client import exposition

from enflame_gcu.device_plugin import metrics
from enflame_gcu.errors import ConfigError

log = logging.getLogger(__name__)
PROBES = ("/healthz", "/readyz")
# Peer addresses whose connection rate is remembered at once (a flood from many addresses
# makes the quietest ones forgotten, never memory grow).
MAX_PEERS = 4096
METRICS_PATHS = ("/metrics", "/")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may hold of the server (docs/user-guide.md, "Security")."""

    connections: int = 256
    per_client: int = 16
    rate_per_client: float = 20.0
    burst_per_client: int = 40
    head_bytes: int = 8192
    head_timeout: float = 5.0
    write_timeout: float = 10.0
    backlog: int = 128


class _Connection:
    """One client: its writer, and whether its request head is complete (then it is served)."""

    __slots__ = ("peer", "served", "writer")

    def __init__(self, writer: asyncio.StreamWriter, peer: str) -> None:
        self.writer = writer
        self.peer = peer
        self.served = False


class MetricsServer:
    """The bound socket and the thread serving it; :meth:`stop` ends both."""

    def __init__(self, exported: metrics.Metrics, sock: socket.socket, limits: Limits) -> None:
        self.exported = exported
        self.limits = limits
        self.socket = sock
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self.dropped = 0  # connections closed to make room or past a deadline (for tests)
        self.refused = 0  # connections closed at accept: their peer was over its rate
        self._rates: dict[str, list[float]] = {}
        self._open: collections.OrderedDict[int, _Connection] = collections.OrderedDict()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._stopping: asyncio.Event | None = None

    def start(self) -> None:
        """Serve in the background; returns once the server accepts connections."""
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        """Close the listening socket and every connection; wait for the thread."""
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=10)

    @property
    def open_connections(self) -> int:
        """Connections open right now (tests and the benchmark read it)."""
        return len(self._open)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        self.socket.setblocking(False)
        self._loop.add_reader(self.socket.fileno(), self._accept)
        self._started.set()
        try:
            await self._stopping.wait()
        finally:
            self._loop.remove_reader(self.socket.fileno())
            self.socket.close()
            for connection in list(self._open.values()):
                connection.writer.transport.abort()
            await asyncio.sleep(0)  # let the aborted connections' tasks finish

    def _accept(self) -> None:
        """Take what the kernel queued. A peer over its connection rate is closed at once,
        before any object is made for it: a flood from one pod costs an accept and a close
        per connection and does not keep the kernel's queue full for everyone else."""
        for _ in range(self.limits.backlog):
            try:
                conn, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: say so, and try again on the next event
                log.warning("cannot accept on the metrics port: %s", exc.strerror or exc)
                return
            peer = str(address[0]) if isinstance(address, tuple) else ""
            if not self._within_rate(peer):
                self.refused += 1
                conn.close()
                continue
            conn.setblocking(False)
            self._loop.create_task(self._start(conn, peer))

    def _within_rate(self, peer: str) -> bool:
        """A token bucket per peer address: ``rate_per_client`` new connections a second,
        ``burst_per_client`` at once."""
        now = time.monotonic()
        limits = self.limits
        bucket = self._rates.get(peer)
        if bucket is None:
            if len(self._rates) >= MAX_PEERS:
                self._forget_quiet_peers(now)
            bucket = self._rates[peer] = [float(limits.burst_per_client), now]
        tokens = min(
            limits.burst_per_client, bucket[0] + (now - bucket[1]) * limits.rate_per_client
        )
        bucket[1] = now
        if tokens < 1:
            bucket[0] = tokens
            return False
        bucket[0] = tokens - 1
        return True

    def _forget_quiet_peers(self, now: float) -> None:
        refill = self.limits.burst_per_client / self.limits.rate_per_client
        for peer, (_, stamp) in list(self._rates.items()):
            if now - stamp >= refill:  # its bucket is full again: nothing to remember
                del self._rates[peer]
        while len(self._rates) >= MAX_PEERS:  # all busy: the longest quiet go first
            del self._rates[min(self._rates, key=lambda p: self._rates[p][1])]

    async def _start(self, conn: socket.socket, peer: str) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=self.limits.head_bytes)
        except OSError:
            conn.close()
            return
        await self._client(reader, writer, peer)

    async def _client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        key = id(writer)
        self._make_room(peer)
        connection = _Connection(writer, peer)
        self._open[key] = connection
        try:
            await self._answer(reader, connection)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            self.dropped += 1
        except Exception:  # a failing collector must not end the server; say what happened
            log.exception("answering a request on the metrics port failed")
        finally:
            self._open.pop(key, None)
            writer.transport.abort()  # one request per connection; nothing lingers in TIME_WAIT

    def _make_room(self, peer: str) -> None:
        """Before taking a connection from ``peer``: at the peer's cap, drop its oldest
        connection; at the overall cap, the oldest of all. Either way one still sending its
        head first (a request being answered is dropped only when no other is left)."""
        mine = [key for key, c in self._open.items() if c.peer == peer]
        if len(mine) >= self.limits.per_client:
            self._drop(mine)
        if len(self._open) >= self.limits.connections:
            self._drop(list(self._open))

    def _drop(self, keys: list[int]) -> None:
        waiting = [key for key in keys if not self._open[key].served]
        victim = waiting[0] if waiting else keys[0]
        self._open.pop(victim).writer.transport.abort()
        self.dropped += 1

    async def _answer(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        writer = connection.writer
        try:
            head = await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), timeout=self.limits.head_timeout
            )
        except asyncio.LimitOverrunError:
            connection.served = True
            await self._send(writer, 431, f"request head over {self.limits.head_bytes} bytes\n")
            return
        connection.served = True
        status, body, content_type, method = self._route(head)
        await self._send(writer, status, body, content_type, head_only=method == "HEAD")

    def _route(self, head: bytes) -> tuple[int, str | bytes, str, str]:
        text = "text/plain; charset=utf-8"
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, "malformed request line\n", text, ""
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, "only GET and HEAD\n", text, method
        path = target.split("?", 1)[0]
        if path in PROBES:
            ok, reason = (self.exported.live if path == "/healthz" else self.exported.ready)()
            return (200 if ok else 503), f"{reason}\n", text, method
        if path not in METRICS_PATHS:
            return 404, "not found: /metrics, /healthz and /readyz are served\n", text, method
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = exposition.choose_encoder(accept)
        return 200, encoder(self.exported.registry), content_type, method

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: str | bytes,
        content_type: str = "text/plain; charset=utf-8",
        *,
        head_only: bool = False,
    ) -> None:
        payload = body.encode() if isinstance(body, str) else body
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        ).encode("latin-1")
        writer.write(head if head_only else head + payload)
        await asyncio.wait_for(writer.drain(), timeout=self.limits.write_timeout)


def _family(address: str) -> tuple[str, bool]:
    if address:
        return address, False
    if socket.has_ipv6 and socket.has_dualstack_ipv6():
        return "::", True
    return "0.0.0.0", False  # noqa: S104 (every address is the documented default)


def listen(address: str, port: int, backlog: int = 128) -> socket.socket:
    """The listening socket; ConfigError naming the address and the cause when it cannot be had
    (the port in use, an address the host does not have), instead of a traceback."""
    host, dual = _family(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        return socket.create_server(
            (host, port), family=family, backlog=backlog, dualstack_ipv6=dual
        )
    except OSError as exc:
        hint = {
            errno.EADDRINUSE: "something else already listens there (another plugin, or an "
            "exporter on the same port?): stop it or choose another --metrics-port",
            errno.EADDRNOTAVAIL: "this host (or pod) has no such address: check "
            "--metrics-bind-address",
            errno.EACCES: "a port below 1024 needs privileges: choose another --metrics-port",
        }.get(exc.errno or 0, "check --metrics-port and --metrics-bind-address")
        raise ConfigError(
            f"cannot serve the metrics port on {shown}: {exc.strerror or exc}; {hint}"
        ) from None


def start(
    exported: metrics.Metrics, port: int, address: str = "", limits: Limits | None = None
) -> MetricsServer:
    """Listen on ``address`` (empty = all) and ``port`` in a daemon thread; the server.

    ConfigError when the port cannot be had (in use, no such address).
    """
    limits = limits or Limits()
    server = MetricsServer(exported, listen(address, port, limits.backlog), limits)
    server.start()
    host = server.address[0]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "serving /metrics, /healthz and /readyz on %s:%d%s (at most %d connections, %.0f s "
        "for a request)",
        shown,
        server.address[1],
        " (all addresses)" if not address else "",
        limits.connections,
        limits.head_timeout,
    )
    return server
