"""Flags, env vars and defaults: CLI > env > defaults, every value validated with a clear text."""

from __future__ import annotations

import pathlib
import re

import pytest

from enflame_gcu import __version__
from enflame_gcu.device_plugin import config, main
from enflame_gcu.errors import ConfigError


def test_defaults_match_the_product_names() -> None:
    got = main.load_config([], {})
    assert got == config.PluginConfig()
    assert got.socket_path == "/var/lib/kubelet/device-plugins/enflame.sock"
    assert got.resource_name == "enflame.com/gcu"
    assert got.device_list_strategy == ("envvar",)
    assert got.health_interval == 5.0


@pytest.mark.parametrize("spelling", ["current", "0.1"])
def test_every_option_has_an_env_var(tmp_path: pathlib.Path, spelling: str) -> None:
    (tmp_path / "c.yaml").write_text("version: v1\n")
    old_env = {
        "CONFIG_FILE": str(tmp_path / "c.yaml"),
        "DP_RESOURCES": "gcu,vgcu",
        "DP_VGCU_RESOURCE_NAME": "example.com/v",
        "DP_SHARED_RESOURCE_NAME": "example.com/s",
        "DP_METRICS_PORT": "9400",
        "DP_PLUGIN_DIR": "/p",
        "DP_HOST_ROOT": "/host",
        "DP_RESOURCE_NAME": "example.com/x",
        "PASS_DEVICE_SPECS": "true",
        "DEVICE_LIST_STRATEGY": "volume-mounts,cdi-cri",
        "DP_HEALTH_INTERVAL": "2.5",
        "DP_DISABLE_HEALTHCHECKS": "all",
        "FAIL_ON_INIT_ERROR": "yes",
        "DP_ALLOCATION_POLICY": "simple",
        "DP_LOG_LEVEL": "DEBUG",
        "DP_NODE_MODE": "runtimeclass",
        "DP_LOG_FORMAT": "json",
        "DP_METRICS_BIND_ADDRESS": "[::1]",
        "DP_POD_RESOURCES_SOCKET": "/pr/kubelet.sock",
        "DP_POD_RESOURCES_INTERVAL": "0",
        "DP_FEATURE_FILE": "/nfd/enflame-gcu",
    }
    # Options 0.1 did not have: one name only (NODE_NAME and KUBECONFIG as the DRA driver's).
    new_env = {
        "ENFLAME_DRS_RESOURCE_NAME": "example.com/d",
        "ENFLAME_EFSMI": "/opt/efsmi",
        "ENFLAME_DRS_RELEASE_GRACE": "12",
        "ENFLAME_DRS": "gcu1,S60",
        "ENFLAME_TELEMETRY_INTERVAL": "30",
        "ENFLAME_TELEMETRY_TIMEOUT": "2",
        "ENFLAME_TELEMETRY_ISOLATION": "process",
        "ENFLAME_EFML_LIBRARY": "/opt/efml/libefml.so",
        "ENFLAME_NODE_STATE": "false",
        "NODE_NAME": "node-1",
        "KUBECONFIG": "/kc",
        "ENFLAME_CONFIG_DEFAULT": "pool-a",
        "ENFLAME_CONFIG_LABEL": "example.com/pool",
        "ENFLAME_CONFIG_LABEL_INTERVAL": "10",
        # The one spelling of the metrics halves above; the same address, so both agree.
        "ENFLAME_HTTP_ADDRESS": "[::1]:9400",
    }
    # Named configs instead of the config file: read, but not together with CONFIG_FILE.
    instead = {"ENFLAME_CONFIG_DIR": "/configs"}
    assert config.env_layer(instead) == {"config_dir": "/configs"}
    assert {o.old_env for o in config.OPTIONS if o.old_env} == set(old_env)
    assert {o.env for o in config.OPTIONS if not o.old_env} == set(new_env) | set(instead)
    renamed = {o.old_env: o.env for o in config.OPTIONS}
    assert all(
        o.env == "ENFLAME_" + o.field.upper()
        for o in config.OPTIONS
        if o.env not in new_env and o.env not in instead
    )
    env = old_env if spelling == "0.1" else {renamed[k]: v for k, v in old_env.items()}
    env = {**env, **new_env}
    warnings: list[str] = []
    got = main.load_config([], env, warnings)
    if spelling == "0.1":  # one warning per old name, naming the new one
        assert len(warnings) == len(old_env)
        expected = "DP_HEALTH_INTERVAL is deprecated: use ENFLAME_HEALTH_INTERVAL"
        assert any(expected in warning for warning in warnings)
    else:
        assert warnings == []
    assert got == config.PluginConfig(
        plugin_dir="/p",
        host_root="/host",
        config_file=str(tmp_path / "c.yaml"),
        resources=("gcu", "vgcu"),
        vgcu_resource_name="example.com/v",
        shared_resource_name="example.com/s",
        drs_resource_name="example.com/d",
        efsmi="/opt/efsmi",
        drs_release_grace=12.0,
        drs="gcu1,S60",
        http_address="[::1]:9400",
        metrics_port=9400,
        resource_name="example.com/x",
        pass_device_specs=True,
        device_list_strategy=("volume-mounts", "cdi-cri"),
        health_interval=2.5,
        disable_healthchecks=True,
        fail_on_init_error=True,
        allocation_policy="simple",
        log_level="debug",
        node_mode="runtimeclass",
        node_mode_source="given explicitly",
        log_format="json",
        metrics_bind_address="::1",
        pod_resources_socket="/pr/kubelet.sock",
        pod_resources_interval=0.0,
        feature_file="/nfd/enflame-gcu",
        telemetry_interval=30.0,
        telemetry_timeout=2.0,
        telemetry_isolation="process",
        efml_library="/opt/efml/libefml.so",
        node_name="node-1",
        kubeconfig="/kc",
        config_default="pool-a",
        config_label="example.com/pool",
        config_label_interval=10.0,
    )


