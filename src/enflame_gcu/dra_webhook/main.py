"""``enflame-dra-webhook``: parse flags, serve the mutating admission webhook over HTTPS.

Every flag has an environment variable (``ENFLAME_<FLAG>``); the command line wins. SIGTERM or
SIGINT stop the server; the API server (``failurePolicy: Ignore``) then admits pods as written.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence

from enflame_gcu import bounded_http
from enflame_gcu.dra_webhook import cluster, rewrite, server
from enflame_gcu.errors import ConfigError, number_flag
from enflame_gcu.support import daemon_cli

log = logging.getLogger("enflame_gcu.dra_webhook")
PROG = "enflame-dra-webhook"
DEFAULT_ADDRESS = ":8443"


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The CLI; each default comes from ``ENFLAME_<FLAG>`` when set."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Mutating admission webhook: a pod asking enflame.com/gcu: N gets a DRA "
        "claim for N cards under one PCIe switch (then root port, NUMA node, any).",
    )
    daemon_cli.add_version(parser)

    def option(flag: str, default: str, text: str) -> None:
        parser.add_argument(f"--{flag}", default=default, help=text)

    daemon_cli.add_http_address(
        parser,
        serves="serve POST /mutate, GET /healthz and /readyz here over HTTPS (empty host: "
        "every address)",
        default=DEFAULT_ADDRESS,
        environ=environ,
        into=("bind_address", "port"),
    )
    option("tls-cert-file", "", "PEM certificate the API server checks (required)")
    option("tls-key-file", "", "the PEM private key of --tls-cert-file (required)")
    option("kubeconfig", "", "kubeconfig file; empty = the pod's service account")
    option("resource-name", rewrite.RESOURCE, "extended resource rewritten into claims")
    option("device-class", rewrite.DEVICE_CLASS, "DeviceClass of whole cards the claims name")
    option("api-timeout", "2", "seconds one API server call may take (below timeoutSeconds)")
    option("remember", "30", "seconds the API check and a namespace's template stay known")
    option("max-body", str(server.MAX_BODY), "largest AdmissionReview body in bytes")
    daemon_cli.add_logging(parser, environ)
    daemon_cli.apply_env_defaults(parser, environ)
    return parser


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    """Serve until ``stop`` is set."""
    if not (args.tls_cert_file and args.tls_key_file):
        raise ConfigError("the API server calls webhooks over HTTPS: give --tls-cert-file and "
                          "--tls-key-file")  # fmt: skip
    # Every flag checked before anything is read or connected to.
    api_timeout = number_flag(args.api_timeout, "api-timeout", 0.1, 30)
    remember = number_flag(args.remember, "remember", 0, 3600)
    port = int(number_flag(str(args.port), "http-address", 0, 65535))
    max_body = int(number_flag(args.max_body, "max-body", 4096, 64 << 20))
    # Read again whenever the files change: a renewed certificate (cert-manager, a replaced
    # Secret) is served without a restart.
    context = bounded_http.ReloadingTLS(args.tls_cert_file, args.tls_key_file).context
    client = cluster.connect(args.kubeconfig, api_timeout)
    known = cluster.Cluster(client, args.device_class, remember=remember)
    everywhere = "::" if socket.has_ipv6 else "0.0.0.0"  # noqa: S104 (asked for with "")
    http = server.WebhookServer(
        (args.bind_address or everywhere, port),
        known,
        context,
        resource=args.resource_name,
        max_body=max_body,
    )
    http.start()
    log.info("serving POST /mutate on %s port %d (HTTPS)", args.bind_address or "every address",
             http.port)  # fmt: skip
    stop.wait()
    http.stop()
    client.close()
    log.info("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``enflame-dra-webhook``."""
    args = build_parser(os.environ).parse_args(argv)
    daemon_cli.configure_logging(args.log_level, args.log_format)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return run(args, stop)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
