"""fileio.atomic_write replaces a path; a symlink there lends it neither owner nor mode
(issue 22 item 7: the owner came from the link's target, even one outside the host root, so a
planted link could make a file we write as root belong to someone else)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from enflame_gcu import claim_specs, fileio
from enflame_gcu.container_toolkit import cdi_keeper
from tests.conftest import MakeNode
from tests.dra_plugin import harness


def test_a_symlinks_target_lends_no_owner_or_mode(tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "someones.conf"
    outside.parent.mkdir()
    outside.write_text("theirs\n")
    os.chown(outside, 4321, 4321)
    outside.chmod(0o666)
    root = tmp_path / "root" / "etc"
    root.mkdir(parents=True)
    link = root / "engine.conf"
    link.symlink_to(outside)

    fileio.atomic_write(str(link), b"ours\n")

    info = os.lstat(link)
    assert not link.is_symlink() and link.read_text() == "ours\n"
    assert (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid())
    assert info.st_mode & 0o7777 == 0o644
    assert outside.read_text() == "theirs\n"  # the target is left alone


def test_a_regular_file_keeps_its_owner_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("old\n")
    os.chown(path, 4321, 4322)
    path.chmod(0o640)
    fileio.atomic_write(str(path), b"new\n")
    info = os.stat(path)
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (4321, 4322, 0o640)
    assert path.read_text() == "new\n"


def _temp(directory: Path, name: str, age: float) -> Path:
    path = directory / f".{name}.{'0a1b2c3d4e5f'}.tmp"
    path.write_text("half")
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_stale_temp_files_of_ours_are_removed_and_nothing_else(tmp_path: Path) -> None:
    """Issue 22 item 13: a writer killed between create and rename left .tmp files in
    /var/run/cdi that nothing removed."""
    old = _temp(tmp_path, "enflame.com-gcu.yaml", 600)
    fresh = tmp_path / ".enflame.com-vgcu.yaml.ffffffffffff.tmp"
    fresh.write_text("a write under way")
    foreign = _temp(tmp_path, "other-vendor.yaml", 600)
    odd = tmp_path / ".enflame.com-gcu.yaml.not-hex-tok.tmp"
    odd.write_text("not our temp name")
    removed = fileio.remove_stale_temps(str(tmp_path), ("enflame.com-",))
    assert removed == [str(old)]
    assert fresh.exists() and foreign.exists() and odd.exists()


def test_the_cdi_keeper_and_the_dra_driver_remove_their_stale_temps(make_node: MakeNode) -> None:
    root = make_node("vendor-8card")
    output = Path(root) / "var/run/cdi"
    output.mkdir(parents=True)
    keeper_temp = _temp(output, "enflame.com-gcu.yaml", 600)
    claim_temp = _temp(output, claim_specs.file_name("0f8c2f4e"), 600)
    lines = cdi_keeper.refresh(root, str(output))
    assert f"{keeper_temp} removed (left by an interrupted write)" in lines
    assert claim_temp.exists()  # the driver's, not the keeper's
    with harness.simulated_node() as where:
        os.makedirs(where.cdi)
        claim_temp = _temp(Path(where.cdi), claim_specs.file_name("0f8c2f4e"), 600)
        harness.make_driver(where, harness.FakeClaims())
        assert not claim_temp.exists()
