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
        (["gcu3", "gcu1", "gcu3"], "3,1"),
        (["vgcu2", "gcu0"], "vgcu2,0"),
        (["gcu12"], "12"),
    ],
)
def test_visible_value_spells_cards_by_minor_and_vgcus_by_name(
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
