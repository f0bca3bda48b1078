"""The efsmi adapter against the simulated efsmi (a real subprocess) and against bad output."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enflame_gcu import efsmi
from enflame_gcu.errors import EfsmiError
from enflame_gcu.simulation import efsmi_sim, simulate, topofile


@pytest.fixture
def tool(tmp_path: os.PathLike[str]) -> Iterator[tuple[str, efsmi.Efsmi]]:
    root = os.path.join(str(tmp_path), "node")
    simulate.create(root, topofile.load("vendor-8card"), char_devices=False)
    yield root, efsmi.Efsmi(efsmi_sim.install(root), timeout=20)


def test_cards_are_listed_with_their_bus_ids_and_drs_state(tool: tuple[str, efsmi.Efsmi]) -> None:
    root, smi = tool
    cards = smi.cards()
    topo, _ = simulate.open_node(root)
    assert [(c.index, c.bus_id) for c in cards] == [(c.minor, c.bdf) for c in topo.cards]
    assert not any(c.drs_on for c in cards)
    smi.set_drs(2, True)
    assert smi.card_for(topo.cards[2].bdf).drs_on
    with pytest.raises(EfsmiError, match=r"lists no card at 0000:ff:00\.0") as caught:
        smi.card_for("ff:00.0")
    assert caught.value.reason == "not-found"


def test_profiles_instances_create_and_destroy(tool: tuple[str, efsmi.Efsmi]) -> None:
    root, smi = tool
    profiles = {p.name: p for p in smi.profiles(0)}
    assert sorted(profiles) == ["1g.8gb", "2g.16gb", "4g.32gb"]  # a T20 32GB: 4 slices
    assert (profiles["1g.8gb"].slices, profiles["1g.8gb"].count) == (1, 4)
    assert profiles["2g.16gb"].memory_gb == 16
    with pytest.raises(EfsmiError, match="DRS is disabled on card 0") as caught:
        smi.create_instance(0, profiles["1g.8gb"].profile_id)
    assert caught.value.reason == "failed"
    smi.set_drs(0, True)
    first = smi.create_instance(0, profiles["2g.16gb"].profile_id)
    second = smi.create_instance(0, profiles["2g.16gb"].profile_id)
    assert first.uuid != second.uuid and first.profile == "2g.16gb"
    assert first.visible_device == f"DRS-{first.uuid}"
    assert [i.uuid for i in smi.instances(0)] == [first.uuid, second.uuid]
    assert smi.instances(1) == []
    with pytest.raises(EfsmiError, match="no room"):
        smi.create_instance(0, profiles["1g.8gb"].profile_id)
    assert smi.destroy_instance(0, first.instance_id) is True
    assert smi.destroy_instance(0, first.instance_id) is False  # already gone: fine
    assert [i.uuid for i in smi.instances()] == [second.uuid]
    assert len(efsmi_sim.instances(root)) == 1


def test_a_hanging_efsmi_is_killed_at_the_time_limit(tool: tuple[str, efsmi.Efsmi]) -> None:
    root, _ = tool
    efsmi_sim.set_fault(root, "list", "hang")
    smi = efsmi.Efsmi(efsmi_sim.install(root), timeout=1.5)
    started = time.monotonic()
    with pytest.raises(EfsmiError, match=r"did not finish within 1\.5s") as caught:
        smi.instances(0)
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 10


def test_a_missing_efsmi_is_named() -> None:
    with pytest.raises(EfsmiError, match="/nonexistent/efsmi not found") as caught:
        efsmi.Efsmi("/nonexistent/efsmi").cards()
    assert caught.value.reason == "missing"


def test_output_we_do_not_understand_is_refused_not_guessed() -> None:
    with pytest.raises(EfsmiError, match="instance row not understood") as caught:
        efsmi.parse_instances("| x 1g.8gb |\n")
    assert caught.value.reason == "unparseable"
    with pytest.raises(EfsmiError, match="profile row not understood"):
        efsmi.parse_profiles("| 0 1g.8gb 0 many 8GB 1 |\n")
    with pytest.raises(EfsmiError, match="device row not understood"):
        efsmi.parse_cards("| Enflame S60 | 1.0 | 0000:03:00.0 |\n")


def test_the_vendor_table_shapes_parse() -> None:
    table = (
        "+------------------------------+\n"
        "| 0  Enflame S60 | 1.0 | 03:00.0 | x |\n"
        "| 35C 25W / 300W | 0MiB / 49152MiB | DRS |\n"
    )
    (card,) = efsmi.parse_cards(table)
    assert (card.index, card.product, card.bus_id, card.drs_on) == (
        0,
        "Enflame S60",
        "0000:03:00.0",
        True,
    )
    (profile,) = efsmi.parse_profiles("| 0  1g.8gb  3  6  8GB  1 |")
    assert (profile.name, profile.profile_id, profile.count, profile.memory, profile.sip) == (
        "1g.8gb",
        "3",
        6,
        "8GB",
        "1",
    )
    (instance,) = efsmi.parse_instances("| 0 1g.8gb 7 9a1e0c3e-2f4b-4c39-8f0a-6d2b1c0e9f11 |")
    assert instance.instance_id == "7" and instance.uuid.startswith("9a1e0c3e")


def test_output_is_capped_while_it_is_read_and_the_talker_killed(tmp_path: Path) -> None:
    """An efsmi that writes without end (8 MiB here, then it would go on) is stopped at the
    cap as it is read, and killed: its output is never all held in memory."""
    pid_file = tmp_path / "pid"
    script = tmp_path / "efsmi"
    script.write_text(
        f"#!/bin/sh\necho $$ > {pid_file}\nhead -c 8388608 /dev/zero\nexec sleep 60\n"
    )
    script.chmod(0o755)
    with pytest.raises(EfsmiError, match="wrote more than 1048576 bytes") as caught:
        efsmi.Efsmi(str(script), timeout=30).instances()
    assert caught.value.reason == "unparseable"
    pid = int(pid_file.read_text())
    assert not os.path.exists(f"/proc/{pid}"), "the efsmi child was left running"


def test_a_card_efsmi_calls_an_invalid_index_is_not_found(tool: tuple[str, efsmi.Efsmi]) -> None:
    root, smi = tool
    simulate.unplug(root, 0)
    with pytest.raises(EfsmiError, match="invalid device index 0") as caught:
        smi.instances(0)
    assert caught.value.reason == "not-found"
