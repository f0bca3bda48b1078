"""The plugin's node state: its own Lease, whose state is written when it changes and whose
heartbeat is renewed alone otherwise, never while holders are unknown; the gcushare annotation
on the Node only when it changes."""

from __future__ import annotations

import asyncio
import copy
import http.server
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from enflame_gcu import devices, health, holders, node_state, sharing
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import node_annotation, resources
from enflame_gcu.errors import ConfigError


class RecordingApi:
    """A NodeApi over a tiny store (one Node's annotations, Leases by name) that records every
    write; ``fail`` makes the next writes raise."""

    namespace = "gcu-system"

    def __init__(self, on_node: dict[str, str] | None = None) -> None:
        self.node: dict[str, str] = {"keep": "me", **(on_node or {})}
        self.leases: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, str | None]]] = []  # Node patches
        self.lease_writes: list[tuple[str, dict[str, Any]]] = []  # (verb, body or patch)
        self.fail = 0

    def _maybe_fail(self) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("connection refused")

    async def patch_annotations(self, node: str, annotations: node_annotation.Annotations) -> None:
        self._maybe_fail()
        self.patches.append((node, dict(annotations)))
        for key, value in annotations.items():
            if value is None:
                self.node.pop(key, None)
            else:
                self.node[key] = value

    async def node_annotations(self, node: str) -> dict[str, str]:
        self._maybe_fail()
        return dict(self.node)

    async def patch_lease(self, name: str, patch: Mapping[str, Any]) -> bool:
        self._maybe_fail()
        if name not in self.leases:
            return False
        self.lease_writes.append(("patch", copy.deepcopy(dict(patch))))
        found = self.leases[name]
        found["metadata"]["annotations"].update(patch.get("metadata", {}).get("annotations", {}))
        found["spec"].update(patch.get("spec", {}))
        return True

    async def create_lease(self, body: Mapping[str, Any]) -> None:
        self._maybe_fail()
        self.lease_writes.append(("create", copy.deepcopy(dict(body))))
        self.leases[body["metadata"]["name"]] = copy.deepcopy(dict(body))

    async def delete_lease(self, name: str) -> None:
        self._maybe_fail()
        self.lease_writes.append(("delete", {"name": name}))
        self.leases.pop(name, None)

    def state(self) -> node_state.NodeState:
        """The state the extender would read from the node's Lease."""
        return node_state.from_lease("node-a", self.leases["node-a"])


def held(pod: str, *ids: str, resource: str = "enflame.com/gcu") -> holders.Holding:
    return holders.Holding("ml", pod, "main", resource, ids)


def setup(
    root: str, config: plugin_config.PluginConfig
) -> tuple[RecordingApi, node_annotation.NodeAnnotator]:
    inventory = devices.discover(root)
    api = RecordingApi()
    annotator = node_annotation.NodeAnnotator(api, "node-a", retry=0.05)
    _, assignment = resources.build(inventory, config)
    monitor = health.HealthMonitor(
        config.host_root, inventory.cards, driver_version=inventory.driver_version
    )
    annotator.set_node(inventory, monitor.report, assignment, config)
    return api, annotator


