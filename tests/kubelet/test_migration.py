"""Moving a node off topscloud (issue 40): a pod that runs under a stand-in for the vendor's
device plugin keeps its cards, and the kubelet its accounting, across migrate's handover of
``enflame.sock`` to our plugin, with the real kubelet (1.20) and no moment without GCUs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from enflame_gcu import devices
from enflame_gcu.container_toolkit import migrate_plugin
from tests.kubelet import harness
from tests.kubelet.test_sighup import CheckpointWatcher

pytestmark = pytest.mark.kubelet

PUSH = "State pushed for device plugin enflame.com/gcu"
# Our plugin's one line on finding a server that takes no lock of ours at the socket path
# (checked before the handover: migrate's own view of "waiting" is read off /proc and holds as
# soon as the process exists, before it has looked at the socket).
STANDING_BY = "does not take"


def _vendor(node: harness.Node) -> subprocess.Popen[bytes]:
    with open(os.path.join(node.work, "vendor-plugin.log"), "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.kubelet.vendor_plugin",
                harness.PLUGIN_DIR,
                node.host_root,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    node.ledger.started(process.pid, sys.executable)
    return process


def test_a_pod_keeps_its_cards_when_migrate_hands_topscloud_s_socket_to_ours(
    node: harness.Node,
) -> None:
    node.up(plugin=False)
    kubelet = node.running_kubelet
    vendor = _vendor(node)
    try:
        node.wait_registered(8)
        held = node.pods.run("held", 2)
        assert len(held.cards) == 2, held.text
        before = {d for h in node.holdings() if h.pod.startswith("held") for d in h.device_ids}
        assert before == set(held.cards)

        node.plugin.start()  # ours stands by while a foreign server holds enflame.sock
        harness.wait_for(
            "our plugin to stand by behind the vendor's socket",
            lambda: STANDING_BY in node.plugin.log(),
            30,
        )
        assert migrate_plugin.inspect("/").state == "vendor-ours-waiting"
        socket = migrate_plugin.inspect("/")
        ours = {card.name for card in devices.discover(node.host_root).cards}
        assert migrate_plugin.check_ids("/", ours) is None

        offset = kubelet.log_size()
        pushed = kubelet.log(offset).count(PUSH)
        watcher = CheckpointWatcher()
        watcher.start()
        try:
            migrate_plugin.hand_over(socket, 30)
            harness.wait_for(
                "our plugin's device list at the kubelet",
                lambda: kubelet.log(offset).count(PUSH) > pushed,
                30,
            )
            node.wait_registered(8)
            vendor.send_signal(signal.SIGTERM)  # the DaemonSet deleted: its stream ends now
            vendor.wait(15)
            time.sleep(1.0)  # a stream's end, if it counted, is logged and applied by now
        finally:
            counts = watcher.stop()
        window = kubelet.log(offset)
        assert counts and min(counts) == 8, f"healthy GCUs per checkpoint version: {counts}"
        assert "Mark all resources Unhealthy" not in window
        assert "Registered endpoint" in window  # ours, on the same socket name
        # The vendor's gRPC server, stopping, unlinked enflame.sock by name (ours by then): our
        # plugin published it again on the stream it had, without registering a second time.
        assert "registration and stream kept" in node.plugin.log()
        assert window.count("Registered endpoint") == 1, window.count("Registered endpoint")

        # The pod runs on, holding the same cards; the kubelet still counts them as taken.
        assert node.pods.status("held").get("phase") == "Running"
        after = {d for h in node.holdings() if h.pod.startswith("held") for d in h.device_ids}
        assert after == before
        rest = node.pods.run("six", 6)
        assert set(rest.cards) == {f"gcu{n}" for n in range(8)} - before, rest.text
    finally:
        if vendor.poll() is None:
            vendor.kill()
            vendor.wait()
