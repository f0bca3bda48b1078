"""What we deploy speaks the daemons' current dialect (issue 50 point 4): no container of the
chart, the static manifests or the operator's components passes an old spelling (each would
print a deprecation line at every start), and every argument parses with the program's own
parser."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from enflame_gcu.device_plugin import main as plugin_main
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.dra_plugin import main as dra_main
from enflame_gcu.gcu_operator import components
from enflame_gcu.gcu_operator import main as operator_main
from enflame_gcu.gcu_operator import resource as rs
from enflame_gcu.scheduler_extender import main as extender_main
from enflame_gcu.support.cli_options import DeprecatedOption
from tests.deploy import helm_render
from tests.deploy.helpers import DEPLOY, load_all

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "enflame-device-plugin": plugin_main.build_parser,
    "enflame-scheduler-extender": lambda: extender_main.build_parser({}),
    "enflame-gcu-operator": operator_main._parser,
    "enflame-dra-plugin": lambda: dra_config.build_parser({}),
}
# $(VAR) references the kubelet expands, as a pod would see them.
EXPANDED = {"$(POD_IP)": "10.0.0.7", "$(NODE_NAME)": "node-1", "$(POD_NAME)": "pod-1",
            "$(POD_NAMESPACE)": "kube-system"}  # fmt: skip


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key in ("containers", "initContainers"):
            yield from node.get(key) or ()
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


def _program(container: dict[str, Any]) -> str:
    command = container.get("command") or []
    if command:
        return str(command[0]).rsplit("/", 1)[-1]
    # The device plugin image's entry point (deploy/docker/Dockerfile).
    return "enflame-device-plugin" if "device-plugin" in str(container.get("image")) else ""


def _old_spellings(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        if isinstance(action, DeprecatedOption)
        for option in action.option_strings
    }


def _check(where: str, container: dict[str, Any]) -> str | None:
    """The program a container runs, after checking its arguments; None when not ours."""
    program = _program(container)
    if program not in PARSERS:
        return None
    args = [str(a) for a in container.get("args") or []]
    command = [str(c) for c in container.get("command") or []][1:]
    args = command + args
    for name, value in EXPANDED.items():
        args = [a.replace(name, value) for a in args]
    if program == "enflame-dra-plugin" and args[:1] == ["cleanup"]:  # the chart's clean-up Job
        parser, args = dra_main.cleanup_parser(), args[1:]
    else:
        parser = PARSERS[program]()
    old = _old_spellings(parser)
    assert old, f"{program}: no old spellings found to check against"
    used = [a for a in args if a.split("=", 1)[0] in old]
    assert not used, f"{where}: {program} passed old spellings {used}"
    parser.parse_args(args)  # SystemExit on anything its parser refuses
    return program


def test_the_static_manifests_pass_no_old_spelling() -> None:
    seen = set()
    for directory in ("yaml", "dra", "extender"):
        folder = os.path.join(DEPLOY, directory)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".yaml"):
                for container in _containers(load_all(os.path.join(folder, name))):
                    seen.add(_check(f"{directory}/{name}", container))
    assert {"enflame-device-plugin", "enflame-scheduler-extender"} <= seen, seen


@pytest.mark.skipif(helm_render.helm_missing(), reason="no .venv-helm (scripts/bootstrap.sh)")
@pytest.mark.parametrize(
    "overrides",
    [
        {"dra": {"enabled": True}, "extender": {"enabled": True}, "toolkit": {"enabled": True},
         "metrics": {"bindAddress": "fd00::7"}},
        {"extender": {"enabled": True, "mode": "daemonset"},
         "metrics": {"bindAddress": "10.0.0.7"}},
        {"operator": {"enabled": True}},
    ],
    ids=["daemons-ipv6-metrics", "extender-daemonset", "operator"],
)  # fmt: skip
def test_the_chart_passes_no_old_spelling(tmp_path: str, overrides: dict[str, Any]) -> None:
    rendered = helm_render.render(str(tmp_path), overrides)
    seen = {
        _check(name, container)
        for name, documents in rendered.items()
        for container in _containers(documents)
    }
    assert seen - {None}, rendered.keys()
    if "metrics" in overrides:
        plugin = next(_containers(rendered["daemonset-device-plugin.yaml"]))
        bind = overrides["metrics"]["bindAddress"]
        want = f"[{bind}]:9402" if ":" in bind else f"{bind}:9402"
        assert f"--http-address={want}" in plugin["args"]


def test_the_operators_components_pass_no_old_spelling() -> None:
    spec = rs.parse({"devicePlugin": {"nodeState": True, "telemetry": {"enabled": True}},
                     "dra": {}})  # fmt: skip
    for key in (rs.DEVICE_PLUGIN, rs.DRA):
        build = (
            components._plugin_container if key == rs.DEVICE_PLUGIN else components._dra_container
        )
        container = build(spec.components[key], spec)
        container.setdefault("image", spec.components[key].image)
        assert _check(f"operator component {key}", container) is not None, container


def test_an_ipv6_pod_ip_before_the_port_parses_without_brackets() -> None:
    """The chart's operator and DRA driver pass --http-address=$(POD_IP):PORT; the port is what
    follows the last colon, so an IPv6 pod IP needs no brackets."""
    args = operator_main._parser().parse_args(["--http-address=fd00::7:8081"])
    assert (args.health_address, args.health_port) == ("fd00::7", 8081)
