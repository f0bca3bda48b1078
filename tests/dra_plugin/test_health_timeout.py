"""Health the kubelet keeps reading as Healthy: the driver re-sends the full list inside the
timeout, and the stand-in kubelet applies the kubelet's timeout rule (DRA.md §3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from enflame_gcu.dra_plugin import service
from enflame_gcu.simulation import simulate
from tests.dra_plugin import harness

DRIVER = harness.DRIVER
CARDS = [f"gcu-{i}" for i in range(8)]


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def states(env: harness.Running) -> dict[str, str]:
    return {name: env.kubelet.device_health(DRIVER, harness.NODE, name) for name in CARDS}


async def until(condition: Any, what: str, timeout: float = 5) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
def one_second_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # One second instead of 30 keeps the test short; the rule is the same.
    monkeypatch.setattr(service, "HEALTH_TIMEOUT_SECONDS", 1)


@pytest.mark.usefixtures("one_second_timeout")
def test_quiet_devices_stay_healthy_after_two_timeouts() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            async with harness.running(where, harness.FakeClaims(), watch_health=True) as env:
                await env.kubelet.wait_registered(DRIVER)
                env.kubelet.follow_health(DRIVER)
                await until(lambda: set(states(env).values()) == {"Healthy"}, "all Healthy")
                first = env.kubelet.health[(DRIVER, harness.NODE, "gcu-0")]
                await asyncio.sleep(2.5)  # two and a half timeouts, nothing changes
                assert states(env) == dict.fromkeys(CARDS, "Healthy")
                later = env.kubelet.health[(DRIVER, harness.NODE, "gcu-0")]
                assert later.received > first.received  # received again, not just kept
                # A resend confirms; it does not pretend the state changed.
                assert later.last_updated_time == first.last_updated_time
                assert later.timeout == 1

    run(main())


@pytest.mark.usefixtures("one_second_timeout")
def test_a_replugged_card_reads_healthy_again_and_stays_so() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            async with harness.running(where, harness.FakeClaims(), watch_health=True) as env:
                await env.kubelet.wait_registered(DRIVER)
                env.kubelet.follow_health(DRIVER)
                await until(lambda: states(env)["gcu-3"] == "Healthy", "gcu-3 Healthy")
                simulate.unplug(where.root, 3)
                await until(lambda: states(env)["gcu-3"] == "Unhealthy", "gcu-3 Unhealthy")
                await asyncio.sleep(2.5)
                assert states(env)["gcu-3"] == "Unhealthy"  # still reported, not Unknown
                simulate.replug(where.root, 3)
                await until(lambda: states(env)["gcu-3"] == "Healthy", "gcu-3 Healthy again")
                await asyncio.sleep(2.5)
                assert states(env) == dict.fromkeys(CARDS, "Healthy")

    run(main())


@pytest.mark.usefixtures("one_second_timeout")
def test_the_stand_in_kubelet_reads_unknown_when_reports_come_slower_than_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A driver that sends once and then only every 20 s (as today's change-only stream does
    # in effect): the kubelet's rule turns every quiet device Unknown one timeout later.
    monkeypatch.setattr(service, "HEALTH_RESEND_FRACTION", 0.05)

    async def main() -> None:
        with harness.simulated_node() as where:
            async with harness.running(where, harness.FakeClaims(), watch_health=True) as env:
                await env.kubelet.wait_registered(DRIVER)
                env.kubelet.follow_health(DRIVER)
                await until(lambda: set(states(env).values()) == {"Healthy"}, "all Healthy")
                reports = env.kubelet.health_reports
                await until(lambda: set(states(env).values()) == {"Unknown"}, "all Unknown", 3)
                assert env.kubelet.health_reports == reports  # nothing new was received
                assert (DRIVER, harness.NODE, "gcu-0") in env.kubelet.health  # kept, but stale

    run(main())


def test_the_stream_resends_every_third_of_the_timeout() -> None:
    assert service.health_resend_seconds() == service.HEALTH_TIMEOUT_SECONDS / 3 == 10
