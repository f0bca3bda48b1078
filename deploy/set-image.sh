#!/usr/bin/env bash
# Points every image: line of ours in the static manifests at one image reference:
#
#   deploy/set-image.sh [--check] REGISTRY [TAG]
#
# REGISTRY is the registry host and repository path the images were pushed under
# (deploy/build-image.sh --push REGISTRY/enflame-gcu-device-plugin TAG put them there), e.g.
# registry.example.com/enflame; TAG defaults to the project version in pyproject.toml. Every
# `image: .../enflame-gcu-device-plugin:...` and `.../enflame-gcu-container-toolkit:...` line in
# deploy/yaml, deploy/dra and deploy/extender becomes REGISTRY/<name>:TAG; other images (the
# examples' debian:12-slim and ubuntu:22.04, registry.k8s.io/kube-scheduler) stay. The chart
# takes the same reference as --set global.image.registry=REGISTRY --set global.image.tag=TAG.
# --check changes nothing and exits 1 when a line of ours names another reference.
set -euo pipefail

usage() { sed -n '2,14s/^# \{0,1\}//p' "$0"; }
check=0
positional=()
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        --check) check=1 ;;
        -*) echo "set-image.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
        *) positional+=("$arg") ;;
    esac
done
if [ "${#positional[@]}" -lt 1 ] || [ "${#positional[@]}" -gt 2 ]; then
    echo "set-image.sh: one REGISTRY and at most one TAG, got ${#positional[@]} arguments" >&2
    usage >&2
    exit 2
fi
deploy=$(cd "$(dirname "$0")" && pwd)
registry=${positional[0]%/}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$deploy/../pyproject.toml" 2>/dev/null | head -n 1)
tag=${positional[1]:-$version}
# What a reference may hold (no space, quote, '@' or '#', the sed delimiter below).
if ! [[ "$registry" =~ ^[A-Za-z0-9][A-Za-z0-9._:/-]*$ ]] || [[ "$registry" == *: ]]; then
    echo "set-image.sh: '$registry' is not a registry and repository path (e.g. registry.example.com/enflame)" >&2
    exit 2
fi
if ! [[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; then
    echo "set-image.sh: '$tag' is not an image tag (letters, digits, '_', '.', '-'; at most 128)" >&2
    exit 2
fi

# An image: line of ours: any registry, our two image names, a tag or a digest.
ours='^([[:space:]]*(- )?image:[[:space:]]*)"?[^[:space:]"]*/(enflame-gcu-(device-plugin|container-toolkit))[:@][^[:space:]"]*"?[[:space:]]*$'
files=()
for dir in yaml dra extender; do
    for file in "$deploy/$dir"/*.yaml; do
        [ -e "$file" ] && files+=("$file")
    done
done
stale=0
changed=0
for file in "${files[@]}"; do
    want=$(sed -E "s#$ours#\\1$registry/\\3:$tag#" "$file")
    if [ "$want" != "$(cat "$file")" ]; then
        if [ "$check" -eq 1 ]; then
            echo "set-image.sh: ${file#"$deploy"/} names another image reference" >&2
            stale=1
        else
            printf '%s\n' "$want" >"$file.set-image"
            mv "$file.set-image" "$file"
            changed=$((changed + 1))
        fi
    fi
done
if [ "$check" -eq 1 ]; then
    exit "$stale"
fi
echo "set-image.sh: $changed of ${#files[@]} manifests now name $registry/<image>:$tag" >&2
