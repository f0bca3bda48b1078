"""doctor checks the engine the kubelet runs, found as deploy/k8s-config.sh finds it, and says
which engine it checked and why."""

from __future__ import annotations

import json

import pytest

from enflame_gcu.container_toolkit import doctor, engines
from enflame_gcu.container_toolkit.cli import main
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx

CONTAINERD = "unix:///run/containerd/containerd.sock"
CONFIG = "/var/lib/kubelet/config.yaml"


@pytest.fixture
def node(make_node: MakeNode) -> str:
    """docker and containerd installed; only containerd has the enflame runtime (default)."""
    root = make_node("vendor-8card")
    fx.fake_host(root)
    engines.configure(
        "containerd", None, engines.RuntimeOptions(set_as_default=True), host_root=root
    )
    return root


def _results(root: str) -> dict[str, doctor.Result]:
    return {result.name: result for result in doctor.run(root)}


def test_the_kubelets_engine_is_checked_and_the_others_are_named(node: str) -> None:
    fx.write(node, CONFIG, f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {CONTAINERD}\n")
    results = _results(node)
    engine = results["engine"]
    assert engine.status == "pass"
    assert engine.detail == (
        "checking containerd, the engine the kubelet runs: the kubelet's CRI endpoint "
        f"{CONTAINERD} (containerRuntimeEndpoint in {CONFIG}); not checked, the kubelet does "
        "not use them: docker"
    )
    assert results["engine-containerd"].status == "pass"
    assert "engine-docker" not in results  # docker runs no pod here: its config does not matter


def test_without_the_kubelets_word_every_engine_is_checked_and_the_socket_named(
    node: str,
) -> None:
    fx.write(node, "/run/containerd/containerd.sock", "")
    results = _results(node)
    assert results["engine"].detail == (
        "checking every engine found (docker, containerd): containerd runs (socket "
        "/run/containerd/containerd.sock (the kubelet's CRI endpoint is not set))"
    )
    assert results["engine-docker"].status == "fail"  # unconfigured, and it may run pods
    assert results["engine-containerd"].status == "pass"


def test_a_kubelet_naming_an_engine_that_is_not_here_warns(node: str) -> None:
    flags = "KUBELET_KUBEADM_ARGS=--container-runtime-endpoint=unix:///var/run/crio/crio.sock\n"
    fx.write(node, "/var/lib/kubelet/kubeadm-flags.env", flags)
    results = _results(node)
    assert results["engine"].status == "warn"
    assert "the kubelet runs crio" in results["engine"].detail
    assert "no crio is installed here" in results["engine"].detail
    assert not [name for name in results if name.startswith("engine-")]


def test_the_json_report_names_the_engine_and_why(
    node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    process = f"/usr/bin/kubelet\0--container-runtime-endpoint={CONTAINERD}\0"
    fx.write(node, "/proc/321/cmdline", process)
    main(["doctor", "--host-root", node, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["engine"] == {
        "engine": "containerd",
        "source": "kubelet",
        "reason": f"the kubelet's CRI endpoint {CONTAINERD} (--container-runtime-endpoint of "
        "the running kubelet)",
        "endpoint": CONTAINERD,
    }
    main(["doctor", "--host-root", node])
    text = capsys.readouterr().out
    assert "PASS  engine " in text and "checking containerd, the engine the kubelet runs" in text
