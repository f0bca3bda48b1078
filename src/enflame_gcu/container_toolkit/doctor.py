"""``enflame-ctk doctor``: the vendor manual's FAQ as checks, each with the exact fix.

Every path is read under a host root, so the same checks run on ``/``, on ``/host`` in a pod
and on a simulated node. A check never raises for what it finds; it returns Results.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import socket
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from enflame_gcu import devices, fileio
from enflame_gcu.container_toolkit import dev_char, runtime_config
from enflame_gcu.container_toolkit.engines import base, containerd, crio, formats, hosts
from enflame_gcu.errors import EnflameError

Status = Literal["pass", "warn", "fail"]
RANK: dict[str, int] = {"pass": 0, "warn": 1, "fail": 2}

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
RUNTIME_PATH = base.DEFAULT_RUNTIME_PATH
RUNC_PATHS = ("/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc")
RELOAD_BUG = ((1, 1, 3), (1, 1, 6))  # runc versions that drop devices on daemon-reload (#3671)
RELOAD_DRIVER = "rmmod enflame && modprobe enflame   # then see: dmesg | grep -i enflame"


@dataclass(frozen=True, slots=True)
class Result:
    """One check's verdict; ``fix`` is the command (or step) that resolves a warn or fail."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class EngineView:
    """What an engine's config says about the enflame runtime."""

    engine: str
    runtime_path: str | None
    is_default: bool
    systemd_cgroup: bool | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Node:
    """Everything the checks share: the root, the GCU inventory and the engines' configs."""

    root: str
    inventory: devices.Inventory
    engines: tuple[EngineView, ...]
    processes: tuple[tuple[str, ...], ...]

    def path(self, host_path: str) -> str:
        """``host_path`` as seen from here."""
        return fileio.host_path(self.root, host_path)


def _configure_fix(engine: str) -> str:
    return f"enflame-ctk runtime configure --runtime {engine} --set-as-default --restart"


def check_driver(node: Node) -> list[Result]:
    """The enflame kernel module is loaded and every Enflame PCI function is bound to it."""
    inventory = node.inventory
    if not inventory.driver_loaded:
        return [
            Result(
                "driver",
                "fail",
                f"not loaded: {devices.DRIVER_VERSION_FILE} is missing",
                "install the Enflame driver package, then: modprobe enflame",
            )
        ]
    if inventory.unbound:
        return [
            Result(
                "driver",
                "fail",
                f"driver {inventory.driver_version} loaded, but not bound to "
                + ", ".join(inventory.unbound),
                RELOAD_DRIVER,
            )
        ]
    return [Result("driver", "pass", f"enflame driver {inventory.driver_version} loaded")]


def check_devices(node: Node) -> list[Result]:
    """``/dev/gcu*`` and ``/dev/gcuctl`` exist and match sysfs."""
    inventory = node.inventory
    if not inventory.cards:
        detail = "no GCU found (no enflame/gcuN entry under /sys/bus/pci/devices)"
        return [
            Result("devices", "fail", detail, "lspci -d 1e36:   # cards seen? " + RELOAD_DRIVER)
        ]
    problems = [
        f"{card.name}: {'; '.join(card.problems)}" for card in inventory.cards if card.problems
    ]
    if not inventory.control.present:
        problems.append(f"{devices.CONTROL_NODE} is missing (every GCU container needs it)")
    if problems:
        return [Result("devices", "fail", " | ".join(problems), RELOAD_DRIVER)]
    names = [card.name for card in inventory.cards]
    models = sorted({card.model for card in inventory.cards})
    detail = (
        f"{len(names)} card(s) {', '.join(names)} ({', '.join(models)}) and {devices.CONTROL_NODE}"
    )
    return [Result("devices", "pass", detail + "; nodes match sysfs")]


def _ours(runtimes: Any, path_of: Callable[[Any], Any]) -> tuple[str | None, str | None]:
    """(name, binary) of the runtime entry that runs enflame-container-runtime, if any."""
    if not isinstance(runtimes, dict):
        return None, None
    for name, entry in runtimes.items():
        binary = path_of(entry) if isinstance(entry, dict) else None
        if isinstance(binary, str) and binary.endswith("enflame-container-runtime"):
            return name, binary
    return None, None


