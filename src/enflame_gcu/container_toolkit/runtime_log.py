"""The runtime's own log file; if it cannot be written, one warning on stderr and carry on."""

from __future__ import annotations

import logging
import os
import sys

from enflame_gcu.container_toolkit import runtime_config

LOGGER_NAME = "enflame_gcu.container_toolkit"
FORMAT = "%(asctime)s pid=%(process)d %(levelname)s %(message)s"


def setup(config: runtime_config.RuntimeConfig) -> logging.Logger:
    """Log to ``config.log_file`` at ``config.log_level``; never to stdout.

    An empty ``log-file`` turns file logging off. An unwritable file is reported once on stderr
    and the container still starts: a missing log must never block a workload.
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(config.log_level.upper())
    logger.propagate = False
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    if not config.log_file:
        logger.addHandler(logging.NullHandler())
        return logger
    handler: logging.Handler
    try:
        os.makedirs(os.path.dirname(config.log_file) or ".", exist_ok=True)
        handler = logging.FileHandler(config.log_file, encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(
            f"enflame-container-runtime: warning: cannot write log file {config.log_file}: "
            f"{exc.strerror or exc}; continuing without a log file\n"
        )
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    return logger
