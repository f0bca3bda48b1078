"""CRI-O: a ``crio.conf.d/99-enflame.toml`` drop-in carrying the runtime table."""

from __future__ import annotations

import os
from typing import Any

from enflame_gcu.container_toolkit.engines import base, formats, storage

DROP_IN_NAME = "99-enflame.toml"
RUNTIMES = ("crio", "runtime", "runtimes")

# Keys that describe the binary itself; they are ours to set, never copied from runc/crun.
OWN_KEYS = ("runtime_path", "runtime_type")


def drop_in_dir(config_path: str) -> str:
    """CRI-O's drop-in directory next to its main config (``/etc/crio/crio.conf.d``)."""
    return os.path.join(os.path.dirname(config_path), "crio.conf.d")


def effective_runtime_config(config_path: str, skip: str, host_root: str = "/") -> dict[str, Any]:
    """The ``crio.runtime`` table as CRI-O sees it: main config, then drop-ins in name order."""
    sources = [config_path]
    directory = storage.target(drop_in_dir(config_path), host_root)
    if os.path.isdir(directory):
        sources += [os.path.join(directory, n) for n in sorted(os.listdir(directory))]
    merged: dict[str, Any] = {"runtimes": {}}
    skipped = storage.target(skip, host_root) if skip else ""
    for source in sources:
        path = storage.target(source, host_root)
        if path == skipped or not os.path.exists(path) or os.path.isdir(path):
            continue  # a FIFO or device is read, so read_text refuses it and names it
        text = storage.read_text(path)
        document = formats.FORMATS["toml"].parse(text or "", path)
        runtime = formats.plain(base.lookup(document, ("crio", "runtime"))) or {}
        for name, table in (runtime.pop("runtimes", None) or {}).items():
            merged["runtimes"].setdefault(name, {}).update(table)
        merged.update(runtime)
    return merged


class CrioEditor:
    """Writes the CRI-O drop-in; the main crio.conf is only read."""

    engine = "crio"
    default_config = "/etc/crio/crio.conf"

    def plan(self, config_path: str, options: base.RuntimeOptions, host_root: str) -> base.Plan:
        """Runtime table copied from the current default (runc or crun) plus our binary."""
        drop_in = os.path.join(drop_in_dir(config_path), DROP_IN_NAME)
        runtime = effective_runtime_config(config_path, skip=drop_in, host_root=host_root)
        runtimes = runtime["runtimes"]
        default = runtime.get("default_runtime")
        candidates = [default] if default and default != options.runtime_name else []
        source = next((n for n in [*candidates, "runc", "crun"] if n in runtimes), None)
        entry = {k: v for k, v in (runtimes.get(source) or {}).items() if k not in OWN_KEYS}
        if source != "runc":
            # crun's state directory would put runc's state where crun keeps its own.
            entry.pop("runtime_root", None)
        operations: list[base.Operation] = [
            base.SetValue((*RUNTIMES, options.runtime_name, "runtime_path"), options.runtime_path),
            base.SetValue((*RUNTIMES, options.runtime_name, "runtime_type"), "oci"),
            *base.leaf_operations((*RUNTIMES, options.runtime_name), entry),
        ]
        if options.set_as_default:
            operations.insert(
                0, base.SetValue(("crio", "runtime", "default_runtime"), options.runtime_name)
            )
        notes = []
        if options.cdi:
            notes.append(
                "CRI-O always reads CDI specs from /etc/cdi and /var/run/cdi: nothing to set"
            )
        if source is None:
            notes.append(f"no runc or crun runtime table found in {config_path} or its drop-ins")
        # Backups go next to crio.conf: CRI-O would load a backup left inside crio.conf.d.
        plan = base.FilePlan(drop_in, "toml", tuple(operations), os.path.dirname(config_path))
        return base.Plan((plan,), tuple(notes))
