"""``enflame-scheduler-extender``: parse flags, start the HTTP server and the API watches.

Every flag has an environment variable (``EXTENDER_<FLAG>``); the command line wins. SIGTERM or
SIGINT stop the watches and the server; the scheduler (``ignorable: true``) then schedules as
it would without the extender.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Mapping, Sequence

from enflame_gcu import __version__
from enflame_gcu.errors import ConfigError
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, heap, protocol, server, tls, watch

log = logging.getLogger("enflame_gcu.scheduler_extender")
DEFAULT_PORT = 32766  # gcushare-scheduler-extender's port, so existing configurations point here


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The CLI; each default comes from ``EXTENDER_<FLAG>`` when set."""
    parser = argparse.ArgumentParser(
        prog="enflame-scheduler-extender",
        description="kube-scheduler extender: prefers nodes that can give a pod's GCUs as one "
        "PCIe switch (then root port, NUMA node), filters shared-GCU pods by free slices.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--check-ready",
        action="store_true",
        help="ask the running extender's GET /readyz at --bind-address and --port over HTTP "
        "and exit 0 when ready, 1 when not (an exec probe for a pod without host networking)",
    )

    def option(flag: str, default: str, text: str) -> None:
        env = "EXTENDER_" + flag.upper().replace("-", "_")
        shown = default or "unset"
        parser.add_argument(
            f"--{flag}",
            default=environ.get(env, default),
            help=f"{text} [env {env}; default {shown}]",
        )

    option("bind-address", "127.0.0.1", "address to listen on (the scheduler's host)")
    option("port", str(DEFAULT_PORT), "port of /filter, /prioritize, /healthz, /readyz, /stats")
    option("kubeconfig", "", "kubeconfig file; empty = the pod's service account")
    option(
        "node-state-namespace",
        "",
        "namespace of the device plugins' node-state Leases; empty = the extender's own",
    )
    option("resource-name", "enflame.com/gcu", "extended resource of whole cards")
    option("shared-resource-name", "enflame.com/shared-gcu", "extended resource of slices")
    option("state-max-age", "180", "seconds after which a node state not refreshed is unknown")
    option(
        "admission-grace",
        "10",
        "seconds after a binding within which a node state may still not list the pod",
    )
    option("guess-ttl", "5", "seconds the node ranked first holds a pod until its binding is seen")
    option(
        "request-timeout",
        "5",
        "seconds a whole request (head and body) may take to arrive; about httpTimeout",
    )
    option(
        "max-body",
        str(server.MAX_BODY),
        "largest request body in bytes; raise only when nodeCacheCapable is false",
    )
    option(
        "tls-cert-file",
        "",
        "serve HTTPS with this PEM certificate (with --tls-key-file); the certificate, key and "
        "client CA are read again when their files change",
    )
    option("tls-key-file", "", "the PEM private key of --tls-cert-file")
    option("tls-client-ca-file", "", "with HTTPS: answer only clients with a cert this CA signed")
    option("log-level", "info", "debug, info, warning or error")
    return parser


def _number(text: str, flag: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"invalid --{flag}: {text!r} is not a number") from None
    if not low <= value <= high:
        raise ConfigError(f"invalid --{flag}: {text} is outside {low:g}..{high:g}")
    return value


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The HTTPS context the TLS flags ask for, or None for plain HTTP."""
    if not (args.tls_cert_file or args.tls_key_file or args.tls_client_ca_file):
        return None
    if not (args.tls_cert_file and args.tls_key_file):
        raise ConfigError("HTTPS needs both --tls-cert-file and --tls-key-file")
    # Read again whenever the files change (a rotated certificate needs no restart).
    return tls.ReloadingTLS(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file).context


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT."""
    cache = extender_cache.ClusterCache(
        args.resource_name,
        args.shared_resource_name,
        max_age=_number(args.state_max_age, "state-max-age", 10, 86400),
        admission_grace=_number(args.admission_grace, "admission-grace", 0, 600),
        guess_ttl=_number(args.guess_ttl, "guess-ttl", 0, 600),
    )
    client = watch.connect(args.kubeconfig)
    watcher = watch.Watcher(client, cache, args.node_state_namespace)
    everywhere = "::" if socket.has_ipv6 else "0.0.0.0"  # noqa: S104 (asked for with "")
    http = server.ExtenderServer(
        (args.bind_address or everywhere, int(_number(args.port, "port", 1, 65535))),
        decisions.Decisions(cache),
        ready=watcher.ready,
        request_timeout=_number(args.request_timeout, "request-timeout", 0.1, 600),
        max_body=int(_number(args.max_body, "max-body", 1024, protocol.MAX_BODY)),
        ssl_context=_tls(args),
    )
    http.start()
    log.info(
        "serving /filter and /prioritize on %s port %d (%s)",
        args.bind_address or "every address",
        http.port,
        "HTTPS" if args.tls_cert_file else "HTTP",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    following = asyncio.ensure_future(watcher.run())
    stopping = asyncio.ensure_future(stop.wait())
    # Once the cache is filled, keep its objects out of the cyclic collector's walks (a full
    # walk at 5,000 nodes pauses a call for 40-350 ms; see heap).
    keeping = asyncio.ensure_future(heap.HeapKeeper().run(watcher.ready))
    await asyncio.wait([following, stopping], return_when=asyncio.FIRST_COMPLETED)
    for task in (following, stopping, keeping):
        task.cancel()
    await asyncio.gather(following, stopping, keeping, return_exceptions=True)
    http.stop()
    await client.close()
    log.info("stopped")
    return 0


def check_ready(args: argparse.Namespace) -> int:
    """0 when the extender at the bind address and port answers /readyz with 200, else 1."""
    host = args.bind_address or "127.0.0.1"
    connection = http.client.HTTPConnection(host.strip("[]"), int(args.port), timeout=3)
    try:
        connection.request("GET", "/readyz")
        response = connection.getresponse()
        print(f"{response.status} {response.read(200).decode(errors='replace').strip()}")
        return 0 if response.status == 200 else 1
    except (OSError, http.client.HTTPException) as exc:
        print(f"enflame-scheduler-extender: not ready: {exc}", file=sys.stderr)
        return 1
    finally:
        connection.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``enflame-scheduler-extender``."""
    args = build_parser(os.environ).parse_args(argv)
    if args.check_ready:
        return check_ready(args)
    level = str(args.log_level).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        print(
            f"enflame-scheduler-extender: invalid --log-level {args.log_level!r}", file=sys.stderr
        )
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The watch loop decodes API objects while HTTP workers answer the scheduler: hand the GIL
    # over every 0.5 ms (default 5 ms), so a call does not wait behind a burst of pod events.
    sys.setswitchinterval(0.0005)
    try:
        return asyncio.run(serve(args))
    except ConfigError as exc:
        print(f"enflame-scheduler-extender: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"enflame-scheduler-extender: cannot listen: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
