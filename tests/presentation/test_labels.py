"""Node labels for feature discovery, from simulated nodes."""

from __future__ import annotations

import os

import pytest

from enflame_gcu import devices, products
from enflame_gcu.presentation import labels

from ..conftest import MakeNode


def test_vendor_machine_labels(vendor_node: str) -> None:
    assert labels.for_inventory(devices.discover(vendor_node)) == {
        "enflame.com/gcu.present": "true",
        "enflame.com/gcu.count": "8",
        "enflame.com/gcu.count.healthy": "8",
        "enflame.com/gcu.model": "T20-32GB",
        "enflame.com/gcu.family": "T",
        "enflame.com/gcu.memory": "32768",
        "enflame.com/gcu.driver.version": "1.0.20230110",
    }


def test_count_is_cards_present_healthy_count_the_usable_ones(make_node: MakeNode) -> None:
    root = make_node("vgcu-2card")
    os.unlink(os.path.join(root, "dev/gcu1"))
    found = labels.for_inventory(devices.discover(root))
    assert found["enflame.com/gcu.count"] == "2"  # stays while a card is broken or unplugged
    assert found["enflame.com/gcu.count.healthy"] == "1"
    assert found["enflame.com/gcu.vgcu.count"] == "8"
    assert found["enflame.com/gcu.memory"] == "49152"  # S60-48GB


def test_mixed_models_say_mixed_and_omit_memory(make_node: MakeNode) -> None:
    root = make_node(
        "gcu0 0000:01:00.0 <- 0000:00:01.0 <- cpu numa=0 device=0x0021\n"
        "gcu1 0000:02:00.0 <- 0000:00:02.0 <- cpu numa=0 device=0xc035\n",
        text=True,
    )
    found = labels.for_inventory(devices.discover(root))
    assert found["enflame.com/gcu.model"] == "mixed"
    assert found["enflame.com/gcu.family"] == "mixed"
    assert "enflame.com/gcu.memory" not in found


def test_node_without_cards_is_labelled_absent(tmp_path: object) -> None:
    assert labels.for_inventory(devices.discover(str(tmp_path))) == {
        "enflame.com/gcu.present": "false"
    }


def test_unloaded_driver_drops_the_version_and_the_healthy_count(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, "sys/module/enflame/version"))
    found = labels.for_inventory(devices.discover(vendor_node))
    assert found["enflame.com/gcu.count.healthy"] == "0"
    assert found["enflame.com/gcu.count"] == "8"
    assert "enflame.com/gcu.driver.version" not in found


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("T10 (QSFP-DD)", "T10-QSFP-DD"),
        ("Enflame GCU (device 0xbeef)", "Enflame-GCU-device-0xbeef"),
        ("1.0.20230110", "1.0.20230110"),
        ("x" * 80, "x" * 63),
        ("-a-", "a"),
    ],
)
def test_label_values_are_valid_kubernetes_label_values(text: str, value: str) -> None:
    assert labels.label_value(text) == value


def test_feature_file_is_sorted_name_value_lines() -> None:
    text = labels.feature_file({"b": "2", "a": "1"})
    assert text == "a=1\nb=2\n"


def test_memory_comes_from_the_model_name() -> None:
    assert products.memory_mib("T20-64GB") == 65536
    assert products.memory_mib("T10") is None


@pytest.mark.parametrize(
    ("slices", "strategy", "replicas"),
    [
        ({}, "none", "1"),
        ({"gcu0": 6, "gcu1": 6}, "time-slicing", "6"),
        ({"gcu0": 4, "gcu1": 8}, "time-slicing", "4"),
    ],
)
def test_sharing_and_node_mode_labels_as_gpu_feature_discovery_names_them(
    vendor_node: str, slices: dict[str, int], strategy: str, replicas: str
) -> None:
    found = labels.for_inventory(devices.discover(vendor_node), slices=slices, node_mode="cdi")
    assert found["enflame.com/gcu.sharing-strategy"] == strategy
    assert found["enflame.com/gcu.replicas"] == replicas
    assert found["enflame.com/gcu.node-mode"] == "cdi"


def test_the_product_has_one_spelling_in_info_labels_and_metrics(vendor_node: str) -> None:
    [model] = {card.model for card in devices.discover(vendor_node).cards}
    assert (
        model
        == "T20-32GB"
        == labels.for_inventory(devices.discover(vendor_node))["enflame.com/gcu.model"]
    )
    for name in products.PRODUCT_NAMES.values():  # every name is already a label value
        assert labels.label_value(name) == name == products.canonical(name)
    assert products.canonical("S60 48GB") == "S60-48GB"  # a 0.1 spelling in a config


def test_a_config_with_the_old_model_spelling_still_sets_the_slices(make_node: MakeNode) -> None:
    from enflame_gcu import sharing
    from enflame_gcu.device_plugin import config, resources

    root = make_node(
        "gcu0 0000:01:00.0 <- 0000:00:01.0 <- cpu numa=0 device=0xc035\n"
        "gcu1 0000:02:00.0 <- 0000:00:02.0 <- cpu numa=0 device=0x0021\n",
        text=True,
    )
    inventory = devices.discover(root)
    settings = config.PluginConfig(
        resources=("shared-gcu",),
        sharing=sharing.SharingSettings(slices=6, slices_by_model={"S60 48GB": 8}),
    )
    placed = resources.assign(inventory, settings)
    assert resources.slice_counts(inventory, settings, placed) == {"gcu0": 8, "gcu1": 6}
    found = labels.for_inventory(inventory, slices={"gcu0": 8, "gcu1": 6})
    assert (found["enflame.com/gcu.replicas"], found["enflame.com/gcu.model"]) == ("6", "mixed")
