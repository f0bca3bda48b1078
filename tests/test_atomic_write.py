"""fileio.atomic_write replaces a path; a symlink there lends it neither owner nor mode
(issue 22 item 7: the owner came from the link's target, even one outside the host root, so a
planted link could make a file we write as root belong to someone else)."""

from __future__ import annotations

import os
from pathlib import Path

from enflame_gcu import fileio


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
