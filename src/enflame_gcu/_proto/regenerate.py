"""Regenerate the committed v1beta1 stubs from api.proto with the pinned grpcio-tools."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

PROTO = "api.proto"
HERE = os.path.dirname(os.path.abspath(__file__))
GENERATED = ("api_pb2.py", "api_pb2_grpc.py")


def generate(out_dir: str, proto_dir: str = HERE) -> list[str]:
    """Run protoc on api.proto into ``out_dir``; return the paths of the generated files."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415 (dev-only)

    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        os.path.join(proto_dir, PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {os.path.join(proto_dir, PROTO)}")
    grpc_stub = os.path.join(out_dir, "api_pb2_grpc.py")
    with open(grpc_stub, encoding="utf-8") as handle:
        text = handle.read()
    # protoc writes a top-level import; inside a package it must be relative to resolve.
    text = re.sub(r"^import api_pb2 as", "from . import api_pb2 as", text, flags=re.MULTILINE)
    with open(grpc_stub, "w", encoding="utf-8") as handle:
        handle.write(text)
    return [os.path.join(out_dir, name) for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    """``make proto``: regenerate in place (or ``--check``: fail when the stubs are stale)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale stubs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stale = []
        for path in generate(tmp):
            name = os.path.basename(path)
            with open(path, encoding="utf-8") as new:
                fresh = new.read()
            target = os.path.join(HERE, name)
            try:
                with open(target, encoding="utf-8") as old:
                    current = old.read()
            except FileNotFoundError:
                current = None
            if current == fresh:
                continue
            stale.append(name)
            if not args.check:
                with open(target, "w", encoding="utf-8") as out:
                    out.write(fresh)
    verb = "stale" if args.check else "regenerated"
    print(f"{verb}: {', '.join(stale)}" if stale else "stubs are up to date")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
