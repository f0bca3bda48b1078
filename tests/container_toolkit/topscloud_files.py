"""What topscloud leaves on a node, as its manual (seeds 000/001) describes it."""

from __future__ import annotations

from tests.container_toolkit import installer_fixtures as fx

# container-toolkit's daemon.json.template, copied to /etc/docker as the manual says.
DAEMON_JSON = """\
{
"default-runtime": "enflame",
"runtimes": {
"enflame": {
"path": "/usr/bin/enflame-container-runtime",
"runtimeArgs": []
}
},
"registry-mirrors": ["https://mirror.example.com"],
"insecure-registries": ["127.0.0.1/8"],
"max-concurrent-downloads": 10,
"log-driver": "json-file",
"log-level": "warn",
"log-opts": {
"max-size": "30m",
"max-file": "3"
},
"default-shm-size": "1G",
"data-root": "/var/lib/docker"
}
"""

# The FAQ's containerd section ("how to configure containerd"), in a version 2 config.
CONTAINERD = """\
version = 2
# written by provisioning, then edited by hand following the topscloud FAQ

[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "enflame"
disable_snapshot_annotations = true
snapshotter = "overlayfs"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.enflame]
privileged_without_host_devices = false
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.enflame.options]
BinaryName = "/usr/bin/enflame-container-runtime"
SystemdCgroup = true
"""

# A CRI-O drop-in with the vendor's runtime as the default (SPEC §4's names).
CRIO_DROP_IN = """\
[crio.runtime]
default_runtime = "enflame"

[crio.runtime.runtimes.enflame]
runtime_path = "/usr/bin/enflame-container-runtime"
runtime_type = "oci"
"""

# The runtime config its .deb installs; not ours to read (a key ours does not know).
RUNTIME_CONFIG = """\
[enflame-container-runtime]
debug = "/var/log/enflame/enflame-container-runtime/runtime.log"
"""


def seed(root: str, *, docker: bool = True, containerd: bool = True, crio: bool = False) -> None:
    """Give the node under ``root`` what the vendor's installer and manual leave."""
    fx.fake_host(root, docker=docker, containerd=containerd, crio=crio)
    if docker:
        fx.write(root, "/etc/docker/daemon.json", DAEMON_JSON)
    if containerd:
        fx.write(root, "/etc/containerd/config.toml", CONTAINERD)
    if crio:
        fx.write(root, "/etc/crio/crio.conf.d/99-enflame.toml", CRIO_DROP_IN)
    fx.write(root, "/etc/enflame-container-runtime/config.toml", RUNTIME_CONFIG)
    fx.write(root, "/var/log/enflame/enflame-container-runtime/runtime.log", "")
