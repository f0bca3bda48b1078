"""``enflame-device-plugin``: parse flags, env vars and the config file; log the effective config;
run the plugin (SIGHUP re-reads the file)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from enflame_gcu import __version__, devices, fileio, naming
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import kubelet, runner
from enflame_gcu.errors import ConfigError, PathOutsideRootError
from enflame_gcu.support import cli_options, daemon_cli, logs

if TYPE_CHECKING:
    # Imported where used (a config file, --config-dir): yaml and prometheus_client are not
    # needed by a plugin started from flags and the environment (bench_plugin_startup.py).
    from enflame_gcu.device_plugin import named_configs

log = logging.getLogger("enflame_gcu.device_plugin")
PROG = "enflame-device-plugin"
OLD_ADDRESS_FLAGS = ("metrics_port", "metrics_bind_address")


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one flag per config option, each naming its environment variable."""
    parser = argparse.ArgumentParser(
        prog="enflame-device-plugin",
        description="Advertise Enflame GCUs to the kubelet (Kubernetes device plugin v1beta1).",
        epilog="Precedence: command line > environment > config file > defaults. SIGHUP "
        "re-reads the config file (an invalid one is refused), rediscovers and re-registers; "
        "SIGTERM/SIGINT stop cleanly.",
    )
    daemon_cli.add_version(parser)
    defaults = plugin_config.PluginConfig()
    for option in plugin_config.OPTIONS:
        if option.field == "disable_healthchecks":
            continue  # env var only, as in other device plugins
        if option.field in OLD_ADDRESS_FLAGS:
            # Hidden old spellings of --http-address's halves: they work, and say so.
            cli_options.add_deprecated(
                parser, "--" + option.field.replace("_", "-"),
                f"{daemon_cli.HTTP_ADDRESS} {daemon_cli.HTTP_METAVAR}", option.field, prog=PROG,
            )  # fmt: skip
            continue
        default = getattr(defaults, option.field)
        if isinstance(default, tuple):
            default = ",".join(default)
        shown = "unset" if default in (None, "") else default
        repeat = "; repeatable" if option.many else ""
        text = f"{option.help}{repeat} {daemon_cli.env_help(option.env, str(shown))}"
        name = "--" + option.field.replace("_", "-")
        choices = [choice for choice in option.choices if choice]
        metavar = "{" + ",".join(choices) + "}" if choices else option.field.upper()
        if option.field == "http_address":
            metavar = daemon_cli.HTTP_METAVAR
        if option.flag:
            parser.add_argument(
                name, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        elif option.many:
            parser.add_argument(
                name, action="append", default=None, metavar="LIST", help=text,
            )  # fmt: skip
        else:
            parser.add_argument(name, default=None, metavar=metavar, help=text)
    parser.epilog = (parser.epilog or "") + (
        f" {naming.DISABLE_HEALTHCHECKS_ENV}=all reports every card healthy as discovered."
        " The old halves of --http-address, --metrics-port and --metrics-bind-address (env "
        "ENFLAME_METRICS_PORT, ENFLAME_METRICS_BIND_ADDRESS), still work; an --http-address "
        "given anywhere wins over them."
    )
    return parser


def load_config(
    argv: Sequence[str] | None,
    environ: dict[str, str],
    warnings: list[str] | None = None,
    named: str = "",
) -> plugin_config.PluginConfig:
    """Parse argv over the environment over the config file (if any) over the defaults;
    ``warnings`` gets one line per deprecated environment variable used. ``named``: the named
    config of ``--config-dir`` to use as the file ("" = none)."""
    args = vars(build_parser().parse_args(argv))
    for option in plugin_config.OPTIONS:
        if option.many and args.get(option.field) is not None:
            args[option.field] = ",".join(args[option.field])
    env = plugin_config.env_layer(environ, warnings)
    layers: list[Mapping[str, object]] = [args, env]
    given = plugin_config.resolve(layers)
    if given.config_file is not None or (given.config_dir is not None and named):
        from enflame_gcu.device_plugin import config_file  # noqa: PLC0415 - yaml, when used
    if given.config_file is not None:
        layers.append(config_file.load(given.config_file))
    elif given.config_dir is not None and named:
        layers.append(config_file.load(os.path.join(given.config_dir, named)))
    config = plugin_config.resolve(layers)
    return dataclasses.replace(config, config_name=named) if named else config


async def _serve(
    config: plugin_config.PluginConfig,
    reload: runner.Reload,
    named: named_configs.NamedConfigs | None,
) -> int:
    signals = kubelet.Signals()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, signals.stop.set)
    loop.add_signal_handler(signal.SIGINT, signals.stop.set)
    loop.add_signal_handler(signal.SIGHUP, signals.restart.set)
    return await runner.run(config, signals, reload, named)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``enflame-device-plugin``."""
    warnings: list[str] = []
    try:
        config = load_config(argv, dict(os.environ), warnings)
        # As cdi watch: a host root whose /sys or /dev leads out of it is refused, not read.
        fileio.require_confined(config.host_root, devices.DISCOVERY_PATHS)
    except (ConfigError, PathOutsideRootError) as exc:
        print(f"enflame-device-plugin: {exc}", file=sys.stderr)
        return 2
    if not os.path.isdir(config.host_root):
        # Checked once at start: a later SIGHUP re-reads the file, never the mounts.
        print(f"enflame-device-plugin: invalid host-root: {config.host_root} "
              f"{'is not a directory' if os.path.exists(config.host_root) else 'does not exist'}",
              file=sys.stderr)  # fmt: skip
        return 2
    logs.configure(config.log_format)
    apply_log_level(config)
    for warning in warnings:
        log.warning("%s", warning)
    log.info("enflame-device-plugin %s starting: %s", __version__, config.describe())
    environ = dict(os.environ)
    named = None
    if config.config_dir is not None:
        from enflame_gcu.device_plugin import named_configs  # noqa: PLC0415 - when used

        named = named_configs.NamedConfigs(config)

    def reload() -> plugin_config.PluginConfig:
        # Same command line and environment; only the file (or the node's label) can change.
        # An old spelling said so at start: not once more per SIGHUP.
        with contextlib.redirect_stderr(io.StringIO()):
            new = load_config(argv, environ, named="" if named is None else named.wanted)
        apply_log_level(new)
        return new

    return asyncio.run(_serve(config, reload, named))


def apply_log_level(config: plugin_config.PluginConfig) -> None:
    """Set our log level; gRPC's, asyncio's and the HTTP client's chatter stays at WARNING or
    above."""
    logging.getLogger().setLevel(plugin_config.log_level(config))
    # The API client logs every request at INFO (the node label is read every 30 s).
    for noisy in ("grpc", "asyncio", "httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, plugin_config.log_level(config)))


if __name__ == "__main__":
    sys.exit(main())
