"""A small in-process fake of the API server endpoints the DRA driver uses (HTTP, one thread).

Served: GET a Node; GET a ResourceClaim; list, watch, create, replace and delete
ResourceSlices (with field selectors on ``spec.nodeName`` / ``spec.driver``), and the
``deletecollection`` the kubelet uses to wipe a node's slices. It keeps resourceVersions,
answers 409 on a stale update or an existing name, adds ``timeAdded`` to taints and rewrites
quantities as the real server does, and can drop fields the way a server without a feature
gate does. ``conflict_next_update`` makes the next update lose a race with another writer.

``drop_fields`` names device fields to drop; ``sharedCounters`` (or ``consumesCounters``) in it
drops every field of partitionable devices, as Kubernetes' ResourceSlice strategy does without
``DRAPartitionableDevices`` (``dropDisabledDRAPartitionableDevicesFields``: the slice's
``sharedCounters`` and ``perDeviceNodeSelection``, each device's ``consumesCounters``,
``nodeName``, ``nodeSelector`` and ``allNodes``): stored without them, and no error.
"""

from __future__ import annotations

import copy
import json
import queue
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)$")
_NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")
_SLICE = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/([^/]+)$")
_MI = re.compile(r"^(\d+)Mi$")
PARTITIONABLE_FIELDS = ("sharedCounters", "consumesCounters")  # either: the gate is off


def _canonical_quantity(text: str) -> str:
    # The server prints quantities canonically: 32768Mi comes back as 32Gi.
    match = _MI.match(text)
    if match and int(match.group(1)) % 1024 == 0:
        return f"{int(match.group(1)) // 1024}Gi"
    return text


def _field(document: dict[str, Any], path: str) -> Any:
    value: Any = document
    for part in path.split("."):
        value = (value or {}).get(part) if isinstance(value, dict) else None
    return value


