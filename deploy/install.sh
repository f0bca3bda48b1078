#!/usr/bin/env bash
# install.sh: the one-click installer for enflame-container-runtime and enflame-ctk on a host.
#
# Why the shell is thin: it only builds the virtualenv (the one step that cannot run our Python
# yet). Every change to the host itself (the runtime launcher, the /usr/bin links, the runtime
# config, the engine configs, the install manifest and their exact undo) is made by
# `enflame-ctk install` / `enflame-ctk uninstall`, whose Python is tested against fake host roots.
set -euo pipefail

PROG=install.sh
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
    cat <<EOF
Usage: $PROG [options]            install the toolkit and configure the engines found
       $PROG --uninstall [options] undo everything a previous install did

Installs enflame-gcu into a virtualenv under PREFIX (pip install of this source tree, or of
--wheel), links /usr/bin/enflame-ctk and gives the node what its node mode needs
(docs/user-guide.md, "Node modes"), recorded in /etc/enflame-gcu/node-mode.json:
  device-specs     nothing more: the kubelet passes the device plugin's DeviceSpecs (the choice
                   of --mode auto on a Kubernetes node with containerd or CRI-O)
  cdi              the node's CDI specs in /var/run/cdi (keep them current: enflame-ctk cdi watch)
  runtimeclass     the runtime as an extra, non-default runtime "enflame" of every engine found
  default-runtime  the runtime as every engine's default (docker; hosts without a kubelet)
For the last two: /usr/bin/enflame-container-runtime (a fast-start launcher),
/etc/enflame-container-runtime/ (config.toml from the template, never overwriting one),
/var/log/enflame/, and the engine configs (docker daemon.json merged, never overwritten;
containerd; CRI-O drop-in), each change backed up. Everything is recorded in
PREFIX/install-manifest.json; --uninstall undoes it (a config.toml you edited is kept, as are
non-empty directories such as the log dir).

