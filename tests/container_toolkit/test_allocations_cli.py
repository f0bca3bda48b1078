"""``enflame-ctk allocations`` against the kubelet stub's PodResources server and a live plugin."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from enflame_gcu.simulation.testing import plugin_process

SHARED = "enflame.com/shared-gcu"
VGCU = "enflame.com/vgcu"
SHARING = """\
version: v1
flags: {resources: [gcu, shared-gcu]}
sharing: {cards: [gcu6], slicesPerCard: 3}
"""


async def ctk(*args: str) -> tuple[int, str, str]:
    """Run enflame-ctk as its own process without blocking the stub's event loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "enflame_gcu.container_toolkit.cli",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def allocations(node: plugin_process.RunningNode, *extra: str) -> tuple[int, str, str]:
    socket = node.pod_resources_socket or os.path.join(node.work, "none", "kubelet.sock")
    return await ctk("allocations", "--root", node.root, "--pod-resources-socket", socket, *extra)


async def document(node: plugin_process.RunningNode, *extra: str) -> dict[str, Any]:
    code, out, err = await allocations(node, "--json", *extra)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def owners(doc: dict[str, Any]) -> dict[str, list[str]]:
    return {
        card["name"]: [f"{h['namespace']}/{h['pod']}/{h['container']}" for h in card["holders"]]
        for card in doc["cards"]
    }


def test_two_pods_show_on_their_cards_and_leave_when_they_go() -> None:
    async def main() -> None:
        async with plugin_process.running_node(pod_resources=True) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 2})
            await node.kubelet.allocate_pod("pod2", {"main": 2}, namespace="ml")
            doc = await document(node)
            assert (doc["schemaVersion"], doc["kind"]) == (1, "Allocations")
            assert "multi_card_pods" not in doc  # camelCase once: no 0.1 twin (issue 50)
            assert doc["cards"][0]["numaNode"] == 0 and doc["summary"]["byLocality"]
            held = {name: who for name, who in owners(doc).items() if who}
            assert held == {
                "gcu0": ["default/pod1/main"],
                "gcu1": ["default/pod1/main"],
                "gcu4": ["ml/pod2/main"],
                "gcu5": ["ml/pod2/main"],
            }
            assert doc["summary"]["multiCardPods"] == 2
            assert doc["summary"]["byLocality"]["switch"] == 2
            # A 1.21+ kubelet also says what it can allocate.
            assert doc["podResources"]["allocatable"]["enflame.com/gcu"] == [
                f"gcu{i}" for i in range(8)
            ]
            code, text, _ = await allocations(node)
            assert code == 0
            lines = text.splitlines()
            assert lines[0].split() == [
                "GCU",
                "MODEL",
                "HEALTH",
                "NUMA",
                "SWITCH",
                "PORT",
                "HELD",
                "BY",
            ]
            gcu4 = next(line for line in lines if line.startswith("gcu4"))
            assert gcu4.split()[-1] == "ml/pod2/main" and " S3 " in gcu4 and " P1 " in gcu4
            assert lines[-1] == "4 of 8 cards held; 2 of 2 multi-card pods switch-local " + (
                "(2 same switch)"
            )

            node.kubelet.delete_pod("pod1")
            doc = await document(node)
            assert {name for name, who in owners(doc).items() if who} == {"gcu4", "gcu5"}
            assert doc["cards"][0]["free"] is True

    asyncio.run(main())


