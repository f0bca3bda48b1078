#!/usr/bin/env bash
# deploy/build-image.sh --from-debian OUTDIR [IMAGE [TAG]] runs this: the two images without
# docker, podman, buildah or a registry, from Debian 12 packages (mmdebstrap) plus this tree's
# wheel and its dependencies from PyPI, written as OCI archives that `ctr images import` reads.
#
#   OUTDIR/enflame-gcu-images-TAG.tar  IMAGE:TAG (entrypoint enflame-device-plugin) and
#                                      TOOLKIT_IMAGE:TAG (enflame-ctk install --host-root /host
#                                      --wait), one shared layer: Debian minbase + python3 + the
#                                      wheel with its [plugin,dra] extras in /usr/local
#   OUTDIR/debian-12-slim.tar          docker.io/library/debian:12-slim: Debian minbase, no docs
#
# ENFLAME_ROOTFS_CACHE=DIR keeps the two mmdebstrap results there and reuses them (a rebuild then
# only installs the wheel). MIRROR sets the Debian mirror (default: mmdebstrap's).
set -euo pipefail
outdir=$1 image=$2 tag=$3 toolkit_image=$4 dry_run=${5:-0}
repo_root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
log() { echo "build-image.sh: $*" >&2; }
suite=bookworm
slim=(--variant=minbase --mode=root --format=tar
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')

if [ "$dry_run" -eq 1 ]; then
    printf '%s\n' "mmdebstrap ${slim[*]} $suite OUTDIR/debian-minbase.tar" \
        "mmdebstrap ${slim[*]} --include=python3 $suite OUTDIR/debian-python3.tar" \
        "$python -m pip wheel --no-deps $repo_root" \
        "$python -m pip install --root ROOTFS --prefix /usr/local 'WHEEL[plugin,dra]'" \
        "write $outdir/enflame-gcu-images-$tag.tar ($image:$tag, $toolkit_image:$tag) and $outdir/debian-12-slim.tar"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || { log "--from-debian needs root (mmdebstrap --mode=root)"; exit 1; }
command -v mmdebstrap >/dev/null || { log "--from-debian needs mmdebstrap: apt-get install mmdebstrap"; exit 1; }
"$python" -m pip --version >/dev/null 2>&1 || { log "--from-debian needs $python with pip"; exit 1; }
started=$(date +%s)
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/enflame-image-XXXXXX")
trap 'rm -rf "$work"' EXIT
cache=${ENFLAME_ROOTFS_CACHE:-$work/rootfs}
mkdir -p "$cache"

rootfs() {  # rootfs NAME [mmdebstrap options]: a cached Debian tarball
    local name=$1
    shift
    if [ ! -s "$cache/$name.tar" ]; then
        log "mmdebstrap $suite $name (downloads from the Debian archive)"
        # shellcheck disable=SC2086
        mmdebstrap --quiet "${slim[@]}" "$@" "$suite" "$cache/$name.tar.part" ${MIRROR:-} >&2
        mv "$cache/$name.tar.part" "$cache/$name.tar"
    fi
    echo "$cache/$name.tar"
}
minbase=$(rootfs debian-minbase)
python_base=$(rootfs debian-python3 --include=python3)

log "building the wheel"
"$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/wheel" "$repo_root" >&2
wheel=$(ls "$work"/wheel/enflame_gcu-*.whl)

log "installing $(basename "$wheel") [plugin,dra] into the image"
root="$work/root"
mkdir -p "$root"
tar -xf "$python_base" -C "$root"
py_version=$(ls "$root/usr/lib" | sed -n 's/^python\(3\.[0-9]*\)$/\1/p' | sort -V | tail -n 1)
host_version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ "$py_version" = "$host_version" ] \
    || { log "the image has python $py_version, $python is $host_version: set PYTHON to a $py_version"; exit 1; }
PIP_ROOT_USER_ACTION=ignore "$python" -m pip install -q --disable-pip-version-check --no-compile \
    --no-warn-script-location --ignore-installed --root "$root" --prefix /usr/local "$wheel[plugin,dra]" >&2
