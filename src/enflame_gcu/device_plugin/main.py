"""``enflame-device-plugin``: parse flags and env vars, log the effective config, run the plugin."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from enflame_gcu import __version__
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import kubelet, runner
from enflame_gcu.errors import ConfigError

log = logging.getLogger("enflame_gcu.device_plugin")


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one flag per config option, each naming its environment variable."""
    parser = argparse.ArgumentParser(
        prog="enflame-device-plugin",
        description="Advertise Enflame GCUs to the kubelet (Kubernetes device plugin v1beta1).",
        epilog="Precedence: command line > environment > defaults. SIGHUP rediscovers and "
        "re-registers; SIGTERM/SIGINT stop cleanly.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    defaults = plugin_config.PluginConfig()
    for option in plugin_config.OPTIONS:
        if option.field == "disable_healthchecks":
            continue  # env var only, as in other device plugins
        default = getattr(defaults, option.field)
        if isinstance(default, tuple):
            default = ",".join(default)
        text = f"{option.help} [env {option.env}; default {default}]"
        name = "--" + option.field.replace("_", "-")
        if option.flag:
            parser.add_argument(
                name, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        elif option.field == "device_list_strategy":
            parser.add_argument(name, action="append", default=None, help=text + "; repeatable")
        else:
            parser.add_argument(name, default=None, help=text)
    parser.epilog = (parser.epilog or "") + (
        f" {'DP_DISABLE_HEALTHCHECKS'}=all reports every card healthy as discovered."
    )
    return parser


def load_config(argv: Sequence[str] | None, environ: dict[str, str]) -> plugin_config.PluginConfig:
    """Parse argv over the environment over the defaults."""
    args = vars(build_parser().parse_args(argv))
    if args.get("device_list_strategy") is not None:
        args["device_list_strategy"] = ",".join(args["device_list_strategy"])
    return plugin_config.resolve([args, plugin_config.env_layer(environ)])


async def _serve(config: plugin_config.PluginConfig) -> int:
    signals = kubelet.Signals()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, signals.stop.set)
    loop.add_signal_handler(signal.SIGINT, signals.stop.set)
    loop.add_signal_handler(signal.SIGHUP, signals.restart.set)
    return await runner.run(config, signals)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``enflame-device-plugin``."""
    try:
        config = load_config(argv, dict(os.environ))
    except ConfigError as exc:
        print(f"enflame-device-plugin: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=plugin_config.log_level(config),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # gRPC's and asyncio's debug chatter drowns our own debug lines; keep them at WARNING.
    for noisy in ("grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, plugin_config.log_level(config)))
    log.info("enflame-device-plugin %s starting: %s", __version__, config.describe())
    return asyncio.run(_serve(config))


if __name__ == "__main__":
    sys.exit(main())
