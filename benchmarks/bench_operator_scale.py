"""The operator at 1,000 (and 5,000) nodes on the tier's real kube-apiserver; prints JSON.

The real program (``python -m enflame_gcu.gcu_operator.main``, its own loop, Lease and idle
watches, default intervals) runs against the cluster tier's control plane (etcd,
kube-apiserver, kube-controller-manager whose DaemonSet controller makes the pods;
tests/cluster/controlplane.py) with N Node objects. Requests are counted by the API server
itself: an audit policy logs every request of the operator's own user (and nobody else's), so
the figures are the server's count, not the client's.

Measured:
- idle: once the GcuResource is Running, requests per minute and the operator's CPU over an
  idle window (``IDLE_SECONDS``, at least 3 minutes), by verb and resource;
- rollout: a device plugin version change with ``maxUnavailable: 10%``: wall time, full passes
  (LISTs of GcuResources), writes, and the most nodes without a ready device plugin pod seen at
  any tick of the stand-in kubelets (the budget is 10% of the nodes).

The kubelets are played through the API by :class:`StandInKubelets`: they bind a pending pod
to the node its affinity names (the scheduler's part), report it Running and Ready (or, for a
pod that must run to completion, Succeeded) ``START_DELAY`` seconds after it was bound, and
delete a terminating pod ``STOP_DELAY`` seconds after its deletion began. They know nothing of
the operator's policy: they never look at GcuResources, DaemonSets or node labels.

``ENFLAME_BENCH_NODES`` (default ``1000``; e.g. ``1000,5000``) picks the sizes;
``ENFLAME_BENCH_IDLE_SECONDS`` the idle window; ``ENFLAME_BENCH_ROLLOUT=0`` skips the rollout.
Needs the control plane build ($ENFLAME_E2E_CLUSTER_DIR), else prints why it did not run.
"""

from __future__ import annotations

import collections
import datetime
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu.gcu_operator import names
from enflame_gcu.gcu_operator import resource as rs
from tests.cluster import controlplane
from tests.gcu_operator import test_apiserver as e2e

OPERATOR_USER = "enflame-bench-operator"
# A real kubelet starts a container whose image is already on the node in about 1-2 s (runc
# create + start, then the status sync); a plugin then registers and its readiness probe
# passes. 3 s is on the fast side of that, so the rollout's wall time is if anything short.
START_DELAY = 3.0
# SIGTERM to a device plugin that exits at once, then the kubelet's status sync.
STOP_DELAY = 1.0
TICK = 1.0
BUDGET = "10%"
RAMP = 180.0
NAMESPACE = "kube-system"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def audit_policy() -> dict[str, Any]:
    """Every request of the operator's user at Metadata level, nothing else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
    }


def resource_body(version: str = "") -> dict[str, Any]:
    """The toolkit and the device plugin (and the validator) on every GCU node."""
    plugin: dict[str, Any] = {
        "namespace": NAMESPACE,
        "nodeSelector": {"enflame.com/gcu.present": "true"},
    }
    if version:
        plugin["version"] = version
    return {
        "apiVersion": f"{rs.GROUP}/{rs.VERSION}",
        "kind": rs.KIND,
        "metadata": {"name": "enflame-gcu-resource"},
        "spec": {
            "nodeMode": "auto",
            "containerToolkit": {"namespace": NAMESPACE},
            "devicePlugin": plugin,
            "upgradePolicy": {"maxUnavailable": BUDGET, "podReadyTimeoutSeconds": 600},
        },
    }


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def audit_requests(path: str, since: float, until: float) -> list[dict[str, Any]]:
    """The operator's requests received in [since, until): one per auditID."""
    seen: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != OPERATOR_USER:
                continue
            at = _stamp(event["requestReceivedTimestamp"])
            if since <= at < until:
                seen.setdefault(event["auditID"], event)
    return list(seen.values())


