"""The operator's CLI logging: its own lines at the chosen level, the HTTP client's per-request
lines only at debug (the cluster tier's operator log had a few of them every second)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from enflame_gcu.gcu_operator import main


@pytest.fixture(autouse=True)
def _restore_levels() -> Iterator[None]:
    before = {name: logging.getLogger(name).level for name in main.HTTP_LOGGERS}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def test_http_requests_are_not_logged_at_info() -> None:
    main.configure_logging("info")
    for name in main.HTTP_LOGGERS:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
    assert logging.getLogger(main.__name__).getEffectiveLevel() <= logging.WARNING


def test_http_requests_are_logged_at_debug() -> None:
    main.configure_logging("debug")
    for name in main.HTTP_LOGGERS:
        assert logging.getLogger(name).isEnabledFor(logging.DEBUG), name
