"""``enflame-dra-plugin`` as its own process: stub kubelet + fake API server, start to stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import claim_cdi
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness, slices_helpers
from tests.dra_plugin.fake_apiserver import FakeApiServer

DRIVER = resourceslices.DRIVER
NODE = harness.NODE


def command(where: harness.Node, kubeconfig: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "enflame_gcu.dra_plugin.main",
        "--node-name",
        NODE,
        "--host-root",
        where.root,
        "--registry-dir",
        where.registry,
        "--plugin-dir",
        where.plugins,
        "--cdi-dir",
        where.cdi,
        "--kubeconfig",
        kubeconfig,
        "--health-interval",
        "0.2",
        *extra,
    ]


async def eventually(condition: Any, what: str, timeout: float = 15) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


def test_the_driver_registers_publishes_prepares_and_stops_cleanly() -> None:
    async def main() -> None:
        with harness.simulated_node() as where, FakeApiServer() as fake:
            fake.add_node(NODE)
            kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
            fake.add_claim(
                harness.claim_document(
                    "enflame", "pair", "uid-p", [("gcus", "gcu-0"), ("gcus", "gcu-1")]
                )
            )
            log_path = os.path.join(where.work, "driver.log")
            stub = DraKubeletStub(where.registry, on_start=_wipe(fake))
            await stub.start()
            with open(log_path, "wb") as log:
                process = await asyncio.create_subprocess_exec(
                    *command(where, kubeconfig), stdout=log, stderr=subprocess.STDOUT
                )
            try:
                await stub.wait_registered(DRIVER, timeout=20)
                await eventually(lambda: len(fake.node_slices(NODE)) == 1, "slices published")
                for item in fake.node_slices(NODE):
                    for version in slices_helpers.VERSIONS:
                        slices_helpers.validate(item, version)
                answer = await stub.prepare(DRIVER, [("enflame", "pair", "uid-p")])
                entry = answer.claims["uid-p"]
                assert entry.error == ""
                assert [d.device_name for d in entry.devices] == ["gcu-0", "gcu-1"]
                assert os.path.exists(claim_cdi.spec_path(where.cdi, "uid-p"))
                # A kubelet restart wipes the slices: the driver publishes them again.
                await stub.restart()
                await stub.wait_registered(DRIVER, count=2, timeout=20)
                await eventually(lambda: len(fake.node_slices(NODE)) == 1, "re-published")
                assert slices_generation(fake) == 2
                process.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(process.wait(), 20) == 0
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await stub.stop()
            with open(log_path, encoding="utf-8") as handle:
                text = handle.read()
            assert "starting on node node-a" in text and "stopped" in text, text
            assert os.listdir(where.registry) == []
            # Stopping is not uninstalling: the slices stay (the kubelet wipes them if the
            # driver does not come back); the prepared claim stays on record.
            assert len(fake.node_slices(NODE)) == 1
            with open(os.path.join(where.plugins, "checkpoint.json"), encoding="utf-8") as f:
                assert list(json.load(f)["claims"]) == ["uid-p"]

    asyncio.run(main())


def slices_generation(fake: FakeApiServer) -> int:
    (generation,) = {s["spec"]["pool"]["generation"] for s in fake.node_slices(NODE)}
    return int(generation)


def _wipe(fake: FakeApiServer) -> Any:
    async def wipe() -> None:
        fake.wipe(NODE)

    return wipe


def test_cleanup_deletes_the_driver_slices_of_every_node() -> None:
    with harness.simulated_node() as where, FakeApiServer() as fake:
        kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
        for name, driver in (("node-a", DRIVER), ("node-b", DRIVER), ("other", "x.example.com")):
            (document,) = resourceslices.build_slices(name, None, [], 1)
            document["spec"]["driver"] = driver
            document["metadata"]["resourceVersion"] = "1"
            fake.slices[document["metadata"]["name"]] = document
        base = [sys.executable, "-m", "enflame_gcu.dra_plugin.main", "cleanup"]
        one = subprocess.run(
            [*base, "--node-name", "node-a", "--kubeconfig", kubeconfig],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert one.returncode == 0, one.stderr
        assert [s["spec"]["nodeName"] for s in fake.slices.values()] == ["node-b", "other"]
        every = subprocess.run(
            [*base, "--all-nodes", "--kubeconfig", kubeconfig],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert every.returncode == 0, every.stderr
        assert [s["spec"]["nodeName"] for s in fake.slices.values()] == ["other"]
        assert "deleted 1 ResourceSlice(s) of gcu.enflame.com on every node" in every.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shared-slices", "99"], "--shared-slices must be 0..64"),
        (["--unhealthy", "ignore"], "--unhealthy: 'ignore' is not one of taint, omit"),
        (["--node-name", ""], "the node name is unknown"),
        (["--host-root", "host"], "--host-root must be an absolute path, got 'host'"),
        (["--cdi-dir", "cdi"], "--cdi-dir must be an absolute path, got 'cdi'"),
    ],
)
def test_bad_settings_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    result = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.dra_plugin.main", "--node-name", "n", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize("extra", [[], ["--no-publish"]])
def test_no_token_and_no_kubeconfig_exit_2_with_a_message_not_a_traceback(
    extra: list[str],
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with harness.simulated_node() as where:
        argv = [a for a in command(where, "x") if a not in ("--kubeconfig", "x")]
        result = subprocess.run(
            [*argv, *extra], capture_output=True, text=True, timeout=60, env=env
        )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "cannot configure the API client from the in-cluster service account" in result.stderr
    assert "pass --kubeconfig" in result.stderr


def test_version_prints_and_exits_zero() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.dra_plugin.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.startswith("enflame-dra-plugin ")


FAILING_SERVE = """
import sys
from enflame_gcu.dra_plugin import kubelet, main

async def fails(self, stop):
    raise OSError("cannot bind the service socket (injected)")

kubelet.KubeletPlugin.serve_until = fails
sys.exit(main.main(sys.argv[1:]))
"""


def test_a_driver_whose_kubelet_side_fails_exits_instead_of_serving_nothing() -> None:
    """Before: serving failed, the process waited for a SIGTERM forever, Ready and useless."""
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(NODE)
        kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
        argv = command(where, kubeconfig)[3:]  # the options, after "-m module"
        result = subprocess.run(
            [sys.executable, "-c", FAILING_SERVE, *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "a part of the driver ended without a stop being asked for" in result.stderr
    assert "cannot bind the service socket (injected)" in result.stderr
