"""The runtime's small log writer and the no-request fast path."""

from __future__ import annotations

import json
import os

import pytest

from enflame_gcu import naming
from enflame_gcu.shim import log as runtime_log
from enflame_gcu.shim import main as runtime
from enflame_gcu.shim import oci
from enflame_gcu.shim import request as device_request
from tests.shim.conftest import MakeBundle, plugin_mount


def test_lines_at_or_above_the_level_are_appended(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "sub", "rt.log")
    log = runtime_log.RuntimeLog(path, "info")
    log.debug("hidden %s", 1)
    log.info("shown %s", "a")
    log.error("bad %d", 2)
    log.close()
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert [line.split(" ", 3)[3] for line in lines] == ["INFO shown a", "ERROR bad 2"]
    assert all(f"pid={os.getpid()}" in line for line in lines)


def test_empty_path_disables_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    log = runtime_log.RuntimeLog("", "debug")
    log.error("nowhere")
    assert capsys.readouterr() == ("", "")


def test_no_marker_means_no_request(make_bundle: MakeBundle) -> None:
    assert not runtime.may_request_devices(make_bundle())
    assert runtime.may_request_devices(make_bundle(env=[f"{naming.VISIBLE_DEVICES_ENV}=0"]))
    mount = {"destination": f"{naming.VOLUME_MOUNT_DIR}/gcu0", "source": "/dev/null"}
    assert runtime.may_request_devices(make_bundle(mounts=[mount]))
    notes = {naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=0"}
    assert runtime.may_request_devices(make_bundle(annotations=notes))
    assert runtime.may_request_devices("/nonexistent")  # let the create path report it


def test_every_request_the_grammar_accepts_carries_a_marker(make_bundle: MakeBundle) -> None:
    # The fast path is only safe if no request can be written without a marker.
    for kwargs in (
        {"env": [f"{naming.VISIBLE_DEVICES_ENV}=all"]},
        {"mounts": [plugin_mount("1")]},
        {"annotations": {"cdi.k8s.io/x": "enflame.com/gcu=1"}},
    ):
        bundle = make_bundle(**kwargs)
        assert device_request.from_spec(oci.load(bundle).data, True).wants_edits
        with open(oci.spec_path(bundle), "rb") as handle:
            raw = json.dumps(json.loads(handle.read())).encode()  # as an engine writes it
        assert any(marker in raw for marker in runtime.REQUEST_MARKERS)
