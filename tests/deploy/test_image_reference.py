"""One image reference (issue 50 point 2): the chart's global.image.registry and .tag name every
image of ours it deploys and the operator's defaults; deploy/set-image.sh sets the static
manifests' image: lines from the same reference."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from enflame_gcu.gcu_operator import main as operator_main
from enflame_gcu.gcu_operator import resource as rs
from tests.deploy import helm_render
from tests.deploy.helpers import CHART_DIR, DEPLOY, REPO

pytestmark = pytest.mark.skipif(
    helm_render.helm_missing(), reason="no .venv-helm (scripts/bootstrap.sh makes it)"
)
REGISTRY = "127.0.0.1:5000/enflame"
TAG = "9.9.9"
# Every component that runs an image of ours, so every template with one renders (with the
# operator on, it deploys the node daemons and the chart's own DaemonSets are off).
DAEMONS: dict[str, Any] = {
    "global": {"image": {"registry": REGISTRY, "tag": TAG}},
    "toolkit": {"enabled": True},
    "dra": {"enabled": True},
    "extender": {"enabled": True},
}
WITH_OPERATOR: dict[str, Any] = {**DAEMONS, "operator": {"enabled": True}}
# Not ours: the extender's kube-scheduler; the examples' workload images.
THIRD_PARTY = re.compile(r"(registry\.k8s\.io/kube-scheduler|debian|ubuntu):")
OURS = ("enflame-gcu-device-plugin", "enflame-gcu-container-toolkit")


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container and init container anywhere under ``node``."""
    if isinstance(node, dict):
        for key in ("containers", "initContainers"):
            yield from node.get(key) or ()
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


def _images(rendered: dict[str, list[Any]]) -> dict[str, str]:
    return {
        f"{name}/{container['name']}": container["image"]
        for name, documents in rendered.items()
        for container in _containers(documents)
    }


def _operator_args(rendered: dict[str, list[Any]]) -> list[str]:
    for name, documents in rendered.items():
        for container in _containers(documents):
            if container["name"] == "operator" and "operator" in name:
                return [str(a) for a in container.get("args") or ()]
    raise AssertionError("the chart rendered no operator container")


def test_global_image_reference_names_every_image_of_ours_and_the_operators(
    tmp_path: str,
) -> None:
    images = _images(helm_render.render(os.path.join(tmp_path, "a"), DAEMONS))
    rendered = helm_render.render(os.path.join(tmp_path, "b"), WITH_OPERATOR)
    images.update(_images(rendered))
    ours = {where: ref for where, ref in images.items() if not THIRD_PARTY.match(ref)}
    # The device plugin, toolkit, DRA driver, extender, operator and its hooks all rendered.
    assert len({where.split("/")[0] for where in ours}) >= 6, images
    for where, ref in ours.items():
        repository, _, tag = ref.rpartition(":")
        assert repository.rpartition("/")[0] == REGISTRY and tag == TAG, (where, ref)
        assert repository.rpartition("/")[2] in OURS, (where, ref)
    assert f"{REGISTRY}/enflame-gcu-container-toolkit:{TAG}" in ours.values()
    args = _operator_args(rendered)
    assert f"--image-registry={REGISTRY}" in args and f"--image-tag={TAG}" in args


def test_the_default_reference_is_the_published_one_at_the_charts_app_version(
    tmp_path: str,
) -> None:
    default = {k: v for k, v in WITH_OPERATOR.items() if k != "global"}
    rendered = helm_render.render(os.path.join(tmp_path, "b"), default)
    images = _images(rendered)
    images.update(
        _images(
            helm_render.render(
                os.path.join(tmp_path, "a"), default | {"operator": {"enabled": False}}
            )
        )
    )
    with open(os.path.join(CHART_DIR, "Chart.yaml"), encoding="utf-8") as handle:
        app_version = yaml.safe_load(handle)["appVersion"]
    ours = {r for r in images.values() if not THIRD_PARTY.match(r)}
    assert ours == {f"ghcr.io/enflame-gcu/{name}:{app_version}" for name in OURS}
    args = _operator_args(rendered)
    assert "--image-registry=ghcr.io/enflame-gcu" in args
    assert f"--image-tag={app_version}" in args


def test_per_image_overrides_still_win_over_the_reference(tmp_path: str) -> None:
    digest = "sha256:" + "a" * 64
    overrides = {
        **DAEMONS,
        "image": {"digest": digest},
        "toolkit": {"enabled": True, "image": {"repository": "other.example/tk", "tag": "t1"}},
    }
    images = _images(helm_render.render(str(tmp_path), overrides))
    toolkit = {r for w, r in images.items() if "container-toolkit" in w}
    assert toolkit == {"other.example/tk:t1"}
    plugin = {r for w, r in images.items() if "daemonset-device-plugin" in w}
    assert plugin == {f"{REGISTRY}/enflame-gcu-device-plugin@{digest}"}


@pytest.mark.parametrize(
    "registry", ["has space/x", "ends/with/", "a@sha256:00", "host:5000/x:tag:"]
)
def test_a_bad_registry_is_refused_by_the_schema(tmp_path: str, registry: str) -> None:
    with pytest.raises(AssertionError, match="global"):
        helm_render.render(str(tmp_path), {"global": {"image": {"registry": registry}}})


