"""A config path that is not a regular file: a FIFO blocks a reader forever, /dev/zero never
ends. Every root-run reader of node config refuses them at once, names what it found, and
changes nothing (the null device reads as empty: its usual meaning)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from enflame_gcu import fileio
from enflame_gcu.container_toolkit import cdi, cdi_keeper
from enflame_gcu.container_toolkit.engines import cri, storage
from enflame_gcu.device_plugin import config_file
from enflame_gcu.errors import ConfigError, EngineConfigError, SpecError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import prepared_edits

# A hang is the failure these tests look for: pytest-timeout ends it.
pytestmark = pytest.mark.timeout(60)

ZERO = os.makedev(1, 5)


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _zero(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o644 | 0o020000, ZERO)
    return path


def test_read_regular_reads_files_and_names_everything_else(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x = 1\n")
    assert fileio.read_regular(str(plain)) == b"x = 1\n"
    assert fileio.read_regular("/dev/null") == b""
    for path, kind in (
        (_fifo(tmp_path / "fifo"), "a FIFO"),
        (_zero(tmp_path / "zero"), "a character device"),
        (tmp_path, "a directory"),
    ):
        with pytest.raises(OSError, match=f"it is {kind}, not a regular file"):
            fileio.read_regular(str(path))
    with pytest.raises(OSError, match="larger than 4 bytes"):
        fileio.read_regular(str(plain), limit=4)
    with pytest.raises(FileNotFoundError):
        fileio.read_regular(str(tmp_path / "missing"))


def test_read_regular_follows_a_link_to_a_file_but_not_past_one_to_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a")
    (tmp_path / "to-plain").symlink_to("plain")
    (tmp_path / "to-fifo").symlink_to(_fifo(tmp_path / "fifo"))
    assert fileio.read_regular(str(tmp_path / "to-plain")) == b"a"
    with pytest.raises(OSError, match="a FIFO"):
        fileio.read_regular(str(tmp_path / "to-fifo"))


@pytest.mark.parametrize("make", [_fifo, _zero], ids=["fifo", "dev-zero"])
@pytest.mark.parametrize("engine", ["containerd", "crio", "docker"])
def test_engine_configure_refuses_a_config_that_is_not_a_file(
    tmp_path: Path, make: object, engine: str
) -> None:
    path = make(tmp_path / "etc" / "engine.conf")  # type: ignore[operator]
    before = sorted(os.listdir(path.parent))
    ctk = [sys.executable, "-m", "enflame_gcu.container_toolkit.cli"]
    result = subprocess.run(
        [*ctk, "runtime", "configure", "--runtime", engine, "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "not a regular file" in result.stderr and "nothing was changed" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(os.listdir(path.parent)) == before  # no backup, no state, no lock left


def test_storage_reader_raises_the_engine_error(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match=r"cannot read .*fifo: it is a FIFO"):
        storage.read_text(str(_fifo(tmp_path / "fifo")))


def test_the_runtime_config_refuses_a_fifo_or_device_and_takes_dev_null_as_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for path in (_fifo(tmp_path / "fifo.toml"), _zero(tmp_path / "zero.toml")):
        monkeypatch.setenv(runtime_config.PATH_ENV, str(path))
        with pytest.raises(ConfigError, match="is not a regular file"):
            runtime_config.load()
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * (runtime_config.MAX_BYTES // 4 + 1))
    monkeypatch.setenv(runtime_config.PATH_ENV, str(big))
    with pytest.raises(ConfigError, match="larger than"):
        runtime_config.load()
    (tmp_path / "empty.toml").write_text("")
    monkeypatch.setenv(runtime_config.PATH_ENV, str(tmp_path / "empty.toml"))
    empty = runtime_config.load()
    monkeypatch.setenv(runtime_config.PATH_ENV, "/dev/null")
    null = runtime_config.load()
    fields = [name for name in runtime_config.RuntimeConfig.__slots__ if name != "path"]
    assert fields and all(getattr(null, n) == getattr(empty, n) for n in fields)


def test_prepared_edits_that_are_a_fifo_are_unavailable_not_a_hang(tmp_path: Path) -> None:
    with pytest.raises(prepared_edits.Unavailable, match="a FIFO"):
        prepared_edits.load(str(_fifo(tmp_path / "prepared-edits.json")), "/")


def test_kubelet_settings_that_are_a_fifo_name_no_engine(tmp_path: Path) -> None:
    _fifo(tmp_path / cri.KUBELET_CONFIG.lstrip("/"))
    _zero(tmp_path / cri.FLAG_FILES[0].lstrip("/"))
    _fifo(tmp_path / cri.FLAG_FILES[1].lstrip("/"))
    _fifo(tmp_path / "proc" / "1" / "cmdline")
    assert cri.kubelet_endpoint(str(tmp_path)) is None
    assert cri.detect(str(tmp_path)).engine == ""


def test_cdi_list_names_a_spec_that_is_a_fifo(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="a FIFO"):
        cdi.load_file(str(_fifo(tmp_path / "cdi" / "planted.yaml")))


def test_the_cdi_keeper_replaces_a_fifo_at_its_spec_path(vendor_node: str, tmp_path: Path) -> None:
    output = tmp_path / "cdi"
    planted = _fifo(output / os.path.basename(cdi_keeper.spec_paths(str(output))[0]))
    changed = cdi_keeper.refresh(vendor_node, str(output))
    assert f"{planted} written" in changed
    assert planted.is_file() and cdi.load_file(str(planted))["kind"] == "enflame.com/gcu"


def test_the_plugin_config_file_that_is_a_fifo_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*: cannot read: it is a FIFO"):
        config_file.load(str(_fifo(tmp_path / "config.yaml")))