Options:
  --prefix DIR       install location (default: /opt/enflame-gcu; the venv is DIR/venv, a link
                     switched in one step to a new DIR/venvs/<time>.<id> by each install)
  --wheel FILE       pip install this wheel instead of the source tree around this script
  --python PY        interpreter that creates the venv, >= 3.10 (default: python3)
  --pip-args ARGS    extra arguments for pip install (e.g. "--no-index --find-links DIR")
  --use-env DIR      use an existing virtualenv that has enflame-gcu installed: no venv, no pip;
                     never removed by --uninstall (pass it to --uninstall as well)
  --mode MODE        auto (default: chosen from the engine, its version and whether a kubelet
                     runs), device-specs, cdi, runtimeclass or default-runtime; a mode the
                     engine cannot honour is refused and nothing changes
  --runtime NAME     docker, containerd or crio; repeatable (default: every engine found)
  --no-default       same as --mode runtimeclass
  --cdi-annotations  the device plugin uses the cdi-annotations strategy: containerd 1.x is
                     told to pass the container annotations cdi.k8s.io/* to the runtime
  --restart-engine   SIGHUP/restart the engines whose config changed (default: print how)
  --host-root DIR    treat DIR as / (tests, images); /usr/bin links then point at host paths
  --migrate          first move the node off Enflame's topscloud (enflame-ctk migrate: adopt its
                     runtime entries, set aside its runtime config, hand its plugin socket to
                     ours); the install then takes the entries out where the mode wants that
  --dry-run          print what would change, change nothing
  --uninstall        undo a previous install
  -h, --help         this text

k3s and RKE2 (their own containerd, config template and socket under other paths): set
ENFLAME_PRESET=k3s or rke2 in the environment (ENFLAME_CONTAINERD_CONFIG, _SOCKET and _SERVICE
override single paths); enflame-ctk install reads them (docs/user-guide.md, "k3s and RKE2").
EOF
}

die() {
    echo "$PROG: $*" >&2
    exit 1
}

PREFIX=/opt/enflame-gcu
HOST_ROOT=/
WHEEL=
PYTHON=python3
PIP_ARGS=
USE_ENV=
DRY_RUN=0
UNINSTALL=0
RESTART=0
MODE=
CDI_ANNOTATIONS=0
MIGRATE=0
RUNTIMES=()

need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --prefix) need_value "$@"; PREFIX=$2; shift 2 ;;
        --host-root) need_value "$@"; HOST_ROOT=$2; shift 2 ;;
        --wheel) need_value "$@"; WHEEL=$2; shift 2 ;;
        --python) need_value "$@"; PYTHON=$2; shift 2 ;;
        --pip-args) need_value "$@"; PIP_ARGS=$2; shift 2 ;;
        --use-env) need_value "$@"; USE_ENV=$2; shift 2 ;;
        --runtime) need_value "$@"; RUNTIMES+=("$2"); shift 2 ;;
        --mode) need_value "$@"; MODE=$2; shift 2 ;;
        --no-default) MODE=${MODE:-runtimeclass}; shift ;;
        --cdi-annotations) CDI_ANNOTATIONS=1; shift ;;
        --restart-engine|--restart) RESTART=1; shift ;; # --restart: the old spelling
        --dry-run) DRY_RUN=1; shift ;;
        --migrate) MIGRATE=1; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

case ${MODE:=auto} in
    auto|device-specs|cdi|runtimeclass|default-runtime) ;;
    *) die "unknown --mode '$MODE'; valid: auto, device-specs, cdi, runtimeclass, default-runtime" ;;
esac
[[ $PREFIX == /* ]] || die "--prefix must be an absolute path, got '$PREFIX'"
[[ -d $HOST_ROOT ]] || die "--host-root '$HOST_ROOT' is not a directory"
HOST_ROOT=$(cd "$HOST_ROOT" && pwd)
if [[ -n $USE_ENV ]]; then
    [[ -x $USE_ENV/bin/enflame-ctk ]] || die "--use-env '$USE_ENV' has no bin/enflame-ctk"
    USE_ENV=$(cd "$USE_ENV" && pwd)
fi
if [[ $HOST_ROOT == / && $DRY_RUN == 0 && $(id -u) != 0 ]]; then
    die "must run as root: it writes /usr/bin, /etc and the engine configs (try --dry-run)"
fi

# A host path as seen from here.
hp() { if [[ $HOST_ROOT == / ]]; then printf '%s' "$1"; else printf '%s%s' "$HOST_ROOT" "$1"; fi; }
# The inverse, for paths this shell found (paths outside HOST_ROOT are left as they are).
host_view() { if [[ $HOST_ROOT != / && $1 == "$HOST_ROOT"/* ]]; then printf '%s' "${1#"$HOST_ROOT"}"; else printf '%s' "$1"; fi; }

# Tests only: SIGKILL this script at step NAME (ENFLAME_TEST_KILL_AT, as enflame-ctk's own).
fault_point() { if [[ ${ENFLAME_TEST_KILL_AT:-} == "$1" ]]; then kill -KILL $$; fi; }
# Make the virtualenv $1 and pip install $SOURCE into it. Where $PYTHON has a pip that can
# install into another interpreter (pip >= 22.3: --python), the venv is made without pip: no
# ensurepip run (most of an install's time: it installs and byte-compiles pip itself, and is a
# package of its own on Debian, python3-venv), and no pip left in the venv the runtime runs
# from. Otherwise ensurepip puts pip in the venv, which installs itself. The path taken is
# named on stderr. Returns 1 naming the step that failed; the caller cleans up.
make_env() {
    local env=$1 quiet=${2:-} pip_version venv_opts=() pip
    pip_version=$("$PYTHON" -c 'import pip; print(*pip.__version__.split(".")[:2])' 2>/dev/null)
    # shellcheck disable=SC2086 # pip_version is "MAJOR MINOR"
    if [[ $pip_version =~ ^[0-9]+\ [0-9]+$ ]] && (( $(printf '%d*100+%d' $pip_version) >= 2203 )); then
        [[ -n $quiet ]] || echo "$PROG: $PYTHON's pip ${pip_version/ /.} installs into a venv without pip" >&2
        venv_opts=(--without-pip)
        pip=("$PYTHON" -m pip --python "$env/bin/python")
    else
        [[ -n $quiet ]] || echo "$PROG: $PYTHON has no pip >= 22.3: the venv gets its own (ensurepip)" >&2
        pip=("$env/bin/python" -m pip)
    fi
    "$PYTHON" -m venv "${venv_opts[@]+"${venv_opts[@]}"}" "$env" \
        || { echo "$PROG: cannot create the virtualenv $env" >&2; return 1; }
    fault_point venv-created
    [[ -n $quiet ]] || echo "$PROG: pip install $SOURCE" >&2
    # shellcheck disable=SC2086 # PIP_ARGS is a list of words on purpose
    "${pip[@]}" install --quiet --disable-pip-version-check $PIP_ARGS "$SOURCE" \
        || { echo "$PROG: pip install of $SOURCE failed (see above)" >&2; return 1; }
}
# Point PREFIX/venv at TARGET (relative to PREFIX) with one rename(2): a runtime starting at
# any moment finds the old venv or the new one. A venv directory from before venvs/ existed
# is swapped with the link by renameat2(RENAME_EXCHANGE), also one step, then moved away.
flip_env() {
    local link
    link=$(hp "$PREFIX")/.venv.link.$$
    rm -f "$link"
    ln -s "$1" "$link"
    if [[ -d $ENV_HERE && ! -L $ENV_HERE ]]; then
        "$PYTHON" -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, os.fsencode(sys.argv[1]), -100, os.fsencode(sys.argv[2]), 2) != 0:
    err = ctypes.get_errno()
    sys.exit(f"cannot swap {sys.argv[2]} for the new venv: {os.strerror(err)}")
' "$link" "$ENV_HERE" || { rm -f "$link"; die "the installed venv is unchanged"; }
        mv -T "$link" "$(hp "$PREFIX")/venvs/.pre-venvs.$$"  # the old directory, removed later
    else
        mv -T "$link" "$ENV_HERE"
    fi
}
# Once the install is recorded: every venv but the live one goes (earlier versions, and what
# an interrupted run left behind).
prune_envs() {
    local live entry
    live=$(readlink "$ENV_HERE" 2>/dev/null) || return 0
    for entry in "$(hp "$PREFIX")"/venvs/* "$(hp "$PREFIX")"/venvs/.pre-venvs.*; do
        if [[ -e $entry && venvs/$(basename "$entry") != "$live" ]]; then rm -rf "$entry"; fi
    done
    rm -f "$(hp "$PREFIX")"/.venv.link.*
    return 0
}

MANIFEST=$(hp "$PREFIX")/install-manifest.json
HAD_MANIFEST=0
[[ -e $MANIFEST ]] && HAD_MANIFEST=1
COMMON=(--host-root "$HOST_ROOT" --toolkit-dir "$PREFIX")
[[ $RESTART == 1 ]] && COMMON+=(--restart-engine)
[[ $DRY_RUN == 1 ]] && COMMON+=(--dry-run)

if [[ $UNINSTALL == 1 ]]; then
    if [[ ! -e $MANIFEST ]]; then
        echo "$PROG: nothing to uninstall: $MANIFEST does not exist" >&2
        exit 0
    fi
    if [[ -n $USE_ENV ]]; then
        CTK=$USE_ENV/bin/enflame-ctk
    elif [[ -x $(hp "$PREFIX")/venv/bin/enflame-ctk ]]; then
        CTK=$(hp "$PREFIX")/venv/bin/enflame-ctk
    else
        die "cannot find the enflame-ctk that made $MANIFEST: pass --use-env DIR"
    fi
    # Undone newest first: engine configs, links, config, the venv, then empty directories.
    "$CTK" uninstall "${COMMON[@]}"
    exit 0
fi

CREATED=()
FRESH_ENV=0
missing=()
# On exit from a failed first install: the venv this run created and the directory levels of
# PREFIX it made (deepest first, only while empty) go, unless a manifest now records them.
remove_fresh_env() {
    [[ $FRESH_ENV == 1 && ! -e $MANIFEST ]] || return 0
    rm -rf "$ENV_HERE" "$(hp "$PREFIX")/venvs" "$(hp "$PREFIX")"/.venv.link.*
    local i
    for ((i = ${#missing[@]} - 1; i >= 0; i--)); do
        rmdir "$(hp "${missing[i]}")" 2>/dev/null || break
    done
    echo "$PROG: removed what this failed first install created ($ENV_HOST); the node is as it was" >&2
}
if [[ -n $USE_ENV ]]; then
    ENV_HOST=$USE_ENV
    ENV_HERE=$USE_ENV
else
    ENV_HOST=$PREFIX/venv
    ENV_HERE=$(hp "$ENV_HOST")
    if [[ -z $WHEEL ]]; then
        [[ -f $SRC_DIR/pyproject.toml ]] || die "no pyproject.toml in $SRC_DIR: pass --wheel FILE"
        SOURCE=$SRC_DIR
    else
        [[ -f $WHEEL ]] || die "--wheel '$WHEEL' does not exist"
        SOURCE=$WHEEL
    fi
    command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH: install python3 (>= 3.10) or pass --python"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "$PYTHON is $("$PYTHON" -V 2>&1); enflame-gcu needs Python >= 3.10 (pass --python)"
    if [[ -e $ENV_HERE && ! -e $MANIFEST ]]; then
        die "$ENV_HERE exists but no install recorded it ($MANIFEST is missing): move it away first"
    fi
    # Record every directory level we create so --uninstall removes exactly those.
    dir=$PREFIX
    missing=()
    while [[ $dir != / && ! -d $(hp "$dir") ]]; do
        missing=("$dir" "${missing[@]+"${missing[@]}"}")
        dir=$(dirname "$dir")
    done
    for dir in "${missing[@]+"${missing[@]}"}"; do CREATED+=(--created "dir:$dir"); done
    CREATED+=(--created "tree:$PREFIX/venvs" --created "tree:$ENV_HOST")
    if [[ $DRY_RUN == 1 && ! -x $ENV_HERE/bin/enflame-ctk ]]; then
        echo "would create the virtualenv $ENV_HOST with $PYTHON"
        echo "would pip install $SOURCE ${PIP_ARGS}"
        # The rest of the plan (files, engine config diffs, restarts) comes from enflame-ctk
        # itself, run by $PYTHON from this source tree (or the wheel, unpacked into a throwaway
        # directory outside the host root, removed on exit): no pip, no network. Only when
        # $PYTHON lacks the dependencies is pip used, and only from what --pip-args names.
        PLAN_ENV=$(mktemp -d "${TMPDIR:-/tmp}/enflame-install-plan.XXXXXX")
        trap 'rm -rf "$PLAN_ENV"' EXIT
        if [[ -n $WHEEL ]]; then
            "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
                "$WHEEL" "$PLAN_ENV/lib" || die "cannot read the wheel $WHEEL"
        else
            mkdir "$PLAN_ENV/lib" && cp -r "$SRC_DIR/src/enflame_gcu" "$PLAN_ENV/lib/"
        fi
        mkdir "$PLAN_ENV/bin"
        printf '#!/bin/sh\nPYTHONPATH=%q exec %q -m enflame_gcu.container_toolkit.cli "$@"\n' \
            "$PLAN_ENV/lib" "$PYTHON" >"$PLAN_ENV/bin/enflame-ctk"
        chmod +x "$PLAN_ENV/bin/enflame-ctk"
        # What `enflame-ctk install --dry-run` imports (the CLI loads only the chosen command).
        if ! lacking=$(PYTHONPATH=$PLAN_ENV/lib "$PYTHON" -c 'import enflame_gcu.container_toolkit.commands.install' 2>&1); then
            [[ -n $PIP_ARGS ]] || die "the dry run cannot show the rest of the plan: $PYTHON lacks what enflame-ctk needs (${lacking##*$'\n'}); the real run installs it with pip. For a dry run, pass --pip-args with a wheelhouse (\"--no-index --find-links DIR\") or --use-env DIR"
            make_env "$PLAN_ENV/venv" quiet >&2 \
                || die "cannot prepare the dry run (pip install $PIP_ARGS into a temporary environment failed)"
            ln -sf "$PLAN_ENV/venv/bin/enflame-ctk" "$PLAN_ENV/bin/enflame-ctk"
        fi
        PLAN_SITE=$("$PYTHON" -c 'import sys; print("lib/python%d.%d/site-packages" % sys.version_info[:2])')
    fi
    if [[ $DRY_RUN == 0 ]]; then
        # The runtime launcher runs PREFIX/venv/bin/python on every runc call, so that venv is
        # never changed in place: each install builds a new one in PREFIX/venvs/, checks that
        # it imports, and only then points the link PREFIX/venv at it with one rename(2). An
        # interrupted (even SIGKILLed) install or upgrade leaves the old venv live.
        VENVS_HERE=$(hp "$PREFIX")/venvs
        if [[ ! -e $ENV_HERE ]]; then
            # A first install: until a manifest records the venv, a failure (pip, an interrupt,
            # enflame-ctk install refusing) removes what this run created, so a re-run works.
            FRESH_ENV=1
            trap remove_fresh_env EXIT
            trap 'exit 130' INT
            trap 'exit 143' TERM
            mkdir -p "$(hp "$PREFIX")"
        fi
        mkdir -p "$VENVS_HERE"
        NEW_ENV=$(mktemp -d "$VENVS_HERE/$(date -u +%Y%m%dT%H%M%S).XXXXXX")
        chmod 0755 "$NEW_ENV"
        echo "$PROG: creating the virtualenv $(host_view "$NEW_ENV")" >&2
        make_env "$NEW_ENV" || { rm -rf "$NEW_ENV"; die "the installed venv is unchanged"; }
        fault_point pip-installed
        # The runtime, and every enflame-ctk command (the full parser imports each one's module).
        "$NEW_ENV/bin/python" -I -c 'import enflame_gcu.shim.main, enflame_gcu.container_toolkit.cli as c; c.build_parser()' \
            || { rm -rf "$NEW_ENV"; die "the new virtualenv does not import enflame_gcu; the installed venv is unchanged"; }
        PREVIOUS_ENV=
        if [[ -L $ENV_HERE ]]; then
            PREVIOUS_ENV=$(readlink "$ENV_HERE")
        fi
        flip_env "venvs/$(basename "$NEW_ENV")"
        fault_point venv-switched
    fi
fi

CTK_ENV=${PLAN_ENV:-$ENV_HERE}
if [[ -n ${PLAN_ENV:-} ]]; then
    PACKAGE_VIEW=$ENV_HOST/$PLAN_SITE # where the real run's venv will hold the package
else
    PACKAGE_DIR=$("$ENV_HERE/bin/python" -c \
        'import enflame_gcu, os; print(os.path.dirname(os.path.dirname(os.path.abspath(enflame_gcu.__file__))))') \
        || die "$ENV_HERE has no working enflame_gcu package"
    PACKAGE_VIEW=$(host_view "$PACKAGE_DIR")
fi
ARGS=(
    --python "$ENV_HOST/bin/python"
    --package-dir "$PACKAGE_VIEW"
    --bin-dir /usr/bin
    --link-ctk "$ENV_HOST/bin/enflame-ctk"
)
ARGS+=(--mode "$MODE")
[[ $CDI_ANNOTATIONS == 1 ]] && ARGS+=(--cdi-annotations)
for runtime in "${RUNTIMES[@]+"${RUNTIMES[@]}"}"; do ARGS+=(--runtime "$runtime"); done

if [[ $MIGRATE == 1 && $UNINSTALL == 0 ]]; then
    # topscloud's own /usr/bin/enflame-container-runtime is set aside (recorded; --uninstall
    # puts it back) rather than refused after migrate changed the node.
    ARGS+=(--set-aside-vendor-runtime)
    MIGRATE_ARGS=(--host-root "$HOST_ROOT")
    if [[ $DRY_RUN == 0 ]]; then
        # The whole install, dry-run, before migrate changes anything: a refusal stops here
        # with the node as it was (a first install's new venv goes with this run's exit trap).
        "$CTK_ENV/bin/enflame-ctk" migrate "${MIGRATE_ARGS[@]}" --dry-run >/dev/null \
            || die "migrating from topscloud would stop (above); nothing was changed"
        "$CTK_ENV/bin/enflame-ctk" install "${COMMON[@]}" --dry-run "${ARGS[@]}" \
            "${CREATED[@]+"${CREATED[@]}"}" >/dev/null \
            || die "the install after migrating would stop (above); nothing was migrated"
    else
        MIGRATE_ARGS+=(--dry-run)
    fi
    "$CTK_ENV/bin/enflame-ctk" migrate "${MIGRATE_ARGS[@]}" \
        || die "migrating from topscloud stopped (above); the install did not run"
fi

if ! "$CTK_ENV/bin/enflame-ctk" install "${COMMON[@]}" "${ARGS[@]}" "${CREATED[@]+"${CREATED[@]}"}"; then
    # enflame-ctk install has taken back this run's changes itself, and only those: an install
    # that was there before (re-install, upgrade) keeps working. Only a first install whose
    # undo left a record behind is finished off here, since everything recorded is this run's.
    if [[ $DRY_RUN == 0 && $HAD_MANIFEST == 0 && -e $MANIFEST ]]; then
        echo "$PROG: install failed; undoing what it recorded" >&2
        "$ENV_HERE/bin/enflame-ctk" uninstall "${COMMON[@]}" >&2 || true
    elif [[ -n ${PREVIOUS_ENV:-} && -d $(hp "$PREFIX")/$PREVIOUS_ENV ]]; then
        flip_env "$PREVIOUS_ENV" # the earlier install keeps its own venv
        echo "$PROG: the earlier virtualenv ($PREVIOUS_ENV) is live again" >&2
    fi
    exit 1
fi
if [[ $DRY_RUN == 0 && -z $USE_ENV ]]; then prune_envs; fi

FRESH_ENV=0 # recorded in the manifest: from here on --uninstall removes it
if [[ $DRY_RUN == 0 ]]; then
    # The undo names the same host root, prefix and environment as this run.
    UNDO=("$0" --uninstall)
    [[ $HOST_ROOT != / ]] && UNDO+=(--host-root "$HOST_ROOT")
    [[ $PREFIX != /opt/enflame-gcu ]] && UNDO+=(--prefix "$PREFIX")
    [[ -n $USE_ENV ]] && UNDO+=(--use-env "$USE_ENV")
    printf -v undo '%q ' "${UNDO[@]}"
    echo "$PROG: recorded in $MANIFEST; undo with: ${undo% }" >&2
    # Which engines need a restart (only those whose config changed) enflame-ctk said above.
fi
