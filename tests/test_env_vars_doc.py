"""The user guides' environment variable table is what the programs read (EN and ZH alike)."""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest

from enflame_gcu.container_toolkit.commands import install as ctk_install
from enflame_gcu.container_toolkit.engines import hosts
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.support import env_vars

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDES = ("docs/user-guide.md", "docs/user-guide.zh-CN.md")
NOT_OPTIONS = {"ENFLAME_CONTAINER_RUNTIME_CONFIG", "NODE_NAME", "POD_UID", "KUBECONFIG"}


def table(guide: str) -> dict[str, tuple[str, set[str]]]:
    """``{variable: (read by, {0.1 names})}`` from the guide's env-vars table."""
    text = (ROOT / guide).read_text("utf-8")
    start = text.index("<!-- env-vars:")
    rows: dict[str, tuple[str, set[str]]] = {}
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        names, where, old = (cell.strip() for cell in line.strip("|").split("|"))
        for name in re.findall(r"`([A-Z_]+)`", names):
            rows[name] = (where, set(re.findall(r"`([A-Z_]+)`", old)))
    return rows


@pytest.mark.parametrize("guide", GUIDES)
def test_the_table_lists_every_device_plugin_variable_and_its_old_name(guide: str) -> None:
    rows = table(guide)
    for option in plugin_config.OPTIONS:
        assert option.env in rows, f"{guide}: {option.env} is missing"
        where, old = rows[option.env]
        assert "enflame-device-plugin" in where
        if option.old_env is not None:
            assert option.old_env in old, f"{guide}: {option.env} does not name {option.old_env}"
        else:
            assert not old, f"{guide}: {option.env} is new in this release: no 0.1 name"


@pytest.mark.parametrize("guide", GUIDES)
def test_every_listed_variable_is_read_and_every_old_name_warns(guide: str) -> None:
    for name, (where, old_names) in table(guide).items():
        if name in NOT_OPTIONS:
            continue
        assert name.startswith(env_vars.PREFIX), name
        option = name.removeprefix(env_vars.PREFIX).lower().replace("_", "-")
        value = _value_for(option)
        programs = [(p, parse) for p, parse in PARSERS if p in where]
        assert programs, f"{guide}: {name} is read by no program we know: {where}"
        for program, parse in programs:
            assert parse({name: value}) == [], f"{name} ({program}) warns"
        for old in old_names:  # some program reads it, and says which name to use instead
            said = [w for _, parse in programs for w in parse({old: value})]
            assert said and name in said[0], f"{guide}: {old} is not read as {name}"


def _value_for(option: str) -> str:
    return {
        "resources": "gcu",
        "shared-slices": "2",
        "unhealthy": "omit",
        "node-mode": "cdi",
        "log-level": "debug",
        "log-format": "json",
        "allocation-policy": "simple",
        "device-list-strategy": "envvar",
        "disable-healthchecks": "all",
        "metrics-port": "9400",
        "metrics-bind-address": "127.0.0.1",
        "drs": "all",
        "drs-resource-name": "enflame.com/drs-gcu",
        "node-state": "false",
        "http-address": "127.0.0.1:8080",
        "telemetry-timeout": "5",
        "efsmi": "/usr/bin/efsmi",
        "preset": "k3s",
        "containerd-service": "k3s-agent",
    }.get(option, "1" if "interval" in option or option.startswith(("pass", "fail")) else "/x")


def _plugin(env: dict[str, str]) -> list[str]:
    warnings: list[str] = []
    plugin_config.env_layer(env, warnings)
    return warnings


def _dra(env: dict[str, str]) -> list[str]:
    return list(dra_config.parse([], {"NODE_NAME": "n1", **env}).deprecated_env)


def _ctk_install(env: dict[str, str]) -> list[str]:
    # Raises on a value it refuses; the toolkit's variables have no 0.1 names to warn about.
    site = ctk_install.containerd_from(argparse.Namespace(), env)
    assert site != hosts.ContainerdSite(), f"{env} changed nothing"
    return []


PARSERS = (
    ("enflame-device-plugin", _plugin),
    ("enflame-dra-plugin", _dra),
    ("enflame-ctk install", _ctk_install),
)
