"""Container images and deploy scripts: hadolint, image facts, build-image.sh, shellcheck.

No container engine runs here, so the images are not built in this suite; the Dockerfiles are
linted with hadolint and their key instructions asserted, and build-image.sh is run in its
--dry-run mode against stand-in builders.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from tests.deploy.helpers import DEPLOY, PLUGIN_IMAGE, REPO, TOOLKIT_IMAGE, tool

DOCKERFILES = ["Dockerfile", "Dockerfile.toolkit"]
SCRIPTS = ["build-image.sh", "k8s-config.sh", "set-image.sh", "push-image-archive.sh"]


def dockerfile(name: str) -> str:
    with open(os.path.join(DEPLOY, "docker", name), encoding="utf-8") as handle:
        return handle.read()


def instructions(name: str) -> list[str]:
    """The Dockerfile's instructions with continuation lines joined and comments dropped."""
    joined = dockerfile(name).replace("\\\n", " ")
    return [
        line.strip()
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_passes_hadolint(name: str) -> None:
    result = subprocess.run(
        [tool("hadolint"), "--no-color", os.path.join(DEPLOY, "docker", name)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_really_lints() -> None:
    """Guards the test above: a known-bad Dockerfile must fail."""
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "-"],
        input="FROM debian:latest\nRUN cd /tmp && ls\n",
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout


def test_plugin_image_installs_the_source_tree_and_runs_the_plugin() -> None:
    lines = instructions("Dockerfile")
    assert lines[0].startswith("FROM python:3.11-slim")
    assert "COPY src ./src" in lines
    # The plugins' extras on top of the node dependencies (pyproject's split).
    assert any(
        line.startswith("RUN pip install") and line.endswith(' "./[plugin,dra]"') for line in lines
    )
    assert any(line.startswith("ENV ENFLAME_VISIBLE_DEVICES=all") for line in lines)
    assert lines[-1] == 'ENTRYPOINT ["enflame-device-plugin"]'


def test_toolkit_image_runs_the_containerized_installer() -> None:
    lines = instructions("Dockerfile.toolkit")
    assert lines[0].startswith("FROM python:3.11-slim")
    assert "COPY src ./src" in lines
    assert lines[-1] == 'ENTRYPOINT ["enflame-ctk", "install", "--host-root", "/host", "--wait"]'


def _fake_builder(directory: str, name: str) -> None:
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def _build_image(args: list[str], path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", os.path.join(DEPLOY, "build-image.sh"), *args],
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": "/nonexistent", **env},
    )


def _system_path_without_builders(tmp_path: str) -> str:
    """A PATH holding only the basic tools the script uses (no docker/podman/buildah)."""
    bin_dir = os.path.join(tmp_path, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    for name in ("sed", "head", "dirname", "basename", "bash"):
        found = shutil.which(name)
        assert found is not None
        os.symlink(found, os.path.join(bin_dir, name))
    return bin_dir


def test_build_image_builds_both_images_with_the_first_builder_found(tmp_path: str) -> None:
    path = _system_path_without_builders(str(tmp_path))
    _fake_builder(path, "podman")
    result = _build_image(["--dry-run"], path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("podman build --file ")
    assert f"deploy/docker/Dockerfile --tag {PLUGIN_IMAGE}:0.1.0 {REPO}" in lines[0]
    assert f"deploy/docker/Dockerfile.toolkit --tag {TOOLKIT_IMAGE}:0.1.0 {REPO}" in lines[1]


def test_build_image_takes_image_and_tag(tmp_path: str) -> None:
    path = _system_path_without_builders(str(tmp_path))
    _fake_builder(path, "buildah")
    result = _build_image(["--dry-run", "registry.local/enflame-device-plugin", "dev"], path)
    assert result.returncode == 0, result.stderr
    assert "buildah bud" in result.stdout
    assert "--tag registry.local/enflame-device-plugin:dev" in result.stdout
    assert "--tag registry.local/enflame-container-toolkit:dev" in result.stdout


@pytest.mark.parametrize("builder", ["docker", "podman", "buildah"])
def test_build_image_push_pushes_both_images_after_building_them(
    tmp_path: str, builder: str
) -> None:
    """build-image.sh built but never pushed (issue 50 point 2)."""
    path = _system_path_without_builders(str(tmp_path))
    _fake_builder(path, builder)
    image = "registry.example.com/enflame/enflame-gcu-device-plugin"
    result = _build_image(["--dry-run", "--push", image, "0.1.0"], path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4, lines
    assert lines[2] == f"{builder} push {image}:0.1.0 "
    toolkit = "registry.example.com/enflame/enflame-gcu-container-toolkit"
    assert lines[3] == f"{builder} push {toolkit}:0.1.0 "
    # Without --push nothing is pushed.
    assert "push" not in _build_image(["--dry-run", image], path).stdout


@pytest.mark.parametrize("builder", ["docker", "podman", "buildah"])
def test_build_image_platforms_builds_and_pushes_one_multi_arch_list(
    tmp_path: str, builder: str
) -> None:
    path = _system_path_without_builders(str(tmp_path))
    _fake_builder(path, builder)
    image = "registry.example.com/enflame/enflame-gcu-device-plugin"
    platforms = "linux/amd64,linux/arm64"
    env_args = ["--dry-run", "--push", image, "0.1.0"]
    result = _build_image(env_args, path, PLATFORMS=platforms)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    toolkit = "registry.example.com/enflame/enflame-gcu-container-toolkit"
    quoted = platforms.replace(",", "\\,")  # as printf %q shows it
    if builder == "docker":  # buildx pushes the list as it builds
        assert len(lines) == 2, lines
        assert lines[0].startswith(f"docker buildx build --platform {quoted} ")
        assert f"--tag {image}:0.1.0 --push " in lines[0]
        assert f"--tag {toolkit}:0.1.0 --push " in lines[1]
    else:
        assert len(lines) == 4, lines
        assert f"--platform {quoted} --manifest {image}:0.1.0 " in lines[0]
        assert lines[2] == f"{builder} manifest push --all {image}:0.1.0 docker://{image}:0.1.0 "
        assert lines[3].endswith(f"docker://{toolkit}:0.1.0 ")
    # A manifest list lives in a registry: PLATFORMS without --push is refused, as with
    # --from-debian (which builds for this machine only).
    refused = _build_image(["--dry-run", image], path, PLATFORMS=platforms)
    assert refused.returncode == 2 and "needs --push" in refused.stderr
    refused = _build_image(["--from-debian", str(tmp_path)], path, PLATFORMS=platforms)
    assert refused.returncode == 2 and "this machine's architecture only" in refused.stderr


def test_build_image_from_debian_push_pushes_the_archive(tmp_path: str) -> None:
    """--from-debian --push was refused: an archive had no way to a registry."""
    path = _system_path_without_builders(str(tmp_path))
    image = "127.0.0.1:5000/enflame/enflame-gcu-device-plugin"
    result = _build_image(["--dry-run", "--from-debian", str(tmp_path), "--push", image], path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        f"({image}:0.1.0, 127.0.0.1:5000/enflame/enflame-gcu-container-toolkit:0.1.0)"
        in (lines[-2])
    )
    assert lines[-1] == f"deploy/push-image-archive.sh {tmp_path}/enflame-gcu-images-0.1.0.tar"


def test_build_image_without_any_builder_says_what_to_install(tmp_path: str) -> None:
    result = _build_image([], _system_path_without_builders(str(tmp_path)))
    assert result.returncode == 1
    assert "install docker, podman or buildah" in result.stderr


SHELLCHECK = shutil.which("shellcheck")


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses(name: str) -> None:
    subprocess.run(["bash", "-n", os.path.join(DEPLOY, name)], check=True)


@pytest.mark.skipif(
    SHELLCHECK is None,
    reason="shellcheck is not installed (Debian package shellcheck, installed by bootstrap.sh)",
)
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_passes_shellcheck(name: str) -> None:
    assert SHELLCHECK is not None
    result = subprocess.run(
        [SHELLCHECK, os.path.join(DEPLOY, name)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