def test_slice_holders_show_on_their_card(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(SHARING)

    async def main() -> None:
        args = ["--config-file", str(config)]
        async with plugin_process.running_node(args=args, pod_resources=True) as node:
            await node.kubelet.wait_for(lambda k: k.capacity(SHARED) == 3, 10, "slices")
            await node.kubelet.allocate_pod("a", {"main": 1}, SHARED)
            await node.kubelet.allocate_pod("b", {"main": 1}, SHARED)
            doc = await document(node)
            gcu6 = next(card for card in doc["cards"] if card["name"] == "gcu6")
            assert sorted((h["pod"], h["resource"]) for h in gcu6["holders"]) == [
                ("a", SHARED),
                ("b", SHARED),
            ]
            assert {h["device"] for h in gcu6["holders"]} <= {f"gcu6-slice{i}" for i in range(3)}
            assert doc["multiCardPods"] == []
            _, text, _ = await allocations(node)
            row = next(line for line in text.splitlines() if line.startswith("gcu6"))
            assert "default/a/main (gcu6-slice" in row and "default/b/main (gcu6-slice" in row

    asyncio.run(main())


def test_vgcu_holders_show_on_their_parent_card_on_a_1_20_kubelet() -> None:
    async def main() -> None:
        async with plugin_process.running_node(
            "vgcu-2card", ["--resources", "vgcu"], pod_resources=True, allocatable_api=False
        ) as node:
            await node.kubelet.allocate_pod("v", {"main": 2}, VGCU)
            doc = await document(node)
            devices = {
                card["name"]: [h["device"] for h in card["holders"]] for card in doc["cards"]
            }
            got = node.kubelet.pods["v"]["main"].device_ids
            parent = {f"vgcu{i}": "gcu0" if i < 4 else "gcu1" for i in range(8)}
            assert devices == {
                card: [d for d in got if parent[d] == card] for card in ("gcu0", "gcu1")
            }
            # A 1.20 kubelet has no GetAllocatableResources: said, not an error.
            assert doc["podResources"]["available"] is True
            assert doc["podResources"]["allocatable"] is None
            assert "Kubernetes < 1.21" in doc["podResources"]["allocatableNote"]

    asyncio.run(main())


def test_without_the_socket_the_cards_show_and_holders_are_not_available() -> None:
    async def main() -> None:
        async with plugin_process.running_node() as node:
            code, text, err = await allocations(node)
            assert code == 1
            assert "PodResources API is not available at" in err
            assert "the socket does not exist" in err
            assert "gcu7" in text and text.splitlines()[-1].startswith("holders unknown")
            # The error once, on stderr, not again in the table on stdout.
            assert "the socket does not exist" not in text
            assert err.count("the socket does not exist") == 1, err
            code, out, err = await allocations(node, "--json")
            assert err.count("the socket does not exist") == 1, err
            doc = json.loads(out)
            assert code == 1 and doc["podResources"]["available"] is False
            assert all(card["holders"] is None for card in doc["cards"])
            assert len(doc["cards"]) == 8

    asyncio.run(main())


def test_only_the_allocations_command_imports_grpc() -> None:
    probe = (
        "import sys\n"
        "from enflame_gcu.container_toolkit import cli\n"
        "cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_names_from_the_kubelet_are_printed_escaped() -> None:
    """Issue 22 item 12: PodResources names went to the terminal raw."""

    async def main() -> None:
        async with plugin_process.running_node(pod_resources=True) as node:
            forged = "p\ngcu7  fake  healthy\x1b[2J"
            await node.kubelet.allocate_pod(forged, {"c\x1b]0;title\x07": 1}, namespace="n\u202e")
            code, text, err = await allocations(node)
            assert code == 0, err
            assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
            assert "n\\u202e/p\\ngcu7  fake  healthy\\x1b[2J/c\\x1b]0;title\\x07" in text
            assert len(text.splitlines()) == 1 + 8 + 1  # header, 8 cards, summary

    asyncio.run(main())


def test_the_default_socket_is_the_one_under_the_host_root() -> None:
    """Issue 22 item 13: with --host-root the default socket was still the host's own."""

    async def main() -> None:
        async with plugin_process.running_node() as node:
            code, _, err = await ctk("allocations", "--host-root", node.root)
            assert code == 1
            assert f"{node.root}/var/lib/kubelet/pod-resources/kubelet.sock" in err

    asyncio.run(main())


def test_dra_claims_show_beside_device_plugin_holders() -> None:
    async def main() -> None:
        async with plugin_process.running_node(pod_resources=True) as node:
            await node.kubelet.allocate_pod("plugin-pod", {"main": 1})
            node.kubelet.add_dra_claim(
                "dra-pod",
                "train",
                ("ml", "part"),
                [("gcu.enflame.com", "gcu-3-1g-8gb-0"), ("other.example.com", "nic-0")],
                namespace="ml",
            )
            node.kubelet.add_dra_claim(
                "dra-pod", "train", ("ml", "whole"), [("gcu.enflame.com", "gcu-6")], "ml"
            )
            doc = await document(node)
            by_card = {card["name"]: card["holders"] for card in doc["cards"]}
            plugin_held = [h for held in by_card.values() for h in held if "claim" not in h]
            assert [(h["pod"], h["resource"]) for h in plugin_held] == [
                ("plugin-pod", "enflame.com/gcu")
            ]
            assert by_card["gcu3"] == [
                {
                    "namespace": "ml",
                    "pod": "dra-pod",
                    "container": "train",
                    "resource": "gcu.enflame.com",
                    "device": "gcu-3-1g-8gb-0",
                    "claim": "ml/part",
                }
            ]
            assert [h["claim"] for h in by_card["gcu6"]] == ["ml/whole"]
            assert doc["unplaced"] == []  # another driver's devices are not ours to show
            code, text, _ = await allocations(node)
            assert code == 0
            (row,) = [line for line in text.splitlines() if line.startswith("gcu3 ")]
            assert row.endswith("ml/dra-pod/train (gcu-3-1g-8gb-0, claim ml/part)")

    asyncio.run(main())
