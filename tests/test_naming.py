"""The spellings the plugin writes and the runtime reads: ENFLAME_VISIBLE_DEVICES and CDI names."""

from __future__ import annotations

import pytest

from enflame_gcu import naming


@pytest.mark.parametrize(
    ("names", "value"),
    [
        ([], "none"),
        (["gcu0"], "0"),
        (["gcu0", "gcu1"], "0,1"),
        (["gcu3", "gcu1", "gcu3"], "1,3"),
        (["vgcu2", "gcu0"], "0,vgcu2"),
        (["gcu12"], "12"),
        (["gcu1", "gcu0"], "0,1"),  # the order a real kubelet asked in
        (["gcu10", "gcu2", "vgcu11", "vgcu3"], "2,10,vgcu3,vgcu11"),  # by number, not text
    ],
)
def test_visible_value_lists_cards_by_minor_in_index_order_then_vgcus_by_name(
    names: list[str], value: str
) -> None:
    assert naming.visible_value(names) == value


@pytest.mark.parametrize(
    ("name", "qualified"),
    [
        ("gcu0", "enflame.com/gcu=0"),
        ("gcu15", "enflame.com/gcu=15"),
        ("vgcu3", "enflame.com/vgcu=3"),
    ],
)
def test_cdi_device_names_are_fully_qualified(name: str, qualified: str) -> None:
    assert naming.cdi_device_name(name) == qualified


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("7", 7),
        ("007", 7),
        (str(naming.MAX_INDEX), naming.MAX_INDEX),
        ("", None),
        ("²", None),  # superscript two: str.isdigit() says yes, int() fails
        ("٣", None),  # Arabic-Indic three: int() gives 3
        ("３", None),  # full-width three
        ("1٣", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1_0", None),
        (str(naming.MAX_INDEX + 1), None),
        ("9" * 5000, None),  # int() would raise past 4300 digits
        ("0" * 5000 + "1", None),
    ],
)
def test_only_ascii_digits_spell_an_index(text: str, value: int | None) -> None:
    assert naming.index(text) == value


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("gcu3", ("gcu", 3)),
        ("vgcu12", ("vgcu", 12)),
        ("gcu", None),
        ("gcu²", None),
        ("vgcu٣", None),
        ("gpu1", None),
    ],
)
def test_device_index(name: str, parsed: tuple[str, int] | None) -> None:
    assert naming.device_index(name) == parsed


def test_index_order_is_by_kind_then_number_without_repeats() -> None:
    names = ["vgcu3", "gcu10", "gcu2", "vgcu1", "gcu2", "gcu0"]
    assert naming.index_order(names) == ["gcu0", "gcu2", "gcu10", "vgcu1", "vgcu3"]
