"""What the cluster tier's scenarios do with the cluster: the guide's ``kubectl`` lines, the
manifests as the tier deploys them, and waits that say what they saw when they run out."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from tests.cluster.controlplane import REPO, ControlPlane
from tests.cluster.nodes import ClusterNode
from tests.kubelet.harness import E2EError

T = TypeVar("T")
CLUSTER_DIR_ENV = "ENFLAME_E2E_CLUSTER_DIR"
IMAGES_ENV = "ENFLAME_E2E_IMAGES"
RESOURCE = "enflame.com/gcu"
PLUGIN_SELECTOR = "app.kubernetes.io/name=enflame-device-plugin"


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60,
    interval: float = 0.5,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll until truthy; E2EError naming ``what`` (and ``detail()``) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise E2EError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(interval)


@dataclass
class Cluster:
    """The session's control plane and nodes."""

    plane: ControlPlane
    nodes: list[ClusterNode]
    work: str
    # (name, simulated board, pod subnet, node IP[, containerd layout]) -> a new Ready node (torn
    # down with the rest)
    add_node: Callable[..., ClusterNode]

    # -- kubectl ----------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        """kubectl's stdout (E2EError with its output on failure when ``check``)."""
        result = self.plane.kubectl(*args, check=False, stdin=stdin)
        if check and result.returncode != 0:
            raise E2EError(f"kubectl {' '.join(args)}: {result.stdout}{result.stderr}")
        return result.stdout + (result.stderr if not check else "")

    def shell(self, line: str) -> str:
        """A guide line ``kubectl ... [| grep ...]`` run with the cluster's kubectl."""
        import subprocess

        kubectl = os.path.join(self.plane.bin, "kubectl")
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**self.plane.env(), "PATH": f"{os.path.dirname(kubectl)}:{os.environ['PATH']}"},
        )
        if result.returncode != 0:
            raise E2EError(f"`{line}` failed ({result.returncode}): {result.stdout}{result.stderr}")
        return result.stdout

    @staticmethod
    def repo_file(path: str) -> str:
        """A path of the checkout."""
        return os.path.join(REPO, path)

    def apply_manifest(
        self, path: str, *, edit: Callable[[list[dict[str, Any]]], Any] | None = None
    ) -> str:
        """``kubectl apply -f`` the checkout's ``path``, as is or changed by ``edit`` (for
        scenarios that break or change it); returns the file applied."""
        with open(self.repo_file(path), encoding="utf-8") as handle:
            documents = [d for d in yaml.safe_load_all(handle) if d]
        if edit is not None:
            edit(documents)
        target = os.path.join(self.work, os.path.basename(path))
        with open(target, "w", encoding="utf-8") as handle:
            yaml.safe_dump_all(documents, handle)
        self.kubectl("apply", "-f", target)
        return target

    # -- objects ----------------------------------------------------------------------------

    def get(self, path: str) -> Any:
        """An API object (None when absent)."""
        return self.plane.get(path)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """Pods of a namespace, optionally by label selector."""
        query = f"?labelSelector={selector}" if selector else ""
        items: list[dict[str, Any]] = self.plane.api(
            "GET", f"/api/v1/namespaces/{namespace}/pods{query}"
        )["items"]
        return items

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod."""
        found: dict[str, Any] | None = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return found

    def node(self, name: str) -> dict[str, Any]:
        """One Node."""
        found: dict[str, Any] = self.plane.api("GET", f"/api/v1/nodes/{name}")
        return found

    def gcus(self, node: str, resource: str = RESOURCE) -> tuple[int, int]:
        """``(capacity, allocatable)`` of ``resource`` in the Node's status (0 when absent)."""
        status = self.node(node).get("status", {})
        return (
            int(status.get("capacity", {}).get(resource, 0)),
            int(status.get("allocatable", {}).get(resource, 0)),
        )

    def ready_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods whose Ready condition is True."""
        return [p for p in self.pods(namespace, selector) if pod_ready(p)]

    def wait_pod(
        self, namespace: str, name: str, phase: str = "Running", timeout: float = 120
    ) -> dict[str, Any]:
        """Wait for a pod phase (Running also needs every container running)."""

        def probe() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            if pod is None:
                return None
            status = pod.get("status", {})
            if status.get("phase") == "Failed" and phase != "Failed":
                raise E2EError(f"pod {namespace}/{name} failed: {json.dumps(status)[:2000]}")
            if status.get("phase") != phase:
                return None
            if phase == "Running":
                states = status.get("containerStatuses") or []
                if not states or not all("running" in s.get("state", {}) for s in states):
                    return None
            return pod

        return wait_for(
            f"pod {namespace}/{name} to be {phase}",
            probe,
            timeout,
            detail=lambda: self.describe("pod", name, namespace),
        )

    def describe(self, kind: str, name: str, namespace: str = "") -> str:
        """``kubectl describe`` for failure messages (never raises)."""
        args = ["describe", kind, name] + (["-n", namespace] if namespace else [])
        return self.plane.kubectl(*args, check=False).stdout[-3000:]

    def events(self, namespace: str, name: str) -> list[str]:
        """Event messages about one object."""
        items = self.plane.api(
            "GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={name}"
        )["items"]
        return [f"{e.get('reason')}: {e.get('message')}" for e in items]

    def delete_pods(self, namespace: str, *names: str) -> None:
        """Delete pods and wait until they are gone."""
        if names:
            self.kubectl("delete", "pod", "-n", namespace, *names, "--wait=true", "--timeout=120s")


def pod_ready(pod: dict[str, Any]) -> bool:
    """Whether the pod's Ready condition is True."""
    for condition in pod.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def dir_files(dirs: dict[str, str]) -> dict[str, dict[str, bytes]]:
    """``{key: {relative path: content}}`` of every file under each directory in ``dirs``
    (subdirectories too, such as containerd's ``certs.d/<host>/hosts.toml``), to compare a
    node's config dirs before and after."""
    found: dict[str, dict[str, bytes]] = {}
    for key, directory in dirs.items():
        found[key] = {}
        for root, subdirs, files in os.walk(directory):
            subdirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                with open(path, "rb") as handle:
                    found[key][os.path.relpath(path, directory)] = handle.read()
    return found


