"""The toolkit's systemd units, for nodes where no toolkit DaemonSet does their work.

- ``enflame-cdi-watch.service`` keeps the CDI specs current (node mode cdi): ``enflame-ctk cdi
  watch``; the DaemonSet does the same in its own process instead.
- ``enflame-dev-char-links.service`` re-creates the ``/dev/char`` links of the GCU nodes at
  boot (runc issue 3671 with the systemd cgroup driver), where udev did not.
- ``enflame-prepared-edits.service`` rewrites the runtime's prepared edits at boot (they live
  in /var/run, emptied by a reboot), so the first creates take the fast path again.

The .deb and .rpm ship all three in /usr/lib/systemd/system (scripts/dist.sh renders them
here); ``deploy/install.sh`` writes them to /etc/systemd/system and enables them. systemctl
runs on the host (chrooted into it from a container) and only where systemd is running;
otherwise the installer says how to start the services by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from enflame_gcu import fileio

UNIT_NAME = "enflame-cdi-watch.service"
UNIT_DIR = "/etc/systemd/system"  # an installer's (a package's go to /usr/lib/systemd/system)
UNIT_PATH = f"{UNIT_DIR}/{UNIT_NAME}"
DEV_CHAR_UNIT = "enflame-dev-char-links.service"
PREPARED_EDITS_UNIT = "enflame-prepared-edits.service"
BOOT_UNITS = (DEV_CHAR_UNIT, PREPARED_EDITS_UNIT)
INSTALLED_BY = (
    "# Installed by enflame-ctk install --mode cdi (deploy/install.sh); removed by uninstall."
)


def render(ctk: str, output_dir: str, by: str = "") -> str:
    """The unit file's text: ``ctk cdi watch`` restarted whenever it stops."""
    return (
        (by or INSTALLED_BY) + "\n"
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


def render_boot(ctk: str, by: str) -> dict[str, str]:
    """The two boot-time units' texts, by unit name; ``by`` is their first (comment) line."""
    return {
        DEV_CHAR_UNIT: (
            f"{by}\n"
            "[Unit]\n"
            "Description=Create /dev/char links for the Enflame GCU device nodes\n"
            "Documentation=https://github.com/opencontainers/runc/issues/3671\n"
            "After=systemd-udev-settle.service systemd-modules-load.service\n"
            "Before=containerd.service crio.service docker.service kubelet.service\n"
            "\n"
            "[Service]\n"
            "Type=oneshot\n"
            f"ExecStart={ctk} system create-dev-char-symlinks\n"
            "RemainAfterExit=yes\n"
            "\n"
            "[Install]\n"
            "WantedBy=multi-user.target\n"
        ),
        PREPARED_EDITS_UNIT: (
            f"{by}\n"
            "[Unit]\n"
            "Description=Write the Enflame GCU runtime's prepared edits (its fast create path)\n"
            "After=systemd-udev-settle.service systemd-modules-load.service\n"
            "Before=containerd.service crio.service docker.service kubelet.service\n"
            "\n"
            "[Service]\n"
            "Type=oneshot\n"
            # The CDI spec itself goes to stdout, discarded: only the prepared edits are wanted.
            f"ExecStart={ctk} cdi generate --output - --prepared-edits config\n"
            "StandardOutput=null\n"
            "\n"
            "[Install]\n"
            "WantedBy=multi-user.target\n"
        ),
    }


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
