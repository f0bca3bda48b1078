"""The chart's toolkit.preset and containerd paths reach the installer container (Helm's code)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import pytest

from enflame_gcu.container_toolkit.commands import install
from enflame_gcu.container_toolkit.engines import hosts
from tests.deploy import helm_render

pytestmark = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
TOOLKIT = "daemonset-container-toolkit.yaml"


def _container(rendered: dict[str, list[Any]]) -> dict[str, Any]:
    pod = helm_render.daemonset(rendered, TOOLKIT)["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    return container


def test_a_preset_and_paths_become_the_installers_environment(tmp_path: os.PathLike[str]) -> None:
    rendered = helm_render.render(
        str(tmp_path),
        {
            "toolkit": {
                "enabled": True,
                "preset": "rke2",
                "containerdSocket": "/run/k3s/containerd/other.sock",
                "env": [{"name": "EXTRA", "value": "1"}],
            }
        },
    )
    env = {e["name"]: e["value"] for e in _container(rendered)["env"]}
    assert env == {
        "ENFLAME_PRESET": "rke2",
        "ENFLAME_CONTAINERD_SOCKET": "/run/k3s/containerd/other.sock",
        "EXTRA": "1",
    }
    # What the installer makes of that environment (the container runs enflame-ctk install).
    site = install.containerd_from(argparse.Namespace(), env)
    assert site == hosts.ContainerdSite(
        hosts.PRESETS["rke2"].config,
        "/run/k3s/containerd/other.sock",
        ("rke2-server", "rke2-agent"),
        "rke2",
    )


def test_no_preset_renders_no_environment(tmp_path: os.PathLike[str]) -> None:
    rendered = helm_render.render(str(tmp_path), {"toolkit": {"enabled": True}})
    assert "env" not in _container(rendered)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"toolkit": {"preset": "microk8s"}}, "preset"),
        ({"toolkit": {"containerdConfig": "relative/config.toml"}}, "containerdConfig"),
        ({"toolkit": {"containerdSocket": 5}}, "containerdSocket"),
    ],
)
def test_the_schema_refuses_a_bad_preset_or_path(
    tmp_path: os.PathLike[str], overrides: dict[str, Any], problem: str
) -> None:
    assert problem in helm_render.lint_errors(str(tmp_path), overrides)
