"""Property-based: configure then unconfigure gives back the original bytes; no key is dropped.

Documents are generated (docker daemon.json, containerd config.toml versions 1-3, CRI-O drop-in
inputs) with keys we touch mixed among arbitrary ones. Bounded and deterministic: a fixed
example count, derandomized, no example database, so CI runs the same examples every time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import tomlkit
from hypothesis import strategies as st

from enflame_gcu.container_toolkit import engines
from enflame_gcu.errors import EngineConfigError

SETTINGS = hypothesis.settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    # The fixture's directory is emptied by every example (_fresh), so sharing it is intended.
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)

KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.", min_size=1, max_size=12)
BARE_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_", min_size=1, max_size=12)
# A drop-in's own keys: not `runtimes`, which CRI-O reads as a table (a string there is a broken
# config that configure refuses, tested below).
DROP_IN_KEYS = BARE_KEYS.filter(lambda key: key != "runtimes")
SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.text(max_size=20).filter(lambda s: "\x00" not in s),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(SCALARS, max_size=3), st.dictionaries(KEYS, inner, max_size=3)
    ),
    max_leaves=8,
)
RUNTIME_NAMES = st.sampled_from(["enflame", "runc", "crun", "kata", "nvidia"])
OPTIONS = st.builds(
    engines.RuntimeOptions,
    set_as_default=st.booleans(),
    cdi=st.booleans(),
    cdi_annotations=st.booleans(),
)


@pytest.fixture
def directory() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="enflame-prop-")
    yield path
    shutil.rmtree(path)


def _fresh(directory: str) -> str:
    for name in os.listdir(directory):
        target = os.path.join(directory, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        else:
            os.unlink(target)
    return directory


def _leaves(value: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, (*prefix, key))
    else:
        yield prefix


# How the config file sits on disk: mode, owner, and whether the path is a symlink to it.
FILES = st.tuples(st.sampled_from([0o600, 0o640, 0o644]), st.sampled_from([0, 1234]), st.booleans())


def _round_trip(
    engine: str,
    path: str,
    text: str,
    options: engines.RuntimeOptions,
    file: tuple[int, int, bool] = (0o644, 0, False),
) -> tuple[str, str]:
    mode, owner, linked = file
    real = os.path.join(os.path.dirname(path), "real", os.path.basename(path)) if linked else path
    os.makedirs(os.path.dirname(real), exist_ok=True)
    with open(real, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(real, mode)
    os.chown(real, owner, owner)
    if linked:
        os.symlink(real, path)
    engines.configure(engine, path, options)
    with open(path, encoding="utf-8") as handle:
        configured = handle.read()
    # Every file configure left next to the config (backups, state) is as private as it.
    for name in os.listdir(os.path.dirname(path)):
        info = os.lstat(os.path.join(os.path.dirname(path), name))
        if ".enflame-" in name and not name.endswith(".lock"):
            assert info.st_mode & 0o777 & ~mode == 0, (name, oct(info.st_mode))
            assert info.st_uid == owner, name
    engines.unconfigure(engine, path)
    assert os.path.islink(path) == linked
    info = os.stat(real)
    assert (info.st_mode & 0o777, info.st_uid, info.st_gid) == (mode, owner, owner)
    with open(path, encoding="utf-8") as handle:
        return configured, handle.read()


@st.composite
def daemon_json(draw: st.DrawFn) -> str:
    document = draw(st.dictionaries(KEYS, VALUES, max_size=6))
    runtimes = draw(st.dictionaries(RUNTIME_NAMES, st.dictionaries(KEYS, VALUES, max_size=3)))
    if runtimes:
        document["runtimes"] = runtimes
    if draw(st.booleans()):
        document["default-runtime"] = draw(RUNTIME_NAMES)
    indent = draw(st.sampled_from([None, 2, 4, "\t"]))
    return json.dumps(document, indent=indent) + draw(st.sampled_from(["", "\n"]))


@SETTINGS
@hypothesis.given(text=daemon_json(), options=OPTIONS, file=FILES)
def test_docker_round_trip_and_no_key_dropped(
    directory: str, text: str, options: engines.RuntimeOptions, file: tuple[int, int, bool]
) -> None:
    path = os.path.join(_fresh(directory), "daemon.json")
    configured, restored = _round_trip("docker", path, text, options, file)
    assert restored == text
    original = json.loads(text)
    after = json.loads(configured)
    for leaf in _leaves(original):
        if leaf[:2] in (("runtimes", "enflame"),) or leaf in (("default-runtime",),):
            continue  # ours to set
        node: Any = after
        for key in leaf:
            assert isinstance(node, dict) and key in node, f"configure dropped {leaf}"
            node = node[key]


CRI_TABLES = {
    1: ("plugins", "cri"),
    2: ("plugins", "io.containerd.grpc.v1.cri"),
    3: ("plugins", "io.containerd.cri.v1.runtime"),
}


@st.composite
def containerd_toml(draw: st.DrawFn) -> str:
    version = draw(st.sampled_from([1, 2, 3]))
    document = tomlkit.document()
    if version != 1 or draw(st.booleans()):
        document["version"] = version
    for key, value in draw(st.dictionaries(KEYS, SCALARS, max_size=3)).items():
        document[key] = value
    containerd: dict[str, Any] = {}
    runtimes: dict[str, Any] = {}
    for name in draw(st.lists(RUNTIME_NAMES, max_size=3, unique=True)):
        entry: dict[str, Any] = {"runtime_type": "io.containerd.runc.v2"}
        entry.update(draw(st.dictionaries(KEYS, SCALARS, max_size=2)))
        if draw(st.booleans()):
            entry["options"] = {"SystemdCgroup": draw(st.booleans())}
        if draw(st.booleans()):
            entry["pod_annotations"] = draw(
                st.lists(st.sampled_from(["io.kata.*", "x.io/*", "*", "cdi.k8s.io/*"]), max_size=2)
            )
        runtimes[name] = entry
    if runtimes:
        containerd["runtimes"] = runtimes
    if runtimes and bool(draw(st.booleans())):
        containerd["default_runtime_name"] = draw(st.sampled_from(sorted(runtimes)))
    if containerd or bool(draw(st.booleans())):
        plugins = tomlkit.table(is_super_table=True)
        cri = tomlkit.table()
        for key, value in draw(st.dictionaries(KEYS, SCALARS, max_size=2)).items():
            cri[key] = value
        if containerd:
            cri["containerd"] = containerd
        plugins[CRI_TABLES[version][1]] = cri
        document["plugins"] = plugins
    text = tomlkit.dumps(document)
    return draw(st.sampled_from(["", "# kept comment\n"])) + text


@SETTINGS
@hypothesis.given(text=containerd_toml(), options=OPTIONS, file=FILES)
def test_containerd_round_trip_and_no_key_dropped(
    directory: str, text: str, options: engines.RuntimeOptions, file: tuple[int, int, bool]
) -> None:
    path = os.path.join(_fresh(directory), "config.toml")
    configured, restored = _round_trip("containerd", path, text, options, file)
    assert restored == text
    original = tomlkit.parse(text).unwrap()
    after = tomlkit.parse(configured).unwrap()
    for leaf in _leaves(original):
        if "enflame" in leaf or leaf[-1:] in (("default_runtime_name",), ("enable_cdi",)):
            continue  # ours to set
        node: Any = after
        for key in leaf:
            assert isinstance(node, dict) and key in node, f"configure dropped {leaf}"
            node = node[key]


@st.composite
def crio_conf(draw: st.DrawFn) -> tuple[str, str | None]:
    main = tomlkit.document()
    runtime = tomlkit.table()
    names = draw(st.lists(st.sampled_from(["runc", "crun", "kata"]), max_size=2, unique=True))
    if names and bool(draw(st.booleans())):
        runtime["default_runtime"] = draw(st.sampled_from(names))
    runtimes = tomlkit.table(is_super_table=True)
    for name in names:
        entry = tomlkit.table()
        entry["runtime_path"] = f"/usr/bin/{name}"
        for key, value in draw(st.dictionaries(KEYS, SCALARS, max_size=2)).items():
            entry[key] = value
        runtimes[name] = entry
    if names:
        runtime["runtimes"] = runtimes
    crio = tomlkit.table(is_super_table=True)
    crio["runtime"] = runtime
    main["crio"] = crio
    # An earlier drop-in of ours (or someone's) that configure must leave byte-exact on undo.
    drop_in = None
    if draw(st.booleans()):
        drop_in = "# operator's own\n[crio.runtime]\n" + "".join(
            f'{k} = "{v}"\n'
            for k, v in draw(st.dictionaries(DROP_IN_KEYS, KEYS, max_size=2)).items()
        )
    return tomlkit.dumps(main), drop_in


@SETTINGS
@hypothesis.given(conf=crio_conf(), options=OPTIONS)
def test_crio_round_trip_and_no_key_dropped(
    directory: str, conf: tuple[str, str | None], options: engines.RuntimeOptions
) -> None:
    main_text, drop_in_text = conf
    root = _fresh(directory)
    main_path = os.path.join(root, "crio.conf")
    with open(main_path, "w", encoding="utf-8") as handle:
        handle.write(main_text)
    drop_in = os.path.join(root, "crio.conf.d", "99-enflame.toml")
    if drop_in_text is not None:
        os.makedirs(os.path.dirname(drop_in))
        with open(drop_in, "w", encoding="utf-8") as handle:
            handle.write(drop_in_text)
    engines.configure("crio", main_path, options)
    with open(drop_in, encoding="utf-8") as handle:
        configured = tomlkit.parse(handle.read()).unwrap()
    if drop_in_text is not None:
        for leaf in _leaves(tomlkit.parse(drop_in_text).unwrap()):
            node: Any = configured
            for key in leaf:
                assert isinstance(node, dict) and key in node, f"configure dropped {leaf}"
                node = node[key]
    engines.unconfigure("crio", main_path)
    with open(main_path, encoding="utf-8") as handle:
        assert handle.read() == main_text
    if drop_in_text is None:
        assert not os.path.exists(drop_in)
    else:
        with open(drop_in, encoding="utf-8") as handle:
            assert handle.read() == drop_in_text


def test_crio_drop_in_with_runtimes_not_a_table_is_refused_untouched(directory: str) -> None:
    root = _fresh(directory)
    main_path = os.path.join(root, "crio.conf")
    main_text = "[crio.runtime]\n"
    with open(main_path, "w", encoding="utf-8") as handle:
        handle.write(main_text)
    drop_in = os.path.join(root, "crio.conf.d", "99-enflame.toml")
    os.makedirs(os.path.dirname(drop_in))
    drop_in_text = '# operator\'s own\n[crio.runtime]\nruntimes = "_"\n'
    with open(drop_in, "w", encoding="utf-8") as handle:
        handle.write(drop_in_text)
    with pytest.raises(EngineConfigError, match="runtimes is a str, expected a table"):
        engines.configure("crio", main_path, engines.RuntimeOptions())
    with open(drop_in, encoding="utf-8") as handle:
        assert handle.read() == drop_in_text
    with open(main_path, encoding="utf-8") as handle:
        assert handle.read() == main_text
    assert sorted(os.listdir(root)) == ["crio.conf", "crio.conf.d"]
    assert os.listdir(os.path.dirname(drop_in)) == ["99-enflame.toml"]
