"""The systemd service that keeps the CDI specs current where no toolkit DaemonSet runs.

``deploy/install.sh --mode cdi`` installs ``enflame-cdi-watch.service`` (``enflame-ctk cdi
watch``); the DaemonSet does the same work in its own process instead. systemctl runs on the
host (chrooted into it from a container) and only where systemd is running; otherwise the
installer says how to start the service by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from enflame_gcu import fileio

UNIT_NAME = "enflame-cdi-watch.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"


def render(ctk: str, output_dir: str) -> str:
    """The unit file's text: ``ctk cdi watch`` restarted whenever it stops."""
    return (
        "# Installed by enflame-ctk install --mode cdi (deploy/install.sh); removed by uninstall.\n"
        "[Unit]\n"
        "Description=Keep the Enflame GCU CDI specs current (node mode cdi)\n"
        "After=systemd-udevd.service\n"
        "\n"
        "[Service]\n"
        f"ExecStart={ctk} cdi watch --output {output_dir}\n"
        "Restart=always\n"
        "RestartSec=1\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def usable(root: str) -> bool:
    """Whether systemd runs on the host under ``root`` and its systemctl can be reached."""
    running = os.path.isdir(fileio.resolve(root, "/run/systemd/system"))
    if root in ("", "/"):
        return running and shutil.which("systemctl") is not None
    found = any(
        os.path.exists(fileio.resolve(root, p)) for p in ("/usr/bin/systemctl", "/bin/systemctl")
    )
    return running and found


def systemctl(root: str, *args: str) -> str | None:
    """Run ``systemctl ARGS`` on the host; None when it worked, else what went wrong."""
    command = ["systemctl", *args]
    if root not in ("", "/"):
        command = ["chroot", root, *command]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if result.returncode != 0:
        return (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
    return None
