"""One bounded HTTP/1.1 server for every port the project serves: the device plugin's metrics
and probes, the DRA driver's metrics and probes, the scheduler extender's verbs.

Served by an asyncio loop of its own in one daemon thread, never a program's main loop (a stuck
main loop still gets its probes answered), and never a thread per connection. Anyone who
reaches the port can open connections, so every one is bounded:

- a peer address opening more than ``rate_per_client`` connections a second has the rest
  closed as they are accepted, before anything is built for them;
- at most ``per_client`` open from one peer address and ``connections`` in all; when full, the
  oldest connection that is not being answered (still sending its request, or idle between
  kept-alive requests) is dropped for the newcomer, the peer's own first, so a flood of idle or
  half-sent connections cannot lock out the kubelet's probe or the scheduler's call;
- a request head of at most ``head_bytes`` and a body of at most ``body_bytes`` (411 without a
  ``Content-Length``, 413 over the limit, before a byte of it is read), and the whole request,
  head and body, must arrive within ``request_timeout`` seconds *in total* (dripping a byte at
  a time does not extend it); a kept-alive connection may then idle ``idle_timeout`` seconds;
- an answer that must be taken within ``write_timeout`` seconds; only ``methods``;
- a request the ``offload`` predicate picks (the metrics exposition) is answered on one worker
  thread of the server's, never on the loop, with at most ``offloaded`` waiting for it (the
  rest get 503): however long an answer takes to build, the loop goes on answering the others
  (the kubelet's probes), and a client within its rate limit cannot queue more than that.

Memory and threads stay flat whatever arrives: at most ``connections`` x (``head_bytes`` +
``body_bytes``) of requests are held. With ``ssl_context`` the port speaks HTTPS (the TLS
handshake counts against ``request_timeout``; a context that requires client certificates
refuses every peer without one).

An empty bind address means every address: IPv6 and IPv4 on a dual-stack socket where the host
has IPv6, else every IPv4 address.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from enflame_gcu.errors import ConfigError

log = logging.getLogger(__name__)
# Peer addresses whose connection rate is remembered at once (a flood from many addresses
# makes the quietest ones forgotten, never memory grow).
MAX_PEERS = 4096
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may hold of the server (docs/user-guide.md, "Security")."""

    connections: int = 256
    per_client: int = 16
    rate_per_client: float = 20.0
    burst_per_client: int = 40
    head_bytes: int = 8192
    head_timeout: float = 5.0  # the whole request, head and body, from its accept
    write_timeout: float = 10.0
    backlog: int = 128
    body_bytes: int = 0  # 0: requests carry no body
    keep_alive: bool = False  # False: one request per connection
    idle_timeout: float = 30.0  # a kept-alive connection until its next request's head
    methods: tuple[str, ...] = ("GET", "HEAD")
    offloaded: int = 4  # requests waiting for (or on) the worker thread; more get 503


