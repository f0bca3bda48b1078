"""A small in-process fake of the API server endpoints the DRA driver uses (HTTP, one thread).

Served: GET a Node; get, create, replace and delete ResourceClaims, ResourceClaimTemplates and
DeviceClasses; list,
watch, create, replace and delete ResourceSlices (with field selectors on ``spec.nodeName`` /
``spec.driver``), and the ``deletecollection`` the kubelet uses to wipe a node's slices.

As strict as a 1.36 server (:mod:`tests.dra_plugin.apiserver_rules`): a write is refused with
422 Invalid and the causes when it breaks the API's limits and rules; the fields of feature
gates that are off are dropped first, silently, as the server's strategies do; it fills in
defaults (a claim request's ``allocationMode``/``count``, a taint's ``timeAdded``), keeps
resourceVersions and ``metadata.generation`` (raised when the spec changes), answers 409 on a
stale update or an existing name, and rewrites quantities canonically.
``conflict_next_update`` makes the next update lose a race with another writer; ``down`` drops
every request unanswered (an outage).

``gates`` overrides the 1.36 feature gates. ``drop_fields`` is the older spelling: ``taints``
turns ``DRADeviceTaints`` off, ``allowMultipleAllocations`` ``DRAConsumableCapacity``,
``sharedCounters`` or ``consumesCounters`` ``DRAPartitionableDevices`` (the slice's
``sharedCounters`` and ``perDeviceNodeSelection``, each device's ``consumesCounters``,
``nodeName``, ``nodeSelector`` and ``allNodes``: stored without them, and no error); any
other device field named there is dropped too (a server that never stores what is written).
``served = False`` is a server without ``resource.k8s.io/v1`` (before 1.34): every path of the
group is 404 page not found.
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

from tests.dra_plugin import apiserver_rules as rules

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)$")
_NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")
_SLICE = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/([^/]+)$")
_CLAIMS = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims$")
_TEMPLATE = re.compile(
    r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaimtemplates/([^/]+)$"
)
_TEMPLATES = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaimtemplates$")
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
_CLASS = re.compile(r"^/apis/resource\.k8s\.io/v1/deviceclasses/([^/]+)$")
_KINDS = {
    "resourceslices": "ResourceSlice",
    "resourceclaims": "ResourceClaim",
    "deviceclasses": "DeviceClass",
    "resourceclaimtemplates": "ResourceClaimTemplate",
}
_GATE_OF_FIELD = {
    "taints": "DRADeviceTaints",
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "sharedCounters": "DRAPartitionableDevices",
    "consumesCounters": "DRAPartitionableDevices",
}
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

    def __init__(
        self, drop_fields: tuple[str, ...] = (), gates: dict[str, bool] | None = None
    ) -> None:
        self.drop_fields = drop_fields
        self.gates = dict(rules.GATES_1_36)
        self.gates.update({_GATE_OF_FIELD[f]: False for f in drop_fields if f in _GATE_OF_FIELD})
        self.gates.update(gates or {})
        self.device_classes: dict[str, dict[str, Any]] = {}
        self.refusals: list[tuple[str, list[str]]] = []
        self.lock = threading.RLock()
        self.version = 100
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.templates: dict[tuple[str, str], dict[str, Any]] = {}
        self.served = True  # False: no resource.k8s.io/v1 at all (a server before 1.34)
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
        """Store a claim as the scheduler left it (allocated), unchecked."""
        document = copy.deepcopy(document)
        meta = document["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta.setdefault("generation", 1)
        meta.setdefault("resourceVersion", self._bump())
        self.claims[(meta["namespace"], meta["name"])] = document

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
        rules.drop_disabled_slice(document, self.gates)
        for device in (document.get("spec") or {}).get("devices") or []:
            for name in set(self.drop_fields) - set(_GATE_OF_FIELD):
                device.pop(name, None)  # a server that loses a field no gate explains
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", "2026-01-01T00:00:00Z")
            for capacity in (device.get("capacity") or {}).values():
                capacity["value"] = _canonical_quantity(str(capacity["value"]))
        return document

    def _admit(
        self,
        kind: str,
        document: dict[str, Any],
        current: dict[str, Any] | None,
    ) -> tuple[dict[str, Any], list[str]]:
        """What the server makes of a create or update: dropped, defaulted, then validated."""
        if kind == "resourceslices":
            stored = self._store(document)
            problems = rules.validate_slice(stored, current, self.gates)
        elif kind == "resourceclaims":
            stored = copy.deepcopy(document)
            rules.drop_disabled_claim(stored, self.gates)
            rules.default_claim(stored)
            if current is None:
                stored.pop("status", None)  # a create never sets the status
            else:
                stored["status"] = copy.deepcopy(current.get("status") or {})
            problems = rules.validate_claim(stored, current, self.gates)
        elif kind == "resourceclaimtemplates":
            stored = copy.deepcopy(document)
            problems = rules.admit_claim_template(stored, current, self.gates)
        else:
            stored = copy.deepcopy(document)
            rules.drop_disabled_device_class(stored, self.gates)
            problems = rules.validate_device_class(stored, current, self.gates)
        meta = stored.setdefault("metadata", {})
        if current is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
            meta["generation"] = 1
        else:
            for key in ("uid", "creationTimestamp"):
                meta[key] = current["metadata"][key]
            changed = stored.get("spec") != current.get("spec")
            meta["generation"] = current["metadata"]["generation"] + int(changed)
        if problems:
            self.refusals.append((f"{kind}/{meta.get('name')}", problems))
        return stored, problems

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
                if not super().parse_request():
                    return False
                if not fake.served and self.path.startswith("/apis/resource.k8s.io/"):
                    # As kube-apiserver answers for a group it does not serve: text, no Status.
                    fake.requests.append((self.command, self.path, 404))
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", "19")
                    self.end_headers()
                    self.wfile.write(b"404 page not found\n")
                    self.close_connection = True  # a request body may follow, unread
                    return False
                return True

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
                    if match := _CLASS.match(path):
                        found = fake.device_classes.get(match.group(1))
                        return self._found(found, f"deviceclass {match.group(1)}")
                    if match := _TEMPLATE.match(path):
                        found = fake.templates.get((match.group(1), match.group(2)))
                        return self._found(found, f"resourceclaimtemplate {match.group(2)}")
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

            def _invalid(self, kind: str, name: str, problems: list[str]) -> None:
                # As the server's 422: "<Kind>.resource.k8s.io "<name>" is invalid: causes".
                causes = [
                    {"reason": "FieldValueInvalid", "field": p.split(":")[0], "message": p}
                    for p in problems
                ]
                body = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Invalid",
                    "message": f'{_KINDS[kind]}.resource.k8s.io "{name}" is invalid: '
                    + "; ".join(problems),
                    "details": {"name": name, "group": "resource.k8s.io", "causes": causes},
                    "code": 422,
                }
                return self._reply(422, body)

            def _route(self, path: str) -> tuple[str, dict[Any, Any], Any] | None:
                """(kind, its store, the key of the object named by the path or None)."""
                if path == SLICES:
                    return "resourceslices", fake.slices, None
                if match := _SLICE.match(path):
                    return "resourceslices", fake.slices, match.group(1)
                if path == CLASSES:
                    return "deviceclasses", fake.device_classes, None
                if match := _CLASS.match(path):
                    return "deviceclasses", fake.device_classes, match.group(1)
                if match := _CLAIMS.match(path):
                    return "resourceclaims", fake.claims, (match.group(1), None)
                if match := _CLAIM.match(path):
                    return "resourceclaims", fake.claims, (match.group(1), match.group(2))
                if match := _TEMPLATES.match(path):
                    return "resourceclaimtemplates", fake.templates, (match.group(1), None)
                if match := _TEMPLATE.match(path):
                    key = (match.group(1), match.group(2))
                    return "resourceclaimtemplates", fake.templates, key
                return None

            def do_POST(self) -> None:
                path, _ = self._parts()
                route = self._route(path)
                if route is None or (route[2] is not None and not isinstance(route[2], tuple)):
                    return self._status(404, "NotFound", f"no route {path}")
                kind, store, key = route
                document = self._body()
                meta = document.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    # As the API server does: the prefix and five random characters.
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                name = meta.get("name", "")
                if kind in ("resourceclaims", "resourceclaimtemplates"):
                    meta["namespace"] = key[0]
                    key = (key[0], name)
                else:
                    key = name
                with fake.lock:
                    if key in store:
                        return self._status(409, "AlreadyExists", f"{kind} {name} exists")
                    stored, problems = fake._admit(kind, document, None)
                    if problems:
                        return self._invalid(kind, name, problems)
                    stored["metadata"]["resourceVersion"] = fake._bump()
                    store[key] = stored
                    if kind == "resourceslices":
                        fake._emit("ADDED", stored)
                    return self._reply(201, stored)

            def do_PUT(self) -> None:
                path, _ = self._parts()
                route = self._route(path)
                if route is None or route[2] is None or route[2] == (route[2][0], None):
                    return self._status(404, "NotFound", f"no route {path}")
                kind, store, key = route
                name = key[1] if isinstance(key, tuple) else key
                document = self._body()
                with fake.lock:
                    current = store.get(key)
                    if current is None:
                        return self._status(404, "NotFound", f"{kind} {name} not found")
                    if kind == "resourceslices" and fake.conflict_next_update:
                        fake.conflict_next_update -= 1
                        fake.touch(name)
                    sent = (document.get("metadata") or {}).get("resourceVersion")
                    # An empty resourceVersion is an unconditional update (these kinds allow it).
                    if sent and sent != current["metadata"]["resourceVersion"]:
                        return self._status(
                            409,
                            "Conflict",
                            f'Operation cannot be fulfilled on {kind} "{name}": the '
                            "object has been modified; please apply your changes to the latest "
                            "version and try again",
                        )
                    stored, problems = fake._admit(kind, document, current)
                    if problems:
                        return self._invalid(kind, name, problems)
                    stored["metadata"]["resourceVersion"] = fake._bump()
                    store[key] = stored
                    if kind == "resourceslices":
                        fake._emit("MODIFIED", stored)
                    return self._reply(200, stored)

            def do_DELETE(self) -> None:
                path, query = self._parts()
                if path == SLICES:
                    count = fake._delete_collection(query.get("fieldSelector", ""))
                    return self._reply(200, {"kind": "Status", "status": "Success", "code": count})
                route = self._route(path)
                if route is None or route[2] is None:
                    return self._status(404, "NotFound", f"no route {path}")
                kind, store, key = route
                name = key[1] if isinstance(key, tuple) else key
                with fake.lock:
                    document = store.pop(key, None)
                    if document is None:
                        return self._status(404, "NotFound", f"{kind} {name} not found")
                    fake._bump()
                    if kind == "resourceslices":
                        fake._emit("DELETED", document)
                    return self._reply(200, document)

        return Handler
