"""Regenerate the committed gRPC stubs from the ``*.proto`` files here with the pinned tools.

protoc runs with the ``src`` directory as its include root, so every file is registered under a
distinct name (``enflame_gcu/_proto/<file>.proto``: the kubelet's own protos are all called
``api.proto``, and one descriptor pool refuses two files of one name) and the generated modules
import each other by absolute package path, with no rewriting afterwards. Besides the message
and gRPC modules, mypy-protobuf writes their typed ``.pyi`` stubs (``--mypy_out`` and
``--mypy_grpc_out``), so mypy checks every message field and servicer signature we use.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_PATH = ("enflame_gcu", "_proto")
# Device plugin v1beta1 (SPEC §3), the DRA driver's protocols (DRA.md §1-3), PodResources v1.
PROTOS = (
    "api.proto",
    "pluginregistration_v1.proto",
    "dra_v1.proto",
    "dra_v1beta1.proto",
    "drahealth_v1.proto",
    "drahealth_v1alpha1.proto",
    "podresources_v1.proto",
)
# mypy-protobuf's protoc plugins, installed next to this interpreter by the dev extras.
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


def generated_names(proto: str) -> tuple[str, ...]:
    """The module and stub file names protoc writes for one proto file."""
    stem = proto.removesuffix(".proto")
    return (f"{stem}_pb2.py", f"{stem}_pb2_grpc.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.pyi")


def _plugin(name: str) -> str:
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: install the dev extras (mypy-protobuf)")
    return f"--plugin={name}={path}"


def generate(out_dir: str, proto_dir: str = HERE) -> list[str]:
    """Run protoc on every proto into ``out_dir``; return the paths of the generated files."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415 (dev-only)

    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    # The include root is the directory that holds the enflame_gcu package.
    src_root = os.path.dirname(os.path.dirname(proto_dir))
    relative = [os.path.join(*PACKAGE_PATH, proto) for proto in PROTOS]
    args = [
        "grpc_tools.protoc",
        f"-I{src_root}",
        f"-I{include}",
        *(_plugin(name) for name in PLUGINS),
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out=quiet:{out_dir}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        *(os.path.join(src_root, path) for path in relative),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(PROTOS)} in {proto_dir}")
    target = os.path.join(out_dir, *PACKAGE_PATH)
    return [os.path.join(target, name) for proto in PROTOS for name in generated_names(proto)]


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