@dataclass(frozen=True, slots=True)
class Request:
    """One request as read: method, path (no query), lower-case headers, body, peer address."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    peer: str


@dataclass(frozen=True, slots=True)
class Response:
    """What a handler answers."""

    status: int
    body: bytes | str
    content_type: str = TEXT
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]
Offload = Callable[[Request], bool]


class _Connection:
    """One client: its writer, and whether a request of it is being answered right now."""

    __slots__ = ("answered", "busy", "peer", "writer")

    def __init__(self, writer: asyncio.StreamWriter, peer: str) -> None:
        self.writer = writer
        self.peer = peer
        self.busy = False
        self.answered = 0


class _Refused(Exception):
    """A request refused with a status before the handler sees it."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class BoundedServer:
    """The bound socket and the thread serving it; :meth:`stop` ends both."""

    def __init__(
        self,
        handler: Handler,
        sock: socket.socket,
        limits: Limits,
        *,
        name: str = "http",
        ssl_context: ssl.SSLContext | None = None,
        offload: Offload | None = None,
    ) -> None:
        self.handler = handler
        self.offload = offload
        self.limits = limits
        self.socket = sock
        self.ssl_context = ssl_context
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self.dropped = 0  # connections closed to make room or past a deadline (for tests)
        self.refused = 0  # connections closed at accept: their peer was over its rate
        self._rates: dict[str, list[float]] = {}
        self._open: collections.OrderedDict[int, _Connection] = collections.OrderedDict()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopping: asyncio.Event | None = None
        # The worker for offloaded answers, made on first use; its queue length.
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._waiting = 0

    @property
    def port(self) -> int:
        """The port bound (useful with port 0)."""
        return int(self.address[1])

    def start(self) -> None:
        """Serve in the background; returns once the server accepts connections."""
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        """Close the listening socket and every connection; wait for the thread."""
        if self._stopping is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=10)

    @property
    def open_connections(self) -> int:
        """Connections open right now (tests and the benchmarks read it)."""
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
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            if self._worker is not None:
                self._worker.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        """Take what the kernel queued. A peer over its connection rate is closed at once,
        before any object is made for it: a flood from one peer costs an accept and a close
        per connection and does not keep the kernel's queue full for everyone else."""
        for _ in range(self.limits.backlog):
            try:
                conn, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: say so, and try again on the next event
                log.warning("cannot accept on %s: %s", self._thread.name, exc.strerror or exc)
                return
            peer = str(address[0]) if isinstance(address, tuple) else ""
            if not self._within_rate(peer):
                self.refused += 1
                conn.close()
                continue
            conn.setblocking(False)
            # Answers go out at once: with Nagle's algorithm a kept-alive client's next request
            # can wait for a delayed ACK (40 ms on Linux).
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
        deadline = self._loop.time() + self.limits.head_timeout
        reader = asyncio.StreamReader(limit=self.limits.head_bytes, loop=self._loop)
        try:
            transport, protocol = await asyncio.wait_for(
                self._loop.connect_accepted_socket(
                    lambda: asyncio.StreamReaderProtocol(reader, loop=self._loop),
                    sock=conn,
                    ssl=self.ssl_context,
                    ssl_handshake_timeout=self.limits.head_timeout if self.ssl_context else None,
                ),
                timeout=self.limits.head_timeout,
            )
        except (OSError, TimeoutError, ssl.SSLError):
            self.dropped += 1
            conn.close()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, self._loop)
        await self._client(reader, writer, peer, deadline)

    async def _client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        deadline: float,
    ) -> None:
        key = id(writer)
        self._make_room(peer)
        connection = _Connection(writer, peer)
        self._open[key] = connection
        try:
            while await self._one(reader, connection, deadline):
                if key not in self._open:
                    break  # dropped to make room while it was answered
                # A kept-alive connection may idle before its next request's head; the rest of
                # that request then gets the same total time as the first.
                deadline = self._loop.time() + self.limits.idle_timeout
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            self.dropped += 1
        except Exception:  # a failing handler must not end the server; say what happened
            log.exception("answering a request on %s failed", self._thread.name)
        finally:
            self._open.pop(key, None)
            writer.transport.abort()  # nothing lingers in TIME_WAIT on the server's side

    def _make_room(self, peer: str) -> None:
        """Before taking a connection from ``peer``: at the peer's cap, drop one of its own; at
        the overall cap, one of all: the oldest that never completed a request, else the oldest
        idle kept-alive one, a request being answered only when no other is left."""
        mine = [key for key, c in self._open.items() if c.peer == peer]
        if len(mine) >= self.limits.per_client:
            self._drop(mine)
        if len(self._open) >= self.limits.connections:
            self._drop(list(self._open))

    def _drop(self, keys: list[int]) -> None:
        # A connection that never completed a request goes first, then an idle kept-alive
        # one (the scheduler's, between calls), a request being answered last.
        def rank(key: int) -> int:
            connection = self._open[key]
            return 2 if connection.busy else 1 if connection.answered else 0

        victim = min(keys, key=rank)
        self._open.pop(victim).writer.transport.abort()
        self.dropped += 1

    async def _one(
        self, reader: asyncio.StreamReader, connection: _Connection, deadline: float
    ) -> bool:
        """Read and answer one request by ``deadline``; whether the connection stays open."""
        writer = connection.writer
        limits = self.limits
        try:
            head = await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), timeout=max(0.0, deadline - self._loop.time())
            )
        except asyncio.LimitOverrunError:
            connection.busy = True
            await self._send(
                writer, Response(431, f"request head over {limits.head_bytes} bytes\n")
            )
            return False
        connection.busy = True
        deadline = min(deadline, self._loop.time() + limits.head_timeout)
        try:
            request, keep = self._parse(head, connection.peer)
            body = b""
            if "content-length" in request.headers or request.method == "POST":
                _ack_now(writer)
                body = await self._body(reader, request, deadline)
            request = Request(request.method, request.path, request.headers, body, request.peer)
        except _Refused as refused:
            await self._send(writer, Response(refused.status, refused.text + "\n"))
            return False
        response = await self._answer(request)
        keep = keep and limits.keep_alive
        await self._send(writer, response, head_only=request.method == "HEAD", keep=keep)
        connection.busy = False
        connection.answered += 1
        return keep

    async def _answer(self, request: Request) -> Response:
        """The handler's answer: on the loop, or on the worker thread for what ``offload``
        picks (503 when ``offloaded`` requests already wait for it)."""
        if self.offload is None or not self.offload(request):
            return self.handler(request)
        if self._waiting >= self.limits.offloaded:
            log.debug("%s %s from %s: %d answers already queued", request.method, request.path,
                      request.peer, self._waiting)  # fmt: skip
            return Response(503, f"busy: {self._waiting} such requests are being answered\n")
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"{self._thread.name}-answer"
            )
        self._waiting += 1
        try:
            return await self._loop.run_in_executor(self._worker, self.handler, request)
        finally:
            self._waiting -= 1

    def _parse(self, head: bytes, peer: str) -> tuple[Request, bool]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(400, "malformed request line")
        method, target, version = parts
        if method not in self.limits.methods:
            raise _Refused(405, f"only {', '.join(self.limits.methods)}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise _Refused(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        wants_close = headers.get("connection", "").lower() == "close"
        keep = version == "HTTP/1.1" and not wants_close
        return Request(method, target.split("?", 1)[0], headers, b"", peer), keep

    async def _body(self, reader: asyncio.StreamReader, request: Request, deadline: float) -> bytes:
        if "transfer-encoding" in request.headers:
            raise _Refused(411, "chunked bodies are not read: send a Content-Length")
        if "content-length" not in request.headers:
            raise _Refused(411, "Content-Length required")
        text = request.headers["content-length"]
        # ASCII digits only: str.isdigit() also takes "²" (which int() refuses) and other
        # scripts' digits.
        if not (text.isascii() and text.isdigit()):
            log.warning(
                "%s %s from %s: malformed Content-Length %r; refused",
                request.method,
                request.path,
                request.peer,
                text[:40],
            )
            raise _Refused(400, "malformed Content-Length: decimal digits expected")
        length = int(text)
        if length > self.limits.body_bytes:
            log.warning(
                "%s %s from %s: body of %d bytes is over %d; refused",
                request.method,
                request.path,
                request.peer,
                length,
                self.limits.body_bytes,
            )
            raise _Refused(413, f"request body over {self.limits.body_bytes} bytes")
        if not length:
            return b""
        return await asyncio.wait_for(
            reader.readexactly(length), timeout=max(0.0, deadline - self._loop.time())
        )

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        response: Response,
        *,
        head_only: bool = False,
        keep: bool = False,
    ) -> None:
        payload = response.body.encode() if isinstance(response.body, str) else response.body
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        head = (
            f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Unknown')}\r\n"
            f"Content-Type: {response.content_type}\r\nContent-Length: {len(payload)}\r\n"
            f"{extra}Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        ).encode("latin-1")
        writer.write(head)
        if not head_only:
            writer.write(payload)  # not joined to the head: a large exposition is not copied
        await asyncio.wait_for(writer.drain(), timeout=self.limits.write_timeout)


def _ack_now(writer: asyncio.StreamWriter) -> None:
    """Acknowledge the request head at once. A client that sends its head and its body in two
    writes (Python's http.client does) holds the body under Nagle's algorithm until the head is
    acknowledged, and the kernel may delay that ACK: without this a POST took 5-40 ms more."""
    sock = writer.get_extra_info("socket")
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if sock is not None and quickack is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)


