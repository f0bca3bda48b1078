"""Restarts: the kubelet's (pods keep their cards, no new Allocate) and the plugin's (SIGKILL)."""

from __future__ import annotations

import os

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet

ALLOCATE_LINE = "Making allocation request for devices"

REGISTRATION_LINE = (
    'Got registration request from device plugin with resource name "enflame.com/gcu"'
)


def _container_state(node: harness.Node, name: str) -> tuple[str, int]:
    status = node.pods.status(name)["containerStatuses"][0]
    return status["containerID"], status["restartCount"]


def _entries() -> list[dict[str, object]]:
    """The kubelet's checkpointed allocations; it writes them in Go map order, so sorted."""
    entries: list[dict[str, object]] = harness.checkpoint()["entries"]
    return sorted(
        entries, key=lambda e: (str(e["pod_uid"]), str(e["container"]), str(e["resource"]))
    )


def test_kubelet_restart_keeps_cards_and_calls_no_allocate(node: harness.Node) -> None:
    node.up()
    node.pods.run("two-a", 2)
    node.pods.run("two-b", 2)
    kubelet = node.running_kubelet
    assert kubelet.log().count(ALLOCATE_LINE) == 2
    held = {name: node.pods.uid(name) for name in ("two-a", "two-b")}
    before = {name: _container_state(node, name) for name in held}
    entries_before = _entries()

    offset = kubelet.restart()
    # The kubelet deleted the plugin's socket on start; the plugin must notice and come back.
    # The restarted kubelet shows the old capacity from its checkpoint at once, so wait for its
    # own log line of the plugin's new registration rather than for the capacity alone.
    harness.wait_for(
        "the restarted kubelet to log the plugin's registration",
        lambda: REGISTRATION_LINE in kubelet.log(offset),
    )
    node.wait_registered(8)
    for name in held:
        node.pods.wait_running(name)
        assert _container_state(node, name) == before[name], "the container was restarted"
    assert _entries() == entries_before
    # A new pod gets the free pair (gcu2/gcu3 would break the manual's rule only if 0,1,4,5
    # were free): the restarted kubelet knows which cards are held.
    report = node.pods.run("two-c", 2)
    assert set(report.cards).isdisjoint({"gcu0", "gcu1", "gcu4", "gcu5"}), report.text
    # Exactly one Allocate after the restart: the new pod's. The old pods were not re-allocated.
    assert kubelet.log(offset).count(ALLOCATE_LINE) == 1, kubelet.log(offset)[-3000:]


def test_plugin_sigkill_and_restart(node: harness.Node) -> None:
    node.up()
    node.pods.run("two-a", 2)
    kubelet = node.running_kubelet
    offset = kubelet.log_size()
    node.plugin.kill()
    assert os.path.exists(harness.PLUGIN_SOCKET), "SIGKILL leaves the socket file behind"
    # The kubelet notices the stream end and marks the resource unhealthy.
    harness.wait_for(
        "the kubelet to mark the cards unhealthy",
        lambda: "Mark all resources Unhealthy for resource enflame.com/gcu" in kubelet.log(offset),
        30,
    )
    # Admission now finds no healthy card (the kubelet keeps that in memory, not in the
    # checkpoint): a pod asking for one is refused, a pod without GCUs shows allocatable 0.
    node.pods.create(harness.pod_manifest("during", [harness.container(gcus=1)]))
    refused = node.pods.wait_failed("during")
    assert "Requested: 1, Available: 0" in refused["message"], refused
    assert node.probe_capacity("probe") == (8, 0)
    node.pods.wait_running("two-a")  # running pods are untouched
    # A restarted plugin must cope with the stale socket and register again.
    node.plugin.start()
    harness.wait_for(
        "the restarted plugin to register",
        lambda: "Got registration request from device plugin" in kubelet.log(offset),
        30,
    )
    node.wait_registered(8)
    assert node.probe_capacity("probe-after") == (8, 8)
    report = node.pods.run("two-b", 2)
    assert set(report.cards) == {"gcu4", "gcu5"}, report.text
    assert "address already in use" not in node.plugin.log()
