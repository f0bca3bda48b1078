"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, built from Debian's sources by ``scripts/e2e-build-cluster.sh``.

Reusable outside the cluster tier (the scheduler extender benchmark, the operator's e2e)::

    from tests.cluster.controlplane import ControlPlane, build

    bin_dir = build()                      # runs scripts/e2e-build-cluster.sh (cached after once)
    with ControlPlane(bin_dir, "/tmp/my-work") as cp:   # the dir must exist and be empty
        cp.kubectl("get", "namespaces")    # CompletedProcess (check=True by default)
        cp.api("POST", "/api/v1/nodes", {...})  # JSON in, JSON out, admin credentials
        print(cp.kubeconfig)               # an admin kubeconfig for any client

Options: ``scheduler=False`` / ``controller_manager=False`` leave a piece out;
``controller_manager_args`` adds (or, given later, overrides) kube-controller-manager flags;
``scheduler_config`` is a KubeSchedulerConfiguration dict (``kubescheduler.config.k8s.io/v1beta1``;
its ``clientConnection.kubeconfig`` is filled in), e.g. with ``extenders``; ``apiserver_args``
adds flags; ``on_start(pid, argv0)`` is called for each process started (the cluster tier passes
its :class:`tests.kubelet.host.Ledger`'s ``started``, so an interrupted run is still undone).
:meth:`ControlPlane.restart_scheduler` starts kube-scheduler again with another configuration
(the chart's extender scenarios give the cluster's own scheduler an ``extenders`` stanza).

What it sets up (everything under ``work``, nothing elsewhere on the host):

- A CA (openssl), the API server's serving certificate for 127.0.0.1/localhost/the service IP,
  an admin client certificate (``system:masters``), and the service-account key pair and issuer
  kube-apiserver 1.20 needs. :meth:`ControlPlane.node_kubeconfig` issues a kubelet's client
  certificate (``system:node:<name>`` in ``system:nodes``), so the Node authorizer and the
  NodeRestriction admission plugin apply to kubelets as on a real cluster.
- Authorization ``Node,RBAC``; ``--allow-privileged`` (the toolkit DaemonSet is privileged).
- The scheduler and controller manager use the admin credentials and serve their own ports on
  127.0.0.1 only (self-signed, in ``work``).

Every process runs in its own session, is stopped by PID (SIGTERM, then SIGKILL) and logs to
``work/<name>.log``; :meth:`ControlPlane.logs` gives their tails for failure messages.
There is no kube-proxy: a Service's cluster IP does not route, so pods that need the API should
use the host network and ``KUBERNETES_SERVICE_HOST=127.0.0.1`` with the API server's port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_SCRIPT = os.path.join(REPO, "scripts", "e2e-build-cluster.sh")
BIN_DIR_ENV = "ENFLAME_E2E_CLUSTER_DIR"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"


class ControlPlaneError(RuntimeError):
    """A piece did not start or answer; the message holds its log tail."""


def build() -> str:
    """The directory holding ``bin/`` (kube-apiserver, ..., etcd) and ``cni/``.

    ``$ENFLAME_E2E_CLUSTER_DIR`` when set (``make e2e-cluster`` sets it), else the build script's
    answer (a cached build returns at once; a first build takes 10-30 minutes on 2 cores).
    """
    given = os.environ.get(BIN_DIR_ENV)
    if given:
        return given
    result = subprocess.run(
        ["bash", BUILD_SCRIPT], stdout=subprocess.PIPE, text=True, check=True, timeout=7200
    )
    return result.stdout.strip().splitlines()[-1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Certificates:
    """A CA and the keys and certificates of one control plane, as files in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.ca = self.path("ca.crt")
        self.ca_key = self.path("ca.key")
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=enflame-e2e-ca", "-keyout", self.ca_key, "-out", self.ca,
            cwd=directory,
        )  # fmt: skip
        self.sa_key = self.path("sa.key")
        self.sa_pub = self.path("sa.pub")
        _openssl("genrsa", "-out", self.sa_key, "2048", cwd=directory)
        _openssl("rsa", "-in", self.sa_key, "-pubout", "-out", self.sa_pub, cwd=directory)

    def path(self, name: str) -> str:
        """A file of this set."""
        return os.path.join(self.directory, name)

    def issue(
        self, name: str, subject: str, *, server_names: Sequence[str] = ()
    ) -> tuple[str, str]:
        """A key and a certificate signed by the CA: ``(cert, key)``; server names make it a
        serving certificate (IP or DNS subjectAltNames)."""
        key, csr, cert = (
            self.path(f"{name}.key"),
            self.path(f"{name}.csr"),
            self.path(f"{name}.crt"),
        )
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", key, "-out", csr,
            cwd=self.directory,
        )  # fmt: skip
        extensions = self.path(f"{name}.ext")
        with open(extensions, "w", encoding="utf-8") as handle:
            handle.write("basicConstraints=CA:FALSE\n")
            if server_names:
                alt = ",".join(
                    f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in server_names
                )
                handle.write(f"subjectAltName={alt}\nextendedKeyUsage=serverAuth\n")
            else:
                handle.write("extendedKeyUsage=clientAuth\n")
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
            "-days", "2", "-extfile", extensions, "-out", cert,
            cwd=self.directory,
        )  # fmt: skip
        return cert, key


def kubeconfig_text(server: str, ca: str, cert: str, key: str, user: str) -> str:
    """A kubeconfig (JSON is YAML) with one cluster, one user and one current context."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": server, "certificate-authority": ca}}
            ],
            "users": [{"name": user, "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        },
        indent=1,
    )


class ControlPlane:
    """etcd + kube-apiserver [+ kube-scheduler] [+ kube-controller-manager] on 127.0.0.1."""

    def __init__(
        self,
        bin_dir: str,
        work: str,
        *,
        scheduler: bool = True,
        controller_manager: bool = True,
        scheduler_config: Mapping[str, Any] | None = None,
        apiserver_args: Sequence[str] = (),
        controller_manager_args: Sequence[str] = (),
        on_start: Callable[[int, str], None] | None = None,
        verbosity: int = 1,
    ) -> None:
        self.bin = os.path.join(bin_dir, "bin")
        self.work = work
        self.with_scheduler = scheduler
        self.with_controller_manager = controller_manager
        self.scheduler_config = dict(scheduler_config or {})
        self.apiserver_args = list(apiserver_args)
        self.controller_manager_args = list(controller_manager_args)
        self.on_start = on_start
        self.verbosity = verbosity
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = os.path.join(work, "admin.kubeconfig")
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, list[str]] = {}  # each piece's command line, for restart()
        self.certs: Certificates | None = None
        self._ssl: ssl.SSLContext | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 180) -> ControlPlane:
        """Start every piece and wait until the API server is ready (and, with the controller
        manager, until the ``default`` ServiceAccount exists)."""
        os.makedirs(self.work, exist_ok=True)
        certs = self.certs = Certificates(os.path.join(self.work, "pki"))
        serving = certs.issue(
            "apiserver",
            "/CN=kube-apiserver",
            server_names=("127.0.0.1", SERVICE_IP, "localhost", "kubernetes",
                          "kubernetes.default", "kubernetes.default.svc"),
        )  # fmt: skip
        admin = certs.issue("admin", "/O=system:masters/CN=enflame-e2e-admin")
        with open(self.kubeconfig, "w", encoding="utf-8") as handle:
            handle.write(kubeconfig_text(self.server, certs.ca, *admin, "admin"))
        self._ssl = ssl.create_default_context(cafile=certs.ca)
        self._ssl.load_cert_chain(*admin)

        etcd_port, etcd_peer = free_port(), free_port()
        etcd = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                os.path.join(self.bin, "etcd"),
                "--name=e2e",
                f"--data-dir={os.path.join(self.work, 'etcd')}",
                f"--listen-client-urls={etcd}",
                f"--advertise-client-urls={etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{etcd_peer}",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                os.path.join(self.bin, "kube-apiserver"),
                f"--etcd-servers={etcd}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                "--insecure-port=0",
                f"--cert-dir={os.path.join(self.work, 'apiserver-certs')}",
                f"--tls-cert-file={serving[0]}",
                f"--tls-private-key-file={serving[1]}",
                f"--client-ca-file={certs.ca}",
                f"--kubelet-client-certificate={admin[0]}",
                f"--kubelet-client-key={admin[1]}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-account-key-file={certs.sa_pub}",
                f"--service-account-signing-key-file={certs.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--profiling=false",
                f"--v={self.verbosity}",
                *self.apiserver_args,
            ],
        )
        self.wait("the API server to be ready", self._ready, timeout)
        if self.with_controller_manager:
            self._spawn(
                "kube-controller-manager",
                [
                    os.path.join(self.bin, "kube-controller-manager"),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--bind-address=127.0.0.1",
                    "--port=0",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={os.path.join(self.work, 'cm-certs')}",
                    f"--service-account-private-key-file={certs.sa_key}",
                    f"--root-ca-file={certs.ca}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--use-service-account-credentials=false",
                    # Its default, /usr/libexec/kubernetes/..., would be created on the host.
                    f"--flex-volume-plugin-dir={os.path.join(self.work, 'flexvolume')}",
                    "--leader-elect=false",
                    # Loopback nodes with no cloud: do not wait long before acting on a
                    # NotReady node, and do not evict during a short test.
                    "--node-monitor-grace-period=40s",
                    "--pod-eviction-timeout=10m",
                    f"--v={self.verbosity}",
                    *self.controller_manager_args,
                ],
            )
        if self.with_scheduler:
            self._start_scheduler()
        if self.with_controller_manager:
            self.wait(
                "the default ServiceAccount",
                lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout,
            )
        return self

    def _start_scheduler(self) -> None:
        command = [
            os.path.join(self.bin, "kube-scheduler"),
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--port=0",
            f"--secure-port={free_port()}",
            f"--cert-dir={os.path.join(self.work, 'scheduler-certs')}",
            f"--v={self.verbosity}",
        ]
        if self.scheduler_config:
            config = dict(self.scheduler_config)
            config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1beta1")
            config.setdefault("kind", "KubeSchedulerConfiguration")
            config.setdefault("leaderElection", {"leaderElect": False})
            config["clientConnection"] = {
                **dict(config.get("clientConnection") or {}),
                "kubeconfig": self.kubeconfig,
            }
            # With --config, kube-scheduler 1.20 ignores --port=0 and serves healthz and
            # metrics on 0.0.0.0:10251: a second control plane on the machine would collide.
            config.setdefault("healthzBindAddress", f"127.0.0.1:{free_port()}")
            config.setdefault("metricsBindAddress", f"127.0.0.1:{free_port()}")
            path = os.path.join(self.work, "scheduler.yaml")
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(config, handle, indent=1)
            command.append(f"--config={path}")
        else:
            command += [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false"]
        self._spawn("kube-scheduler", command)

    def restart_scheduler(self, config: Mapping[str, Any] | None) -> None:
        """Stop kube-scheduler and start it again with ``config`` (a KubeSchedulerConfiguration
        dict as ``scheduler_config``; None: flags only), e.g. to add or drop ``extenders``."""
        process = self.processes.pop("kube-scheduler", None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.scheduler_config = dict(config or {})
        self._start_scheduler()

    def restart(self, name: str, down_for: float = 0.0) -> float:
        """SIGKILL one piece (``etcd``, ``kube-apiserver``, ``kube-scheduler``,
        ``kube-controller-manager``: no clean shutdown, as a crash), keep it down ``down_for``
        seconds, start it again with the same command line; the seconds it was down."""
        command = self.commands[name]
        process = self.processes.pop(name, None)
        started = time.monotonic()
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(10)
        time.sleep(down_for)
        self._spawn(name, command)
        return time.monotonic() - started

    def stop(self) -> None:
        """Stop every piece by PID, newest first (SIGTERM, SIGKILL after 10 s)."""
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)

    def _spawn(self, name: str, command: list[str]) -> None:
        with open(os.path.join(self.work, f"{name}.log"), "ab") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.processes[name] = process
        self.commands[name] = command
        if self.on_start is not None:
            self.on_start(process.pid, command[0])

    # -- waiting and evidence ---------------------------------------------------------------

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
        """Poll ``probe`` until truthy; ControlPlaneError with the logs (or a piece's exit)."""
        deadline = time.monotonic() + timeout
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited ({process.returncode}) while waiting for {what}:\n"
                        + self.log(name)
                    )
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.2)

    def log(self, name: str, size: int = 3000) -> str:
        """The tail of one piece's log."""
        try:
            with open(os.path.join(self.work, f"{name}.log"), "rb") as handle:
                return handle.read().decode("utf-8", "replace")[-size:]
        except FileNotFoundError:
            return ""

    def logs(self, size: int = 2000) -> str:
        """The tails of every piece's log."""
        return "\n".join(f"--- {name} ---\n{self.log(name, size)}" for name in self.processes)

    def _ready(self) -> bool:
        try:
            return bool(self.request("GET", "/readyz", raw=True) == "ok")
        except (OSError, ControlPlaneError):
            return False

    # -- clients ----------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, *, raw: bool = False, timeout: float = 30
    ) -> Any:
        """One API call with the admin credentials; the decoded JSON (text when ``raw``).
        ControlPlaneError names the status and the server's message."""
        if self._ssl is None:
            raise ControlPlaneError("the control plane is not started")
        data = None if body is None else json.dumps(body).encode()
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        request = urllib.request.Request(  # noqa: S310 (https to our own API server)
            self.server + path, data=data, method=method, headers={"Content-Type": content}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._ssl) as answer:  # noqa: S310
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise ControlPlaneError(f"{method} {path}: {exc.code} {detail}") from None
        return text if raw else json.loads(text)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """:meth:`request` returning decoded JSON."""
        return self.request(method, path, body)

    def get(self, path: str) -> Any:
        """GET, or None when the object does not exist (404)."""
        try:
            return self.request("GET", path)
        except ControlPlaneError as exc:
            if ": 404 " in str(exc):
                return None
            raise

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        stdin: str | None = None,
        timeout: float = 120,
        kubeconfig: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl --kubeconfig <admin> ARGS``; raises ControlPlaneError on failure when
        ``check``."""
        command = [
            os.path.join(self.bin, "kubectl"),
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            *args,
        ]
        result = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def node_kubeconfig(self, node: str, directory: str) -> str:
        """A kubeconfig for the kubelet of ``node`` (its own client certificate)."""
        if self.certs is None:
            raise ControlPlaneError("the control plane is not started")
        cert, key = self.certs.issue(f"node-{node}", f"/O=system:nodes/CN=system:node:{node}")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "kubelet.kubeconfig")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(kubeconfig_text(self.server, self.certs.ca, cert, key, f"node-{node}"))
        return path

    def env(self) -> dict[str, str]:
        """Environment for subprocesses that read ``KUBECONFIG`` (helm, kubectl, clients)."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}


@contextlib.contextmanager
def running(work: str, **options: Any) -> Iterator[ControlPlane]:
    """``with running(work) as cp:`` — :func:`build`, then a started :class:`ControlPlane`."""
    with ControlPlane(build(), work, **options) as plane:
        yield plane
