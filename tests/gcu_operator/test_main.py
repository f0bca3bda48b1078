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


def test_remove_resources_deletes_every_resource_and_waits_for_the_operator() -> None:
    from enflame_gcu.gcu_operator import api, runner
    from tests.gcu_operator.fake_api import FakeApi, FakeCluster
    from tests.gcu_operator.helpers import converge, ours, vendor_example

    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours())
    fake.now += 1
    fake.put(api.LEGACY_GCU_RESOURCE, vendor_example())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    ticks = {"n": 0}

    def operator_runs(_: float) -> None:  # the running operator, between two looks
        ticks["n"] += 1
        operator.run_once()
        cluster.step()

    code = main.remove_resources(fake, 600, clock=lambda: ticks["n"] * 2.0, sleep=operator_runs)
    assert code == 0
    assert fake.objects(api.GCU_RESOURCE) == [] and fake.objects(api.LEGACY_GCU_RESOURCE) == []
    assert fake.objects(api.DAEMONSET) == []
    assert cluster.undo_log == ["node-a"]


def test_remove_resources_names_what_is_left_when_no_operator_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from enflame_gcu.gcu_operator import api
    from tests.gcu_operator.fake_api import FakeApi
    from tests.gcu_operator.helpers import ours

    fake = FakeApi()
    resource = ours()
    resource["metadata"]["finalizers"] = ["topsops.enflame.com/v1"]
    fake.put(api.GCU_RESOURCE, resource)
    now = {"t": 0.0}

    def wait(seconds: float) -> None:
        now["t"] += seconds

    assert main.remove_resources(fake, 10, clock=lambda: now["t"], sleep=wait) == 1
    assert "topscloud.enflame.com/gcu" in caplog.text
    assert "is the operator running?" in caplog.text
