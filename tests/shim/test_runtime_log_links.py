"""The runtime's log as an attacker who can write in its directory would aim it (issue 48 item 1).

The runtime runs as root and logs text a pod chooses; a log that follows a link to
``/etc/ld.so.preload`` owns the node. Each case: no byte reaches the target, no log file is
written, and one warning on stderr names the problem; the container still starts.
"""

from __future__ import annotations

import os

import pytest

from enflame_gcu.shim import log as runtime_log

NOBODY = 65534


@pytest.fixture
def logdir(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(str(tmp_path), "log", "enflame")
    os.makedirs(path, mode=0o755)
    return path


@pytest.fixture
def preload(tmp_path: os.PathLike[str]) -> str:
    """A root-owned file standing for /etc/ld.so.preload."""
    path = os.path.join(str(tmp_path), "etc", "ld.so.preload")
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("")
    return path


def _log_a_pod_line(path: str) -> None:
    log = runtime_log.RuntimeLog(path, "info")
    log.info("gave %s", "x /var/log/evil.so y")
    log.error("second line")
    log.close()


def _one_warning(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "continuing without a log file" in lines[0]
    for word in words:
        assert word in lines[0]
    return lines[0]


def test_a_symlink_to_ld_so_preload_is_never_followed(
    logdir: str, preload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(logdir, "enflame-container-runtime.log")
    os.symlink(preload, path)
    _log_a_pod_line(path)
    assert os.path.getsize(preload) == 0
    assert os.path.islink(path)
    _one_warning(capsys, path)


def test_a_hard_link_to_a_root_file_is_refused(
    logdir: str, preload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(logdir, "enflame-container-runtime.log")
    os.link(preload, path)
    _log_a_pod_line(path)
    assert os.path.getsize(preload) == 0
    _one_warning(capsys, "2 hard links")


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_a_log_directory_others_can_write_gets_no_file(
    logdir: str, mode: int, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chmod(logdir, mode)
    path = os.path.join(logdir, "enflame-container-runtime.log")
    _log_a_pod_line(path)
    assert os.listdir(logdir) == []
    _one_warning(capsys, logdir, "writable by its group or others")


def test_a_log_directory_of_another_user_gets_no_file(
    logdir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chown(logdir, NOBODY, NOBODY)
    path = os.path.join(logdir, "enflame-container-runtime.log")
    _log_a_pod_line(path)
    assert os.listdir(logdir) == []
    _one_warning(capsys, f"owned by uid {NOBODY}")


def test_an_ancestor_others_can_write_is_refused_and_one_of_another_user_too(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    top = os.path.join(str(tmp_path), "var")
    os.makedirs(os.path.join(top, "log"))
    # Not sticky: anybody may rename var/log away and plant another.
    os.chmod(top, 0o777)  # noqa: S103 - the hostile mode under test
    path = os.path.join(top, "log", "enflame", "rt.log")
    _log_a_pod_line(path)
    assert not os.path.exists(os.path.dirname(path))  # not even the directory is made
    _one_warning(capsys, "writable by others")
    os.chmod(top, 0o755)  # noqa: S103 - the hostile mode undone
    os.chown(top, NOBODY, NOBODY)
    _log_a_pod_line(path)
    _one_warning(capsys, f"owned by uid {NOBODY}")


def test_a_directory_link_of_another_user_is_not_followed(
    tmp_path: os.PathLike[str], logdir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    link = os.path.join(str(tmp_path), "elsewhere")
    os.symlink(logdir, link)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    _log_a_pod_line(os.path.join(link, "rt.log"))
    assert os.listdir(logdir) == []
    _one_warning(capsys, f"a link owned by uid {NOBODY}")


def test_a_fifo_at_the_log_name_does_not_hang_the_runtime(
    logdir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(logdir, "rt.log")
    os.mkfifo(path)
    _log_a_pod_line(path)
    _one_warning(capsys, path)


def test_our_own_links_and_a_sticky_ancestor_still_log(
    tmp_path: os.PathLike[str], logdir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    link = os.path.join(str(tmp_path), "run")
    os.symlink(os.path.relpath(logdir, str(tmp_path)), link)  # as /var/run -> /run
    path = os.path.join(link, "rt.log")
    old = os.umask(0o002)
    try:
        _log_a_pod_line(os.path.join(link, "new", "rt.log"))  # made 0755 whatever the umask
    finally:
        os.umask(old)
    _log_a_pod_line(path)
    assert capsys.readouterr() == ("", "")
    with open(os.path.join(logdir, "rt.log"), encoding="utf-8") as handle:
        assert "gave x /var/log/evil.so y" in handle.read()
    assert os.stat(os.path.join(logdir, "new")).st_mode & 0o777 == 0o755