def _matches(document: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, wanted = term.partition("=")
        if str(_field(document, key.strip())) != wanted.strip():
            return False
    return True


class FakeApiServer:
    """State plus an HTTP server on 127.0.0.1; use as a context manager."""

    def __init__(self, drop_fields: tuple[str, ...] = ()) -> None:
        self.drop_fields = drop_fields
        self.lock = threading.RLock()
        self.version = 100
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.requests: list[tuple[str, str, int]] = []
        self.conflict_next_update = 0
        self.down = False  # an outage: every request is dropped without an answer
        self._watchers: list[queue.Queue[tuple[int, str, dict[str, Any]] | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig pointing at this server; return its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "driver", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "driver"}}],
            "current-context": "fake",
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        return path

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            for watcher in self._watchers:
                watcher.put(None)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    # --- state --------------------------------------------------------------------------

    def add_node(self, name: str) -> str:
        uid = str(uuid.uuid4())
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": uid},
        }
        return uid

    def add_claim(self, document: dict[str, Any]) -> None:
        meta = document["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = copy.deepcopy(document)

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def _emit(self, kind: str, document: dict[str, Any]) -> None:
        event = (self.version, kind, copy.deepcopy(document))
        self.events.append(event)
        for watcher in self._watchers:
            watcher.put(event)

    def _store(self, document: dict[str, Any]) -> dict[str, Any]:
        document = copy.deepcopy(document)
        partitionable = not set(self.drop_fields) & set(PARTITIONABLE_FIELDS)
        spec = document.get("spec") or {}
        if not partitionable:
            for name in ("sharedCounters", "perDeviceNodeSelection"):
                spec.pop(name, None)
        for device in spec.get("devices") or []:
            for name in self.drop_fields:
                device.pop(name, None)
            if not partitionable:
                for name in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
                    device.pop(name, None)
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", "2026-01-01T00:00:00Z")
            for capacity in (device.get("capacity") or {}).values():
                capacity["value"] = _canonical_quantity(str(capacity["value"]))
        return document

    def wipe(self, node: str, driver: str | None = None) -> int:
        """What the kubelet does at its start: delete the node's slices (of one driver)."""
        selector = f"spec.nodeName={node}" + (f",spec.driver={driver}" if driver else "")
        return self._delete_collection(selector)

    def touch(self, name: str) -> None:
        """Another writer changes a slice (its resourceVersion moves on)."""
        with self.lock:
            document = self.slices[name]
            document["metadata"].setdefault("labels", {})["touched"] = str(time.time())
            document["metadata"]["resourceVersion"] = self._bump()
            self._emit("MODIFIED", document)

    def _delete_collection(self, selector: str) -> int:
        with self.lock:
            names = [n for n, d in self.slices.items() if _matches(d, selector)]
            for name in names:
                document = self.slices.pop(name)
                self._bump()
                self._emit("DELETED", document)
            return len(names)

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        with self.lock:
            return sorted(
                (
                    copy.deepcopy(d)
                    for d in self.slices.values()
                    if d["spec"].get("nodeName") == node
                ),
                key=lambda d: d["metadata"]["name"],
            )

    # --- HTTP ---------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def parse_request(self) -> bool:
                if fake.down:  # an outage: answer nothing, hang up
                    self.close_connection = True
                    return False
                return super().parse_request()

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                fake.requests.append((self.command, urllib.parse.urlsplit(self.path).path, code))
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._reply(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": reason,
                        "message": message,
                        "code": code,
                    },
                )

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")  # type: ignore[no-any-return]

            def _parts(self) -> tuple[str, dict[str, str]]:
                parsed = urllib.parse.urlsplit(self.path)
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
                return parsed.path, query

            def do_GET(self) -> None:
                path, query = self._parts()
                with fake.lock:
                    if match := _NODE.match(path):
                        node = fake.nodes.get(match.group(1))
                        return self._found(node, f"node {match.group(1)}")
                    if match := _CLAIM.match(path):
                        claim = fake.claims.get((match.group(1), match.group(2)))
                        return self._found(claim, f"resourceclaim {match.group(2)}")
                    if match := _SLICE.match(path):
                        return self._found(fake.slices.get(match.group(1)), match.group(1))
                if path == SLICES and query.get("watch") in ("true", "1"):
                    return self._watch(query)
                if path == SLICES:
                    selector = query.get("fieldSelector", "")
                    with fake.lock:
                        items = [
                            copy.deepcopy(d) for d in fake.slices.values() if _matches(d, selector)
                        ]
                        version = str(fake.version)
                    return self._reply(
                        200,
                        {
                            "apiVersion": "resource.k8s.io/v1",
                            "kind": "ResourceSliceList",
                            "metadata": {"resourceVersion": version},
                            "items": items,
                        },
                    )
                return self._status(404, "NotFound", f"no route {path}")

            def _found(self, document: dict[str, Any] | None, what: str) -> None:
                if document is None:
                    return self._status(404, "NotFound", f"{what} not found")
                return self._reply(200, document)

            def _watch(self, query: dict[str, str]) -> None:
                selector = query.get("fieldSelector", "")
                since = int(query.get("resourceVersion") or 0)
                timeout = float(query.get("timeoutSeconds") or 3600)
                watcher: queue.Queue[tuple[int, str, dict[str, Any]] | None] = queue.Queue()
                with fake.lock:
                    backlog = [e for e in fake.events if e[0] > since] if since else []
                    fake._watchers.append(watcher)
                fake.requests.append((self.command, urllib.parse.urlsplit(self.path).path, 200))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = time.monotonic() + timeout
                try:
                    for event in self._events(backlog, watcher, deadline):
                        version, kind, document = event
                        if not _matches(document, selector):
                            continue
                        document["metadata"]["resourceVersion"] = str(version)
                        line = json.dumps({"type": kind, "object": document}).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with fake.lock:
                        fake._watchers.remove(watcher)

            @staticmethod
            def _events(
                backlog: list[tuple[int, str, dict[str, Any]]],
                watcher: queue.Queue[tuple[int, str, dict[str, Any]] | None],
                deadline: float,
            ) -> Iterator[tuple[int, str, dict[str, Any]]]:
                yield from backlog
                while time.monotonic() < deadline:
                    try:
                        event = watcher.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if event is None:
                        return
                    yield event

            def do_POST(self) -> None:
                path, _ = self._parts()
                if path != SLICES:
                    return self._status(404, "NotFound", f"no route {path}")
                document = self._body()
                if not document["metadata"].get("name") and document["metadata"].get(
                    "generateName"
                ):  # as the API server does: the prefix and five random characters
                    suffix = uuid.uuid4().hex[:5]
                    document["metadata"]["name"] = document["metadata"]["generateName"] + suffix
                name = document["metadata"]["name"]
                with fake.lock:
                    if name in fake.slices:
                        return self._status(409, "AlreadyExists", f"resourceslice {name} exists")
                    stored = fake._store(document)
                    stored["metadata"]["uid"] = str(uuid.uuid4())
                    stored["metadata"]["resourceVersion"] = fake._bump()
                    fake.slices[name] = stored
                    fake._emit("ADDED", stored)
                    return self._reply(201, stored)

            def do_PUT(self) -> None:
                path, _ = self._parts()
                match = _SLICE.match(path)
                if not match:
                    return self._status(404, "NotFound", f"no route {path}")
                document = self._body()
                name = match.group(1)
                with fake.lock:
                    current = fake.slices.get(name)
                    if current is None:
                        return self._status(404, "NotFound", f"resourceslice {name} not found")
                    if fake.conflict_next_update:
                        fake.conflict_next_update -= 1
                        fake.touch(name)
                    sent = document["metadata"].get("resourceVersion")
                    if sent != current["metadata"]["resourceVersion"]:
                        return self._status(
                            409,
                            "Conflict",
                            f'Operation cannot be fulfilled on resourceslices "{name}": the '
                            "object has been modified; please apply your changes to the latest "
                            "version and try again",
                        )
                    stored = fake._store(document)
                    stored["metadata"]["uid"] = current["metadata"]["uid"]
                    stored["metadata"]["resourceVersion"] = fake._bump()
                    fake.slices[name] = stored
                    fake._emit("MODIFIED", stored)
                    return self._reply(200, stored)

            def do_DELETE(self) -> None:
                path, query = self._parts()
                if path == SLICES:
                    count = fake._delete_collection(query.get("fieldSelector", ""))
                    return self._reply(200, {"kind": "Status", "status": "Success", "code": count})
                match = _SLICE.match(path)
                if not match:
                    return self._status(404, "NotFound", f"no route {path}")
                with fake.lock:
                    document = fake.slices.pop(match.group(1), None)
                    if document is None:
                        return self._status(
                            404, "NotFound", f"resourceslice {match.group(1)} not found"
                        )
                    fake._bump()
                    fake._emit("DELETED", document)
                    return self._reply(200, document)

        return Handler
