"""Issue 50 point 2 on the real cluster: the images and the packaged chart pushed to a registry
on loopback (Debian's docker-registry, inside the tier's network namespace), and the chart
installed from there (oci://) with its one image reference pointing there: the device plugin
and toolkit pods pull from it (the nodes' containerd reads the registry as plain HTTP from
certs.d/<host>/hosts.toml, as a user's would) and become Ready."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import PLUGIN_SELECTOR, Cluster, pod_ready, wait_for
from tests.cluster.controlplane import REPO, free_port
from tests.cluster.test_helm import HELM_PYTHON, helm

pytestmark = pytest.mark.cluster
REGISTRY_BINARY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
TOOLKIT_SELECTOR = "app.kubernetes.io/name=enflame-container-toolkit"
NODES = ("gcu-node-1", "gcu-node-2")


def _registry_config(root: str, port: int) -> str:
    path = os.path.join(root, "config.yml")
    config = {
        "version": 0.1,
        "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": os.path.join(root, "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    return path


@pytest.fixture
def loopback_registry(cluster: Cluster) -> Iterator[str]:
    """``127.0.0.1:PORT``: a docker-registry serving from the session's work dir (its process
    noted in the ledger, so an aborted run still ends it)."""
    if not os.access(REGISTRY_BINARY, os.X_OK):
        pytest.fail("no docker-registry: scripts/bootstrap.sh installs Debian's docker-registry")
    root = os.path.join(cluster.work, "registry")
    os.makedirs(root)
    port = free_port()
    with open(os.path.join(root, "registry.log"), "ab") as log:
        process = subprocess.Popen(
            [REGISTRY_BINARY, "serve", _registry_config(root, port)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    cluster.nodes[0].ledger.started(process.pid, REGISTRY_BINARY)
    host = f"127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"docker-registry exited: {_tail(root)}")
        try:
            with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    wait_for("the loopback registry to answer", answers, 30)
    try:
        yield host
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(root: str) -> str:
    with open(os.path.join(root, "registry.log"), encoding="utf-8", errors="replace") as handle:
        return handle.read()[-2000:]


def _push(cluster: Cluster, registry: str) -> list[str]:
    """deploy/push-image-archive.sh with podman on a private store (nothing on the host's)."""
    archives = glob.glob(os.path.join(os.environ["ENFLAME_E2E_IMAGES"], "enflame-gcu-images-*.tar"))
    assert len(archives) == 1, archives
    store = os.path.join(cluster.work, "podman")
    os.makedirs(store)
    with open(os.path.join(store, "storage.conf"), "w", encoding="utf-8") as handle:
        handle.write(f'[storage]\ndriver = "vfs"\ngraphroot = "{store}/graph"\n'
                     f'runroot = "{store}/run"\n')  # fmt: skip
    with open(os.path.join(store, "containers.conf"), "w", encoding="utf-8") as handle:
        handle.write(
            f'[engine]\ntmp_dir = "{store}/tmp"\nevents_logger = "none"\n'
            f'static_dir = "{store}/graph/libpod"\nvolume_path = "{store}/volumes"\n'
        )
    env = {
        **os.environ,
        "COPIER": "podman",
        "CONTAINERS_STORAGE_CONF": os.path.join(store, "storage.conf"),
        "CONTAINERS_CONF": os.path.join(store, "containers.conf"),
        "TMPDIR": store,
        "HOME": store,  # podman's per-user auth and config files
    }
    started = time.monotonic()
    result = subprocess.run(
        ["bash", os.path.join(REPO, "deploy", "push-image-archive.sh"), archives[0],
         f"{registry}/enflame"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"\npushed in {time.monotonic() - started:.0f} s: {result.stderr.splitlines()[-1]}")
    with urllib.request.urlopen(f"http://{registry}/v2/_catalog", timeout=5) as reply:
        catalog: list[str] = json.load(reply)["repositories"]
    return catalog


def _trust_plain_http(cluster: Cluster, registry: str) -> list[str]:
    """What a user writes for a registry without TLS: containerd's hosts.toml for it; returns
    the directories written, for the test to take away again."""
    written = []
    for node in cluster.nodes:
        if node.name not in NODES:
            continue
        directory = node.seen_from_here(f"/etc/containerd/certs.d/{registry}")
        os.makedirs(directory, exist_ok=True)
        written.append(directory)
        with open(os.path.join(directory, "hosts.toml"), "w", encoding="utf-8") as handle:
            handle.write(f'server = "http://{registry}"\n\n[host."http://{registry}"]\n'
                         '  capabilities = ["pull", "resolve"]\n')  # fmt: skip
    return written


def _package_chart(cluster: Cluster) -> str:
    out = os.path.join(cluster.work, "chart")
    result = subprocess.run(
        ["bash", "scripts/chart-package.sh"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "DIST_DIR": out}, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return str(result.stdout.strip().rpartition(" ")[2])


def _ready(cluster: Cluster, selector: str) -> list[dict[str, Any]] | None:
    pods = cluster.pods("kube-system", selector)
    ready = [p for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return ready if len(ready) == len(NODES) == len(pods) else None


@pytest.mark.skipif(
    not os.access(HELM_PYTHON, os.X_OK) and os.environ.get("CI") != "true",
    reason="no .venv-helm (scripts/bootstrap.sh makes it with helm-python-sdk); fails under CI",
)
def test_the_chart_installs_from_images_pushed_to_a_loopback_registry(
    cluster: Cluster, loopback_registry: str
) -> None:
    registry = loopback_registry
    catalog = _push(cluster, registry)
    assert set(catalog) >= {
        "enflame/enflame-gcu-device-plugin",
        "enflame/enflame-gcu-container-toolkit",
    }
    trusted = _trust_plain_http(cluster, registry)
    try:
        for name in NODES:
            cluster.shell(f"kubectl label node {name} enflame.com/gcu.present=true --overwrite")
        cluster.kubectl("delete", "-f", cluster.repo_file("deploy/yaml/enflame-device-plugin.yaml"),
                        "--ignore-not-found")  # fmt: skip
        wait_for("the static plugin pods to go",
                 lambda: not cluster.pods("kube-system", PLUGIN_SELECTOR), 120)  # fmt: skip

        # The packaged chart goes to the same registry (an OCI artifact, as `helm push` puts it)
        # and is installed from there, as a user's cluster would take it.
        package = _package_chart(cluster)
        pushed = helm(cluster, "push", package, f"oci://{registry}/enflame/charts", "plain-http")
        with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
            version = re.search(r'^version = "([^"]+)"', handle.read(), re.MULTILINE)
        assert version is not None
        chart = f"oci://{registry}/enflame/charts/enflame-gcu"
        options = {"chart_version": version[1], "plain_http": True}
        # The one reference, set once; Always: the nodes hold the same images under their
        # ghcr.io names (imported), and these must come from the registry.
        values = {
            "global": {"image": {"registry": f"{registry}/enflame"}},
            "image": {"pullPolicy": "Always"},
            "toolkit": {"enabled": True, "image": {"pullPolicy": "Always"}},
            "nodeMode": "device-specs",
        }
        helm(cluster, "install", "enflame-gcu", chart, "kube-system", json.dumps(values),
             json.dumps(options))  # fmt: skip
        print(f"chart pushed: {pushed['result']}")
        try:
            for what, selector in (("plugin", PLUGIN_SELECTOR), ("toolkit", TOOLKIT_SELECTOR)):
                pods = wait_for(
                    f"the chart's {what} pods to be Ready from {registry}",
                    lambda selector=selector: _ready(cluster, selector),  # type: ignore[misc]
                    240,
                    detail=lambda selector=selector: cluster.kubectl(  # type: ignore[misc]
                        "-n", "kube-system", "describe", "pods", "-l", selector, check=False
                    ),
                )
                for pod in pods:
                    image = pod["spec"]["containers"][0]["image"]
                    assert image.startswith(f"{registry}/enflame/"), image
                    status = pod["status"]["containerStatuses"][0]
                    assert status["image"].startswith(f"{registry}/enflame/"), status
            for node in cluster.nodes:
                if node.name in NODES:
                    listed = node.ctr("images", "ls", "-q").stdout.split()
                    pulled = {ref for ref in listed if ref.startswith(f"{registry}/enflame/")}
                    assert len(pulled) >= 2, (node.name, listed)
            with open(
                os.path.join(cluster.work, "registry", "registry.log"), encoding="utf-8"
            ) as log:
                served = log.read()
            assert "GET /v2/enflame/enflame-gcu-device-plugin/manifests" in served, served[-2000:]
        finally:
            helm(cluster, "uninstall", "enflame-gcu", "kube-system")
            wait_for(
                "the chart's pods to go",
                lambda: (
                    not cluster.pods("kube-system", PLUGIN_SELECTOR)
                    and not cluster.pods("kube-system", TOOLKIT_SELECTOR)
                ),
                240,
            )
            # Back to the static manifest for the scenarios that follow.
            cluster.shell("kubectl apply -f deploy/yaml/enflame-device-plugin.yaml")
    finally:
        # The node's /etc/containerd as the later scenarios expect it (they compare it
        # file by file before and after the toolkit).
        for directory in trusted:
            shutil.rmtree(directory)
