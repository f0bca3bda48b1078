"""SIGHUP reloads the plugin without a moment in which the kubelet holds fewer healthy cards.

Two ways the kubelet (1.20) can lose the cards for a moment, both visible in its own records:

- the plugin sends a list with cards Unhealthy: the kubelet writes its checkpoint on every list
  it gets, with the healthy devices as ``RegisteredDevices``, so a watcher that reads every
  version of that file sees what admission saw;
- the ListAndWatch stream of the registered endpoint ends before a new registration replaced
  it: the kubelet logs ``Mark all resources Unhealthy`` and empties its healthy set in memory
  until the plugin is back (no checkpoint write).

Either way a pod admitted in that window (~30 ms when this was found) failed with
UnexpectedAdmissionError.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


class CheckpointWatcher(threading.Thread):
    """Reads every version of the checkpoint (the kubelet replaces it by rename)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.counts: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        last: tuple[int, int] | None = None
        while not self.stopping.is_set():
            try:
                info = os.stat(harness.CHECKPOINT)
            except FileNotFoundError:
                time.sleep(0.0005)
                continue
            key = (info.st_ino, info.st_mtime_ns)
            if key != last:
                count = harness.registered_count()
                if count >= 0:
                    last = key
                    self.counts.append(count)
            time.sleep(0.0005)

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join(5)
        return self.counts


def test_sighup_never_leaves_the_kubelet_short_of_healthy_cards(node: harness.Node) -> None:
    node.up()
    kubelet = node.running_kubelet
    node.pods.run("two-a", 2)
    offset = kubelet.log_size()
    push = "State pushed for device plugin enflame.com/gcu"
    watcher = CheckpointWatcher()
    watcher.start()
    try:
        for round_ in range(3):
            pushed = kubelet.log(offset).count(push)
            node.plugin.signal(signal.SIGHUP)
            # A reload ends with the plugin's fresh device list reaching the kubelet.

            def pushed_again(before: int = pushed) -> bool:
                return kubelet.log(offset).count(push) > before

            harness.wait_for(f"a device list after SIGHUP {round_ + 1}", pushed_again, 30)
            node.wait_registered(8)
            time.sleep(0.5)  # the old stream's end, if any, is logged by now
    finally:
        counts = watcher.stop()
    window = kubelet.log(offset)
    assert counts, "the watcher saw no checkpoint write"
    assert min(counts) == 8, f"healthy GCUs in each checkpoint version during SIGHUP: {counts}"
    assert "Mark all resources Unhealthy" not in window
    # Admission right after: all eight free cards minus the held pair.
    report = node.pods.run("six", 6)
    assert set(report.cards) == {f"gcu{n}" for n in range(2, 8)}, report.text