def test_command_line_beats_environment() -> None:
    env = {"PASS_DEVICE_SPECS": "true", "DP_PLUGIN_DIR": "/env", "DP_HEALTH_INTERVAL": "9"}
    got = main.load_config(["--no-pass-device-specs", "--plugin-dir", "/cli"], env)
    assert (got.pass_device_specs, got.plugin_dir, got.health_interval) == (False, "/cli", 9.0)


def test_device_list_strategy_is_repeatable_and_comma_separated() -> None:
    got = main.load_config(
        ["--device-list-strategy", "envvar,cdi-annotations", "--device-list-strategy", "cdi-cri"],
        {},
    )
    assert got.device_list_strategy == ("envvar", "cdi-annotations", "cdi-cri")


@pytest.mark.parametrize(
    ("argv", "env", "phrase"),
    [
        (["--device-list-strategy", "magic"], {}, "unknown strategy magic; valid: envvar"),
        ([], {"PASS_DEVICE_SPECS": "maybe"}, "invalid pass-device-specs: 'maybe' is not a bool"),
        (["--health-interval", "0"], {}, "outside 0.05..3600"),
        (["--health-interval", "soon"], {}, "invalid health-interval"),
        (["--resource-name", "gcu"], {}, "needs a domain prefix"),
        (["--resource-name", "kubernetes.io/gcu"], {}, "needs a domain prefix"),
        (["--plugin-dir", "relative"], {}, "not an absolute path"),
        (["--log-level", "loud"], {}, "not one of debug, info"),
        ([], {"DP_DISABLE_HEALTHCHECKS": "xids"}, "use 'all'"),
        (["--allocation-policy", "random"], {}, "not one of simple, topology"),
        (["--metrics-bind-address", "localhost"], {}, "'localhost' is not an IP address"),
        (["--log-format", "xml"], {}, "not one of text, json"),
        (["--pod-resources-interval", "0.01"], {}, "outside 0.1..3600 seconds (0 = never"),
    ],
)
def test_bad_values_name_the_setting_and_what_is_valid(
    argv: list[str], env: dict[str, str], phrase: str
) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        main.load_config(argv, env)
    assert phrase in str(caught.value)


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main.main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"enflame-device-plugin {__version__}"


def test_help_documents_every_env_var(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in config.OPTIONS:
        assert option.env in text


def test_bad_config_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["--health-interval", "-1"]) == 2
    assert "invalid health-interval" in capsys.readouterr().err


def test_describe_lists_every_setting_once() -> None:
    text = config.PluginConfig().describe()
    assert text.count("=") == len(config.PluginConfig.__dataclass_fields__)
    assert "socket_name='enflame.sock'" in text


def test_the_current_name_wins_over_the_old_one() -> None:
    warnings: list[str] = []
    env = {"ENFLAME_HEALTH_INTERVAL": "3", "DP_HEALTH_INTERVAL": "9", "PASS_DEVICE_SPECS": "1"}
    got = main.load_config([], env, warnings)
    assert got.health_interval == 3.0 and got.pass_device_specs is True
    assert warnings == [
        "environment variable PASS_DEVICE_SPECS is deprecated: use ENFLAME_PASS_DEVICE_SPECS "
        "(the old name stops working in 0.2.0)"
    ]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--telemetry-interval", "0.01", "outside 0.1..3600 seconds (0 turns card telemetry off)"),
        ("--telemetry-interval", "often", "not a number of seconds"),
        ("--telemetry-timeout", "0", "outside 0.05..60 seconds"),
        ("--efml-library", "libefml.so", "not an absolute path"),
    ],
)
def test_telemetry_settings_are_checked(flag: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        main.load_config([flag, value], {})