def _toml(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return dict(formats.plain(formats.FORMATS["toml"].parse(handle.read(), path)))


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _docker_view(node: Node) -> EngineView:
    path = node.path(hosts.DEFAULT_CONFIGS["docker"])
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    name, binary = _ours(data.get("runtimes"), lambda entry: entry.get("path"))
    options = " ".join(str(o) for o in data.get("exec-opts") or [])
    systemd = "cgroupdriver=systemd" in options or None
    default = name is not None and data.get("default-runtime") == name
    return EngineView("docker", binary, default, systemd)


def _containerd_view(node: Node) -> EngineView:
    path = node.path(hosts.DEFAULT_CONFIGS["containerd"])
    document = _toml(path)
    for pattern in document.get("imports") or []:
        # containerd merges imported files over the main config (drop-ins of version 3).
        for imported in sorted(glob.glob(node.path(pattern))):
            _merge(document, _toml(imported))
    version = containerd.config_version(document, path)
    table = base.lookup(document, (*containerd.CRI_TABLE[version], "containerd")) or {}
    runtimes = table.get("runtimes") or {}
    name, binary = _ours(runtimes, lambda entry: (entry.get("options") or {}).get("BinaryName"))
    runc = base.lookup(runtimes, ("runc", "options", "SystemdCgroup"))
    problem = None
    ours = base.lookup(runtimes, (name, "options", "SystemdCgroup")) if name else None
    if name is not None and runc is True and ours is not True:
        problem = (
            f"runc uses SystemdCgroup = true but runtime {name!r} does not: its pods "
            "crash-loop on systemd hosts"
        )
    default = name is not None and table.get("default_runtime_name") == name
    return EngineView("containerd", binary, default, runc if runc is not None else None, problem)


def _crio_view(node: Node) -> EngineView:
    config = node.path(hosts.DEFAULT_CONFIGS["crio"])
    runtime = crio.effective_runtime_config(config, skip="")
    name, binary = _ours(runtime.get("runtimes"), lambda entry: entry.get("runtime_path"))
    default = name is not None and runtime.get("default_runtime") == name
    # CRI-O's cgroup_manager defaults to systemd.
    systemd = runtime.get("cgroup_manager", "systemd") == "systemd"
    return EngineView("crio", binary, default, systemd)


VIEWS: dict[str, Callable[[Node], EngineView]] = {
    "docker": _docker_view,
    "containerd": _containerd_view,
    "crio": _crio_view,
}


def read_engines(root: str) -> tuple[EngineView, ...]:
    """What each engine found under ``root`` has configured for the enflame runtime."""
    views = []
    probe = Node(root, devices.Inventory(root, None, (), devices.DeviceNode("")), (), ())
    for engine in hosts.detect(root):
        config = hosts.DEFAULT_CONFIGS[engine]
        try:
            views.append(VIEWS[engine](probe))
        except FileNotFoundError:
            views.append(EngineView(engine, None, False, None, f"{config} does not exist"))
        except (OSError, ValueError, EnflameError) as exc:
            views.append(EngineView(engine, None, False, None, f"cannot read {config}: {exc}"))
    return tuple(views)


def check_engines(node: Node) -> list[Result]:
    """Each engine knows the enflame runtime, keeps SystemdCgroup and uses it by default."""
    if not node.engines:
        detail = "no docker, containerd or CRI-O found (binaries, /etc dirs or sockets)"
        return [
            Result("engine", "warn", detail, "install a container engine, then: deploy/install.sh")
        ]
    results = []
    for view in node.engines:
        name, fix = f"engine-{view.engine}", _configure_fix(view.engine)
        if view.runtime_path is None:
            detail = view.problem or "no runtime entry runs enflame-container-runtime"
            results.append(Result(name, "fail", detail, fix))
        elif view.problem:
            results.append(Result(name, "fail", view.problem, fix))
        elif not view.is_default:
            detail = (
                f"enflame runtime ({view.runtime_path}) configured but not the default: pods get "
                "GCUs only through the default runtime or a RuntimeClass with handler enflame"
            )
            results.append(Result(name, "warn", detail, fix))
        else:
            detail = f"enflame runtime {view.runtime_path} is the default runtime"
            results.append(Result(name, "pass", detail))
    return results


def _resolve(node: Node, host_path: str) -> str:
    """Follow symlinks the way the host would, staying under the root."""
    path = host_path
    for _ in range(40):
        local = node.path(path)
        if not os.path.islink(local):
            return local
        target = os.readlink(local)
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return node.path(path)


def check_runtime_binary(node: Node) -> list[Result]:
    """The runtime the engines point at (default /usr/bin/...) exists, runs, has its interpreter."""
    paths = sorted({v.runtime_path for v in node.engines if v.runtime_path} or {RUNTIME_PATH})
    fix = "deploy/install.sh   # or the enflame-container-toolkit DaemonSet"
    problems = []
    for path in paths:
        local = _resolve(node, path)
        if not os.path.isfile(local):
            problems.append(f"{path} does not exist")
        elif not os.access(local, os.X_OK):
            problems.append(f"{path} is not executable")
        else:
            with open(local, "rb") as handle:
                first = handle.readline(200)
            if first.startswith(b"#!"):
                interpreter = first[2:].split()[0].decode("utf-8", "replace")
                if not os.path.exists(_resolve(node, interpreter)):
                    problems.append(f"{path} needs {interpreter}, which does not exist")
    if problems:
        return [Result("runtime-binary", "fail", "; ".join(problems), fix)]
    return [Result("runtime-binary", "pass", f"{', '.join(paths)} installed")]


def check_runtime_config(node: Node) -> list[Result]:
    """The runtime's config file parses (a missing one means defaults)."""
    path = runtime_config.DEFAULT_PATH
    if not os.path.exists(node.path(path)):
        return [Result("runtime-config", "pass", f"{path} absent: built-in defaults apply")]
    try:
        runtime_config.load(node.path(path))
    except EnflameError as exc:
        return [Result("runtime-config", "fail", str(exc), f"fix or remove {path}")]
    return [Result("runtime-config", "pass", f"{path} is valid")]


def _runc_version(local: str) -> tuple[int, int, int] | None:
    try:
        result = subprocess.run(
            [local, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"runc version (\d+)\.(\d+)\.(\d+)", result.stdout)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def check_runc(node: Node) -> list[Result]:
    """runc 1.1.3-1.1.6 + systemd cgroups: devices need /dev/char links to survive daemon-reload."""
    found = next((p for p in RUNC_PATHS if os.path.isfile(node.path(p))), None)
    if found is None:
        return [
            Result("runc", "warn", f"no runc in {', '.join(RUNC_PATHS)}", "apt-get install runc")
        ]
    version = _runc_version(node.path(found))
    if version is None:
        return [Result("runc", "warn", f"cannot tell the version of {found}", f"{found} --version")]
    shown = ".".join(map(str, version))
    if not RELOAD_BUG[0] <= version <= RELOAD_BUG[1]:
        return [Result("runc", "pass", f"runc {shown}: not affected by runc issue 3671")]
    links = dev_char.plan(node.root)
    if not links:
        return [Result("runc", "pass", f"runc {shown}: no GCU device nodes to keep (issue 3671)")]
    missing = [
        f"{link} -> {target}"
        for link, target in links
        if not (os.path.islink(node.path(link)) and os.readlink(node.path(link)) == target)
    ]
    if not missing:
        return [Result("runc", "pass", f"runc {shown} with /dev/char links for every GCU node")]
    systemd = (
        any(v.systemd_cgroup for v in node.engines)
        or _kubelet_setting(node, "cgroupDriver", "--cgroup-driver") == "systemd"
    )
    detail = (
        f"runc {shown} drops GCU access on `systemctl daemon-reload` (runc issue 3671) unless "
        f"/dev/char links exist; missing: {', '.join(missing)}"
    )
    if not systemd:
        detail += " (only with the systemd cgroup driver, which doctor could not confirm)"
    fix = "enflame-ctk system create-dev-char-symlinks   # or upgrade runc to 1.1.7+"
    return [Result("runc", "fail" if systemd else "warn", detail, fix)]


def _listening(path: str) -> bool:
    """True when something accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        directory_fd = None
        try:
            if len(path) > 100:  # sun_path holds 108 bytes; go through the directory's fd
                directory_fd = os.open(os.path.dirname(path), os.O_PATH)
                path = f"/proc/self/fd/{directory_fd}/{os.path.basename(path)}"
            sock.connect(path)
            return True
        except OSError:
            return False
        finally:
            if directory_fd is not None:
                os.close(directory_fd)


def _socket_state(local: str) -> str:
    try:
        mode = os.lstat(local).st_mode
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISSOCK(mode):
        return "not a socket"
    return "listening" if _listening(local) else "stale"


def check_kubelet(node: Node) -> list[Result]:
    """The kubelet's device-plugin dir exists and it serves kubelet.sock there."""
    if not os.path.isdir(node.path("/var/lib/kubelet")):
        detail = "no /var/lib/kubelet: not a Kubernetes node (or a non-default --root-dir)"
        return [
            Result("kubelet", "warn", detail, "join the node to the cluster (kubeadm join ...)")
        ]
    if not os.path.isdir(node.path(PLUGIN_DIR)):
        detail = f"{PLUGIN_DIR} is missing: the kubelet has not started its device manager"
        return [Result("kubelet", "fail", detail, "systemctl restart kubelet")]
    state = _socket_state(node.path(f"{PLUGIN_DIR}/kubelet.sock"))
    if state != "listening":
        detail = f"{PLUGIN_DIR}/kubelet.sock is {state}: the kubelet is not running"
        return [
            Result("kubelet", "fail", detail, "systemctl restart kubelet; journalctl -u kubelet")
        ]
    return [Result("kubelet", "pass", f"kubelet serves {PLUGIN_DIR}/kubelet.sock")]


def check_plugin_socket(node: Node) -> list[Result]:
    """``enflame.sock`` is served by a live device plugin, not left stale."""
    if not os.path.isdir(node.path(PLUGIN_DIR)):
        return []
    path = f"{PLUGIN_DIR}/enflame.sock"
    state = _socket_state(node.path(path))
    if state == "missing":
        detail = "no enflame.sock: the device plugin is not running on this node"
        return [
            Result(
                "plugin-socket",
                "warn",
                detail,
                "kubectl apply -f deploy/yaml/enflame-device-plugin.yaml",
            )
        ]
    if state != "listening":
        detail = f"{path} is {state}: nobody listens (bind: address already in use on restart)"
        fix = f"rm {path} && systemctl restart kubelet   # then restart the device plugin pod"
        return [Result("plugin-socket", "fail", detail, fix)]
    return [Result("plugin-socket", "pass", f"the device plugin serves {path}")]


def read_processes(root: str) -> tuple[tuple[str, ...], ...]:
    """Command lines of the processes under ``root``/proc (the host's, with hostPID)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(fileio.host_path(root, "/proc")):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                with open(fileio.host_path(root, f"/proc/{entry}/cmdline"), "rb") as handle:
                    words = handle.read().decode("utf-8", "replace").split("\0")
                if words and words[0]:
                    found.append(tuple(w for w in words if w))
    return tuple(found)


def _flags(node: Node, program: str) -> Iterator[tuple[str, str]]:
    """``(--flag, value)`` pairs of running ``program`` processes (``--a=b`` and ``--a b``)."""
    for words in node.processes:
        if os.path.basename(words[0]) != program:
            continue
        for index, word in enumerate(words[1:], start=1):
            name, sep, value = word.partition("=")
            if not sep and index + 1 < len(words) and not words[index + 1].startswith("-"):
                value = words[index + 1]
            yield name, value


def _kubelet_setting(node: Node, key: str, flag: str) -> Any:
    """A kubelet setting: its command-line flag wins over its config file."""
    for name, value in _flags(node, "kubelet"):
        if name == flag:
            return value
    config = dict(_flags(node, "kubelet")).get("--config", KUBELET_CONFIG)
    try:
        with open(node.path(config), encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        return None
    return data.get(key) if isinstance(data, dict) else None


def check_swap(node: Node) -> list[Result]:
    """Swap is off, as the kubelet (and the vendor manual) require."""
    try:
        with open(node.path("/proc/swaps"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError as exc:
        return [Result("swap", "warn", f"cannot read /proc/swaps: {exc.strerror}", "swapon --show")]
    active = [line.split()[0] for line in lines if line.strip()]
    if not active:
        return [Result("swap", "pass", "swap is off")]
    fix = "swapoff -a   # and comment out the swap lines in /etc/fstab"
    tolerated = str(_kubelet_setting(node, "failSwapOn", "--fail-swap-on")).lower() == "false"
    status: Status = "warn" if tolerated else "fail"
    note = " (the kubelet tolerates it: failSwapOn is false)" if tolerated else ""
    return [Result("swap", status, f"swap is on: {', '.join(active)}{note}", fix)]


def check_cpu_manager(node: Node) -> list[Result]:
    """With cpuManagerPolicy static, the plugin must pass device specs (compat manifest)."""
    policy = _kubelet_setting(node, "cpuManagerPolicy", "--cpu-manager-policy") or "none"
    if policy != "static":
        return [Result("cpu-manager", "pass", f"kubelet cpuManagerPolicy is {policy}")]
    if any(name == "--pass-device-specs" for name, _ in _flags(node, "enflame-device-plugin")):
        detail = "cpuManagerPolicy static, and the device plugin runs with --pass-device-specs"
        return [Result("cpu-manager", "pass", detail)]
    detail = (
        "cpuManagerPolicy static rewrites container cgroups: GCUs the runtime injected lose "
        "access (efml: HAL initialization failed) unless the plugin runs --pass-device-specs"
    )
    fix = "kubectl apply -f deploy/yaml/enflame-device-plugin-compat-with-cpumanager.yaml"
    return [Result("cpu-manager", "warn", detail, fix)]


CHECKS: tuple[Callable[[Node], list[Result]], ...] = (
    check_driver,
    check_devices,
    check_runtime_binary,
    check_runtime_config,
    check_engines,
    check_runc,
    check_kubelet,
    check_plugin_socket,
    check_swap,
    check_cpu_manager,
)


def inspect(root: str = "/") -> Node:
    """Read everything the checks need from the node under ``root``."""
    return Node(root, devices.discover(root), read_engines(root), read_processes(root))


def run(root: str = "/") -> list[Result]:
    """Every check's results for the node under ``root``, in FAQ order."""
    node = inspect(root)
    return [result for check in CHECKS for result in check(node)]


def worst(results: list[Result]) -> Status:
    """The most severe status among ``results`` (pass when there are none)."""
    return max((r.status for r in results), key=RANK.__getitem__, default="pass")