def summarize(requests: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Requests per minute, by verb/resource, with the Lease apart."""
    by: collections.Counter[str] = collections.Counter()
    for event in requests:
        ref = event.get("objectRef") or {}
        by[f"{event.get('verb')} {ref.get('resource')}"] += 1
    lease = sum(n for key, n in by.items() if key.endswith(" leases"))
    total = sum(by.values())
    return {
        "seconds": round(seconds, 1),
        "requests": total,
        "requests_per_minute": round(total * 60 / seconds, 2),
        "lease_requests_per_minute": round(lease * 60 / seconds, 2),
        "requests_per_minute_without_lease": round((total - lease) * 60 / seconds, 2),
        "by_verb_and_resource": dict(sorted(by.items())),
    }


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Api:
    """Requests to the control plane over one kept-alive HTTPS connection (cp.request opens a
    new TLS connection per call: at thousands of calls that, not the server, set the pace)."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self._conn: http.client.HTTPSConnection | None = None

    def __call__(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.cp.port, context=self.cp._ssl, timeout=120
                )
            try:
                self._conn.request(method, path, body=data, headers={"Content-Type": content})
                answer = self._conn.getresponse()
                text = answer.read().decode()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
                continue
            if answer.status >= 400:
                raise controlplane.ControlPlaneError(
                    f"{method} {path}: {answer.status} {text[:300]}"
                )
            return json.loads(text) if text else None
        return None


class StandInKubelets:
    """The scheduler's binding and every kubelet's pod status, through the API, with delays."""

    def __init__(self, cp: Any) -> None:
        self.api = Api(cp)
        self.bound_at: dict[str, float] = {}
        self.deleting_at: dict[str, float] = {}
        self.ticks = 0

    def tick(self) -> list[dict[str, Any]]:
        """One look at every pod in the namespace; returns the pods as seen."""
        self.ticks += 1
        now = time.monotonic()
        listed: list[dict[str, Any]] = self.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")[
            "items"
        ]
        for pod in listed:
            meta, spec = pod["metadata"], pod["spec"]
            uid = meta["uid"]
            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{meta['name']}"
            try:
                if meta.get("deletionTimestamp"):
                    since = self.deleting_at.setdefault(uid, now)
                    if now - since >= STOP_DELAY:
                        self.api("DELETE", path, {"gracePeriodSeconds": 0})
                    continue
                if not spec.get("nodeName"):
                    self._bind(pod, path)
                    self.bound_at[uid] = now
                    continue
                since = self.bound_at.setdefault(uid, now)
                if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                    continue
                if now - since >= START_DELAY:
                    self._start(pod, path)
            except controlplane.ControlPlaneError as exc:
                if ": 404 " not in str(exc) and ": 409 " not in str(exc):
                    raise
        return listed

    def _bind(self, pod: dict[str, Any], path: str) -> None:
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        self.api(
            "POST",
            path + "/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod["metadata"]["name"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )

    def _start(self, pod: dict[str, Any], path: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        spec = pod["spec"]
        if spec.get("restartPolicy") == "Never":
            state = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "message": "ok",
                    "startedAt": now,
                    "finishedAt": now,
                }
            }
            pod["status"] = {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": state,
                    }
                    for c in spec["containers"]
                ],
            }
        else:
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            }
        self.api("PUT", path + "/status", pod)


def plugin_unavailable(pods: list[dict[str, Any]], nodes: int) -> int:
    """GCU nodes without a ready, non-terminating device plugin pod."""
    ready = set()
    for pod in pods:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        if labels.get(names.COMPONENT_LABEL) != rs.DEVICE_PLUGIN or meta.get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready.add(pod["spec"].get("nodeName"))
    return nodes - len(ready)


def _phase(cp: Any) -> dict[str, Any]:
    gr = cp.get(f"/apis/{rs.GROUP}/v1/{rs.PLURAL}/enflame-gcu-resource") or {}
    return dict(gr.get("status") or {})


def _plugin_images(pods: list[dict[str, Any]]) -> set[str]:
    return {
        p["spec"]["containers"][0]["image"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) == rs.DEVICE_PLUGIN
    }


def _operator(cp: Any, work: str) -> tuple[subprocess.Popen[bytes], str]:
    assert cp.certs is not None
    cert, key = cp.certs.issue("bench-operator", f"/O=system:masters/CN={OPERATOR_USER}")
    kubeconfig = os.path.join(work, "operator.kubeconfig")
    with open(kubeconfig, "w", encoding="utf-8") as handle:
        handle.write(controlplane.kubeconfig_text(cp.server, cp.certs.ca, cert, key, "operator"))
    log = os.path.join(work, "operator.log")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enflame_gcu.gcu_operator.main",
                f"--kubeconfig={kubeconfig}",
                "--namespace=kube-system",
                "--identity=bench",
            ],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": os.path.join(repo, "src")},
        )
    return process, log


