"""The operator on the harness as the chart installs it: its CRDs, the chart's own RBAC objects
(rendered by Helm's code, applied as they are), and the operator process running with its
ServiceAccount's token under the real ``Node,RBAC`` authorizer — never as an admin."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from enflame_gcu.gcu_operator import resource as rs
from tests.controlplane.harness import Harness, until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRD_FILE = os.path.join(REPO, "deploy", "operator", "crd.yaml")
NAMESPACE = "enflame-operator"  # the release namespace
RELEASE = "test-release"  # helm_render's release name
SERVICE_ACCOUNT = f"{RELEASE}-enflame-gcu-operator"
GR_PATH = f"/apis/{rs.GROUP}/v1/gcuresources"
# The operator container's arguments as the chart renders them (set by :func:`install`).
CHART_ARGS: list[str] = []
# What the harness changes of them: passes every second (the tests wait on the operator), the
# health endpoint on a port of its own on loopback (the pod IP stands for it in the chart).
FAST = {
    "--interval": "1",
    "--max-interval": "5",
    "--health-port": "0",
    "--health-address": "127.0.0.1",
}


def chart_objects(overrides: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's operator objects with ``operator.enabled`` (all but its PodDisruptionBudget
    and its hook Job; the Deployment is kept for its arguments, never applied: the test runs
    the process itself)."""
    from tests.deploy import helm_render

    values: dict[str, Any] = {"operator": {"enabled": True}}
    values = helm_render.merged(values, dict(overrides or {}))
    with tempfile.TemporaryDirectory(prefix="enflame-chart-") as work:
        rendered = helm_render.render(work, values)
    skip = {"PodDisruptionBudget", "Job"}
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    found = []
    for doc in rendered.get("operator.yaml", []):
        if doc["kind"] in skip:
            continue
        # helm_render renders without a release namespace; Helm with `-n NAMESPACE` puts it
        # where .Release.Namespace stands: the objects' and the bindings' subjects' namespace.
        if doc["kind"] not in cluster_scoped and not doc["metadata"].get("namespace"):
            doc["metadata"]["namespace"] = NAMESPACE
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount" and not subject.get("namespace"):
                subject["namespace"] = NAMESPACE
        found.append(doc)
    return found


def install(harness: Harness) -> str:
    """CRDs and the chart's RBAC for the operator; the path of a kubeconfig holding the
    operator ServiceAccount's token."""
    plane = harness.plane
    plane.kubectl("apply", "-f", CRD_FILE)
    for group in (rs.GROUP, rs.LEGACY_GROUP):
        plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{rs.PLURAL}.{group}", "--timeout=60s"
        )
    if plane.get(f"/api/v1/namespaces/{NAMESPACE}") is None:
        plane.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NAMESPACE}})  # fmt: skip
    objects = chart_objects()
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    CHART_ARGS[:] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump_all([o for o in objects if o["kind"] != "Deployment"], handle)
    try:
        plane.kubectl("apply", "-f", handle.name)
    finally:
        os.unlink(handle.name)
    token = until(lambda: _token(harness), "the operator ServiceAccount's token", 60)
    path = os.path.join(plane.work, "operator.kubeconfig")
    assert plane.certs is not None
    with open(path, "w", encoding="utf-8") as out:
        json.dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "h", "cluster": {"server": plane.server,
                                                       "certificate-authority": plane.certs.ca}}],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "h", "context": {"cluster": "h", "user": "operator"}}],
                "current-context": "h",
            },
            out,
        )  # fmt: skip
    return path


def _token(harness: Harness) -> str:
    account = harness.plane.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}")
    for ref in (account or {}).get("secrets") or []:
        secret = harness.plane.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ref['name']}")
        data = (secret or {}).get("data") or {}
        if data.get("token"):
            return base64.b64decode(data["token"]).decode()
    return ""


@contextlib.contextmanager
def operator_process(
    harness: Harness, kubeconfig: str, *extra: str, log_name: str = "operator"
) -> Iterator[subprocess.Popen[bytes]]:
    """``enflame-gcu-operator`` with the chart's arguments (fast intervals), until the block
    ends; its log is ``<work>/<log_name>.log``."""
    log_path = os.path.join(harness.plane.work, f"{log_name}.log")
    assert CHART_ARGS, "install() first: the chart's arguments are read there"
    # helm_render renders with an empty .Release.Namespace, which these arguments are made of
    # (the release namespace, and componentNamespaces [] beside it by default).
    overrides = {"--component-namespace": NAMESPACE, "--allowed-namespaces": NAMESPACE, **FAST}
    for arg in extra:
        key, _, value = arg.partition("=")
        overrides[key] = value
    args = []
    for arg in CHART_ARGS:
        key, _, value = arg.partition("=")
        args.append(f"{key}={overrides.pop(key)}" if key in overrides else arg)
    args += [f"{key}={value}" for key, value in overrides.items()]
    command = [
        sys.executable, "-m", "enflame_gcu.gcu_operator.main",
        f"--kubeconfig={kubeconfig}", f"--namespace={NAMESPACE}", f"--identity={log_name}",
        *args,
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def log_tail(harness: Harness, log_name: str = "operator", size: int = 4000) -> str:
    """The end of the operator's log, for failure messages."""
    with (
        contextlib.suppress(OSError),
        open(os.path.join(harness.plane.work, f"{log_name}.log"), "rb") as f,
    ):
        return f.read().decode("utf-8", "replace")[-size:]
    return ""


def resource_body(name: str, **spec: Any) -> dict[str, Any]:
    """A GcuResource in our group: the project's example spec with ``spec`` laid over it."""
    from tests.deploy import helm_render

    with open(
        os.path.join(REPO, "deploy", "operator", "examples", "gcu-resource.yaml"), encoding="utf-8"
    ) as f:
        example = yaml.safe_load(f)
    example["metadata"] = {"name": name}
    example["spec"] = helm_render.merged(example["spec"], spec)
    body: dict[str, Any] = example
    return body


def get_resource(harness: Harness, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = harness.plane.get(f"{GR_PATH}/{name}")
    return found


def phase(harness: Harness, name: str) -> str:
    return str(((get_resource(harness, name) or {}).get("status") or {}).get("phase", ""))


def delete_resource(harness: Harness, name: str, timeout: float = 240) -> None:
    """Delete the resource and wait for the operator to release it (its finalizer); a resource
    still there after ``timeout`` loses its finalizers so the next test starts clean."""
    with contextlib.suppress(Exception):
        harness.plane.request("DELETE", f"{GR_PATH}/{name}")
    deadline = time.monotonic() + timeout
    while get_resource(harness, name) is not None:
        if time.monotonic() > deadline:
            harness.plane.api("PATCH", f"{GR_PATH}/{name}", {"metadata": {"finalizers": None}})
            break
        time.sleep(1)
