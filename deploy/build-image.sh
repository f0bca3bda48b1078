#!/usr/bin/env bash
# Builds the two images from this source tree: the device plugin and the toolkit installer.
#
#   deploy/build-image.sh [--dry-run] [IMAGE [TAG]]
#
# IMAGE is the device plugin image (default ghcr.io/enflame-gcu/enflame-gcu-device-plugin);
# the toolkit image is named after it with "device-plugin" replaced by "container-toolkit"
# (or "-container-toolkit" appended), unless TOOLKIT_IMAGE is set. TAG defaults to the project
# version in pyproject.toml. The builder is docker, podman or buildah, whichever is found first
# (BUILDER=... chooses one). --dry-run prints the commands instead of running them.
set -euo pipefail

usage() {
    sed -n '2,11s/^# \{0,1\}//p' "$0"
}

dry_run=0
positional=()
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        --dry-run) dry_run=1 ;;
        -*) echo "build-image.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
        *) positional+=("$arg") ;;
    esac
done
if [ "${#positional[@]}" -gt 2 ]; then
    echo "build-image.sh: at most two arguments (IMAGE TAG), got ${#positional[@]}" >&2
    exit 2
fi

repo_root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo_root/pyproject.toml" | head -n 1)
image=${positional[0]:-ghcr.io/enflame-gcu/enflame-gcu-device-plugin}
tag=${positional[1]:-${version:?build-image.sh: no version found in pyproject.toml; pass TAG}}
if [ -n "${TOOLKIT_IMAGE:-}" ]; then
    toolkit_image=$TOOLKIT_IMAGE
elif [[ "$image" == *device-plugin ]]; then
    toolkit_image="${image%device-plugin}container-toolkit"
else
    toolkit_image="${image}-container-toolkit"
fi

builder=${BUILDER:-}
if [ -z "$builder" ]; then
    for candidate in docker podman buildah; do
        if command -v "$candidate" >/dev/null 2>&1; then
            builder=$candidate
            break
        fi
    done
fi
if [ -z "$builder" ]; then
    echo "build-image.sh: no image builder found: install docker, podman or buildah (or set BUILDER)" >&2
    exit 1
fi
if [ "$dry_run" -eq 0 ] && ! command -v "$builder" >/dev/null 2>&1; then
    echo "build-image.sh: BUILDER=$builder is not on PATH" >&2
    exit 1
fi

build() { # build DOCKERFILE IMAGE_REF
    local cmd
    case "$(basename "$builder")" in
        buildah) cmd=("$builder" bud --file "$1" --tag "$2" "$repo_root") ;;
        *) cmd=("$builder" build --file "$1" --tag "$2" "$repo_root") ;;
    esac
    if [ "$dry_run" -eq 1 ]; then
        printf '%q ' "${cmd[@]}"
        printf '\n'
    else
        echo "build-image.sh: building $2" >&2
        "${cmd[@]}"
    fi
}

build "$repo_root/deploy/docker/Dockerfile" "$image:$tag"
build "$repo_root/deploy/docker/Dockerfile.toolkit" "$toolkit_image:$tag"
if [ "$dry_run" -eq 0 ]; then
    echo "build-image.sh: built $image:$tag and $toolkit_image:$tag" >&2
fi
