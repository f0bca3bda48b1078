"""containerd passes only *container* annotations that name devices; doctor checks strategies.

A pod author writes pod annotations, the kubelet writes container annotations (from the device
plugin's Allocate answer): only the latter may carry ``cdi.k8s.io/*`` or ``enflame.com/*``.
"""

from __future__ import annotations

import os

import pytest
import tomlkit

from enflame_gcu.container_toolkit import doctor, engines, installer
from enflame_gcu.container_toolkit.cli import main
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx
from tests.container_toolkit.engines.helpers import read

CRI = 'plugins."io.containerd.grpc.v1.cri"'
RUNC_WITH_POD_ANNOTATIONS = f"""version = 2
[{CRI}.containerd]
  default_runtime_name = "runc"
  [{CRI}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    pod_annotations = ["io.katacontainers.*", "cdi.k8s.io/*", "*", "enflame.com/gcu"]
    [{CRI}.containerd.runtimes.runc.options]
      SystemdCgroup = true
"""


def _entry(path: str) -> dict[str, object]:
    cri = tomlkit.parse(read(path)).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]
    return dict(cri["containerd"]["runtimes"]["enflame"])


def test_pod_annotation_patterns_that_name_devices_are_not_copied(
    tmp_path: os.PathLike[str],
) -> None:
    config = fx.write(str(tmp_path), "/config.toml", RUNC_WITH_POD_ANNOTATIONS)
    change = engines.configure("containerd", config, engines.RuntimeOptions())
    assert _entry(config)["pod_annotations"] == ["io.katacontainers.*"]
    assert "container_annotations" not in _entry(config)
    assert any("a pod's own annotations must never name devices" in n for n in change.notes)
    engines.unconfigure("containerd", config)
    assert read(config) == RUNC_WITH_POD_ANNOTATIONS


def test_an_existing_entry_that_passes_pod_device_annotations_is_fixed(
    tmp_path: os.PathLike[str],
) -> None:
    text = fx.CONTAINERD_V2 + (
        f"\n    [{CRI}.containerd.runtimes.enflame]\n"
        '      runtime_type = "io.containerd.runc.v2"\n'
        '      pod_annotations = ["cdi.k8s.io/*"]\n'
    )
    config = fx.write(str(tmp_path), "/config.toml", text)
    engines.configure("containerd", config, engines.RuntimeOptions())
    assert _entry(config)["pod_annotations"] == []


@pytest.mark.parametrize("version", [1, 2])
def test_cdi_annotations_strategy_passes_container_annotations_on_containerd_1x(
    tmp_path: os.PathLike[str], version: int
) -> None:
    text = fx.CONTAINERD_V2 if version == 2 else "version = 1\n[plugins.cri.containerd]\n"
    config = fx.write(str(tmp_path), "/config.toml", text)
    argv = ["runtime", "configure", "--runtime", "containerd", "--config", config]
    assert main([*argv, "--cdi-annotations"]) == 0
    table = ("plugins", "cri") if version == 1 else ("plugins", "io.containerd.grpc.v1.cri")
    document = tomlkit.parse(read(config)).unwrap()
    entry = document[table[0]][table[1]]["containerd"]["runtimes"]["enflame"]
    assert entry["container_annotations"] == ["cdi.k8s.io/*"]
    assert "pod_annotations" not in entry
    assert main(["runtime", "unconfigure", "--runtime", "containerd", "--config", config]) == 0
    assert read(config) == text


def test_without_the_strategy_no_annotation_is_passed(tmp_path: os.PathLike[str]) -> None:
    config = fx.write(str(tmp_path), "/config.toml", fx.CONTAINERD_V2)
    engines.configure("containerd", config, engines.RuntimeOptions())
    assert "container_annotations" not in _entry(config)


def test_install_passes_the_option_through(tmp_path: os.PathLike[str]) -> None:
    host = fx.fake_host(str(tmp_path), docker=False)
    installer.install(installer.InstallOptions(host_root=host, cdi_annotations=True))
    entry = _entry(os.path.join(host, "etc/containerd/config.toml"))
    assert entry["container_annotations"] == ["cdi.k8s.io/*"]


CONTAINERD_16 = '#!/bin/sh\necho "containerd github.com/containerd/containerd 1.6.20 abc"\n'
CONTAINERD_17 = '#!/bin/sh\necho "containerd github.com/containerd/containerd v1.7.13 abc"\n'


@pytest.fixture
def node(make_node: MakeNode) -> str:
    root = make_node("vendor-8card")
    fx.fake_host(root, docker=False)
    fx.write(root, "/usr/bin/containerd", CONTAINERD_16, 0o755)
    return root


def _strategy(root: str, strategies: tuple[str, ...]) -> doctor.Result:
    return next(r for r in doctor.run(root, strategies) if r.name == "device-list-strategy")


def test_doctor_flags_cdi_annotations_without_the_pass_through(node: str) -> None:
    engines.configure("containerd", None, engines.RuntimeOptions(), host_root=node)
    result = _strategy(node, ("cdi-annotations",))
    assert result.status == "fail" and "containerd 1.6 drops" in result.detail
    assert "--cdi-annotations" in result.fix
    engines.configure(
        "containerd", None, engines.RuntimeOptions(cdi_annotations=True), host_root=node
    )
    assert _strategy(node, ("cdi-annotations",)).status == "pass"


def test_doctor_flags_cdi_cri_on_containerd_before_1_7(node: str) -> None:
    engines.configure("containerd", None, engines.RuntimeOptions(cdi=True), host_root=node)
    result = _strategy(node, ("envvar", "cdi-cri"))
    assert result.status == "fail" and "cdi-cri needs containerd >= 1.7" in result.detail
    fx.write(node, "/usr/bin/containerd", CONTAINERD_17, 0o755)
    assert _strategy(node, ("cdi-cri",)).status == "pass"


def test_doctor_flags_pod_annotations_that_name_devices(
    node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engines.configure("containerd", None, engines.RuntimeOptions(), host_root=node)
    path = os.path.join(node, "etc/containerd/config.toml")
    document = tomlkit.parse(read(path))
    document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["enflame"][
        "pod_annotations"
    ] = ["cdi.k8s.io/*"]
    fx.write(node, "/etc/containerd/config.toml", tomlkit.dumps(document))
    assert _strategy(node, ()).status == "fail"
    main(["doctor", "--host-root", node, "--device-list-strategy", "envvar"])
    assert "any pod author can name devices" in capsys.readouterr().out
