"""The library as the vendor installs it: /usr/lib/libefml.so a link into /usr/local/efsmi, with
a dependency there. Links are followed hop by hop inside the host root, and a dangling or
escaping candidate is named instead of skipped silently."""

from __future__ import annotations

import os
import shutil

import pytest

from enflame_gcu.efml import library
from enflame_gcu.errors import EfmlError
from enflame_gcu.simulation import efmlsim
from tests.conftest import MakeNode


@pytest.fixture
def node(make_node: MakeNode) -> str:
    root = make_node("vgcu-2card")
    efmlsim.install(root, vendor_layout=True)
    return root


def test_a_link_into_the_vendors_directory_is_followed_inside_the_host_root(node: str) -> None:
    link = os.path.join(node, "usr/lib/libefml.so")
    assert os.readlink(link) == "/usr/local/efsmi/lib/libefml.so.1.2.3"  # the host's path
    loaded = library.Library.load(node)
    assert loaded.path == os.path.join(
        os.path.realpath(node), "usr/local/efsmi/lib/libefml.so.1.2.3"
    )
    loaded.init()  # its dependency (libefsmi_sim.so, next to it) was found
    try:
        assert loaded.device_count() == 2
    finally:
        loaded.shutdown()


def test_a_dangling_candidate_is_named(node: str) -> None:
    shutil.rmtree(os.path.join(node, "usr/local/efsmi"))  # the directory not mounted
    with pytest.raises(EfmlError) as raised:
        library.Library.load(node)
    text = str(raised.value)
    assert "dangling" in text
    assert f"{node}/usr/lib/libefml.so -> /usr/local/efsmi/lib/libefml.so.1.2.3" in text


def test_a_link_that_climbs_out_of_the_host_root_is_refused_and_named(make_node: MakeNode) -> None:
    root = make_node("vgcu-2card")
    os.makedirs(os.path.join(root, "usr/lib"), exist_ok=True)
    os.symlink("../../../../../../../../etc/hostname", os.path.join(root, "usr/lib/libefml.so"))
    with pytest.raises(EfmlError, match="would lead out of the host root"):
        library.Library.load(root)
