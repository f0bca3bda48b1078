"""support.unix_sockets: who listens, which file is which, and private bind names."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from enflame_gcu.support import unix_sockets


def _bound(path: Path, *, listen: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listen:
        sock.listen(1)
    return sock


def test_listening_tells_a_live_socket_from_a_stale_file_and_from_nothing(tmp_path: Path) -> None:
    live, stale = tmp_path / "live.sock", tmp_path / "stale.sock"
    server = _bound(live, listen=True)
    _bound(stale, listen=False).close()  # the file stays, nobody accepts on it
    (tmp_path / "plain").write_text("x")
    try:
        assert unix_sockets.listening(str(live))
        assert not unix_sockets.listening(str(stale))
        assert not unix_sockets.listening(str(tmp_path / "plain"))
        assert not unix_sockets.listening(str(tmp_path / "missing.sock"))
    finally:
        server.close()


def test_identity_tells_a_recreated_file_apart_and_inode_follows_a_rename(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    assert unix_sockets.identity(str(path)) is None and unix_sockets.inode(str(path)) is None
    path.write_text("one")
    first = unix_sockets.identity(str(path))
    before = unix_sockets.inode(str(path))
    moved = tmp_path / "moved"
    os.rename(path, moved)
    assert unix_sockets.inode(str(moved)) == before  # a rename keeps the file's inode
    os.unlink(moved)
    path.write_text("two")
    assert unix_sockets.identity(str(path)) != first  # same inode number or not, ctime differs


def test_private_bind_name_sits_beside_the_socket_and_is_fresh_each_time(tmp_path: Path) -> None:
    path = str(tmp_path / "enflame.sock")
    first, second = unix_sockets.private_bind_name(path), unix_sockets.private_bind_name(path)
    assert first != second
    for name in (first, second):
        assert os.path.dirname(name) == str(tmp_path)
        token = os.path.basename(name).removeprefix(".enflame.sock.")
        assert len(token) == 2 * unix_sockets.BIND_TOKEN_BYTES and int(token, 16) >= 0


def test_remove_stale_binds_removes_only_dead_private_names_of_that_socket(tmp_path: Path) -> None:
    path = tmp_path / "enflame.sock"
    dead = Path(unix_sockets.private_bind_name(str(path)))
    live = Path(unix_sockets.private_bind_name(str(path)))
    _bound(dead, listen=False).close()
    server = _bound(live, listen=True)
    kept = [
        tmp_path / ".enflame.sock.0123456",  # 7 digits: not our shape
        tmp_path / ".enflame.sock.0123456G",  # not hex
        tmp_path / ".enflame.sock.ABCDEF01",  # upper case: token_hex never writes it
        tmp_path / ".other.sock.01234567",  # another socket's private name
        tmp_path / "enflame.sock",
    ]
    for other in kept:
        other.write_text("")
    try:
        unix_sockets.remove_stale_binds(str(path))
        assert not dead.exists()
        assert live.exists()
        assert all(other.exists() for other in kept)
    finally:
        server.close()


def test_remove_stale_binds_in_a_missing_directory_does_nothing(tmp_path: Path) -> None:
    unix_sockets.remove_stale_binds(str(tmp_path / "gone" / "enflame.sock"))
    assert not (tmp_path / "gone").exists()
