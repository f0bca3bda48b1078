"""Every node command the user guides show, run from one install path on a simulated node.

Issue 23 item 1: each install path (the .deb, the .rpm's root, the offline bundle, install.sh,
the toolkit image's contents) must run every documented node command. The commands are read
from the guides (tests/deploy/test_docs_commands.py's extraction); each documented
``enflame-ctk`` subcommand is either run here on a simulated node, or named in
:data:`NOT_RUN` with the reason (it changes the node's engines or never ends, and has tests
of its own). A subcommand the guides gain later fails :func:`check_coverage` until it is added.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence

from tests.deploy import test_docs_commands as docs

GUIDES = ("docs/user-guide.md", "docs/user-guide.zh-CN.md", "README.md", "docs/packaging.md")
# subcommand -> (argv after enflame-ctk, exit statuses that mean "worked"). {node}: the simulated
# node; {out}: a scratch directory. doctor exits 1 on a simulated node (no engine there), and
# allocations 1 when the kubelet's PodResources socket is absent (documented: cards still shown).
RUN: dict[str, list[tuple[list[str], set[int]]]] = {
    "--version": [(["--version"], {0})],
    "info": [(["info", "--host-root", "{node}"], {0}),
             (["info", "--host-root", "{node}", "--json"], {0})],
    "doctor": [(["doctor", "--host-root", "{node}"], {0, 1}),
               (["doctor", "--host-root", "{node}", "--json"], {0, 1})],
    "allocations": [
        (["allocations", "--host-root", "{node}", "--pod-resources-socket", "{out}/none.sock"],
         {1}),
        (["allocations", "--host-root", "{node}", "--pod-resources-socket", "{out}/none.sock",
          "--json"], {1}),
    ],
    "cdi generate": [(["cdi", "generate", "--host-root", "{node}", "--output", "{out}/cdi"], {0})],
    "cdi list": [(["cdi", "list", "--host-root", "{node}", "--spec-dir", "{out}/cdi"], {0})],
    "labels": [(["labels", "--host-root", "{node}", "--output", "{out}/labels"], {0})],
    "runtime detect": [(["runtime", "detect", "--host-root", "{node}"], {0, 1})],
    "migrate": [(["migrate", "--dry-run", "--host-root", "{node}"], {0})],
    "sim topologies": [(["sim", "topologies"], {0})],
    "system create-dev-char-symlinks": [
        (["system", "create-dev-char-symlinks", "--host-root", "{node}"], {0})
    ],
}  # fmt: skip
PRINTS = ("--version", "info", "doctor", "allocations", "cdi list", "sim topologies")
NOT_RUN = {
    "install": "changes engines and /usr/bin: tests/container_toolkit/test_install*.py",
    "uninstall": "undoes install: the same tests",
    "runtime configure": "edits an engine config: each install path's own test runs it",
    "runtime unconfigure": "the same",
    "cdi watch": "never ends: tests/container_toolkit/test_cdi*.py runs it as a process",
    "cdi validate": "needs the CDI JSON schema, shipped in the package by issue 23 item 9",
    "sim create": "makes a simulated node (test fixture, not a node command)",
}


def documented() -> set[str]:
    """The ``enflame-ctk`` subcommands (e.g. ``cdi list``) the guides show."""
    parser = docs.ctk_parser()
    found = set()
    for guide in GUIDES:
        for command in docs.commands(docs.read(guide)):
            if docs.program_of(command[0]) != "enflame-ctk":
                continue
            words = [w for w in command[1:] if not w.startswith("-")][:2]
            subs = docs.subcommands(parser)
            if not words:
                if "--version" in command:
                    found.add("--version")
                continue
            if subs is None or words[0] not in subs:
                continue
            inner = docs.subcommands(subs[words[0]])
            if inner is not None and len(words) > 1 and words[1] in inner:
                found.add(f"{words[0]} {words[1]}")
            else:
                found.add(words[0])
    return found


def check_coverage() -> list[str]:
    """Documented subcommands neither run here nor excused."""
    return sorted(documented() - set(RUN) - set(NOT_RUN))


def run_all(
    ctk: Sequence[str],
    node: str,
    out: str,
    runner: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
    *,
    make_out: bool = True,  # False: ``out`` is a path in a chroot, made by the caller
) -> list[str]:
    """Run every documented node command with ``ctk``; return what did not work (empty: all)."""
    run = runner or (
        lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    )
    if make_out:
        os.makedirs(out, exist_ok=True)
    problems = []
    for name, runs in RUN.items():
        for template, ok in runs:
            argv = [*ctk, *(w.format(node=node, out=out) for w in template)]
            done = run(argv)
            shown = " ".join(template)
            if "Traceback" in done.stderr or done.returncode not in ok:
                problems.append(f"{shown}: rc {done.returncode}: {done.stderr.strip()[-600:]}")
            elif name in PRINTS and not done.stdout.strip():
                problems.append(f"{shown}: printed nothing")
    return problems
