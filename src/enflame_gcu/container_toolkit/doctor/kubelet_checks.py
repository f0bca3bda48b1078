"""Doctor checks of the kubelet side: its device-plugin dir and sockets, swap, CPU manager."""

from __future__ import annotations

import os
import socket
import stat

from enflame_gcu import fileio, node_modes
from enflame_gcu.container_toolkit.doctor import processes
from enflame_gcu.container_toolkit.doctor.model import Node, Result, Status

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


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
    # ``local`` comes from Node.path: a symlinked socket was already followed inside the root.
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
        fix = (
            "kubectl -n kube-system get pods -o wide "
            "-l app.kubernetes.io/name=enflame-device-plugin   # one here? (labels, taints)"
        )
        return [Result("plugin-socket", "warn", detail, fix)]
    if state != "listening":
        detail = f"{path} is {state}: nobody listens (bind: address already in use on restart)"
        fix = f"rm {path} && systemctl restart kubelet   # then restart the device plugin pod"
        return [Result("plugin-socket", "fail", detail, fix)]
    return [Result("plugin-socket", "pass", f"the device plugin serves {path}")]


def check_swap(node: Node) -> list[Result]:
    """Swap is off, as the kubelet (and the vendor manual) require."""
    if not os.path.isdir(node.path("/var/lib/kubelet")):
        return []  # no kubelet here: the kubelet check says so, nothing to pass
    try:
        text = fileio.read_regular(node.path("/proc/swaps"), 1 << 20).decode("utf-8", "replace")
        lines = text.splitlines()[1:]
    except OSError as exc:
        return [Result("swap", "warn", f"cannot read /proc/swaps: {exc.strerror}", "swapon --show")]
    active = [line.split()[0] for line in lines if line.strip()]
    if not active:
        return [Result("swap", "pass", "swap is off")]
    fix = "swapoff -a   # and comment out the swap lines in /etc/fstab"
    failing = processes.kubelet_setting(node, "failSwapOn", "--fail-swap-on")
    tolerated = str(failing).lower() == "false"
    status: Status = "warn" if tolerated else "fail"
    note = " (the kubelet tolerates it: failSwapOn is false)" if tolerated else ""
    return [Result("swap", status, f"swap is on: {', '.join(active)}{note}", fix)]


def _mode_passes_specs(node: Node, plugin_flags: list[tuple[str, str]]) -> bool:
    """Whether the plugin's --node-mode makes it pass DeviceSpecs (unless told otherwise)."""
    if any(name == "--no-pass-device-specs" for name, _ in plugin_flags):
        return False
    asked = next((value for name, value in plugin_flags if name == "--node-mode"), "")
    if asked == node_modes.AUTO:
        try:
            record = node_modes.read(node.root)
        except ValueError:
            return False
        asked = record.mode if record else node_modes.FALLBACK
    row = node_modes.MODES.get(asked)
    return row is not None and row.pass_device_specs


def check_cpu_manager(node: Node) -> list[Result]:
    """With cpuManagerPolicy static, the plugin must pass device specs (compat manifest)."""
    if not os.path.isdir(node.path("/var/lib/kubelet")):
        return []  # no kubelet here: the kubelet check says so, nothing to pass
    if not processes.kubelet_known(node):
        detail = (
            f"no kubelet running and no {processes.KUBELET_CONFIG}: cannot tell its "
            "cpuManagerPolicy"
        )
        return [Result("cpu-manager", "warn", detail, "systemctl status kubelet")]
    policy = processes.kubelet_setting(node, "cpuManagerPolicy", "--cpu-manager-policy") or "none"
    if policy != "static":
        return [Result("cpu-manager", "pass", f"kubelet cpuManagerPolicy is {policy}")]
    plugin_flags = list(processes.flags(node, "enflame-device-plugin"))
    passes = processes.plugin_switch(
        node, "--pass-device-specs", "PASS_DEVICE_SPECS", "passDeviceSpecs"
    )
    if passes:
        detail = "cpuManagerPolicy static, and the device plugin passes device specs"
        return [Result("cpu-manager", "pass", detail)]
    if _mode_passes_specs(node, plugin_flags):
        detail = (
            "cpuManagerPolicy static, and the plugin passes DeviceSpecs (node mode device-specs)"
        )
        return [Result("cpu-manager", "pass", detail)]
    detail = (
        "cpuManagerPolicy static rewrites container cgroups: GCUs the runtime injected lose "
        "access (efml: HAL initialization failed) unless the plugin runs --pass-device-specs"
    )
    if passes is None:
        detail += " (no device plugin process found on this node to check)"
    fix = (
        "helm upgrade enflame-gcu <chart> -n kube-system --reuse-values "
        "--set devicePlugin.passDeviceSpecs=true   # static manifests: "
        "kubectl apply -f enflame-device-plugin-compat-with-cpumanager.yaml"
    )
    return [Result("cpu-manager", "warn", detail, fix)]
