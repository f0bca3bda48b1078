"""ENFLAME_VISIBLE_DEVICES lists cards in card order, whatever order the kubelet passes them in.

The kubelet hands Allocate the device IDs of a Go set, in arbitrary order; a value that
followed it (``1,0``) differed from pod to pod for the same cards.
"""

from __future__ import annotations

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def test_visible_devices_are_in_card_order(node: harness.Node) -> None:
    node.up()
    seen: list[tuple[str, str, str]] = []

    def check(name: str, count: int) -> None:
        report = node.pods.run(name, count)
        uid = node.pods.uid(name)
        (entry,) = [e for e in harness.checkpoint()["entries"] if e["pod_uid"] == uid]
        recorded = harness.decode_response(entry["response"])["envs"]["ENFLAME_VISIBLE_DEVICES"]
        seen.append((name, report.visible, recorded))
        minors = [int(item) for item in report.visible.split(",")]
        assert minors == sorted(minors), f"(pod, container env, kubelet checkpoint): {seen}"
        assert recorded == report.visible

    # Several pods: a kubelet order that happens to be sorted once cannot hide the defect.
    for name, count in (("two-a", 2), ("two-b", 2), ("four", 4)):
        check(name, count)
    for name in ("two-a", "two-b", "four"):
        node.pods.delete(name)
    for round_ in range(3):
        check(f"eight-{round_}", 8)
        node.pods.delete(f"eight-{round_}")