def _family(address: str) -> tuple[str, bool]:
    if address:
        return address, False
    if socket.has_ipv6 and socket.has_dualstack_ipv6():
        return "::", True
    return "0.0.0.0", False  # noqa: S104 (an empty address asks for every address)


def listen(address: str, port: int, backlog: int = 128, what: str = "the port") -> socket.socket:
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
            errno.EADDRINUSE: "something else already listens there: stop it or choose "
            "another port",
            errno.EADDRNOTAVAIL: "this host (or pod) has no such address: check the bind address",
            errno.EACCES: "a port below 1024 needs privileges: choose another port",
        }.get(exc.errno or 0, "check the port and the bind address")
        raise ConfigError(
            f"cannot serve {what} on {shown}: {exc.strerror or exc}; {hint}"
        ) from None


def tls_context(cert_file: str, key_file: str, client_ca_file: str = "") -> ssl.SSLContext:
    """A server context from PEM files; with ``client_ca_file`` every client must present a
    certificate signed by it. ConfigError naming the file when one cannot be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot use the TLS certificate {cert_file} with key {key_file}: {exc}"
        ) from None
    if client_ca_file:
        try:
            context.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot use the client CA file {client_ca_file}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serve(
    handler: Handler,
    address: str,
    port: int,
    limits: Limits | None = None,
    *,
    name: str = "http",
    what: str = "the port",
    ssl_context: ssl.SSLContext | None = None,
    offload: Offload | None = None,
) -> BoundedServer:
    """Listen on ``address`` (empty = all) and ``port`` in a daemon thread; the server.

    ConfigError when the port cannot be had (in use, no such address)."""
    limits = limits or Limits()
    server = BoundedServer(
        handler, listen(address, port, limits.backlog, what), limits, name=name,
        ssl_context=ssl_context, offload=offload,
    )  # fmt: skip
    server.start()
    return server


# --- certificates that follow their files ---------------------------------------------------
# Certificates rotate (cert-manager, a Secret's files swapped under a mounted volume) while a
# server runs for months. The listening context picks, at each handshake (its ``sni_callback``,
# which OpenSSL calls with or without a server name), the newest context built from the files:
# when a file's inode, size or modification time moved (checked at most every ``check_every``
# seconds), a fresh context is built and used for the handshakes that follow; connections
# already open keep theirs. Files that cannot be used (half written, a key that does not match)
# keep the previous context: one WARNING per new set of files.
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
        self._current = tls_context(cert_file, key_file, client_ca_file)
        self.context = tls_context(cert_file, key_file, client_ca_file)
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
                fresh = tls_context(*self.files)
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
