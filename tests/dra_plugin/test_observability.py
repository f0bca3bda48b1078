"""Operators can see the driver: /healthz, /readyz and /metrics of the real process (loopback)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import observability
from enflame_gcu.errors import EfsmiError
from enflame_gcu.simulation import efsmi_sim
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command, eventually

DRIVER = resourceslices.DRIVER
NODE = harness.NODE


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_probes_and_metrics_follow_registration_publishing_and_claims() -> None:
    async def main() -> None:
        with harness.simulated_node() as where, FakeApiServer() as fake:
            fake.add_node(NODE)
            fake.add_claim(harness.claim_document("ns", "p", "uid-p", [("p", "gcu-1-1g-8gb-0")]))
            fake.add_claim(harness.claim_document("ns", "bad", "uid-bad", [("p", "gcu-9")]))
            kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
            port = free_port()
            tool = efsmi_sim.install(where.root)
            args = [
                *command(where, kubeconfig),
                *("--drs", "gcu1", "--efsmi", tool, "--http-address", f"127.0.0.1:{port}"),
            ]
            log_path = os.path.join(where.work, "driver.log")
            with open(log_path, "wb") as log:
                process = await asyncio.create_subprocess_exec(
                    *args, stdout=log, stderr=subprocess.STDOUT
                )
            stub = DraKubeletStub(where.registry)
            try:
                await eventually(lambda: get(port, "/healthz")[0] == 200, "live", 60)
                # Not registered yet: the kubelet stub is not running.
                status, text = get(port, "/readyz")
                assert (status, text.strip()) == (503, "not registered with the kubelet yet")
                await stub.start()
                await stub.wait_registered(DRIVER, timeout=30)
                await eventually(lambda: get(port, "/readyz")[0] == 200, "ready", 30)
                assert len(fake.node_slices(NODE)) == 2  # counter sets + devices
                ok = await stub.prepare(DRIVER, [("ns", "p", "uid-p")])
                assert ok.claims["uid-p"].error == ""
                bad = await stub.prepare(DRIVER, [("ns", "bad", "uid-bad")])
                assert "not a device this node offers" in bad.claims["uid-bad"].error
                status, text = get(port, "/metrics")
                assert status == 200
                found = samples(text)
                assert found[("enflame_dra_claims_prepared", ())] == 1
                assert found[("enflame_dra_drs_instances", (("card", "gcu1"),))] == 1
                assert found[("enflame_dra_prepare_seconds_count", ())] == 2
                assert (
                    found[
                        (
                            "enflame_dra_errors_total",
                            (("operation", "prepare"), ("reason", "claim")),
                        )
                    ]
                    == 1
                )
                assert (
                    found[
                        ("enflame_dra_devices_published", (("state", "healthy"), ("type", "drs")))
                    ]
                    == 7
                )
                assert (
                    found[
                        ("enflame_dra_devices_published", (("state", "healthy"), ("type", "gcu")))
                    ]
                    == 8
                )
                assert found[("enflame_dra_slices_published_generation", ())] == 1
                unprepared = await stub.unprepare(DRIVER, [("ns", "p", "uid-p")])
                assert unprepared.claims["uid-p"].error == ""
                found = samples(get(port, "/metrics")[1])
                assert found[("enflame_dra_unprepare_seconds_count", ())] == 1
                assert found[("enflame_dra_claims_prepared", ())] == 0
                assert get(port, "/nothing")[0] == 404
                process.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(process.wait(), 20) == 0
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await stub.stop()

    asyncio.run(main())


def test_error_reasons_are_short_and_bounded() -> None:
    assert observability.reason_of(EfsmiError("timeout", "x")) == "efsmi-timeout"
    assert observability.reason_of(OSError("x")) == "io"
    assert observability.reason_of(RuntimeError("x")) == "other"


@pytest.mark.parametrize("text", ["9400", "host:", "a:b", "1.2.3.4:70000"])
def test_a_bad_http_address_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        observability.parse_address(text)
