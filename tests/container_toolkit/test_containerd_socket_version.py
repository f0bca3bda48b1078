"""The containerd socket option is what node mode ``auto`` asks for the version: a real one.

A real containerd (Debian's 1.6) on a private socket, the engine tests' fixture: its directory
is the host root, and no containerd binary lies under it, so only the socket can tell.
"""

from __future__ import annotations

import os
import re

import pytest

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import engines, installer, node_mode
from enflame_gcu.container_toolkit.engines import containerd_api
from tests.container_toolkit import installer_fixtures as fx
from tests.container_toolkit.engines.test_engine_containerd_real import (  # noqa: F401 - fixture
    Containerd,
    containerd,
)

pytestmark = pytest.mark.containerd


def test_the_version_comes_from_the_socket_given(containerd: Containerd) -> None:  # noqa: F811
    root = containerd.directory
    assert not os.path.exists(os.path.join(root, "usr/bin/containerd"))
    served = containerd.ctr("version").stdout
    server = re.search(r"Server:\s*\n\s*Version:\s*(\S+)", served)
    assert server is not None, served
    assert containerd_api.version(root, "/containerd.sock") == server[1]
    site = engines.containerd_site(socket="/containerd.sock")
    expected = containerd_api.major_minor(server[1])
    assert expected is not None and expected[0] >= 1
    assert node_mode.engine_version(root, "containerd", site) == expected
    # The stock socket path holds nothing under this root: the version cannot be told.
    assert node_mode.engine_version(root, "containerd") is None
    engine = node_mode.detect(root, None, site)
    assert (engine.name, engine.version) == ("containerd", expected)


def test_auto_records_the_version_the_socket_reports(containerd: Containerd) -> None:  # noqa: F811
    root = containerd.directory
    fx.fake_host(root, docker=False, containerd=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    site = engines.containerd_site(socket="/containerd.sock")
    options = installer.InstallOptions(host_root=root, mode="auto", containerd=site)
    outcome = installer.install(options)
    record = node_modes.read(root)
    assert record is not None and record.engine == "containerd"
    major, minor = node_mode.engine_version(root, "containerd", site) or (0, 0)
    assert record.engine_version == f"{major}.{minor}"
    assert outcome.mode == record.mode
    installer.uninstall(root)
    assert node_modes.read(root) is None
