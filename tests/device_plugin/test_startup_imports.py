"""Start-up imports: what the plugin's default start does not use is not imported before it.

After a kubelet restart, an upgrade or a crash the node serves no GCU until the plugin has
registered, and most of a start is imports (benchmarks/bench_plugin_startup.py). The metrics
endpoint, the NFD feature file, the node-state annotation, named configs and the config
file are off by default; their modules (prometheus_client with http.server, yaml, the API
client) are imported where those options are used.
"""

from __future__ import annotations

import os
import subprocess
import sys

NOT_AT_START = (
    "prometheus_client",
    "http.server",
    "yaml",
    "enflame_gcu.device_plugin.metrics",
    "enflame_gcu.device_plugin.http_server",
    "enflame_gcu.device_plugin.named_configs",
    "enflame_gcu.device_plugin.node_annotation",
    "enflame_gcu.device_plugin.config_file",
    "enflame_gcu.device_plugin.holdings_feed",
    "enflame_gcu.device_plugin.feature_file",
    "enflame_gcu.kubelet_api.podresources",
)


def test_the_default_start_imports_none_of_the_optional_parts() -> None:
    code = (
        "import sys, os\n"
        "from enflame_gcu.device_plugin import main, runner\n"
        "config = main.load_config(['--host-root', '/'], {})\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert "enflame_gcu.device_plugin.runner" in loaded  # the check sees the real start path
    assert sorted(loaded & set(NOT_AT_START)) == []


def test_a_config_file_still_loads_through_the_lazy_import(tmp_path: os.PathLike[str]) -> None:
    path = f"{tmp_path}/config.yaml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("version: v1\nflags:\n  passDeviceSpecs: true\n")
    code = (
        "from enflame_gcu.device_plugin import main\n"
        f"print(main.load_config(['--config-file', {path!r}], {{}}).pass_device_specs)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