# Debian's python3 reads /usr/local/lib/python3.X/dist-packages; the scripts run its python3.
site="$root/usr/local/lib/python$py_version"
mkdir -p "$site/dist-packages"
cp -a "$site/site-packages/." "$site/dist-packages/"
rm -rf "$site/site-packages"
for script in "$root"/usr/local/bin/*; do
    if head -c 2 "$script" | grep -q '#!'; then
        sed -i '1s|^#!.*python.*$|#!/usr/bin/python3|' "$script"
    fi
done
# Bytecode made now, by the image's own python3: the pods run on a read-only root with
# PYTHONDONTWRITEBYTECODE, so a module without its .pyc is compiled again at every start
# (docs/benchmarks.md, device plugin start-up: 940-1,220 ms of CPU against 250-280 ms).
chroot "$root" /usr/bin/python3 -m compileall -q "/usr/local/lib/python$py_version/dist-packages" >&2
ls "$site"/dist-packages/enflame_gcu/device_plugin/__pycache__/main.cpython-*.pyc >/dev/null \
    || { log "no bytecode for enflame_gcu.device_plugin.main in the image"; exit 1; }
chroot "$root" /usr/local/bin/enflame-device-plugin --version >&2
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*
tar --numeric-owner -C "$root" -cf "$work/layer.tar" .

log "writing the OCI archives"
"$python" - "$outdir" "$tag" "$work/layer.tar" "$minbase" "$image" "$toolkit_image" <<'EOF'
import hashlib, io, json, os, platform, sys, tarfile

outdir, tag, layer, minbase, image, toolkit = sys.argv[1:]
arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"]


def digest_of(path):
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def write(path, images):
    """images: (name, layer tar, entrypoint, cmd, extra env, title)"""
    blobs, files, manifests = {}, {}, []

    def blob(data, media):
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}

    for name, layer_path, entrypoint, cmd, extra_env, title in images:
        digest = digest_of(layer_path)
        files[digest] = layer_path
        config = {"Env": env[:1] + extra_env}
        if entrypoint:
            config["Entrypoint"] = entrypoint
        if cmd:
            config["Cmd"] = cmd
        config["Labels"] = {"org.opencontainers.image.title": title}
        image_config = {"architecture": arch, "os": "linux", "config": config,
                        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]}}
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": blob(json.dumps(image_config).encode(), "application/vnd.oci.image.config.v1+json"),
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": f"sha256:{digest}", "size": os.path.getsize(layer_path)}],
        }
        descriptor = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        descriptor["platform"] = {"architecture": arch, "os": "linux"}
        descriptor["annotations"] = {"io.containerd.image.name": name,
                                     "org.opencontainers.image.ref.name": name.rpartition(":")[2]}
        manifests.append(descriptor)
    with tarfile.open(path + ".part", "w") as archive:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        for digest, layer_path in files.items():
            archive.add(layer_path, arcname=f"blobs/sha256/{digest}")
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest}", data)
        add("index.json", json.dumps({"schemaVersion": 2, "manifests": manifests}).encode())
    os.replace(path + ".part", path)
    print(f"build-image.sh: wrote {path} ({os.path.getsize(path) >> 20} MiB)", file=sys.stderr)


write(os.path.join(outdir, f"enflame-gcu-images-{tag}.tar"), [
    (f"{image}:{tag}", layer, ["enflame-device-plugin"], [], ["ENFLAME_VISIBLE_DEVICES=all"] + env[1:],
     "enflame-gcu-device-plugin"),
    (f"{toolkit}:{tag}", layer, ["enflame-ctk", "install", "--host-root", "/host", "--wait"], [], env[1:],
     "enflame-gcu-container-toolkit"),
])
write(os.path.join(outdir, "debian-12-slim.tar"), [
    ("docker.io/library/debian:12-slim", minbase, [], ["bash"], [], "debian"),
])
EOF
log "built from Debian in $(($(date +%s) - started)) s: import with ctr -n k8s.io images import $outdir/enflame-gcu-images-$tag.tar"