def _ready(api: Any, name: str) -> None:
    """What a kubelet does once when it starts: report the node Ready; and what the node
    lifecycle controller then does: lift the not-ready taint the API server put on the new
    node. Neither is repeated (no heartbeats: nothing here would mark the nodes unknown)."""
    path = f"/api/v1/nodes/{name}"
    api("PATCH", path, {"spec": {"taints": None}})
    node = api("GET", path)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    node["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ]
    }
    api("PUT", path + "/status", node)


def _controllers(cp: Any, work: str) -> None:
    """kube-controller-manager with only the controllers the bench needs: the DaemonSet
    controller makes the pods, the garbage collector removes what owners leave, the service
    account controllers make the namespace's default account the pods run as. Not the node
    lifecycle controller: the Node objects have no kubelet heartbeating them, and it would taint
    every node unreachable after its grace period (and the DaemonSet controller would then place
    no new pod: a rollout would stall on a machine that is not there)."""
    assert cp.certs is not None
    cp._spawn(
        "kube-controller-manager",
        [
            os.path.join(cp.bin, "kube-controller-manager"),
            f"--kubeconfig={cp.kubeconfig}",
            f"--authentication-kubeconfig={cp.kubeconfig}",
            f"--authorization-kubeconfig={cp.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--port=0",
            f"--secure-port={controlplane.free_port()}",
            f"--cert-dir={os.path.join(work, 'cm-certs')}",
            "--controllers=daemonset,garbagecollector,serviceaccount,serviceaccount-token",
            f"--service-account-private-key-file={cp.certs.sa_key}",
            f"--root-ca-file={cp.certs.ca}",
            "--use-service-account-credentials=false",
            f"--flex-volume-plugin-dir={os.path.join(work, 'flexvolume')}",
            "--leader-elect=false",
            "--v=1",
        ],
    )


def _until(cp: Any, kubelets: StandInKubelets, done: Any, what: str, limit: float) -> list[Any]:
    start = time.monotonic()
    while True:
        pods = kubelets.tick()
        if done(pods):
            return pods
        if time.monotonic() - start > limit:
            raise RuntimeError(f"{what}: not reached in {limit:.0f} s; status {_phase(cp)}")
        time.sleep(TICK)


