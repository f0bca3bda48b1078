#!/usr/bin/env bash
# `make dist`: every release artifact into dist/ (docs/packaging.md names each one).
#   enflame_gcu-V-py3-none-any.whl, enflame_gcu-V.tar.gz   the Python distribution
#   enflame-container-toolkit_V-1_all.deb, -V-1.noarch.rpm the node-side pieces only
#   enflame-gcu-node-bundle-V.tar.gz                       offline bundle: wheelhouse + installer
# The wheel leaves out the test helpers and the demo (ENFLAME_DIST_WITH_TESTING=1 keeps them);
# the sdist has everything. The bundle's wheelhouse is downloaded once, here, for the host
# interpreters (BUNDLE_PYTHONS) and machines (BUNDLE_ARCHES, manylinux2014 wheels) it supports;
# it then installs with no network.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${DIST_DIR:-dist}
WORK=$(realpath -m "${DIST_WORK:-build/dist}")
BUNDLE_PYTHONS=${BUNDLE_PYTHONS:-"3.10 3.11 3.12 3.13"}
BUNDLE_ARCHES=${BUNDLE_ARCHES:-"x86_64 aarch64"}
PACKAGE=enflame-container-toolkit
# Subpackages the node packages leave out: they need grpc, lightkube or inotify and run in the
# plugin images, never on the host.
NODE_EXCLUDE=(device_plugin dra_plugin _proto)

PYABS=$(realpath -s "$PY")
VERSION=$("$PY" -c 'import enflame_gcu; print(enflame_gcu.__version__)')
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"

# 1. Source tree as git knows it (plus uncommitted edits), so stray files never ship.
src=$WORK/src
mkdir -p "$src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [[ -e $f ]] && printf '%s\0' "$f"
done | xargs -0 cp --parents -t "$src"
(cd "$src" && "$PYABS" -c 'from setuptools import build_meta as m; m.build_sdist("dist")' >/dev/null)
if [[ ${ENFLAME_DIST_WITH_TESTING:-0} != 1 ]]; then
    # Test helpers and the demo are not part of the product.
    find "$src/src/enflame_gcu" \( -name testing -type d -o -name 'demo.py' -o -name demo -type d \) \
        -prune -exec rm -rf {} +
fi
(cd "$src" && "$PYABS" -c 'from setuptools import build_meta as m; m.build_wheel("dist")' >/dev/null)
wheel=$(ls "$src"/dist/enflame_gcu-"$VERSION"-*.whl)
sdist=$(ls "$src"/dist/enflame_gcu-"$VERSION".tar.gz)
cp "$wheel" "$sdist" "$OUT/"
echo "dist: $OUT/$(basename "$wheel")"
echo "dist: $OUT/$(basename "$sdist")"

# 2. The node tree shared by the .deb and the .rpm.
stage=$WORK/node-root
lib=/usr/lib/enflame-gcu/python
mkdir -p "$stage$lib" "$stage/usr/bin" "$stage/etc/enflame-container-runtime" \
    "$stage/etc/logrotate.d" "$stage/var/log/enflame" "$stage/usr/share/doc/$PACKAGE"
"$PY" - "$wheel" "$stage$lib" "${NODE_EXCLUDE[@]}" <<'EOF'
import re, sys, zipfile
wheel, target, *exclude = sys.argv[1:]
# A module that needs a plugin-only dependency stays in the images, and so does every module
# importing one that stays there (tests/packaging checks that everything left imports with the
# node's dependencies alone).
plugin_only = re.compile(
    rb"^\s*(import|from)\s+(grpc|google|lightkube|prometheus_client)\b", re.M
)
with zipfile.ZipFile(wheel) as archive:
    sources = {
        name: archive.read(name)
        for name in archive.namelist()
        if name.startswith("enflame_gcu/")
        and not (len(name.split("/")) > 2 and name.split("/")[1] in exclude)
    }
    dropped = {n for n, text in sources.items() if n.endswith(".py") and plugin_only.search(text)}
    while True:
        patterns = []
        for name in dropped:
            dotted = name[: -len(".py")].replace("/", ".")
            package, _, leaf = dotted.rpartition(".")
            # Top-level imports only: an import inside a function is optional by design.
            patterns.append(rb"^(?:import|from)\s+" + re.escape(dotted).encode() + rb"\b")
            patterns.append(rb"^from\s+" + re.escape(package).encode() + rb"\s+import\s[^\n]*\b" + leaf.encode() + rb"\b")
        uses = re.compile(b"|".join(patterns), re.M) if patterns else None
        more = {
            n for n, text in sources.items()
            if n.endswith(".py") and n not in dropped and uses is not None and uses.search(text)
        }
        if not more:
            break
        dropped |= more
    for name in sorted(dropped):
        print(f"dist: node packages leave out {name} (plugin-only imports)")
    for name in sources:
        if name not in dropped:
            archive.extract(name, target)
