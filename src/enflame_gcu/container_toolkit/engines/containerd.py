"""containerd: add the runtime to config.toml (version 1, 2 or 3) or to a conf.d drop-in."""

from __future__ import annotations

import copy
import fnmatch
import logging
import os
from collections.abc import Mapping
from typing import Any

from enflame_gcu.container_toolkit.engines import base, formats, storage
from enflame_gcu.errors import EngineConfigError

log = logging.getLogger(__name__)

RUNC_V2 = "io.containerd.runc.v2"
DROP_IN_NAME = "99-enflame.toml"

# Annotation prefixes that name devices: only the kubelet (from the device plugin's answer, as
# *container* annotations) may set them. A pod author sets *pod* annotations, so a
# pod_annotations pattern that could pass one of these on would let any pod ask for cards.
DEVICE_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "enflame.com/")
CDI_CONTAINER_ANNOTATIONS = "cdi.k8s.io/*"
_WILDCARDS = "*?[\\"


def passes_device_annotations(pattern: str) -> bool:
    """True when the annotation pattern could match a ``cdi.k8s.io/`` or ``enflame.com/`` key.

    Conservative: the literal text before the first wildcard decides, so ``*``, ``c*`` and
    ``cdi.k8s.io/*`` all count, ``io.katacontainers.*`` does not.
    """
    cut = min((i for i, c in enumerate(pattern) if c in _WILDCARDS), default=len(pattern))
    literal = pattern[:cut]
    return any(p.startswith(literal) or literal.startswith(p) for p in DEVICE_ANNOTATION_PREFIXES)


def safe_pod_annotations(patterns: Any) -> list[Any]:
    """``patterns`` without those that would pass device annotations from the pod."""
    if not isinstance(patterns, list):
        return []
    return [p for p in patterns if not (isinstance(p, str) and passes_device_annotations(p))]


# The CRI plugin table per config version (SPEC §5); it holds enable_cdi and `containerd`.
CRI_TABLE: dict[int, tuple[str, ...]] = {
    1: ("plugins", "cri"),
    2: ("plugins", "io.containerd.grpc.v1.cri"),
    3: ("plugins", "io.containerd.cri.v1.runtime"),
}


def config_version(document: Mapping[str, Any], path: str) -> int:
    """The config's schema version; containerd treats a missing ``version`` as 1."""
    version = formats.plain(document.get("version", 1))
    if version not in CRI_TABLE:
        raise EngineConfigError(
            f"cannot edit {path}: version = {version!r} is not a containerd config version "
            f"this tool knows (known: {sorted(CRI_TABLE)})"
        )
    return int(version)


def runtime_entry(
    runtimes: Mapping[str, Any], default_name: str | None, options: base.RuntimeOptions
) -> tuple[dict[str, Any], str]:
    """Our runtime table, copied from the default (else runc) entry; returns it and its source."""
    source = "runc"
    if default_name and default_name != options.runtime_name and default_name in runtimes:
        source = default_name
    entry = copy.deepcopy(dict(runtimes.get(source) or {}))
    if entry.get("runtime_type", RUNC_V2) != RUNC_V2:
        # Options of another shim (e.g. the v1 linux shim) mean nothing to runc.v2.
        entry = {k: v for k, v in entry.items() if k not in ("options", "runtime_engine")}
    entry["runtime_type"] = RUNC_V2
    entry_options = dict(entry.get("options") or {})
    entry_options["BinaryName"] = options.runtime_path
    entry["options"] = entry_options
    if "pod_annotations" in entry:
        entry["pod_annotations"] = safe_pod_annotations(entry["pod_annotations"])
    return entry, source


