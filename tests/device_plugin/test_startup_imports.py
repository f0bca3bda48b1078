"""Start-up imports: what the plugin's default start does not use is not imported before it.

After a kubelet restart, an upgrade or a crash the node serves no GCU until the plugin has
registered, and most of a start is imports (benchmarks/bench_plugin_startup.py). The metrics
endpoint, the NFD feature file, the node-state annotation, named configs and the config
file are off by default; their modules (prometheus_client with http.server, yaml, the API
client) are imported where those options are used.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys

from enflame_gcu.simulation.testing import kubelet_stub, plugin_process

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
    # drs-gcu only: efsmi, the DRS partition model and its ResourceSlice renderings.
    "enflame_gcu.drs",
    "enflame_gcu.efsmi",
    "enflame_gcu.resourceslices",
    "enflame_gcu.device_plugin.drs_instances",
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


def _imports_before_registration() -> list[str]:
    """The real plugin process on a simulated node: the modules it imported (``python -X
    importtime``, in the order they finished) before it logged its registration."""
    work, root, plugins = plugin_process.make_node("vendor-8card")

    async def start() -> str:
        async with kubelet_stub.KubeletStub(plugins) as kubelet:
            plugin = plugin_process.PluginProcess(
                plugins, root, env={"PYTHONPROFILEIMPORTTIME": "1"}
            )
            await plugin.start()
            try:
                await kubelet.wait_for(
                    lambda k: any(a.resource_name == "enflame.com/gcu" for a in k.history),
                    60,
                    "the plugin to register and list its cards",
                )
            finally:
                await plugin.stop()
            return plugin.log_text()

    try:
        text = asyncio.run(start())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    before, found, _ = text.partition("registered enflame.com/gcu")
    assert found, text
    return re.findall(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", before, re.MULTILINE)


def test_registration_imports_none_of_the_optional_parts() -> None:
    imported = _imports_before_registration()
    assert "enflame_gcu.device_plugin.kubelet" in imported  # the check sees the real path
    assert sorted(set(imported) & set(NOT_AT_START)) == []


def test_importing_the_plugin_starts_no_process() -> None:
    # asyncinotify looks libc up with ctypes.util.find_library, which forks /sbin/ldconfig.
    code = (
        "import subprocess\n"
        "started = []\n"
        "class Recording(subprocess.Popen):\n"
        "    def __init__(self, args, *rest, **options):\n"
        "        started.append(args)\n"
        "        super().__init__(args, *rest, **options)\n"
        "subprocess.Popen = Recording\n"
        "import enflame_gcu.device_plugin.main\n"
        "from enflame_gcu.support import inotify\n"
        "with inotify.ChangeWatcher(['/']):\n"
        "    pass\n"
        "print(started)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