EOF
# Libraries a node interpreter may lack, carried by the packages (the newest release meeting the
# wheel's own requirement): asyncinotify, which no distribution packages, is first on the path;
# PyYAML (its pure-Python half) and tomlkit are a fallback in $vendor, used only where the
# interpreter has none of its own (EL's python3.11 beside EL9's python3 3.9), so Debian's
# python3-yaml and python3-tomlkit stay the ones a Debian node runs.
vendor=/usr/lib/enflame-gcu/vendor
mkdir -p "$stage$vendor"
requirement() {
    "$PY" - "$wheel" "$1" <<'EOF'
import email.parser, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.parser.Parser().parsestr(archive.read(name).decode())
print(next(r for r in metadata.get_all("Requires-Dist") if r.startswith(sys.argv[2])
           and "extra ==" not in r))
EOF
}
for lib_name in asyncinotify PyYAML tomlkit; do
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --platform manylinux2014_x86_64 --platform any \
        --dest "$WORK/vendor/$lib_name" "$(requirement "$lib_name")" 2>"$WORK/pip-vendor.log" \
        || { cat "$WORK/pip-vendor.log" >&2; exit 1; }
done
# Python sources only: PyYAML's compiled half is per machine and optional (it falls back).
"$PY" - "$stage$lib" "$stage$vendor" "$WORK"/vendor/*/*.whl <<'EOF'
import sys, zipfile
lib, vendor, *wheels = sys.argv[1:]
for wheel in wheels:
    target = lib if "asyncinotify" in wheel else vendor
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            top = name.split("/")[0]
            if name.endswith(".py") and not top.endswith(".dist-info") and top != "_yaml":
                archive.extract(name, target)
EOF
entry() { # the console script's module:function, from the wheel (follows moved modules)
    "$PY" - "$wheel" "$1" <<'EOF'
import configparser, sys, zipfile
wheel, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    text = next(archive.read(n).decode() for n in archive.namelist()
                if n.endswith(".dist-info/entry_points.txt"))
parser = configparser.ConfigParser()
parser.read_string(text)
print(parser["console_scripts"][name])
EOF
}
# Both programs run with /usr/lib/enflame-gcu/python3, a link the package's postinst (%post)
# points at the node's newest suitable interpreter: python3 where it is >= 3.10 (Debian 12,
# Ubuntu 22.04+, Fedora), else python3.13/3.12/3.11/3.10 (EL8, EL9); see packaging/node-python.
python=/usr/lib/enflame-gcu/python3
"$PY" -m enflame_gcu.container_toolkit.cli system install-runtime-launcher \
    --output "$stage/usr/bin/enflame-container-runtime" --python "$python" \
    --package-dir "$lib" 2>/dev/null
ctk=$(entry enflame-ctk)
cat >"$stage/usr/bin/enflame-ctk" <<EOF
#!$python -I
# enflame-ctk from the $PACKAGE package: its own copy of enflame_gcu; PyYAML and tomlkit from
# the interpreter's own site-packages, else the package's fallback copies in $vendor.
import sys
sys.path.insert(0, "$lib")
sys.path.append("$vendor")
from ${ctk%%:*} import ${ctk##*:}
sys.exit(${ctk##*:}())
EOF
install -m 0755 packaging/node-python "$stage/usr/lib/enflame-gcu/node-python"
chmod 0755 "$stage/usr/bin/enflame-ctk"
cp src/enflame_gcu/data/config.toml "$stage/etc/enflame-container-runtime/config.toml"
cp src/enflame_gcu/data/logrotate "$stage/etc/logrotate.d/enflame-container-runtime"
# The toolkit's systemd units, rendered by the code install.sh uses, shipped disabled: the
# user guide says when to enable each (enflame-ctk doctor names a missing one).
units=/usr/lib/systemd/system
mkdir -p "$stage$units"
"$PY" - "$stage$units" <<'EOF'
import os, sys
from enflame_gcu.container_toolkit import cdi, cdi_service
by = "# Shipped by the enflame-container-toolkit package: systemctl enable --now <this unit>."
units = cdi_service.render_boot("/usr/bin/enflame-ctk", by)
units[cdi_service.UNIT_NAME] = cdi_service.render("/usr/bin/enflame-ctk", cdi.DEFAULT_OUTPUT_DIR, by)
for name, text in units.items():
    with open(os.path.join(sys.argv[1], name), "w", encoding="utf-8") as handle:
        handle.write(text)
EOF
cp README.md "$stage/usr/share/doc/$PACKAGE/"
cp packaging/deb/copyright "$stage/usr/share/doc/$PACKAGE/copyright"
# The changelog's date is the last commit's, so two builds of one commit are the same bytes.
release_date=$(git log -1 --format=%cD 2>/dev/null || date -R)
sed -e "s/@VERSION@/$VERSION/" -e "s/@DATE@/$release_date/" packaging/deb/changelog.in \
    | gzip -9n >"$stage/usr/share/doc/$PACKAGE/changelog.Debian.gz"
find "$stage" -type d -exec chmod 0755 {} +
find "$stage" -type f ! -path "$stage/usr/bin/*" ! -name node-python -exec chmod 0644 {} +

# 3. .deb (dpkg-deb, owned by root whoever builds it).
deb_root=$WORK/deb-root
cp -a "$stage" "$deb_root"
mkdir -p "$deb_root/DEBIAN"
sed "s/@VERSION@/$VERSION/" packaging/deb/control.in >"$deb_root/DEBIAN/control"
printf '%s\n' /etc/enflame-container-runtime/config.toml /etc/logrotate.d/enflame-container-runtime \
    >"$deb_root/DEBIAN/conffiles"
install -m 0755 packaging/deb/postinst packaging/deb/prerm "$deb_root/DEBIAN/"
# Debian 12 and Ubuntu 22.04+ have python3 >= 3.10, which the .deb depends on: its programs run
# with /usr/bin/python3 itself (the .rpm's run through the link %post makes).
sed -i "1s|^#!/usr/lib/enflame-gcu/python3 |#!/usr/bin/python3 |" \
    "$deb_root/usr/bin/enflame-ctk" "$deb_root/usr/bin/enflame-container-runtime"
# md5sums: what `dpkg --verify` (debsums) checks the installed files against.
(cd "$deb_root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z \
    | xargs -0 md5sum) >"$deb_root/DEBIAN/md5sums"
chmod 0644 "$deb_root/DEBIAN/md5sums"
deb=$OUT/${PACKAGE}_${VERSION}-1_all.deb
dpkg-deb --root-owner-group -Zxz --build "$deb_root" "$deb" >/dev/null
echo "dist: $deb"

# 4. .rpm (rpmbuild from Debian's rpm package; noarch, dependencies declared in the spec).
top=$WORK/rpmbuild
mkdir -p "$top"/{SPECS,RPMS,BUILD,BUILDROOT}
rpm_date=$(LC_ALL=C date -u -d "$release_date" '+%a %b %d %Y')
sed -e "s/@VERSION@/$VERSION/g" -e "s/@RPMDATE@/$rpm_date/" packaging/rpm/$PACKAGE.spec.in \
    >"$top/SPECS/$PACKAGE.spec"
rpmbuild --quiet -bb --define "_topdir $top" --define "stage $stage" \
    --define "_build_id_links none" "$top/SPECS/$PACKAGE.spec" >/dev/null
rpm=$OUT/$PACKAGE-$VERSION-1.noarch.rpm
cp "$top/RPMS/noarch/$PACKAGE-$VERSION-1.noarch.rpm" "$rpm"
echo "dist: $rpm"

# 5. Offline bundle: our wheel, and its node dependencies for each supported machine (a
# wheelhouse of its own, picked by the installer from `uname -m`) and interpreter.
name=enflame-gcu-node-bundle-$VERSION
bundle=$WORK/$name
mkdir -p "$bundle/wheelhouse"
cp "$wheel" "$bundle/wheelhouse/"
for arch in $BUNDLE_ARCHES; do
    for version in $BUNDLE_PYTHONS; do
        "$PY" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
            --python-version "$version" --platform "manylinux2014_$arch" --platform any \
            --dest "$bundle/wheelhouse/$arch" "$wheel" 2>"$WORK/pip.log" \
            || { cat "$WORK/pip.log" >&2; exit 1; }
    done
    rm "$bundle/wheelhouse/$arch/$(basename "$wheel")" # one copy, in wheelhouse/
done
cp deploy/install.sh "$bundle/install.sh"
install -m 0755 packaging/bundle/install "$bundle/install"
# shellcheck disable=SC2086 # one per line
printf '%s\n' $BUNDLE_PYTHONS >"$bundle/PYTHONS"
# shellcheck disable=SC2086
printf '%s\n' $BUNDLE_ARCHES >"$bundle/ARCHES"
# The bundle's own checksums: its install checks them before anything runs.
(cd "$bundle" && find . -type f ! -name SHA256SUMS -printf '%P\0' | LC_ALL=C sort -z \
    | xargs -0 sha256sum) >"$bundle/SHA256SUMS"
tar -C "$WORK" --owner=0 --group=0 -czf "$OUT/$name.tar.gz" "$name"
echo "dist: $OUT/$name.tar.gz"

# 6. SHA256SUMS over every artifact of this run (`sha256sum -c SHA256SUMS` checks a download);
# SIGN_KEY=<gpg key id> also writes SHA256SUMS.asc, a detached signature (docs/packaging.md).
artifacts=("$(basename "$wheel")" "$(basename "$sdist")" "$(basename "$deb")" "$(basename "$rpm")"
    "$name.tar.gz")
(cd "$OUT" && sha256sum "${artifacts[@]}") >"$OUT/SHA256SUMS"
echo "dist: $OUT/SHA256SUMS"
if [[ -n ${SIGN_KEY:-} ]]; then
    rm -f "$OUT/SHA256SUMS.asc"
    gpg --batch --yes --local-user "$SIGN_KEY" --armor --detach-sign \
        --output "$OUT/SHA256SUMS.asc" "$OUT/SHA256SUMS"
    echo "dist: $OUT/SHA256SUMS.asc"
fi
