"""Write a one-layer OCI image archive (``ctr images import`` reads it) from local files.

Test images are built from binaries already on the machine (busybox-static, a static pause),
so nothing is pulled from a registry.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """What goes into the image: files (path in image -> host file), symlinks and the config."""

    name: str
    files: Mapping[str, str]
    symlinks: Mapping[str, str] = field(default_factory=dict)
    directories: Sequence[str] = ("dev", "proc", "sys", "tmp", "etc", "var/run")
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/bin",)


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _layer(spec: ImageSpec) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as layer:
        made: set[str] = set()

        def directory(path: str) -> None:
            parts = path.strip("/").split("/")
            for index in range(1, len(parts) + 1):
                name = "/".join(parts[:index])
                if name and name not in made:
                    info = tarfile.TarInfo(name)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    layer.addfile(info)
                    made.add(name)

        for path in spec.directories:
            directory(path)
        for target, source in sorted(spec.files.items()):
            directory(target.strip("/").rpartition("/")[0])
            info = layer.gettarinfo(source, arcname=target.strip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(source, "rb") as handle:
                layer.addfile(info, handle)
        for link, points_to in sorted(spec.symlinks.items()):
            directory(link.strip("/").rpartition("/")[0])
            info = tarfile.TarInfo(link.strip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, points_to
            layer.addfile(info)
    return buffer.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    blobs[f"blobs/sha256/{digest}"] = data
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def write_archive(path: str, spec: ImageSpec) -> None:
    """Write an OCI image-layout tar at ``path`` holding the one image ``spec.name``."""
    layer = _layer(spec)
    arch = _arch()
    blobs: dict[str, bytes] = {}
    config: dict[str, Any] = {"Env": list(spec.env)}
    if spec.entrypoint:
        config["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        config["Cmd"] = list(spec.cmd)
    image_config = {
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": _blob(blobs, json.dumps(image_config).encode(), CONFIG_TYPE),
        "layers": [_blob(blobs, layer, LAYER_TYPE)],
    }
    descriptor = _blob(blobs, json.dumps(manifest).encode(), MANIFEST_TYPE)
    descriptor["platform"] = {"architecture": arch, "os": "linux"}
    descriptor["annotations"] = {
        "io.containerd.image.name": spec.name,
        "org.opencontainers.image.ref.name": spec.name.rpartition(":")[2],
    }
    files = {
        **blobs,
        "index.json": json.dumps({"schemaVersion": 2, "manifests": [descriptor]}).encode(),
        "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
    }
    with tarfile.open(path, "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
