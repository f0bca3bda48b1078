"""Calls gated by card generation, V2 -> legacy fallback, one refused reading dropping only that
reading, the binding declared from one signature table, and the vGCU list sized for 128."""

from __future__ import annotations

import ctypes
import os
import re
from typing import Any

import pytest

from enflame_gcu.efml import library, reading, types
from enflame_gcu.errors import EfmlError
from enflame_gcu.simulation import efmlsim


def test_a_gcu210_is_never_asked_for_the_gcu300_only_calls(node: str, lib: library.Library) -> None:
    # Were they called, the refusal would take the whole card out (as it did).
    efmlsim.set_values(
        node,
        "card0",
        {"arch": "1", "asic_temp": "57", "refuse": "EfmlGetGcuVirtStatus=254 EfmlGetDevTempV2=254"},
    )
    card = reading.read_card(lib, 0)
    assert card.arch == 1 and card.virt_mode is None and card.errors == ()
    assert card.temperatures == library.Temperatures(57.0, 36.0, None)  # the legacy call


def test_temperature_v2_not_supported_falls_back_to_the_legacy_call(
    node: str, lib: library.Library
) -> None:
    efmlsim.set_values(node, "card0", {"asic_temp": "61", "unsupported": "EfmlGetDevTempV2"})
    card = reading.read_card(lib, 0)
    assert card.temperatures is not None and card.temperatures.asic == 61.0
    assert card.temperatures.board is None
    assert reading.read_card(lib, 1).temperatures == library.Temperatures(38.0, 36.0, 33.0)


def test_one_refused_reading_drops_only_that_reading_and_is_named(
    node: str, lib: library.Library
) -> None:
    efmlsim.set_values(node, "card1", {"usage": "12.5", "refuse": "EfmlGetDevPwr=254"})
    card = reading.read_card(lib, 1)
    assert card.power is None and card.usage == 12.5 and card.temperatures is not None
    assert card.errors == (("EfmlGetDevPwr", "EFML_ERROR_FAIL"),)


def test_a_card_whose_identity_fails_is_still_left_out(node: str, lib: library.Library) -> None:
    efmlsim.set_values(node, "card1", {"refuse": "EfmlGetDevInfo=254"})
    with pytest.raises(EfmlError, match="EfmlGetDevInfo: EFML_ERROR_FAIL"):
        reading.read_card(lib, 1)


def test_a_wrong_argument_type_is_refused_before_the_c_call(lib: library.Library) -> None:
    wrong = ctypes.c_float()
    with pytest.raises(ctypes.ArgumentError):
        lib.function("EfmlGetDevCount")(ctypes.byref(wrong))
    declared: Any = lib.function("EfmlGetDevInfo")
    assert declared.argtypes == types.SIGNATURES["EfmlGetDevInfo"]


def test_every_function_the_binding_calls_has_its_signature() -> None:
    folder = os.path.dirname(library.__file__)
    called: set[str] = set()
    for name in ("library.py", "reading.py"):
        with open(os.path.join(folder, name), encoding="utf-8") as handle:
            called |= set(re.findall(r'"(Efml[A-Za-z0-9]+)"', handle.read()))
    assert called and called <= set(types.SIGNATURES), called - set(types.SIGNATURES)


def test_a_card_with_more_than_32_vgcus_lists_every_one(node: str, lib: library.Library) -> None:
    many = [str(v) for v in range(100, 140)]
    efmlsim.set_values(node, "card0", {"vdevs": " ".join(many)})
    assert lib.vgcu_ids(0) == tuple(int(v) for v in many)


def test_max_clock_and_events(node: str, lib: library.Library) -> None:
    assert lib.max_clock(0) == 1500
    assert lib.event(50) is None  # TIMEOUT: no event
    efmlsim.set_values(
        node, "node", {"event_seq": "1", "event_id": "3", "event_type": "10", "event_msg": "reset"}
    )
    assert lib.event(50) == (3, 10, "reset")
    assert lib.event(50) is None  # handed out once
