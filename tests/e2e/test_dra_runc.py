"""DRA end to end on the node: stub kubelet Prepare -> per-claim CDI spec -> a real container.

The claim is what the scheduler would allocate for the switch-local example (our allocator
stand-in picks it from the published devices); the driver prepares it for the stub kubelet
over gRPC; the container is started by our runtime in front of the real runc, either with a
``cdi.k8s.io/<driver>_<claim UID>`` container annotation (the runtime resolves the CDI names
itself; kubelets before 1.31 sent it, current ones pass CDI names only through the CRI, which
containerd 1.6 ignores: see docs/dra.md) or with the CDI spec applied by a CDI-aware engine
first (test_dra_podman.py does that with a real podman).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from enflame_gcu import devices, resourceslices
from enflame_gcu.dra_plugin import claim_cdi
from enflame_gcu.dra_plugin import config as dra_config
from tests.dra_plugin import allocator, harness, slices_helpers
from tests.e2e import kubelet_emulation
from tests.e2e.conftest import Node, gcu_nodes, write_runtime_config
from tests.shim.schemas import assert_valid_cdi

pytestmark = pytest.mark.runc
DRIVER = resourceslices.DRIVER
CDI_DIR = "/var/run/cdi"  # under the simulated node's root, as the runtime resolves it


def prepare(node: Node, claim: tuple[str, str, str], example: str) -> tuple[list[str], list[str]]:
    """Allocate ``example`` on the node, prepare it through the stub kubelet; (devices, CDI ids)."""
    inventory = devices.discover(node.root)
    published = resourceslices.node_devices(inventory, {c.name: True for c in inventory.cards})
    picked = allocator.allocate(
        slices_helpers.example(example), slices_helpers.device_classes(), published
    )
    assert picked is not None
    results = [(request, device) for request, names in picked.items() for device in names]
    return prepare_results(node, claim, results)


PreparedDevice = tuple[tuple[str, ...], str, tuple[str, ...]]  # request names, device, CDI ids


def prepare_results(
    node: Node,
    claim: tuple[str, str, str],
    results: list[tuple[str, str]] | list[dict[str, Any]],
    shared_slices: int = 0,
) -> tuple[list[str], list[str]]:
    """Prepare a claim allocated to ``results`` through the stub kubelet; (devices, CDI ids)."""
    answer = prepare_devices(node, claim, results, shared_slices)
    return [device for _, device, _ in answer], kubelet_cdi_ids(answer)


def prepare_devices(
    node: Node,
    claim: tuple[str, str, str],
    results: list[tuple[str, str]] | list[dict[str, Any]],
    shared_slices: int = 0,
    pods: int = 1,
) -> list[PreparedDevice]:
    """The driver's answer for the claim, asked once per pod that uses it (all must agree)."""

    async def main() -> list[PreparedDevice]:
        with harness.simulated_node() as sockets:  # short paths for the unix sockets
            source = harness.FakeClaims()
            source.add(harness.claim_document(*claim, results))
            settings = dra_config.DraConfig(
                node_name=harness.NODE,
                root=node.root,
                registry_dir=sockets.registry,
                plugin_dir=sockets.plugins,
                cdi_dir=cdi_dir(node),
                shared_slices=shared_slices,
                publish=False,
            )
            async with harness.running(sockets, source, settings=settings) as env:
                await env.kubelet.wait_registered(DRIVER)
                answers = []
                for _ in range(pods):
                    answer = (await env.kubelet.prepare(DRIVER, [claim])).claims[claim[2]]
                    assert answer.error == ""
                    answers.append(
                        [
                            (tuple(d.request_names), d.device_name, tuple(d.cdi_device_ids))
                            for d in answer.devices
                        ]
                    )
                assert all(a == answers[0] for a in answers)
                return answers[0]

    return asyncio.run(main())


def kubelet_cdi_ids(devices: list[PreparedDevice], request: str = "") -> list[str]:
    """The CDI names the kubelet gives a container that uses the claim (or one request of it)."""
    return [
        cdi_id
        for names, _, ids in devices
        if not request or not names or request in names
        for cdi_id in ids
    ]


def cdi_dir(node: Node) -> str:
    """The node's /var/run/cdi, where the driver writes and the runtime reads claim specs."""
    return os.path.join(node.root, CDI_DIR.lstrip("/"))


