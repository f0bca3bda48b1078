"""podman runs what the DRA driver prepared for a card that appeared after it started, and for
a DRS partition: the per-claim CDI spec, applied by a real CDI-aware engine (issue 26)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.simulation import efsmi_sim, simulate
from tests.dra_plugin import harness
from tests.e2e.conftest import Node, gcu_nodes
from tests.e2e.test_dra_podman import run_podman
from tests.e2e.test_dra_runc import cdi_dir

pytestmark = pytest.mark.runc
DRIVER = resourceslices.DRIVER


def seen(node: Node, cdi_ids: list[str]) -> tuple[list[str], dict[str, str]]:
    result = run_podman(node, cdi_ids)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    listing, _, env = result.stdout.partition(b"---")
    variables = dict(
        line.split("=", 1)
        for line in env.decode().splitlines()
        if line.startswith(("ENFLAME_VISIBLE_DEVICES", "TOPS_VISIBLE_DEVICES"))
    )
    return gcu_nodes(listing), variables


def prepare(node: Node, claim: tuple[str, str, str], device: str, **settings: Any) -> list[str]:
    """Start the driver (health watched), plug gcu3 in if it is out, prepare the claim."""

    async def main() -> list[str]:
        with harness.simulated_node() as sockets:
            source = harness.FakeClaims()
            source.add(harness.claim_document(*claim, [("req", device)]))
            config = dra_config.DraConfig(
                node_name=harness.NODE,
                root=node.root,
                registry_dir=sockets.registry,
                plugin_dir=sockets.plugins,
                cdi_dir=cdi_dir(node),
                health_interval=0.2,
                publish=False,
                **settings,
            )
            async with harness.running(sockets, source, settings=config, watch_health=True) as env:
                await env.kubelet.wait_registered(DRIVER)
                if 3 in simulate.open_node(node.root)[1].unplugged:
                    assert "gcu-3" not in env.devices.published_names()
                    simulate.replug(node.root, 3)
                    for _ in range(200):
                        if "gcu-3" in env.devices.published_names():
                            break
                        await asyncio.sleep(0.05)
                answer = (await env.kubelet.prepare(DRIVER, [claim])).claims[claim[2]]
                assert answer.error == ""
                return [i for d in answer.devices for i in d.cdi_device_ids]

    return asyncio.run(main())


def test_podman_gets_a_card_plugged_in_after_the_driver_started(node: Node) -> None:
    simulate.unplug(node.root, 3)
    claim = ("enflame", "late-card", "4e4c3b1a-0000-4000-8000-0000000000b1")
    cdi_ids = prepare(node, claim, "gcu-3")
    assert seen(node, cdi_ids) == (["gcu3", "gcuctl"], {"ENFLAME_VISIBLE_DEVICES": "3"})


def test_podman_gets_a_drs_partition_as_its_card_and_instance(node: Node) -> None:
    tool = efsmi_sim.install(node.root)
    claim = ("enflame", "drs-part", "4e4c3b1a-0000-4000-8000-0000000000b2")
    cdi_ids = prepare(node, claim, "gcu-5-1g-8gb-0", drs="gcu5", efsmi=tool)
    (instance,) = efsmi_sim.instances(node.root)
    assert seen(node, cdi_ids) == (
        ["gcu5", "gcuctl"],
        {"ENFLAME_VISIBLE_DEVICES": "5", "TOPS_VISIBLE_DEVICES": f"DRS-{instance['uuid']}"},
    )