def run(nodes: int, idle_seconds: float, rollout: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes}
    with tempfile.TemporaryDirectory(prefix="enflame-operator-scale-") as work:
        policy = os.path.join(work, "audit-policy.json")
        with open(policy, "w", encoding="utf-8") as handle:
            json.dump(audit_policy(), handle)
        audit = os.path.join(work, "audit.log")
        args = [f"--audit-policy-file={policy}", f"--audit-log-path={audit}"]
        with controlplane.ControlPlane(
            controlplane.build(), work, scheduler=False, controller_manager=False,
            apiserver_args=args,
        ) as cp:  # fmt: skip
            _controllers(cp, work)
            cp.wait(
                "the default ServiceAccount",
                lambda: cp.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
                120,
            )
            cp.kubectl("apply", "-f", str(e2e.CRD_FILE))
            for group in (rs.GROUP, rs.LEGACY_GROUP):
                cp.kubectl("wait", "--for=condition=Established", f"crd/{rs.PLURAL}.{group}")
            start = time.monotonic()
            fast = Api(cp)
            for i in range(nodes):
                fast(
                    "POST",
                    "/api/v1/nodes",
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": f"node-{i:04d}",
                            "labels": {"enflame.com/gcu.present": "true"},
                        },
                    },
                )
                _ready(fast, f"node-{i:04d}")
            out["create_nodes_seconds"] = round(time.monotonic() - start, 1)
            cp.api("POST", f"/apis/{rs.GROUP}/v1/{rs.PLURAL}", resource_body())
            operator, log = _operator(cp, work)
            kubelets = StandInKubelets(cp)
            try:
                start = time.monotonic()
                _until(
                    cp,
                    kubelets,
                    lambda _: _phase(cp).get("phase") == "Running",
                    "Running",
                    limit=3600,
                )
                out["deploy_seconds"] = round(time.monotonic() - start, 1)
                # Idle: no kubelet ticks (nothing changes); the server counts what the operator
                # asks meanwhile. The first RAMP seconds hold the back-off's shorter waits
                # (10, 20, 40, 80, 160 s); what follows is the steady state.
                begin, cpu = time.time(), cpu_seconds(operator.pid)
                windows = []
                for start_at, end_at in ((0.0, RAMP), (RAMP, max(RAMP + 60, idle_seconds))):
                    time.sleep(max(0.0, begin + end_at - time.time()))
                    now, used = time.time(), cpu_seconds(operator.pid)
                    window = summarize(
                        audit_requests(audit, begin + start_at, now), now - begin - start_at
                    )
                    window["operator_cpu_percent"] = round(
                        100 * (used - cpu) / (now - begin - start_at), 2
                    )
                    window["from_running_s"] = [start_at, round(now - begin)]
                    windows.append(window)
                    cpu = used
                out["idle"] = windows
                if rollout:
                    out["rollout"] = _rollout(cp, kubelets, audit, nodes)
                out["operator_rss_mib"] = _rss_mib(operator.pid)
            finally:
                operator.terminate()
                try:
                    operator.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    operator.kill()
                    operator.wait()
            with open(log, encoding="utf-8", errors="replace") as handle:
                tail = handle.read()[-600:]
            out["operator_log_tail"] = tail.splitlines()[-3:]
    return out


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _rollout(cp: Any, kubelets: StandInKubelets, audit: str, nodes: int) -> dict[str, Any]:
    allowed = nodes // 10
    target = f"{rs.DEFAULT_REPOSITORY}/enflame-gcu-device-plugin:0.2.0"
    cp.api(
        "PATCH",
        f"/apis/{rs.GROUP}/v1/{rs.PLURAL}/enflame-gcu-resource",
        {"spec": {"devicePlugin": {"version": "0.2.0"}}},
    )
    begin = time.time()
    start = time.monotonic()
    worst = {"unavailable": 0, "upgrading": 0}
    steps = 0

    def done(pods: list[Any]) -> bool:
        nonlocal steps
        steps += 1
        worst["unavailable"] = max(worst["unavailable"], plugin_unavailable(pods, nodes))
        status = _phase(cp)
        upgrading = len((status.get("rollout") or {}).get("upgrading") or [])
        worst["upgrading"] = max(worst["upgrading"], upgrading)
        return status.get("phase") == "Running" and _plugin_images(pods) == {target}

    _until(cp, kubelets, done, "plugin 0.2.0 everywhere", limit=3600)
    seconds = time.monotonic() - start
    requests = audit_requests(audit, begin, time.time())
    writes = collections.Counter(
        f"{e['verb']} {(e.get('objectRef') or {}).get('resource')}"
        for e in requests
        if e.get("verb") in WRITE_VERBS and (e.get("objectRef") or {}).get("resource") != "leases"
    )
    passes = sum(
        1
        for e in requests
        if e.get("verb") == "list"
        and (e.get("objectRef") or {}).get("resource") == rs.PLURAL
        and (e.get("objectRef") or {}).get("apiGroup") == rs.GROUP
    )
    return {
        "max_unavailable": BUDGET,
        "allowed_unavailable_nodes": allowed,
        "seconds": round(seconds, 1),
        "full_passes": passes,
        "requests": len(requests),
        "writes": sum(writes.values()),
        "writes_by_verb_and_resource": dict(sorted(writes.items())),
        "observed_steps": steps,
        "max_nodes_without_ready_plugin": worst["unavailable"],
        "max_upgrading_in_status": worst["upgrading"],
        "budget_held_at_every_step": worst["unavailable"] <= allowed
        and worst["upgrading"] <= allowed,
        "start_delay_s": START_DELAY,
        "stop_delay_s": STOP_DELAY,
    }


def main() -> None:
    if not os.environ.get(controlplane.BIN_DIR_ENV):
        reason = f"${controlplane.BIN_DIR_ENV} is not set (scripts/e2e-build-cluster.sh prints it)"
        json.dump({"benchmark": "operator-scale", "not_run": reason}, sys.stdout)
        sys.stdout.write("\n")
        return
    sizes = [int(n) for n in os.environ.get("ENFLAME_BENCH_NODES", "1000").split(",") if n]
    idle_seconds = float(os.environ.get("ENFLAME_BENCH_IDLE_SECONDS", "360"))
    rollout = os.environ.get("ENFLAME_BENCH_ROLLOUT", "1") != "0"
    runs = []
    for nodes in sizes:
        load_before = os.getloadavg()
        result = run(nodes, idle_seconds, rollout)
        result["load_average_before_after"] = [
            round(load_before[0], 2),
            round(os.getloadavg()[0], 2),
        ]
        runs.append(result)
    json.dump(
        {
            "benchmark": "operator-scale",
            "kubernetes": "1.20 (Debian's source package)",
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "runs": runs,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
