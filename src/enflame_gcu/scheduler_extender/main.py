"""``enflame-scheduler-extender``: parse flags, start the HTTP server and the API watches.

Every flag has an environment variable (``ENFLAME_<FLAG>``; the old ``EXTENDER_<FLAG>`` still
works, with a warning); the command line wins. SIGTERM or
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

from enflame_gcu.errors import ConfigError, number_flag
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, heap, protocol, server, tls, watch
from enflame_gcu.support import daemon_cli, env_vars

log = logging.getLogger("enflame_gcu.scheduler_extender")
DEFAULT_PORT = 32766  # gcushare-scheduler-extender's port, so existing configurations point here
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"  # the scheduler's host: it calls over loopback
PROG = "enflame-scheduler-extender"
OLD_PREFIX = "EXTENDER_"  # the variables' prefix until 0.2.0 (env_vars.OLD_NAMES_UNTIL)


def build_parser(
    environ: Mapping[str, str], warnings: list[str] | None = None
) -> argparse.ArgumentParser:
    """The CLI; each default comes from ``ENFLAME_<FLAG>`` (or the old ``EXTENDER_<FLAG>``,
    noted in ``warnings``) when set."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="kube-scheduler extender: prefers nodes that can give a pod's GCUs as one "
        "PCIe switch (then root port, NUMA node), filters shared-GCU pods by free slices.",
    )
    daemon_cli.add_version(parser)
    parser.add_argument(
        "--check-ready",
        action="store_true",
        help="ask the running extender's GET /readyz at --http-address over HTTP "
        "and exit 0 when ready, 1 when not (an exec probe for a pod without host networking)",
    )

    def option(flag: str, default: str, text: str) -> None:
        parser.add_argument(f"--{flag}", default=default, help=text)

    _add_address(parser, environ, warnings)
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
    daemon_cli.add_logging(parser, environ, warnings, old_level_env=OLD_PREFIX + "LOG_LEVEL")
    daemon_cli.apply_env_defaults(
        parser, environ, skip={"check_ready"}, old_prefix=OLD_PREFIX, warnings=warnings
    )
    return parser


def _add_address(
    parser: argparse.ArgumentParser, environ: Mapping[str, str], warnings: list[str] | None
) -> None:
    """``--http-address`` and its old halves, ``--bind-address`` and ``--port`` (and their
    ``EXTENDER_`` variables), kept apart as ``bind_address`` and ``port``."""
    env = dict(environ)
    if "ENFLAME_HTTP_ADDRESS" not in env:
        halves = ("EXTENDER_BIND_ADDRESS", "EXTENDER_PORT")
        old = {name: env[name] for name in halves if name in env}
        if old:
            host, port = daemon_cli.split_address(DEFAULT_ADDRESS)
            try:
                port = int(old.get("EXTENDER_PORT", port))
            except ValueError:
                parser.error(f"invalid EXTENDER_PORT: {old['EXTENDER_PORT']!r} is not a port")
            host = old.get("EXTENDER_BIND_ADDRESS", host)
            env["ENFLAME_HTTP_ADDRESS"] = daemon_cli.join_address(host, port)
            for name in old:
                if warnings is not None:
                    warnings.append(env_vars.deprecated(name, "ENFLAME_HTTP_ADDRESS"))
    daemon_cli.add_http_address(
        parser,
        serves="serve /filter, /prioritize, /healthz, /readyz and /stats here (empty host: "
        "every address)",
        default=DEFAULT_ADDRESS,
        environ=env,
        into=("bind_address", "port"),
    )
    daemon_cli.add_old_address_part(parser, "--bind-address", "bind_address", prog=PROG, port=False)
    daemon_cli.add_old_address_part(parser, "--port", "port", prog=PROG, port=True)


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
    # Every flag checked before anything is read or connected to.
    port = int(number_flag(str(args.port), "http-address", 1, 65535))
    request_timeout = number_flag(args.request_timeout, "request-timeout", 0.1, 600)
    max_body = int(number_flag(args.max_body, "max-body", 1024, protocol.MAX_BODY))
    cache = extender_cache.ClusterCache(
        args.resource_name,
        args.shared_resource_name,
        max_age=number_flag(args.state_max_age, "state-max-age", 10, 86400),
        admission_grace=number_flag(args.admission_grace, "admission-grace", 0, 600),
        guess_ttl=number_flag(args.guess_ttl, "guess-ttl", 0, 600),
    )
    ssl_context = _tls(args)
    client = watch.connect(args.kubeconfig)
    watcher = watch.Watcher(client, cache, args.node_state_namespace)
    everywhere = "::" if socket.has_ipv6 else "0.0.0.0"  # noqa: S104 (asked for with "")
    http = server.ExtenderServer(
        (args.bind_address or everywhere, port),
        decisions.Decisions(cache),
        ready=watcher.ready,
        request_timeout=request_timeout,
        max_body=max_body,
        ssl_context=ssl_context,
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
    warnings: list[str] = []
    args = build_parser(os.environ, warnings).parse_args(argv)
    daemon_cli.stderr_warnings(PROG, warnings)
    if args.check_ready:
        return check_ready(args)
    daemon_cli.configure_logging(args.log_level, args.log_format)
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
