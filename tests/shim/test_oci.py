"""Loading, shape checks and the atomic save of a bundle's config.json."""

from __future__ import annotations

import json
import os
import threading

import pytest

from enflame_gcu.errors import SpecError
from enflame_gcu.shim import oci


def write(bundle: str, text: str) -> None:
    with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
        handle.write(text)


def test_load_keeps_the_exact_bytes(make_bundle: object) -> None:
    bundle = make_bundle()  # type: ignore[operator]
    spec = oci.load(bundle)
    with open(os.path.join(bundle, "config.json"), "rb") as handle:
        assert spec.raw == handle.read()
    assert spec.data["x-unknown-top-field"] == [1, 2, 3]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"process": []}', "'process' must be a JSON object"),
        ('{"process": {"env": ["A=1", 2]}}', "process.env' must be a list of strings"),
        ('{"mounts": {}}', "'mounts' must be a JSON array"),
        ('{"linux": {"devices": {}}}', "linux.devices' must be a JSON array"),
        ('{"annotations": {"a": 1}}', "annotation 'a' must be a string"),
    ],
)
def test_bad_specs_are_named(tmp_path: os.PathLike[str], text: str, message: str) -> None:
    write(str(tmp_path), text)
    with pytest.raises(SpecError, match=message):
        oci.load(str(tmp_path))


def test_missing_spec_names_the_path(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(SpecError, match=f"cannot read {tmp_path}/config.json"):
        oci.load(str(tmp_path))


def test_save_is_atomic_keeps_mode_and_leaves_no_temp_files(make_bundle: object) -> None:
    bundle = make_bundle()  # type: ignore[operator]
    path = os.path.join(bundle, "config.json")
    os.chmod(path, 0o600)
    spec = oci.load(bundle)
    seen: list[object] = []
    stop = threading.Event()

    def reader() -> None:
        # Every read during the saves must see a complete JSON document, old or new.
        while not stop.is_set():
            with open(path, "rb") as handle:
                seen.append(json.loads(handle.read())["hostname"])

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for index in range(50):
            data = dict(spec.data, hostname=f"h{index}", padding="x" * 200_000)
            oci.save(spec, data)
    finally:
        stop.set()
        thread.join()
    assert seen
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert sorted(os.listdir(bundle)) == ["config.json"]
    assert oci.load(bundle).data["hostname"] == "h49"


def test_save_failure_names_the_file_and_leaves_no_temp_file(tmp_path: os.PathLike[str]) -> None:
    # A directory where the spec should go: the final rename fails after the temp file exists.
    target = os.path.join(str(tmp_path), "config.json")
    os.mkdir(target)
    spec = oci.Spec(target, b"{}", {})
    with pytest.raises(SpecError, match=f"cannot write {target}"):
        oci.save(spec, {"new": True})
    assert os.listdir(str(tmp_path)) == ["config.json"]
    assert os.path.isdir(target)
