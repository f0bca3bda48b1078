"""``--telemetry-isolation process``: libefml in a child process. The plugin serves the child's
readings; a child that dies (a libefml crash) leaves the plugin serving, says why on
exporter_up, and is started again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from enflame_gcu.device_plugin import telemetry_child
from enflame_gcu.simulation import efmlsim
from enflame_gcu.simulation.testing import plugin_process
from tests.conftest import MakeNode
from tests.device_plugin.test_metrics import free_port, scrape
from tests.device_plugin.test_telemetry import args, eventually, labelled, values


def wait(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def child(
    make_node: MakeNode, monkeypatch: pytest.MonkeyPatch
) -> Iterator[telemetry_child.ChildCollector]:
    monkeypatch.setattr(telemetry_child, "RESTART_AFTER", 0.2)
    root = make_node("vgcu-2card")
    efmlsim.install(root)
    efmlsim.set_values(root, "card1", {"usage": "33"})
    collector = telemetry_child.ChildCollector(root, 0.2, 5)
    collector.start()
    yield collector
    collector.stop()


def test_the_child_collects_and_a_crashed_child_is_restarted(
    child: telemetry_child.ChildCollector,
) -> None:
    wait(lambda: child.snapshot.up and len(child.snapshot.cards) == 2, "the child's first pass")
    assert child.snapshot.cards[1].usage == 33
    process = child.process
    assert process is not None and process.pid != os.getpid()
    os.kill(process.pid, signal.SIGSEGV)  # what a libefml crash does to its process
    wait(lambda: child.snapshot.cause == "child_exited", "the crash reported")
    assert "exited (-11)" in child.snapshot.reason
    wait(lambda: child.snapshot.up and child.restarts == 1, "the child started again")
    assert child.process is not process


def test_the_plugin_serves_the_childs_readings_and_outlives_it() -> None:
    port = free_port()

    async def main() -> None:
        extra = ["--resources=vgcu", "--telemetry-isolation=process"]
        async with plugin_process.running_node(
            "vgcu-2card", args(port, *extra), pod_resources=True, efml=True
        ) as node:
            efmlsim.set_values(node.root, "card1", {"usage": "44"})
            await eventually(
                lambda: values(scrape(port), "enflame_gcu_usage", card="gcu1") == [44],
                "the child's readings on /metrics",
            )
            children = [
                int(pid)
                for pid in os.listdir("/proc")
                if pid.isdigit() and _is_child(int(pid), plugin_pid(node))
            ]
            assert len(children) == 1
            os.kill(children[0], signal.SIGKILL)
            await eventually(
                lambda: labelled(scrape(port), "enflame_gcu_exporter_up", reason="child_exited"),
                "exporter_up 0 with the reason",
            )
            # The plugin still serves the kubelet: a pod gets a card.
            await node.kubelet.wait_for(
                lambda k: len(k.free("enflame.com/vgcu")) == 8, 10, "the vGCUs listed"
            )
            given = await node.kubelet.allocate_pod(
                "after-crash", {"main": 1}, resource="enflame.com/vgcu"
            )
            assert given["main"].device_ids

    asyncio.run(main())


def _is_child(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except OSError:
        return False
    return int(fields[1]) == parent and b"telemetry_child" in command


def plugin_pid(node: plugin_process.RunningNode) -> int:
    process = node.plugin.process
    assert process is not None
    return process.pid
