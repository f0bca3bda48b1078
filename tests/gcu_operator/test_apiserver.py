"""The operator and its CRDs against a real Kubernetes 1.20 control plane (cluster tier).

etcd, kube-apiserver and kube-controller-manager (the DaemonSet controller and the garbage
collector) from tests/cluster/controlplane.py; no scheduler and no kubelets: two Node objects,
and a stand-in that does what the scheduler and kubelets would do to the pods through the API
(binds DaemonSet pods to their node, reports them Running and Ready, lets validator pods succeed,
finishes terminating pods). The operator runs in-process over lightkube and as its CLI.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from enflame_gcu.gcu_operator import kube, leader, names, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.gcu_operator.helpers import EXAMPLE, REPO, VENDOR_EXAMPLE

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
NODES = ("gcu-node-1", "gcu-node-2")
CRD_FILE = REPO / "deploy" / "operator" / "crd.yaml"


@pytest.fixture(scope="module")
def plane() -> Iterator[Any]:
    from tests.cluster import controlplane

    with (
        tempfile.TemporaryDirectory(prefix="enflame-operator-e2e-") as work,
        controlplane.ControlPlane(controlplane.build(), work, scheduler=False) as cp,
    ):
        cp.kubectl("apply", "-f", str(CRD_FILE))
        for group in (rs.GROUP, rs.LEGACY_GROUP):
            cp.kubectl(
                "wait", "--for=condition=Established", f"crd/{rs.PLURAL}.{group}", "--timeout=60s"
            )
        # kubectl validates against /openapi/v2, which publishes a new CRD some seconds after
        # it is Established; until then kubectl cannot refuse unknown fields.
        deadline = time.monotonic() + 90
        published = "com.enflame.topscloud.v1.GcuResource"
        while published not in cp.request("GET", "/openapi/v2", raw=True):
            assert time.monotonic() < deadline, "the CRD's schema was never published"
            time.sleep(2)
        for name in NODES:
            cp.api(
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": {"enflame.com/gcu.present": "true"}},
                },
            )
        yield cp


_CLIENTS: list[kube.LightkubeApi] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _client(cp: Any) -> kube.LightkubeApi:
    import lightkube
    from lightkube.config.kubeconfig import KubeConfig

    config = KubeConfig.from_file(cp.kubeconfig)
    _CLIENTS.append(
        kube.LightkubeApi(lightkube.Client(config, field_manager="enflame-gcu-operator"))
    )
    return _CLIENTS[-1]


def _operator(cp: Any) -> runner.Operator:
    return runner.Operator(_client(cp))


def _kubelets(cp: Any) -> None:
    """One tick of the scheduler and kubelets, through the API."""
    for pod in cp.api("GET", "/api/v1/namespaces/kube-system/pods")["items"]:
        meta, spec = pod["metadata"], pod["spec"]
        path = f"/api/v1/namespaces/kube-system/pods/{meta['name']}"
        if meta.get("deletionTimestamp"):
            cp.request("DELETE", path, {"gracePeriodSeconds": 0})
            continue
        if not spec.get("nodeName"):
            terms = spec["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
            cp.api(
                "POST",
                path + "/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                },
            )
            continue
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            continue
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if spec.get("restartPolicy") == "Never":
            pod["status"] = {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "validator",
                        "image": spec["containers"][0]["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "message": "ok",
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            }
        else:
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            }
        cp.api("PUT", path + "/status", pod)


def _gr(cp: Any, group: str, name: str) -> dict[str, Any] | None:
    return cp.get(f"/apis/{group}/v1/{rs.PLURAL}/{name}")  # type: ignore[no-any-return]


def _until(
    cp: Any, operator: runner.Operator, done: Any, what: str, *, rounds: int = 60, check: Any = None
) -> None:
    for _ in range(rounds):
        results = operator.run_once()
        assert not any(r.error for r in results), results
        if check is not None:
            check()
        if done():
            return
        _kubelets(cp)
        time.sleep(0.3)
    raise AssertionError(f"{what}: not reached; logs:\n{cp.logs()}")


def test_the_apiserver_refuses_wrong_values_naming_the_field(plane: Any) -> None:
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["metadata"]["name"] = "typo"
    bad["spec"]["nodeMode"] = "cdii"
    bad["spec"]["devicePlugin"]["imagePullPolicy"] = "Sometimes"
    with pytest.raises(Exception, match=r"spec\.nodeMode") as refused:
        plane.api("POST", f"/apis/{rs.GROUP}/v1/{rs.PLURAL}", bad)
    assert "spec.devicePlugin.imagePullPolicy" in str(refused.value)
    # An unknown field: kubectl validates against the schema the API server publishes.
    typo = yaml.safe_load(EXAMPLE.read_text())
    typo["metadata"]["name"] = "typo"
    typo["spec"]["devicePlgin"] = {}
    result = plane.kubectl("apply", "-f", "-", stdin=json.dumps(typo), check=False)
    assert result.returncode != 0 and "devicePlgin" in result.stderr, result


def test_vendor_example_and_ours_deploy_and_show_ready_running(plane: Any) -> None:
    plane.kubectl("apply", "-f", str(VENDOR_EXAMPLE))  # unchanged, the 2.0 group
    operator = _operator(plane)

    def vendor_running() -> bool:
        vendor = _gr(plane, rs.LEGACY_GROUP, "enflame-gcu-resource") or {}
        return (vendor.get("status") or {}).get("phase") == "Running"

    _until(plane, operator, vendor_running, "the vendor's example Running")
    plane.kubectl("apply", "-f", str(EXAMPLE))

    def both_running() -> bool:
        ours = _gr(plane, rs.GROUP, "enflame-gcu-resource") or {}
        vendor = _gr(plane, rs.LEGACY_GROUP, "enflame-gcu-resource") or {}
        return all((r.get("status") or {}).get("phase") == "Running" for r in (ours, vendor))

    def ours_conflicts() -> bool:
        status = (_gr(plane, rs.GROUP, "enflame-gcu-resource") or {}).get("status") or {}
        return status.get("phase") == "Failed"

    # Both want the Service enflame-gcu-exporter: the second is told, the first keeps it.
    _until(plane, operator, ours_conflicts, "a conflict reported")
    message = _gr(plane, rs.GROUP, "enflame-gcu-resource")["status"]["conditions"][0]["message"]  # type: ignore[index]
    assert "Service kube-system/enflame-gcu-exporter exists and was not created" in message
    plane.kubectl(
        "patch", f"{rs.PLURAL}.{rs.GROUP}", "enflame-gcu-resource", "--type=merge",
        "-p", json.dumps({"spec": {"gcuExporter": {"name": "enflame-gcu-exporter-2"}}}),
    )  # fmt: skip
    _until(plane, operator, both_running, "both resources Running")
    # A fresh discovery cache: kubectl cached the API's resources before the CRDs existed.
    with tempfile.TemporaryDirectory() as cache:
        table = plane.kubectl("--cache-dir", cache, "get", "gr").stdout.split("\n")
        legacy = plane.kubectl(
            "--cache-dir", cache, "get", f"{rs.PLURAL}.{rs.LEGACY_GROUP}"
        ).stdout.split("\n")
    assert table[0].split() == ["NAME", "READY", "STATUS", "AGE"]
    assert table[1].split()[:3] == ["enflame-gcu-resource", "5/5", "Running"]
    assert legacy[1].split()[:3] == ["enflame-gcu-resource", "5/5", "Running"]
    vendor = _gr(plane, rs.LEGACY_GROUP, "enflame-gcu-resource")
    assert vendor is not None
    assert {"spec.nfd", "spec.devicePlugin.image"} <= {
        u["field"] for u in vendor["status"]["unsupported"]
    }
    daemonsets = {
        d["metadata"]["name"]
        for d in plane.api("GET", "/apis/apps/v1/namespaces/kube-system/daemonsets")["items"]
    }
    assert {
        "enflame-gcu-docker-plugin",
        "enflame-gcu-k8s-plugin",
        "enflame-container-toolkit",
        "enflame-k8s-device-plugin",
    } <= daemonsets
    for name in NODES:
        labels = plane.api("GET", f"/api/v1/nodes/{name}")["metadata"]["labels"]
        assert labels[names.VALIDATED_LABEL] == "true"
    # A converged pass writes nothing.
    assert all(r.actions == 0 for r in operator.run_once())


def test_plugin_version_change_rolls_node_by_node(plane: Any) -> None:
    operator = _operator(plane)
    plane.kubectl(
        "patch", f"{rs.PLURAL}.{rs.GROUP}", "enflame-gcu-resource", "--type=merge",
        "-p", json.dumps({"spec": {"devicePlugin": {"version": "0.2.0"}}}),
    )  # fmt: skip

    def rolled() -> bool:
        gr = _gr(plane, rs.GROUP, "enflame-gcu-resource") or {}
        pods = plane.api(
            "GET",
            "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io/name=enflame-device-plugin",
        )["items"]
        images = {
            p["spec"]["containers"][0]["image"]
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and any(
                o["name"] == "enflame-k8s-device-plugin" for o in p["metadata"]["ownerReferences"]
            )
        }
        return (gr.get("status") or {}).get("phase") == "Running" and images == {
            f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
        }

    seen_upgrading = []

    def watch() -> None:
        gr = _gr(plane, rs.GROUP, "enflame-gcu-resource") or {}
        rollout = (gr.get("status") or {}).get("rollout") or {}
        seen_upgrading.append(len(rollout.get("upgrading") or []))

    _until(plane, operator, rolled, "plugin 0.2.0 on every node", check=watch)
    assert max(seen_upgrading) == 1  # maxUnavailable 1: one node at a time


def test_operator_process_killed_again_and_again_mid_rollout_converges(plane: Any) -> None:
    import signal
    import subprocess
    import sys

    plane.kubectl(
        "patch", f"{rs.PLURAL}.{rs.GROUP}", "enflame-gcu-resource", "--type=merge",
        "-p", json.dumps({"spec": {"devicePlugin": {"version": "0.3.0"}}}),
    )  # fmt: skip
    want = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.3.0"
    command = [
        sys.executable, "-m", "enflame_gcu.gcu_operator.main", "--kubeconfig", plane.kubeconfig,
        "--interval", "0.2", "--identity", "e2e", "--lease-duration", "2",
    ]  # fmt: skip
    upgrading: list[int] = []
    kills = 0
    log_path = os.path.join(plane.work, "operator-kills.log")

    def log_text() -> str:
        with open(log_path, encoding="utf-8") as handle:
            return handle.read()

    # The kubelets and the scheduler act on their own while the operator is killed and restarted.
    stop = threading.Event()

    errors: list[str] = []

    def kubelets() -> None:
        while not stop.is_set():
            try:
                _kubelets(plane)
            except Exception as exc:  # a race with the operator: the next tick retries
                errors.append(str(exc)[:300])
            stop.wait(0.3)

    stand_in = threading.Thread(target=kubelets, daemon=True)
    stand_in.start()
    try:
        for attempt in range(40):
            with open(log_path, "w", encoding="utf-8") as log:
                process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + 120
            while "starting" not in log_text():
                assert process.poll() is None, log_text()
                assert time.monotonic() < deadline, "the operator did not start"
                time.sleep(0.05)
            time.sleep(0.2 + (attempt % 6) * 0.4)  # killed at a different point each time
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            kills += 1
            gr = _gr(plane, rs.GROUP, "enflame-gcu-resource") or {}
            status = gr.get("status") or {}
            upgrading.append(len((status.get("rollout") or {}).get("upgrading") or []))
            pods = plane.api(
                "GET",
                "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io/name=enflame-device-plugin",
            )["items"]
            images = {
                p["spec"]["containers"][0]["image"]
                for p in pods
                if any(
                    o["name"] == "enflame-k8s-device-plugin"
                    for o in p["metadata"]["ownerReferences"]
                )
            }
            if status.get("phase") == "Running" and images == {want}:
                break
        else:
            pods_now = plane.kubectl("get", "pods", "-A", "-o", "wide").stdout
            raise AssertionError(
                f"no convergence after {kills} kills: {status}\n{pods_now}\n"
                f"stand-in errors: {errors[-5:]}\n{plane.log('kube-controller-manager', 3000)}"
            )
    finally:
        stop.set()
        stand_in.join(timeout=30)
    assert kills > 1 and max(upgrading) <= 1
    # The killed holder's Lease expires; a fresh pass finds nothing left to do.
    time.sleep(2.5)
    assert all(r.actions == 0 for r in _operator(plane).run_once())


def test_cli_and_lease(plane: Any) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.gcu_operator.main", "--once",
         "--kubeconfig", plane.kubeconfig],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cluster = _client(plane)
    a = leader.LeaderElector(cluster, "kube-system", "a")
    b = leader.LeaderElector(cluster, "kube-system", "b")
    now = time.time()
    assert a.try_acquire(now)
    assert not b.try_acquire(now + 1)
    a.release()
    assert b.try_acquire(now + 2)


def test_delete_removes_everything_in_order_and_releases_the_finalizer(plane: Any) -> None:
    operator = _operator(plane)
    for group in (rs.GROUP, rs.LEGACY_GROUP):
        plane.kubectl("delete", f"{rs.PLURAL}.{group}", "enflame-gcu-resource", "--wait=false")

    def gone() -> bool:
        return all(
            _gr(plane, g, "enflame-gcu-resource") is None for g in (rs.GROUP, rs.LEGACY_GROUP)
        )

    _until(plane, operator, gone, "both resources deleted")
    assert plane.api("GET", "/apis/apps/v1/namespaces/kube-system/daemonsets")["items"] == []
    for name in NODES:
        node = plane.api("GET", f"/api/v1/nodes/{name}")
        assert node["metadata"]["labels"] == {"enflame.com/gcu.present": "true"}
        assert names.NODE_STATE_ANNOTATION not in (node["metadata"].get("annotations") or {})
