"""containerd config.toml: versions 1/2/3, runc options carried over, comments kept, drop-ins."""

from __future__ import annotations

import os
from typing import Any

import pytest
import tomlkit

from enflame_gcu.container_toolkit import engines
from enflame_gcu.errors import EngineConfigError
from tests.container_toolkit.engines.conftest import InstallGolden
from tests.container_toolkit.engines.helpers import check_golden, golden_text, listing, read

CRI = {
    "v1": ("plugins", "cri"),
    "v2": ("plugins", "io.containerd.grpc.v1.cri"),
    "v3": ("plugins", "io.containerd.cri.v1.runtime"),
}


def at(document: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_runtime_goes_to_the_versions_table_with_runc_options(
    install_golden: InstallGolden, version: str
) -> None:
    path = install_golden(f"containerd-{version}.toml", "etc/containerd/config.toml")
    options = engines.RuntimeOptions(set_as_default=True, cdi=True)
    engines.configure("containerd", path, options)
    text = read(path)
    check_golden(f"containerd-{version}.configured.toml", text)
    config = tomlkit.parse(text).unwrap()
    cri = at(config, CRI[version])
    runtime = cri["containerd"]["runtimes"]["enflame"]
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"]["BinaryName"] == "/usr/bin/enflame-container-runtime"
    assert runtime["options"]["SystemdCgroup"] is True
    assert cri["containerd"]["default_runtime_name"] == "enflame"
    assert cri["enable_cdi"] is True
    # runc itself is untouched, and every comment of the original survives.
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    original_comments = [
        ln.strip() for ln in golden_text(f"containerd-{version}.toml").splitlines() if "#" in ln
    ]
    for comment in original_comments:
        assert comment in text


def test_v2_copies_every_runc_key(install_golden: InstallGolden) -> None:
    path = install_golden("containerd-v2.toml", "config.toml")
    engines.configure("containerd", path)
    config = tomlkit.parse(read(path)).unwrap()
    runtime = at(config, CRI["v2"])["containerd"]["runtimes"]["enflame"]
    assert runtime == {
        "runtime_type": "io.containerd.runc.v2",
        "privileged_without_host_devices": False,
        "options": {"BinaryName": "/usr/bin/enflame-container-runtime", "SystemdCgroup": True},
    }
    assert at(config, CRI["v2"])["containerd"]["default_runtime_name"] == "runc"
    assert "enable_cdi" not in at(config, CRI["v2"])


def test_options_come_from_the_current_default_runtime(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(
            "version = 2\n"
            '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            '  default_runtime_name = "custom"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.custom]\n'
            '  runtime_type = "io.containerd.runc.v2"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.custom.options]\n'
            '  SystemdCgroup = true\n  Root = "/run/custom"\n'
        )
    engines.configure("containerd", path, engines.RuntimeOptions(runtime_name="gcu"))
    config = tomlkit.parse(read(path)).unwrap()
    options = at(config, CRI["v2"])["containerd"]["runtimes"]["gcu"]["options"]
    assert options == {
        "SystemdCgroup": True,
        "Root": "/run/custom",
        "BinaryName": "/usr/bin/enflame-container-runtime",
    }


def test_missing_config_is_created_as_version_2(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    change = engines.configure("containerd", path, engines.RuntimeOptions(runtime_path="/opt/r"))
    assert change.files[0].action == "created"
    assert any("no runc runtime entry" in note for note in change.notes)
    check_golden("containerd-created.toml", read(path))
    config = tomlkit.parse(read(path)).unwrap()
    assert config["version"] == 2
    assert at(config, CRI["v2"])["containerd"]["runtimes"]["enflame"]["options"] == {
        "BinaryName": "/opt/r"
    }


def test_unknown_version_is_refused(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("version = 7\n")
    with pytest.raises(EngineConfigError, match=r"version = 7 .*known: \[1, 2, 3\]"):
        engines.configure("containerd", path)
    assert read(path) == "version = 7\n"


def test_malformed_toml_is_refused_with_position(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('version = 2\n[plugins\nroot = "/x"\n')
    with pytest.raises(EngineConfigError, match=r"not valid TOML \(line 2, column"):
        engines.configure("containerd", path)
    assert listing(str(tmp_path)) == ["config.toml"]


def test_drop_in_for_version_3(install_golden: InstallGolden) -> None:
    path = install_golden("containerd-v3.toml", "etc/containerd/config.toml")
    options = engines.RuntimeOptions(drop_in=True, set_as_default=True)
    change = engines.configure(
        "containerd",
        path,
        options,
        host_root=os.path.dirname(os.path.dirname(os.path.dirname(path))),
    )
    drop_in = os.path.join(os.path.dirname(path), "conf.d", "99-enflame.toml")
    assert [f.action for f in change.files] == ["created", "modified"]
    check_golden("containerd-v3.drop-in.toml", read(drop_in))
    check_golden("containerd-v3.imports.toml", read(path))
    # The imports entry is the path the host sees, not the test's temporary root.
    assert tomlkit.parse(read(path))["imports"] == ["/etc/containerd/conf.d/99-enflame.toml"]
    runtime = at(tomlkit.parse(read(drop_in)).unwrap(), CRI["v3"])["containerd"]["runtimes"][
        "enflame"
    ]
    assert runtime["options"]["SystemdCgroup"] is True
    engines.unconfigure("containerd", path)
    assert read(path) == golden_text("containerd-v3.toml")
    assert not os.path.exists(drop_in)


def test_drop_in_already_imported_by_a_glob_leaves_main_config_alone(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    main = f'version = 3\nimports = ["{tmp_path}/conf.d/*.toml"]\n'
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(main)
    change = engines.configure("containerd", path, engines.RuntimeOptions(drop_in=True))
    assert [f.path for f in change.files] == [
        os.path.join(str(tmp_path), "conf.d", "99-enflame.toml")
    ]
    assert read(path) == main


def test_drop_in_is_refused_for_version_2(install_golden: InstallGolden) -> None:
    path = install_golden("containerd-v2.toml", "config.toml")
    with pytest.raises(EngineConfigError, match=r"containerd 1\.x replaces a plugin's whole table"):
        engines.configure("containerd", path, engines.RuntimeOptions(drop_in=True))
    assert read(path) == golden_text("containerd-v2.toml")
    assert listing(os.path.dirname(path)) == ["config.toml"]