def test_written_once_per_change_and_not_before_holders_are_known(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    api, annotator = setup(vendor_node, config)

    async def scenario() -> None:
        assert await annotator.write_once()
        assert api.lease_writes == []  # holders unknown: nothing written
        annotator.set_holdings([held("train", "gcu0", "gcu1")])
        await annotator.write_once()
        first = api.state()
        assert "gcu0" not in first.free and first.pods == {"ml/train"}
        await annotator.write_once()  # same state: no second write
        annotator.set_holdings(None)  # PodResources failing: keep what was written
        await annotator.write_once()
        annotator.set_holdings([])
        await annotator.write_once()

    asyncio.run(scenario())
    assert [verb for verb, _ in api.lease_writes] == ["create", "patch"]
    created = api.lease_writes[0][1]
    assert created["metadata"]["name"] == created["spec"]["holderIdentity"] == "node-a"
    assert created["metadata"]["namespace"] == "gcu-system"
    assert created["metadata"]["labels"] == node_state.LEASE_LABELS
    assert len(api.state().free) == 8
    # No shared cards and nothing of ours on the Node: the Node is read once, never written.
    assert api.patches == []
    assert api.node == {"keep": "me"}


def test_shared_cards_write_the_gcushare_capacity_on_the_node_only_when_it_changes(
    vendor_node: str,
) -> None:
    config = plugin_config.PluginConfig(
        host_root=vendor_node, resources=("gcu", "shared-gcu"), shared_cards=("gcu7",)
    )
    api, annotator = setup(vendor_node, config)
    slice0 = held("s", "gcu7-slice0", resource="enflame.com/shared-gcu")

    async def scenario() -> None:
        annotator.set_holdings([slice0])
        await annotator.write_once()
        annotator.set_holdings([slice0, held("w", "gcu0")])  # a whole card: same capacity
        await annotator.write_once()
        annotator.set_holdings([])
        await annotator.write_once()

    asyncio.run(scenario())
    capacities = [p[node_state.SHARED_CAPACITY_ANNOTATION] for _, p in api.patches]
    assert [json.loads(c or "") for c in capacities] == [{"7": 5}, {"7": 6}]
    assert [c.name for c in api.state().cards] == [f"gcu{i}" for i in range(7)]
    assert len(api.lease_writes) == 3  # the state changed three times
    assert node_state.ANNOTATION not in api.node  # the state itself never on the Node


def test_the_first_write_drops_an_older_versions_state_from_the_node_and_a_restart_writes_none(
    vendor_node: str,
) -> None:
    config = plugin_config.PluginConfig(
        host_root=vendor_node, resources=("gcu", "shared-gcu"), shared_cards=("gcu7",)
    )
    api, annotator = setup(vendor_node, config)
    api.node[node_state.ANNOTATION] = '{"version":2}'  # left by the previous plugin version
    annotator.set_holdings([])
    asyncio.run(annotator.write_once())
    assert api.patches == [
        ("node-a", {node_state.ANNOTATION: None, node_state.SHARED_CAPACITY_ANNOTATION: '{"7": 6}'})
    ]
    _, restarted = setup(vendor_node, config)
    restarted.api = api
    restarted.set_holdings([])
    asyncio.run(restarted.write_once())
    assert len(api.patches) == 1  # the Node already says it: not written again


def test_a_failed_write_is_retried_and_logged_once(
    vendor_node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = plugin_config.PluginConfig(host_root=vendor_node)
    api, annotator = setup(vendor_node, config)
    api.fail = 3
    annotator.set_holdings([])

    async def scenario() -> None:
        task = asyncio.ensure_future(annotator.run())
        for _ in range(200):
            if "node-a" in api.leases:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert [verb for verb, _ in api.lease_writes] == ["create"]
    warnings = [
        r for r in caplog.records if "cannot write the node state of node-a" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert any("written again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("layer", "says"),
    [
        ({"node_state": "true"}, "needs node-name"),
        ({"node_state": "true", "node_name": "n1", "pod_resources_interval": "0"}, "above 0"),
        ({"node_name": "bad name!"}, "not a node name"),
    ],
)
def test_node_state_settings_are_checked(layer: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        plugin_config.resolve([layer])


def test_an_unchanged_state_only_renews_the_lease(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    inventory = devices.discover(vendor_node)
    api = RecordingApi()
    now = [1000.0]
    annotator = node_annotation.NodeAnnotator(api, "node-a", refresh=60, clock=lambda: now[0])
    _, assignment = resources.build(inventory, config)
    monitor = health.HealthMonitor(
        config.host_root, inventory.cards, driver_version=inventory.driver_version
    )
    annotator.set_node(inventory, monitor.report, assignment, config)

    async def scenario() -> None:
        annotator.set_holdings([])
        await annotator.write_once()
        now[0] += 5
        annotator.set_holdings([])  # the next PodResources read: same holders
        await annotator.write_once()  # nothing changed, refresh not due: no write
        now[0] += 60
        await annotator.write_once()  # due: the renewal alone, with the last read's time
        assert api.state().observed == 1005.0
        now[0] += 65
        await annotator.write_once()  # due, but PodResources not read since: no renewal
        annotator.set_holdings([])
        await annotator.write_once()  # read now: renewed
        assert api.state().observed == 1130.0

    asyncio.run(scenario())
    assert [verb for verb, _ in api.lease_writes] == ["create", "patch", "patch"]
    assert api.lease_writes[1][1] == {"spec": {"renewTime": node_state.micro_time(1005.0)}}
    assert (annotator.content_writes, annotator.heartbeats) == (1, 2)


def test_a_lease_deleted_under_the_plugin_is_created_again(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    now = [1000.0]
    api = RecordingApi()
    _, annotator = setup(vendor_node, config)
    annotator.api, annotator._clock = api, lambda: now[0]

    async def scenario() -> None:
        annotator.set_holdings([])
        await annotator.write_once()
        api.leases.clear()  # someone deleted it
        now[0] += 61
        annotator.set_holdings([])
        await annotator.write_once()

    asyncio.run(scenario())
    assert [verb for verb, _ in api.lease_writes] == ["create", "create"]
    assert api.state().observed == 1061.0


def test_a_clean_shutdown_removes_the_state(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(
        host_root=vendor_node, resources=("gcu", "shared-gcu"), shared_cards=("gcu7",)
    )
    api, annotator = setup(vendor_node, config)
    annotator.set_holdings([])

    async def scenario() -> None:
        await annotator.write_once()
        await annotator.clear()

    asyncio.run(scenario())
    assert api.lease_writes[-1] == ("delete", {"name": "node-a"})
    assert api.leases == {} and api.node == {"keep": "me"}


class SilentApi(RecordingApi):
    """An API server that accepts the connection and never answers a deletion."""

    async def delete_lease(self, name: str) -> None:
        await asyncio.Event().wait()


def test_a_shutdown_does_not_wait_for_an_api_server_that_never_answers(
    vendor_node: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    _, annotator = setup(vendor_node, config)
    api = annotator.api = SilentApi()
    annotator.set_holdings([])

    async def scenario() -> None:
        await annotator.write_once()
        await asyncio.wait_for(annotator.clear(timeout=0.2), 10)

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert "node-a" in api.leases  # the state written; its removal never answered
    assert "no answer in 0.2 s" in caplog.text


def test_the_published_state_names_the_plugins_slice_policy(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(
        host_root=vendor_node,
        resources=("gcu", "shared-gcu"),
        shared_cards=("gcu7",),
        sharing=sharing.SharingSettings(policy="distributed", max_slices_per_container=2),
    )
    api, annotator = setup(vendor_node, config)
    annotator.set_holdings([])
    asyncio.run(annotator.write_once())
    state = api.state()
    assert (state.policy, state.max_per_container) == ("distributed", 2)
    assert state.observed > 0


class LeaseApiServer:
    """Just enough of an API server over real HTTP for the writer's calls: GET and merge-PATCH
    one Node; create, merge-PATCH and DELETE Leases of one namespace (404 and 409 as the real
    server answers them). Every request is recorded."""

    LEASES = "/apis/coordination.k8s.io/v1/namespaces/gcu-system/leases"

    def __init__(self) -> None:
        self.node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": "node-a", "annotations": {}}}  # fmt: skip
        self.leases: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, int]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, code: int, body: Mapping[str, Any]) -> None:
                data = json.dumps(body).encode()
                outer.requests.append((self.command, self.path.split("?")[0], code))
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _missing(self, code: int = 404, reason: str = "NotFound") -> None:
                self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": reason, "code": code})  # fmt: skip

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return dict(json.loads(self.rfile.read(length) or b"{}"))

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/api/v1/nodes/node-a":
                    return self._reply(200, outer.node)
                return self._missing()

            def do_PATCH(self) -> None:
                path, patch = self.path.split("?")[0], self._body()
                if path == "/api/v1/nodes/node-a":
                    notes = outer.node["metadata"]["annotations"]
                    for key, value in patch["metadata"]["annotations"].items():
                        if value is None:
                            notes.pop(key, None)
                        else:
                            notes[key] = value
                    return self._reply(200, outer.node)
                name = path.rsplit("/", 1)[1]
                found = outer.leases.get(name) if path.startswith(outer.LEASES + "/") else None
                if found is None:
                    return self._missing()
                found["metadata"]["annotations"].update(
                    patch.get("metadata", {}).get("annotations", {})
                )
                found["spec"].update(patch.get("spec", {}))
                return self._reply(200, found)

            def do_POST(self) -> None:
                body = self._body()
                if self.path.split("?")[0] != outer.LEASES:
                    return self._missing()
                if body["metadata"]["name"] in outer.leases:
                    return self._missing(409, "AlreadyExists")
                outer.leases[body["metadata"]["name"]] = body
                return self._reply(201, body)

            def do_DELETE(self) -> None:
                name = self.path.split("?")[0].rsplit("/", 1)[1]
                if outer.leases.pop(name, None) is None:
                    return self._missing()
                return self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def kubeconfig(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        context = {"cluster": "fake", "user": "plugin", "namespace": "gcu-system"}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://{host!s}:{port}"}}],
            "users": [{"name": "plugin", "user": {}}],
            "contexts": [{"name": "fake", "context": context}],
            "current-context": "fake",
        }
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        return path


def test_the_lightkube_api_writes_the_lease_and_the_node_over_http(
    vendor_node: str, tmp_path: Any
) -> None:
    fake = LeaseApiServer()
    fake.thread.start()
    config = plugin_config.PluginConfig(
        host_root=vendor_node, resources=("gcu", "shared-gcu"), shared_cards=("gcu7",)
    )
    now = [1_800_000_000.0]
    try:

        async def scenario() -> None:
            api = node_annotation.LightkubeNodeApi(fake.kubeconfig(str(tmp_path / "config")))
            _, annotator = setup(vendor_node, config)
            annotator.api, annotator._clock = api, lambda: now[0]
            try:
                annotator.set_holdings([])
                assert await annotator.write_once()  # no Lease yet: the patch's 404, a create
                now[0] += 61
                annotator.set_holdings([])
                assert await annotator.write_once()  # the renewal
                await annotator.clear()
                await api.delete_lease("node-a")  # already gone: fine
            finally:
                await api.close()

        asyncio.run(scenario())
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    lease_path = f"{LeaseApiServer.LEASES}/node-a"
    assert fake.requests == [
        ("PATCH", lease_path, 404),
        ("POST", LeaseApiServer.LEASES, 201),
        ("GET", "/api/v1/nodes/node-a", 200),
        ("PATCH", "/api/v1/nodes/node-a", 200),  # the gcushare capacity
        ("PATCH", lease_path, 200),  # the renewal; the Node not again
        ("DELETE", lease_path, 200),
        ("PATCH", "/api/v1/nodes/node-a", 200),  # the capacity removed
        ("DELETE", lease_path, 404),
    ]
    assert fake.node["metadata"]["annotations"] == {}
