#!/usr/bin/env bash
# Builds the two images from this source tree: the device plugin and the toolkit installer.
#
#   deploy/build-image.sh [--dry-run] [--push] [IMAGE [TAG]]
#
# --push pushes both images to IMAGE's registry after building them (log in first: docker login,
# podman login or buildah login). Point the chart at what you pushed once:
# --set global.image.registry=<IMAGE without /enflame-gcu-device-plugin> --set
# global.image.tag=TAG (the operator's components follow it); the static manifests with
# deploy/set-image.sh REGISTRY TAG.
#
# IMAGE is the device plugin image (default ghcr.io/enflame-gcu/enflame-gcu-device-plugin);
# the toolkit image is named after it with "device-plugin" replaced by "container-toolkit"
# (or "-container-toolkit" appended), unless TOOLKIT_IMAGE is set. TAG defaults to the project
# version in pyproject.toml. The builder is docker, podman or buildah, whichever is found first
# (BUILDER=... chooses one). --dry-run prints the commands instead of running them.
# PLATFORMS=linux/amd64,linux/arm64 builds one image per platform under one multi-arch manifest
# list (docker buildx build --push, or podman/buildah build --manifest then manifest push --all;
# needs --push, and qemu-user-static binfmt for platforms other than the machine's).
#
#   deploy/build-image.sh --from-debian OUTDIR [--push] [IMAGE [TAG]]
#
# Without docker, podman, buildah or a registry: builds both images from Debian packages
# (mmdebstrap, Debian 12 "bookworm", python3) plus this tree's wheel and its dependencies from
# PyPI, and writes them as one OCI archive OUTDIR/enflame-gcu-images-TAG.tar that containerd
# imports: `ctr -n k8s.io images import FILE` on each node (k3s: `k3s ctr images import FILE`).
# OUTDIR/debian-12-slim.tar holds debian:12-slim (Debian's minbase), the image the example pods
# name. Needs root, mmdebstrap and python3 with pip; MIRROR sets the Debian mirror. The machine's
# architecture only (no multi-arch list). --push then pushes both images from the archive
# (deploy/push-image-archive.sh: skopeo, else podman).
set -euo pipefail

usage() {
    sed -n '2,32s/^# \{0,1\}//p' "$0"
}

dry_run=0
push=0
from_debian=""
positional=()
expect_outdir=0
for arg in "$@"; do
    if [ "$expect_outdir" -eq 1 ]; then
        from_debian=$arg
        expect_outdir=0
        continue
    fi
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        --dry-run) dry_run=1 ;;
        --push) push=1 ;;
        --from-debian) expect_outdir=1 ;;
        --from-debian=*) from_debian=${arg#--from-debian=} ;;
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

if [ "$expect_outdir" -eq 1 ] || { [ -n "$from_debian" ] && [ "$from_debian" != "${from_debian#-}" ]; }; then
    echo "build-image.sh: --from-debian needs an output directory" >&2
    exit 2
fi
if [ -n "$from_debian" ] && [ -n "${PLATFORMS:-}" ]; then
    echo "build-image.sh: --from-debian builds for this machine's architecture only; PLATFORMS needs docker, podman or buildah" >&2
    exit 2
fi
if [ -n "$from_debian" ]; then
    bash "$repo_root/deploy/build-image-debian.sh" "$from_debian" "$image" "$tag" "$toolkit_image" "$dry_run"
    if [ "$push" -eq 1 ]; then
        archive="$from_debian/enflame-gcu-images-$tag.tar"
        if [ "$dry_run" -eq 1 ]; then
            printf '%s\n' "deploy/push-image-archive.sh $archive"
        else
            bash "$repo_root/deploy/push-image-archive.sh" "$archive"
        fi
    fi
    exit 0
fi
if [ -n "${PLATFORMS:-}" ] && [ "$push" -eq 0 ]; then
    echo "build-image.sh: PLATFORMS=$PLATFORMS needs --push (a multi-arch manifest list lives in a registry)" >&2
    exit 2
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

run() { # run WHAT CMD...: print CMD under --dry-run, else say WHAT and run it
    local what=$1
    shift
    if [ "$dry_run" -eq 1 ]; then
        printf '%q ' "$@"
        printf '\n'
    else
        echo "build-image.sh: $what" >&2
        "$@"
    fi
}

build() { # build DOCKERFILE IMAGE_REF
    local name
    name=$(basename "$builder")
    if [ -n "${PLATFORMS:-}" ]; then
        # One image per platform under one manifest list, pushed whole.
        case "$name" in
            docker) run "building and pushing $2 for $PLATFORMS" "$builder" buildx build \
                --platform "$PLATFORMS" --file "$1" --tag "$2" --push "$repo_root" ;;
            buildah) run "building $2 for $PLATFORMS" "$builder" bud --platform "$PLATFORMS" \
                --manifest "$2" --file "$1" "$repo_root" ;;
            *) run "building $2 for $PLATFORMS" "$builder" build --platform "$PLATFORMS" \
                --manifest "$2" --file "$1" "$repo_root" ;;
        esac
        return
    fi
    case "$name" in
        buildah) run "building $2" "$builder" bud --file "$1" --tag "$2" "$repo_root" ;;
        *) run "building $2" "$builder" build --file "$1" --tag "$2" "$repo_root" ;;
    esac
}

push_image() { # push IMAGE_REF (docker, podman and buildah all spell it "push REF")
    if [ -z "${PLATFORMS:-}" ]; then
        run "pushing $1" "$builder" push "$1"
    elif [ "$(basename "$builder")" != docker ]; then  # docker buildx pushed while building
        run "pushing the manifest list $1" "$builder" manifest push --all "$1" "docker://$1"
    fi
}

build "$repo_root/deploy/docker/Dockerfile" "$image:$tag"
build "$repo_root/deploy/docker/Dockerfile.toolkit" "$toolkit_image:$tag"
if [ "$push" -eq 1 ]; then
    push_image "$image:$tag"
    push_image "$toolkit_image:$tag"
fi
if [ "$dry_run" -eq 0 ]; then
    what=built
    [ "$push" -eq 0 ] || what="built and pushed"
    echo "build-image.sh: $what $image:$tag and $toolkit_image:$tag" >&2
fi
