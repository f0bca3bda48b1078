"""Shared helpers of the DRA tests: fixtures' nodes as published devices, schema validation."""

from __future__ import annotations

import functools
import os
from typing import Any

import yaml
from kubernetes_validate import utils as kv

from enflame_gcu import devices, health, resourceslices
from enflame_gcu.simulation import simulate, topofile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DRA_DEPLOY = os.path.join(REPO, "deploy", "dra")
EXAMPLES = os.path.join(DRA_DEPLOY, "examples")
NO_SWITCH_FIXTURE = os.path.join(HERE, "fixtures", "rootports-6card.topo")
# Every card fixture: the built-in ones (vendor manual, 2 sockets, flat...) and cards on root
# ports without switches.
FIXTURES = [*topofile.builtin_names(), NO_SWITCH_FIXTURE]
OLDEST = "1.34.0"  # resource.k8s.io/v1 is GA from here
NEWEST = kv.latest_version()
VERSIONS = [OLDEST, NEWEST]
DEFAULT_OPTIONS = resourceslices.PublishOptions()


def fixture_id(name: str) -> str:
    """Short test id of a fixture."""
    return os.path.basename(name).removesuffix(".topo")


def make_fixture_node(tmp_root: str, name: str) -> devices.Inventory:
    """Simulate a fixture under ``tmp_root`` and discover it."""
    simulate.create(tmp_root, topofile.load(name))
    return devices.discover(tmp_root)


def published(
    inventory: devices.Inventory,
    options: resourceslices.PublishOptions = DEFAULT_OPTIONS,
) -> list[dict[str, Any]]:
    """The devices the driver would publish for a freshly discovered node."""
    report = health.check(inventory.root, inventory.cards)
    return resourceslices.node_devices(inventory, report.healthy(), options)


def validate(document: dict[str, Any], version: str) -> None:
    """Strict schema validation with kubernetes-validate (raises on any error)."""
    kv.validate(document, version, strict=True)


def load_yaml(path: str) -> list[dict[str, Any]]:
    """Every document of a YAML file."""
    with open(path, encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


@functools.cache
def device_classes() -> dict[str, dict[str, Any]]:
    """Our DeviceClasses by name."""
    return {
        doc["metadata"]["name"]: doc
        for doc in load_yaml(os.path.join(DRA_DEPLOY, "deviceclasses.yaml"))
    }


def example(name: str) -> dict[str, Any]:
    """The claim spec of an example's ResourceClaimTemplate."""
    docs = load_yaml(os.path.join(EXAMPLES, f"{name}.yaml"))
    template = next(doc for doc in docs if doc["kind"] == "ResourceClaimTemplate")
    return template["spec"]["spec"]  # type: ignore[no-any-return]
