"""The DRA driver reads ENFLAME_<OPTION> like the device plugin; its 0.1 ENFLAME_DRA_* names
still work for a release, each with a warning naming the new one."""

from __future__ import annotations

import pytest

from enflame_gcu.dra_plugin import config


def test_options_come_from_enflame_variables() -> None:
    env = {
        "NODE_NAME": "n1",
        "ENFLAME_HOST_ROOT": "/host",
        "ENFLAME_SHARED_SLICES": "4",
        "ENFLAME_UNHEALTHY": "omit",
        "ENFLAME_HEALTH_INTERVAL": "2",
        "ENFLAME_LOG_LEVEL": "debug",
        "ENFLAME_DISABLE_HEALTHCHECKS": "all",
    }
    got = config.parse([], env)
    assert (got.root, got.shared_slices, got.unhealthy) == ("/host", 4, "omit")
    assert (got.health_interval, got.log_level, got.health_disabled) == (2.0, "debug", True)
    assert got.deprecated_env == ()


@pytest.mark.parametrize(
    ("old", "new", "value", "field", "expected"),
    [
        ("ENFLAME_DRA_ROOT", "ENFLAME_HOST_ROOT", "/h", "root", "/h"),
        ("ENFLAME_DRA_CDI_DIR", "ENFLAME_CDI_DIR", "/c", "cdi_dir", "/c"),
        ("ENFLAME_DRA_LOG_LEVEL", "ENFLAME_LOG_LEVEL", "error", "log_level", "error"),
        ("DP_DISABLE_HEALTHCHECKS", "ENFLAME_DISABLE_HEALTHCHECKS", "all", "health_disabled", True),
    ],
)
def test_old_names_still_work_with_a_warning(
    old: str, new: str, value: str, field: str, expected: object
) -> None:
    got = config.parse([], {"NODE_NAME": "n1", old: value})
    assert getattr(got, field) == expected
    assert got.deprecated_env == (
        f"environment variable {old} is deprecated: use {new} "
        "(the old name stops working in 0.2.0)",
    )
    newer = config.parse([], {"NODE_NAME": "n1", old: value, new: value})
    assert not newer.deprecated_env  # the new name wins and nothing is said