def claim_spec(node: Node, uid: str) -> dict[str, Any]:
    path = claim_cdi.spec_path(cdi_dir(node), uid)
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def configure_runtime(node: Node, strict: bool = False) -> None:
    write_runtime_config(
        node.config,
        runtimes=[node.tools.runc],
        root=node.root,
        cdi_spec_dirs=[CDI_DIR],
        accept_envvar_when_unprivileged=not strict,
        log_file=os.path.join(node.workdir, "runtime.log"),
    )


def run(node: Node, bundle: str) -> tuple[list[str], dict[str, str]]:
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    listing, _, env = result.stdout.partition(b"---")
    variables = dict(
        line.split("=", 1) for line in env.decode().splitlines() if line.startswith("ENFLAME_")
    )
    return gcu_nodes(listing), variables


ARGS = ["sh", "-c", "ls /dev; echo ---; env"]


def test_switch_local_claim_reaches_a_real_container_through_the_kubelet_annotation(
    node: Node,
) -> None:
    configure_runtime(node)
    claim = ("enflame", "pair", "4e4c3b1a-0000-4000-8000-000000000001")
    names, cdi_ids = prepare(node, claim, "two-gcus-one-switch")
    assert names == ["gcu-0", "gcu-1"]  # the manual's first switch-local pair
    assert cdi_ids == [f"k8s.gcu.enflame.com/claim={claim[2]}-gcus"]
    annotation = {f"cdi.k8s.io/{DRIVER}_{claim[2]}": ",".join(cdi_ids)}
    seen, env = run(node, node.bundle(ARGS, annotations=annotation))
    assert seen == ["gcu0", "gcu1", "gcuctl"]
    assert env == {"ENFLAME_VISIBLE_DEVICES": "0,1"}


def test_strict_mode_an_image_asking_for_all_still_gets_only_the_claim(node: Node) -> None:
    configure_runtime(node, strict=True)
    claim = ("enflame", "port", "4e4c3b1a-0000-4000-8000-000000000002")
    names, cdi_ids = prepare(node, claim, "four-gcus-one-root-port")
    assert names == ["gcu-0", "gcu-1", "gcu-2", "gcu-3"]
    annotation = {f"cdi.k8s.io/{DRIVER}_{claim[2]}": ",".join(cdi_ids)}
    bundle = node.bundle(ARGS, env=["ENFLAME_VISIBLE_DEVICES=all"], annotations=annotation)
    seen, _ = run(node, bundle)
    assert seen == ["gcu0", "gcu1", "gcu2", "gcu3", "gcuctl"]


def test_a_cdi_aware_engine_applying_the_spec_gives_the_same_container(node: Node) -> None:
    configure_runtime(node)
    claim = ("enflame", "cri", "4e4c3b1a-0000-4000-8000-000000000003")
    _, cdi_ids = prepare(node, claim, "two-gcus-one-switch")
    spec = claim_spec(node, claim[2])

    def edit(oci: dict[str, Any]) -> None:
        for qualified in cdi_ids:
            kubelet_emulation.apply_cdi(oci, qualified, [{**spec, "containerEdits": {}}])

    seen, env = run(node, node.bundle(ARGS, edit=edit))
    assert seen == ["gcu0", "gcu1", "gcuctl"]
    assert env["ENFLAME_VISIBLE_DEVICES"] == "0,1"


def test_the_claim_spec_is_a_valid_cdi_spec(node: Node) -> None:
    claim = ("enflame", "schema", "4e4c3b1a-0000-4000-8000-000000000004")
    prepare(node, claim, "two-gcus-one-switch")
    assert_valid_cdi(claim_spec(node, claim[2]))


def test_an_annotation_naming_an_unprepared_claim_fails_the_create_cleanly(node: Node) -> None:
    configure_runtime(node)
    name = "k8s.gcu.enflame.com/claim=4e4c3b1a-0000-4000-8000-00000000dead-gcus"
    bundle = node.bundle(ARGS, annotations={f"cdi.k8s.io/{DRIVER}_dead": name})
    result = node.run(bundle)
    assert result.returncode != 0
    assert b"no per-claim CDI spec defines" in result.stderr
    assert b"runc was not run" in result.stderr
