"""docker: add the runtime to ``/etc/docker/daemon.json``, keeping every other key."""

from __future__ import annotations

from enflame_gcu.container_toolkit.engines import base
from enflame_gcu.errors import EngineConfigError

# Keys under "runtimes" are reloaded on SIGHUP; anything else needs a dockerd restart.
RELOADABLE_PREFIX = "runtimes."


class DockerEditor:
    """Edits daemon.json: ``runtimes.<name>``, maybe ``default-runtime`` and ``features.cdi``."""

    engine = "docker"
    default_config = "/etc/docker/daemon.json"

    def plan(self, config_path: str, options: base.RuntimeOptions, host_root: str) -> base.Plan:
        """daemon.json edits for ``options``; a missing file is created by the write."""
        if options.drop_in:
            raise EngineConfigError(
                "docker has no drop-in directory: run without --drop-in to merge the runtime "
                f"into {config_path}"
            )
        name = options.runtime_name
        operations: list[base.Operation] = [
            base.SetValue(("runtimes", name, "path"), options.runtime_path),
            # An operator's own runtimeArgs (e.g. --debug) are kept on a re-run.
            base.SetValue(("runtimes", name, "runtimeArgs"), [], only_if_missing=True),
        ]
        if options.set_as_default:
            operations.append(base.SetValue(("default-runtime",), name))
        notes = []
        if options.cdi:
            operations.append(base.SetValue(("features", "cdi"), True))
            notes.append("docker reads CDI specs only from version 25 on (features.cdi)")
        return base.Plan((base.FilePlan(config_path, "json", tuple(operations)),), tuple(notes))