def cards_in(text: str) -> list[str]:
    """``gcuN`` names in a container's ``ls -l /dev/gcu*`` output (gcuctl excluded)."""
    return sorted(set(re.findall(r"/dev/(gcu\d+)\b", text)), key=lambda n: int(n[3:]))


def one_of(values: Sequence[T]) -> T:
    """The single element (E2EError otherwise)."""
    if len(values) != 1:
        raise E2EError(f"expected exactly one, got {values!r}")
    return values[0]


def listing_pod(name: str, gcus: int = 2, *, node: str = "", scheduler: str = "") -> str:
    """A debian:12-slim pod in ``enflame`` asking for ``gcus`` cards and listing them; on
    ``node`` when given (else wherever the scheduler puts it), by ``scheduler`` when given."""
    lines = [f"  schedulerName: {scheduler}"] if scheduler else []
    if node:
        lines += ["  nodeSelector:", f"    kubernetes.io/hostname: {node}"]
    placement = "".join(line + "\n" for line in lines)
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: enflame
spec:
{placement}  terminationGracePeriodSeconds: 1
  containers:
    - name: gcu
      image: debian:12-slim
      command: ["sh", "-c", "ls -l /dev/gcu* && sleep infinity"]
      resources:
        limits:
          {RESOURCE}: {gcus}
"""


def pinned(name: str, node: str, gcus: int = 2) -> str:
    """A listing pod on ``node`` asking for ``gcus`` cards."""
    return listing_pod(name, gcus, node=node)