@pytest.fixture
def image_defaults() -> Iterator[None]:
    previous = rs.image_defaults()
    yield
    rs.set_image_defaults(previous)


def test_the_operators_components_default_to_its_image_flags(image_defaults: None) -> None:
    args = operator_main._parser().parse_args([f"--image-registry={REGISTRY}/", "--image-tag", TAG])
    rs.set_image_defaults(rs.ImageDefaults(args.image_registry, args.image_tag))
    spec = rs.parse({"containerToolkit": {}, "devicePlugin": {}, "gcuExporter": {}})
    assert spec.components[rs.TOOLKIT].image == f"{REGISTRY}/enflame-gcu-container-toolkit:{TAG}"
    assert spec.components[rs.DEVICE_PLUGIN].image == f"{REGISTRY}/enflame-gcu-device-plugin:{TAG}"
    # What the resource names still wins; the vendor's image names fall back to the reference.
    pinned = rs.parse({"devicePlugin": {"repository": "mine.example/x", "version": "0.2.0"}})
    assert (
        pinned.components[rs.DEVICE_PLUGIN].image
        == "mine.example/x/enflame-gcu-device-plugin:0.2.0"
    )
    vendor = rs.parse({"devicePlugin": {"image": "gcu-plugin", "version": "latest"}})
    assert (
        vendor.components[rs.DEVICE_PLUGIN].image == f"{REGISTRY}/enflame-gcu-device-plugin:{TAG}"
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--image-registry", "a b/c"),
        ("--image-registry", "x@sha256:1"),
        ("--image-tag", "no/slash"),
        ("--image-tag", ""),
    ],
)
def test_the_operator_refuses_a_bad_image_flag(flag: str, value: str) -> None:
    with pytest.raises(SystemExit) as raised:
        operator_main._parser().parse_args([f"{flag}={value}"])
    assert raised.value.code == 2


def test_the_operators_example_leaves_the_images_to_the_reference() -> None:
    with open(
        os.path.join(DEPLOY, "operator", "examples", "gcu-resource.yaml"), encoding="utf-8"
    ) as handle:
        spec = yaml.safe_load(handle)["spec"]
    for key, value in spec.items():
        if isinstance(value, dict):
            named = {"repository", "image", "version"} & set(value)
            assert not named, (
                f"spec.{key} names {named}: the chart's one reference would not reach it"
            )


# --- the static manifests: deploy/set-image.sh -----------------------------------------------


def _image_lines(root: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for directory in ("yaml", "dra", "extender"):
        for dirpath, _, files in os.walk(os.path.join(root, directory)):
            for name in sorted(files):
                if name.endswith(".yaml"):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8") as handle:
                        lines = re.findall(
                            r"^\s*(?:- )?image:\s*\"?([^\s\"]+)", handle.read(), re.M
                        )
                    found[os.path.relpath(path, root)] = lines
    return found


def _copy(tmp_path: str) -> str:
    root = os.path.join(tmp_path, "deploy")
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("helm"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    return root


def _set_image(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", os.path.join(root, "set-image.sh"), *args], capture_output=True, text=True
    )


def test_set_image_points_every_manifest_image_of_ours_at_one_reference(tmp_path: str) -> None:
    root = _copy(str(tmp_path))
    result = _set_image(root, REGISTRY + "/", TAG)
    assert result.returncode == 0, result.stderr
    lines = _image_lines(root)
    ours = [ref for refs in lines.values() for ref in refs if not THIRD_PARTY.match(ref)]
    assert len(ours) >= 10, lines
    assert set(ours) == {f"{REGISTRY}/{name}:{TAG}" for name in OURS}, lines
    # Everything else is left as it was, byte for byte.
    for path, refs in _image_lines(DEPLOY).items():
        assert [r for r in refs if THIRD_PARTY.match(r)] == [
            r for r in lines[path] if THIRD_PARTY.match(r)
        ]
    assert _set_image(root, "--check", REGISTRY, TAG).returncode == 0
    # A second reference replaces the first (the lines stay ours whatever registry they name).
    assert _set_image(root, "other.example:5000/x").returncode == 0
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
        version = re.search(r'^version = "(.*)"$', handle.read(), re.M)
    assert version is not None
    again = {r for rs_ in _image_lines(root).values() for r in rs_ if not THIRD_PARTY.match(r)}
    assert again == {f"other.example:5000/x/{name}:{version[1]}" for name in OURS}


def test_set_image_check_finds_the_shipped_manifests_at_the_default_reference() -> None:
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
        version = re.search(r'^version = "(.*)"$', handle.read(), re.M)
    assert version is not None
    assert _set_image(DEPLOY, "--check", "ghcr.io/enflame-gcu", version[1]).returncode == 0
    stale = _set_image(DEPLOY, "--check", REGISTRY, TAG)
    assert stale.returncode == 1 and "enflame-device-plugin.yaml" in stale.stderr


@pytest.mark.parametrize(
    "args", [("a b",), ("x#y",), ("ok.example", "bad/tag"), ("ok.example:",), ()]
)
def test_set_image_refuses_a_bad_reference_and_changes_nothing(
    tmp_path: str, args: tuple[str, ...]
) -> None:
    root = _copy(str(tmp_path))
    before = _image_lines(root)
    result = _set_image(root, *args)
    assert result.returncode == 2, result.stderr
    assert _image_lines(root) == before
