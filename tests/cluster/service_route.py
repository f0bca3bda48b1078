"""The ``kubernetes`` Service's address for pods of the cluster tier, which has no kube-proxy.

The kubelet gives every container ``KUBERNETES_SERVICE_HOST=10.0.0.1`` and port 443 (the
``kubernetes`` Service), and in-cluster clients (the extender, a kube-scheduler in a pod, the
plugin's node-state writer) dial that. :class:`ServiceRoute` puts the Service's IP on ``lo`` of
the tier's private network namespace and relays TCP from ``10.0.0.1:443`` to the API server on
``127.0.0.1`` (TLS passes through untouched: the API server's certificate names 10.0.0.1), so
host-network pods and pod-network pods (routed through the node's bridge) reach the API as on a
cluster with kube-proxy. Only in the tier's own network namespace (``ENFLAME_E2E_NETNS``); the
address goes with :meth:`ServiceRoute.close` (and with the namespace, whatever happens).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from types import TracebackType

from tests.cluster.controlplane import SERVICE_IP
from tests.kubelet.harness import E2EError

SERVICE_PORT = 443


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


class ServiceRoute:
    """``SERVICE_IP:443`` -> ``127.0.0.1:api_port`` while open."""

    def __init__(self, api_port: int) -> None:
        if os.environ.get("ENFLAME_E2E_NETNS") != "private":
            raise E2EError("refusing to add the Service IP outside the tier's network namespace")
        self.api_port = api_port
        self.relayed = 0
        self._added = False
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._relays: list[threading.Thread] = []

    def __enter__(self) -> ServiceRoute:
        return self.open()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> ServiceRoute:
        """Add the address, listen, relay in a daemon thread."""
        result = subprocess.run(
            ["ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 and "File exists" not in result.stderr:
            raise E2EError(f"ip addr add {SERVICE_IP}/32 dev lo: {result.stderr}")
        self._added = result.returncode == 0
        listener = socket.create_server((SERVICE_IP, SERVICE_PORT), reuse_port=False)
        listener.settimeout(0.5)
        self._listener = listener
        self._thread = threading.Thread(target=self._serve, name="service-route", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.api_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            self.relayed += 1
            with self._lock:
                self._open.update((client, upstream))
            relay = threading.Thread(
                target=self._relay, args=(client, upstream), name="service-relay", daemon=True
            )
            relay.start()
            self._relays = [r for r in self._relays if r.is_alive()] + [relay]

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both directions of one connection; both sockets closed when both ends are done."""
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()

    def close(self) -> None:
        """Stop listening and remove the address (relayed connections die with it)."""
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            left = list(self._open)
        for connection in left:  # the relays see their sockets fail, finish and close them
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for relay in self._relays:
            relay.join(5)
        if self._added:
            subprocess.run(
                ["ip", "addr", "del", f"{SERVICE_IP}/32", "dev", "lo"],
                capture_output=True,
                check=False,
            )
            self._added = False
