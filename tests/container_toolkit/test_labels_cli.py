"""``enflame-ctk labels`` as an operator runs it."""

from __future__ import annotations

import os

import pytest

from enflame_gcu.container_toolkit import cli


def test_labels_to_stdout(vendor_node: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["labels", "--host-root", vendor_node, "--output", "-"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["enflame.com/gcu.count=8", "enflame.com/gcu.count.healthy=8"]
    assert "enflame.com/gcu.present=true" in lines
    assert len(lines) == 7


def test_labels_carry_the_recorded_node_mode(
    vendor_node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    os.makedirs(os.path.join(vendor_node, "etc/enflame-gcu"), exist_ok=True)
    with open(os.path.join(vendor_node, "etc/enflame-gcu/node-mode.json"), "w") as handle:
        handle.write('{"version": "v1", "mode": "device-specs"}')
    assert cli.main(["labels", "--host-root", vendor_node, "--output", "-"]) == 0
    assert "enflame.com/gcu.node-mode=device-specs" in capsys.readouterr().out.splitlines()


def test_labels_written_to_a_feature_file(vendor_node: str, tmp_path: object) -> None:
    target = os.path.join(str(tmp_path), "features.d", "enflame-gcu")
    assert cli.main(["labels", "--host-root", vendor_node, "--output", target]) == 0
    with open(target, encoding="utf-8") as handle:
        assert "enflame.com/gcu.model=T20-32GB\n" in handle.read()
    assert oct(os.stat(target).st_mode & 0o777) == "0o644"
