#!/usr/bin/env bash
# `make chart-package`: dist/enflame-gcu-<chart version>.tgz, laid out as `helm package` lays a
# chart out (one top directory named after the chart), without needing a helm binary.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${DIST_DIR:-dist}
mkdir -p "$OUT"
"$PY" - deploy/helm/enflame-gcu "$OUT" <<'PYEOF'
import fnmatch, gzip, io, os, re, sys, tarfile
import yaml
chart_dir, out = sys.argv[1:]
with open(os.path.join(chart_dir, "Chart.yaml"), encoding="utf-8") as handle:
    chart = yaml.safe_load(handle)
# One version scheme: the chart's version and appVersion are the package's (its images' tag).
with open("pyproject.toml", encoding="utf-8") as handle:
    found = re.search(r'^version = "([^"]+)"', handle.read(), re.MULTILINE)
package = found.group(1) if found else None
if package is None or chart.get("version") != package or str(chart.get("appVersion")) != package:
    sys.exit(f"chart-package: Chart.yaml has version {chart.get('version')} and appVersion "
             f"{chart.get('appVersion')}, pyproject.toml {package}: set both to the package's "
             "version; nothing written")
ignore = []
helmignore = os.path.join(chart_dir, ".helmignore")
if os.path.exists(helmignore):
    with open(helmignore, encoding="utf-8") as handle:
        ignore = [l.strip() for l in handle if l.strip() and not l.startswith("#")]
target = os.path.join(out, f"{chart['name']}-{chart['version']}.tgz")
buffer = io.BytesIO()
with tarfile.open(fileobj=buffer, mode="w") as archive:
    for directory, dirs, files in os.walk(chart_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, chart_dir)
            if any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in ignore):
                continue
            info = archive.gettarinfo(path, f"{chart['name']}/{rel}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0  # reproducible: the same chart gives the same bytes
            info.mode = 0o644
            with open(path, "rb") as handle:
                archive.addfile(info, handle)
with open(target, "wb") as handle:
    with gzip.GzipFile(fileobj=handle, mode="wb", mtime=0, filename="") as zipped:
        zipped.write(buffer.getvalue())
print(f"chart-package: {target}")
PYEOF
