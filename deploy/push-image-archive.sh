#!/usr/bin/env bash
# Pushes every image of an OCI archive (deploy/build-image.sh --from-debian writes one) to a
# registry, with no image builder:
#
#   deploy/push-image-archive.sh [--dry-run] ARCHIVE [REGISTRY]
#
# Each image goes to the name its io.containerd.image.name annotation gives, or, with REGISTRY
# (registry host and repository path, e.g. registry.example.com/enflame), to REGISTRY/<last
# path part of that name>:<its tag>. The copier is skopeo (copy oci:DIR docker://NAME) or, without
# it, podman (pull oci:DIR, then push); COPIER=... chooses one. A registry on loopback
# (127.0.0.1, localhost, [::1]) is spoken to in plain HTTP; others in HTTPS (log in first:
# skopeo login or podman login). --dry-run prints the copier's commands instead of running them.
set -euo pipefail

usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }
dry_run=0
positional=()
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        --dry-run) dry_run=1 ;;
        -*) echo "push-image-archive.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
        *) positional+=("$arg") ;;
    esac
done
if [ "${#positional[@]}" -lt 1 ] || [ "${#positional[@]}" -gt 2 ]; then
    echo "push-image-archive.sh: one ARCHIVE and at most one REGISTRY, got ${#positional[@]} arguments" >&2
    exit 2
fi
archive=${positional[0]}
registry=${positional[1]:-}
registry=${registry%/}
[ -f "$archive" ] || { echo "push-image-archive.sh: no archive $archive" >&2; exit 1; }
if [ -n "$registry" ] && { ! [[ "$registry" =~ ^[A-Za-z0-9][A-Za-z0-9._:/-]*$ ]] || [[ "$registry" == *: ]]; }; then
    echo "push-image-archive.sh: '$registry' is not a registry and repository path (e.g. registry.example.com/enflame)" >&2
    exit 2
fi
copier=${COPIER:-}
if [ -z "$copier" ]; then
    for candidate in skopeo podman; do
        if command -v "$candidate" >/dev/null 2>&1; then
            copier=$candidate
            break
        fi
    done
fi
if [ -z "$copier" ]; then
    echo "push-image-archive.sh: pushing an archive needs skopeo or podman (apt-get install skopeo)" >&2
    exit 1
fi
python=${PYTHON:-python3}

# Lower case only: podman names an image pulled from oci:DIR after DIR.
work=$(mktemp -d "${TMPDIR:-/tmp}/enflame-push-XXXXXX")
work_lower=$(printf '%s' "$work" | tr '[:upper:]' '[:lower:]')
if [ "$work_lower" != "$work" ]; then
    mkdir -m 700 "$work_lower" || { rmdir "$work"; echo "push-image-archive.sh: cannot make $work_lower" >&2; exit 1; }
    rmdir "$work"
    work=$work_lower
fi
trap 'rm -rf "$work"' EXIT
# One OCI layout per image (its blobs hard-linked from the unpacked archive): skopeo and podman
# read an archive holding one image only. Prints "DIR<TAB>TARGET" per image.
"$python" - "$archive" "$work" "$registry" >"$work/plan" <<'EOF'
import json, os, re, sys, tarfile

archive, work, registry = sys.argv[1:]
unpacked = os.path.join(work, "archive")
with tarfile.open(archive) as tar:
    for member in tar.getmembers():
        if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in member.name.split("/"):
            sys.exit(f"push-image-archive.sh: {archive}: unexpected entry {member.name!r}; not an OCI archive of ours")
    tar.extractall(unpacked)
try:
    with open(os.path.join(unpacked, "index.json"), encoding="utf-8") as handle:
        manifests = json.load(handle)["manifests"]
except (OSError, ValueError, KeyError) as exc:
    sys.exit(f"push-image-archive.sh: {archive} is not an OCI archive (index.json: {exc})")
for number, descriptor in enumerate(manifests):
    name = (descriptor.get("annotations") or {}).get("io.containerd.image.name", "")
    match = re.fullmatch(r"(?:.+/)?([^/:@]+):([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})", name)
    if not match:
        sys.exit(f"push-image-archive.sh: {archive}: image {number} has no io.containerd.image.name with a tag ({name!r})")
    target = f"{registry}/{match[1]}:{match[2]}" if registry else name
    layout = os.path.join(work, f"image-{number}")
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    for entry in os.listdir(os.path.join(unpacked, "blobs", "sha256")):
        os.link(os.path.join(unpacked, "blobs", "sha256", entry), os.path.join(layout, "blobs", "sha256", entry))
    with open(os.path.join(layout, "oci-layout"), "w", encoding="utf-8") as handle:
        handle.write('{"imageLayoutVersion": "1.0.0"}')
    with open(os.path.join(layout, "index.json"), "w", encoding="utf-8") as handle:
        json.dump({"schemaVersion": 2, "manifests": [descriptor]}, handle)
    print(f"{layout}\t{target}")
EOF

run() {
    if [ "$dry_run" -eq 1 ]; then
        printf '%q ' "$@"
        printf '\n'
    else
        "$@"
    fi
}
pushed=()
while IFS=$'\t' read -r layout target; do
    host=${target%%/*}
    tls=true
    case "$host" in
        127.0.0.1 | 127.0.0.1:* | localhost | localhost:* | "[::1]" | "[::1]:"*) tls=false ;;
    esac
    [ "$dry_run" -eq 1 ] || echo "push-image-archive.sh: pushing $target" >&2
    case "$(basename "$copier")" in
        skopeo) run "$copier" copy --dest-tls-verify="$tls" "oci:$layout" "docker://$target" ;;
        *)
            # podman keeps the image in its storage under TARGET's name (podman rmi removes it).
            if [ "$dry_run" -eq 1 ]; then
                run "$copier" pull -q "oci:$layout"
                id=IMAGE
            else
                id=$("$copier" pull -q "oci:$layout" | tail -n 1)
            fi
            [ -n "$id" ] || { echo "push-image-archive.sh: podman pulled no image from $layout" >&2; exit 1; }
            run "$copier" tag "$id" "$target"
            run "$copier" push --tls-verify="$tls" "$target" "docker://$target"
            ;;
    esac
    pushed+=("$target")
done <"$work/plan"
[ "$dry_run" -eq 1 ] || echo "push-image-archive.sh: pushed ${pushed[*]}" >&2
