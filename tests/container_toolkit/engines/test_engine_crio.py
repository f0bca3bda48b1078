"""CRI-O: a drop-in with runc's (or crun's) keys; the main config is only read."""

from __future__ import annotations

import os

import tomlkit

from enflame_gcu.container_toolkit import engines
from tests.container_toolkit.engines.conftest import InstallGolden
from tests.container_toolkit.engines.helpers import check_golden, golden_text, listing, read


def test_drop_in_copies_runc_keys_from_config_and_drop_ins(install_golden: InstallGolden) -> None:
    path = install_golden("crio.conf", "etc/crio/crio.conf")
    install_golden("crio.conf.d", "etc/crio/crio.conf.d")
    change = engines.configure("crio", path, engines.RuntimeOptions(set_as_default=True))
    drop_in = os.path.join(os.path.dirname(path), "crio.conf.d", "99-enflame.toml")
    assert [f.path for f in change.files] == [drop_in]
    text = read(drop_in)
    check_golden("crio.drop-in.toml", text)
    config = tomlkit.parse(text).unwrap()["crio"]["runtime"]
    assert config["default_runtime"] == "enflame"
    assert config["runtimes"]["enflame"] == {
        "runtime_path": "/usr/bin/enflame-container-runtime",
        "runtime_type": "oci",
        "runtime_root": "/run/runc",
        "monitor_path": "/usr/libexec/crio/conmon",
        "allowed_annotations": ["io.kubernetes.cri-o.Devices"],
        "monitor_env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"],
    }
    assert read(path) == golden_text("crio.conf")
    # Nothing but our drop-in may appear in crio.conf.d: CRI-O would load it.
    assert sorted(os.listdir(os.path.dirname(drop_in))) == ["10-runc.toml", "99-enflame.toml"]


def test_crun_default_is_copied_without_its_state_dir(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "crio.conf")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(
            '[crio.runtime]\ndefault_runtime = "crun"\n'
            '[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n'
            'runtime_root = "/run/crun"\nmonitor_cgroup = "pod"\n'
        )
    engines.configure("crio", path, engines.RuntimeOptions(cdi=True))
    drop_in = os.path.join(str(tmp_path), "crio.conf.d", "99-enflame.toml")
    runtime = tomlkit.parse(read(drop_in)).unwrap()["crio"]["runtime"]
    assert runtime == {
        "runtimes": {
            "enflame": {
                "runtime_path": "/usr/bin/enflame-container-runtime",
                "runtime_type": "oci",
                "monitor_cgroup": "pod",
            }
        }
    }


def test_unconfigure_removes_drop_in_and_every_trace(install_golden: InstallGolden) -> None:
    path = install_golden("crio.conf", "etc/crio/crio.conf")
    install_golden("crio.conf.d", "etc/crio/crio.conf.d")
    root = os.path.dirname(os.path.dirname(path))
    before = listing(root)
    engines.configure("crio", path, engines.RuntimeOptions(set_as_default=True))
    assert "crio/crio.conf.enflame-state.json" in listing(root)
    change = engines.unconfigure("crio", path)
    assert [f.action for f in change.files] == ["deleted"]
    assert listing(root) == before
