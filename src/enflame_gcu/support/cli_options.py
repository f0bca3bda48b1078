"""Old option spellings every program of ours keeps the same way: hidden, working, with a warning.

An old spelling (``--root``) stores into the new option's destination, is left out of
``--help``, and when used prints ``<prog>: warning: --root is deprecated, use --host-root``
on stderr. ``enflame-ctk`` and ``enflame-dra-plugin`` share it; neither imports the other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class DeprecatedOption(argparse.Action):
    """An old spelling: stores into the new option's dest and says which spelling to use."""

    def __init__(self, *args: Any, new: str = "", prog: str = "", **kwargs: Any) -> None:
        self.new = new
        self.prog = prog
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        prog = self.prog or parser.prog.split()[0]
        message = f"{prog}: warning: {option_string} is deprecated, use {self.new}"
        print(message, file=sys.stderr, flush=True)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def add_deprecated(
    parser: argparse.ArgumentParser,
    old: str,
    new: str,
    dest: str,
    *,
    prog: str,
    flag: bool = False,
    type: Any = None,
) -> None:
    """Accept ``old`` as a hidden alias of ``new`` (same dest); using it warns as ``prog``."""
    extra: dict[str, Any] = {"nargs": 0} if flag else {"type": type}
    parser.add_argument(
        old, dest=dest, action=DeprecatedOption, new=new, prog=prog, help=argparse.SUPPRESS,
        default=argparse.SUPPRESS, **extra,
    )  # fmt: skip