class ContainerdEditor:
    """Edits containerd's config.toml with tomlkit so comments and layout are kept."""

    engine = "containerd"
    default_config = "/etc/containerd/config.toml"

    def plan(self, config_path: str, options: base.RuntimeOptions, host_root: str) -> base.Plan:
        """Runtime, default and CDI edits in the table path of the config's version."""
        text = storage.read_text(storage.target(config_path, host_root))
        document = formats.FORMATS["toml"].parse(text or "", config_path)
        version = config_version(document, config_path) if text is not None else 2
        cri = CRI_TABLE[version]
        runtimes = formats.plain(base.lookup(document, (*cri, "containerd", "runtimes"))) or {}
        default_name = formats.plain(
            base.lookup(document, (*cri, "containerd", "default_runtime_name"))
        )
        entry, source = runtime_entry(runtimes, default_name, options)
        notes = []
        ours = runtimes.get(options.runtime_name)
        current = ours.get("pod_annotations") if isinstance(ours, dict) else None
        if isinstance(current, list) and safe_pod_annotations(current) != current:
            entry.setdefault("pod_annotations", safe_pod_annotations(current))
        dropped = [
            p
            for p in [
                *(current or []),
                *((runtimes.get(source) or {}).get("pod_annotations") or []),
            ]
            if isinstance(p, str) and passes_device_annotations(p)
        ]
        if dropped:
            notes.append(
                f"pod_annotations {sorted(set(dropped))} left out of the {options.runtime_name} "
                "runtime: a pod's own annotations must never name devices"
            )
        if options.cdi_annotations:
            self._pass_cdi_annotations(entry, version, notes)
        if source not in runtimes:
            notes.append(
                f"{config_path} has no {source} runtime entry to copy options such as "
                "SystemdCgroup from; set them in the enflame entry if your runc needs them"
            )
        operations: list[base.Operation] = []
        if text is None:
            operations.append(base.SetValue(("version",), version))
        operations.extend(
            base.leaf_operations((*cri, "containerd", "runtimes", options.runtime_name), entry)
        )
        if options.set_as_default:
            operations.append(
                base.SetValue((*cri, "containerd", "default_runtime_name"), options.runtime_name)
            )
        if options.cdi:
            operations.append(base.SetValue((*cri, "enable_cdi"), True))
            notes.append("containerd reads CDI specs only from 1.7 on (enable_cdi)")
        if not options.drop_in:
            return base.Plan((base.FilePlan(config_path, "toml", tuple(operations)),), tuple(notes))
        return self._drop_in_plan(
            config_path=config_path,
            document=document,
            version=version,
            operations=operations,
            host_root=host_root,
            notes=notes,
        )

    @staticmethod
    def _pass_cdi_annotations(entry: dict[str, Any], version: int, notes: list[str]) -> None:
        if version >= 3:
            notes.append(
                "containerd 2.x (a version 3 config) turns the kubelet's cdi.k8s.io/* "
                "annotations into devices itself when enable_cdi is on (the default): nothing "
                "passed to the runtime"
            )
            return
        # containerd 1.x's CRI plugin hands a runtime only the container annotations its
        # runtime table lists; the device plugin's answer arrives as container annotations.
        listed = entry.get("container_annotations")
        patterns = list(listed) if isinstance(listed, list) else []
        if CDI_CONTAINER_ANNOTATIONS not in patterns:
            patterns.append(CDI_CONTAINER_ANNOTATIONS)
        entry["container_annotations"] = patterns

    def _drop_in_plan(
        self,
        *,
        config_path: str,
        document: Mapping[str, Any],
        version: int,
        operations: list[base.Operation],
        host_root: str,
        notes: list[str],
    ) -> base.Plan:
        if version < 3:
            # Checked with containerd 1.6: an imported file's [plugins."<id>"] table replaces the
            # main config's whole table, so sandbox_image, runc and the rest would be lost.
            raise EngineConfigError(
                f"cannot use --drop-in with {config_path}: it is a version {version} config, and "
                "containerd 1.x replaces a plugin's whole table with an imported file's, which "
                "would drop the CRI settings in config.toml; configure config.toml in place "
                "(without --drop-in), or use a version 3 config (containerd 2.x)"
            )
        drop_in = os.path.join(os.path.dirname(config_path), "conf.d", DROP_IN_NAME)
        drop_in_ops = [base.SetValue(("version",), version), *operations]
        imported = base.host_view(drop_in, host_root)
        imports = formats.plain(document.get("imports")) or []
        files = [base.FilePlan(drop_in, "toml", tuple(drop_in_ops), os.path.dirname(config_path))]
        if any(fnmatch.fnmatchcase(imported, pattern) for pattern in imports):
            notes.append(f"{config_path} already imports {imported}")
        else:
            files.append(
                base.FilePlan(config_path, "toml", (base.AppendItem(("imports",), imported),))
            )
        return base.Plan(tuple(files), tuple(notes))
