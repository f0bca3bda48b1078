"""Environment variables: one spelling for every program, the 0.1 names still read for a release.

An option ``--foo-bar`` of ``enflame-device-plugin`` or ``enflame-dra-plugin`` is also
``ENFLAME_FOO_BAR`` (docs/user-guide.md, "Environment variables"). The names 0.1 used
(``DP_*``, NVIDIA's unprefixed ``PASS_DEVICE_SPECS`` and friends, ``ENFLAME_DRA_*``) still work
until :data:`OLD_NAMES_UNTIL`, each with a warning naming the new one; the new name wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PREFIX = "ENFLAME_"
OLD_NAMES_UNTIL = "0.2.0"


def for_option(option: str) -> str:
    """``health-interval`` or ``health_interval`` -> ``ENFLAME_HEALTH_INTERVAL``."""
    return PREFIX + option.upper().replace("-", "_")


def lookup(
    environ: Mapping[str, str], name: str, old: Sequence[str] = ()
) -> tuple[str | None, str | None]:
    """``(value, warning)``: ``name``'s value, else the first old name's with a warning."""
    if name in environ:
        return environ[name], None
    for old_name in old:
        if old_name in environ:
            return environ[old_name], deprecated(old_name, name)
    return None, None


def deprecated(old_name: str, name: str) -> str:
    """The warning for an old variable name."""
    return (
        f"environment variable {old_name} is deprecated: use {name} "
        f"(the old name stops working in {OLD_NAMES_UNTIL})"
    )
