"""``enflame-ctk info`` and ``enflame-ctk sim`` as an operator runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from enflame_gcu.container_toolkit import cli
from enflame_gcu.simulation import topofile

from ..conftest import MakeNode

CTK = os.path.join(os.path.dirname(sys.executable), "enflame-ctk")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTK, *args], capture_output=True, text=True, timeout=60)


def test_info_text_shows_cards_groups_and_tree(vendor_node: str) -> None:
    result = _run("info", "--host-root", vendor_node)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Driver:         enflame 1.0.20230110" in out
    assert "Cards:          8 usable of 8" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("gcu")]
    assert [row[0] for row in rows] == [f"gcu{i}" for i in range(8)]
    assert rows[0][:7] == ["gcu0", "/dev/gcu0", "0000:11:00.0", "T20-32GB", "0", "S0", "P0"]
    assert [row[5] for row in rows] == ["S0", "S0", "S1", "S2", "S3", "S3", "S4", "S5"]
    assert [row[6] for row in rows] == ["P0"] * 4 + ["P1"] * 4
    tree = out[out.index("\ncpu\n") + 1 :].splitlines()
    assert tree[:8] == [
        "cpu",
        "├── pci0000:0c",
        "│   └── 0000:0c:02.0  [root port]",
        "│       └── 0000:0d:00.0",
        "│           ├── 0000:0e:00.0",
        "│           │   └── 0000:0f:00.0  [switch]",
        "│           │       ├── 0000:10:00.0",
        "│           │       │   └── 0000:11:00.0  gcu0  T20-32GB  numa 0",
    ]
    assert "0000:0f:00.0  [switch]" in out
    assert "0000:97:02.0  [root port]" in out


def test_info_json_is_the_same_facts(vendor_node: str) -> None:
    result = _run("info", "--host-root", vendor_node, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["driver"] == {"loaded": True, "version": "1.0.20230110"}
    assert data["switchGroups"] == [
        ["gcu0", "gcu1"],
        ["gcu2"],
        ["gcu3"],
        ["gcu4", "gcu5"],
        ["gcu6"],
        ["gcu7"],
    ]
    assert data["rootPortGroups"] == [
        ["gcu0", "gcu1", "gcu2", "gcu3"],
        ["gcu4", "gcu5", "gcu6", "gcu7"],
    ]
    gcu5 = data["cards"][5]
    assert gcu5["bdf"] == "0000:9d:00.0"
    assert gcu5["numaNode"] == 1
    assert gcu5["deviceId"] == "0x0021"
    assert gcu5["usable"] is True
    assert gcu5["pciChain"][0] == "0000:97:02.0"


def test_info_reports_an_unusable_card_and_exits_zero_while_others_work(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, "dev/gcu6"))
    result = _run("info", "--host-root", vendor_node)
    assert result.returncode == 0
    assert "Cards:          7 usable of 8" in result.stdout
    assert "NOT USABLE: /dev/gcu6 is missing" in result.stdout


def test_info_on_a_node_without_cards_says_so_and_fails(tmp_path: object) -> None:
    result = _run("info", "--host-root", str(tmp_path))
    assert result.returncode == 1
    assert "No GCU cards found" in result.stdout
    assert "cannot list /sys/bus/pci/devices" in result.stdout


@pytest.mark.parametrize("name", topofile.builtin_names())
def test_info_works_on_every_builtin_topology(make_node: MakeNode, name: str) -> None:
    root = make_node(name)
    assert cli.main(["info", "--host-root", root, "--json"]) == 0


def test_sim_cli_create_unplug_replug_and_errors(tmp_path: object) -> None:
    root = os.path.join(str(tmp_path), "node")
    created = _run("sim", "create", root, "--topology", "flat-4card")
    assert created.returncode == 0, created.stderr
    assert "enflame-ctk: device nodes are character devices (mknod)" in created.stderr
    assert _run("sim", "unplug", root, "gcu2").returncode == 0
    data = json.loads(_run("info", "--host-root", root, "--json").stdout)
    assert [c["name"] for c in data["cards"]] == ["gcu0", "gcu1", "gcu3"]
    assert _run("sim", "replug", root, "2").returncode == 0
    bad = _run("sim", "unplug", root, "gcu9")
    assert bad.returncode == 1
    assert "no card gcu9 on this node; cards: gcu0, gcu1, gcu2, gcu3" in bad.stderr
    missing = _run("sim", "create", os.path.join(str(tmp_path), "x"), "--topology", "nope")
    assert missing.returncode == 1
    assert "no built-in topology 'nope'" in missing.stderr


def test_sim_cli_driver_actions(tmp_path: object) -> None:
    root = os.path.join(str(tmp_path), "node")
    assert _run("sim", "create", root).returncode == 0
    assert _run("sim", "set-driver-version", root, "1.2.3").returncode == 0
    assert (
        json.loads(_run("info", "--host-root", root, "--json").stdout)["driver"]["version"]
        == "1.2.3"
    )
    assert _run("sim", "unload-driver", root).returncode == 0
    unloaded = _run("info", "--host-root", root)
    assert unloaded.returncode == 1
    assert "Driver:         enflame NOT LOADED" in unloaded.stdout
    assert _run("sim", "load-driver", root).returncode == 0
    assert _run("info", "--host-root", root).returncode == 0
