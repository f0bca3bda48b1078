"""``enflame-ctk sim create`` builds the simulated libefml (or says why it cannot), and ``sim efml
set|fail|hang|clear`` changes what it reports, as an operator watching /metrics would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from enflame_gcu.efml import library, reading
from enflame_gcu.errors import EfmlError
from enflame_gcu.simulation import efmlsim

CTK = os.path.join(os.path.dirname(sys.executable), "enflame-ctk")


def ctk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CTK, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture
def root(tmp_path: object) -> Iterator[str]:
    path = os.path.join(str(tmp_path), "node")
    created = ctk("sim", "create", path, "--topology", "vgcu-2card")
    assert created.returncode == 0, created.stderr
    assert f"simulated libefml at {path}/usr/lib/libefml.so" in created.stderr
    yield path


def loaded(root: str) -> library.Library:
    lib = library.Library.load(root)
    lib.init()
    return lib


def test_sim_create_builds_the_simulated_libefml(root: str) -> None:
    lib = loaded(root)
    try:
        assert lib.device_count() == 2
        assert "/usr/local/efsmi/lib/" in lib.path  # installed as the vendor installs it
    finally:
        lib.shutdown()


def test_sim_create_says_why_it_cannot_build_the_library(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "node")
    scratch = os.path.join(str(tmp_path), "tmp")  # no cached build to fall back on
    os.makedirs(scratch)
    created = ctk("sim", "create", path, env={"CC": "/nonexistent/cc", "TMPDIR": scratch})
    assert created.returncode == 0, created.stderr  # the node itself is made
    assert "simulated libefml not built, card telemetry will be off: no C compiler" in (
        created.stderr
    )
    assert not os.path.lexists(os.path.join(path, "usr/lib/libefml.so"))


def test_sim_efml_set_fail_hang_and_clear(root: str) -> None:
    assert ctk("sim", "efml", "set", root, "gcu1", "asic_temp=91", "usage=12.5").returncode == 0
    lib = loaded(root)
    try:
        card = reading.read_card(lib, 1)
        assert card.temperatures is not None and card.temperatures.asic == 91
        assert card.usage == 12.5
        assert (
            ctk("sim", "efml", "fail", root, "gcu1", "254", "--call", "EfmlGetDevPwr").returncode
            == 0
        )
        card = reading.read_card(lib, 1)
        assert card.power is None and card.errors == (("EfmlGetDevPwr", "EFML_ERROR_FAIL"),)
        assert ctk("sim", "efml", "fail", root, "1", "254").returncode == 0
        with pytest.raises(EfmlError, match="EFML_ERROR_FAIL"):
            reading.read_card(lib, 1)
        assert ctk("sim", "efml", "hang", root, "gcu1").returncode == 0
        assert efmlsim.read_values(root, "card1")["hang"] == "1"
        assert ctk("sim", "efml", "clear", root, "gcu1").returncode == 0
        assert not {"fail", "hang", "refuse"} & set(efmlsim.read_values(root, "card1"))
        assert reading.read_card(lib, 1).power is not None
    finally:
        lib.shutdown()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("set", "gcu1", "nosuch=1"), "gcu1 has no reading 'nosuch'; readings: "),
        (("set", "gcu1", "fail=3"), "'fail' is a fault: use 'sim efml fail'"),
        (("set", "gcu1", "asic_temp"), "'asic_temp' is not KEY=VALUE"),
        (("set", "gcu9", "asic_temp=1"), "no card gcu9"),
        (("fail", "gcu1", "0"), "error code 0 is outside 1..255"),
        (("fail", "gcu1", "3", "--call", "rm -rf"), "'rm -rf' is not a libefml function name"),
    ],
)
def test_sim_efml_refuses_bad_input_and_changes_nothing(
    root: str, args: tuple[str, ...], message: str
) -> None:
    before = efmlsim.read_values(root, "card1")
    action, card, *rest = args
    result = ctk("sim", "efml", action, root, card, *rest)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert efmlsim.read_values(root, "card1") == before


def test_a_driver_version_change_is_a_reload_for_the_simulated_libefml(root: str) -> None:
    lib = loaded(root)
    try:
        assert ctk("sim", "set-driver-version", root, "1.2.4").returncode == 0
        with pytest.raises(EfmlError, match="EFML_ERROR_UNINITIALIZED"):
            lib.device_count()
        assert lib.driver_version() == "1.2.4"
        lib.init()
        assert lib.device_count() == 2
    finally:
        lib.shutdown()
