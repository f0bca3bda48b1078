#!/usr/bin/env bash
# Prepares a Kubernetes node for Enflame GCUs (run as root on each GCU node):
#   1. turns swap off now and comments the swap entries out of /etc/fstab (kubelet requirement);
#   2. checks the kubelet: the plugin speaks device plugin API v1beta1 (kubelet 1.10 or newer);
#      the DevicePlugins feature gate is on by default from 1.10, so it is only touched when
#      someone turned it off (kubelets 1.10-1.25; the gate is locked on from 1.26);
#   3. applies the node mode to the engine the kubelet uses (docs/user-guide.md, "Node modes"):
#      device-specs (auto on containerd and CRI-O) leaves it as it is; default-runtime (auto on
#      docker) runs `enflame-ctk runtime configure --runtime <engine> --set-as-default`;
#      runtimeclass the same without --set-as-default; cdi is left to deploy/install.sh.
#
# Usage: deploy/k8s-config.sh [--dry-run] [--runtime docker|containerd|crio] [--no-restart]
#                             [--mode MODE] [--skip-swap] [--skip-kubelet] [--skip-runtime]
#                             [--host-root DIR]
#   --dry-run      print what would change (and enflame-ctk's diff), change nothing
#   --runtime      the engine to configure (default: as `enflame-ctk runtime detect` says:
#                  the kubelet's CRI endpoint, else the first socket; see detect_runtime)
#   --mode         auto (default), device-specs, cdi, runtimeclass or default-runtime
#   --no-restart   do not reload/restart the engine or the kubelet (do it yourself later)
#   --host-root DIR  act on a node tree under DIR (testing); commands acting on the live system
#                  (swapoff, systemctl, engine restarts) are then only printed
# Environment: KUBELET (kubelet binary), ENFLAME_CTK (enflame-ctk binary).
set -euo pipefail

dry_run=0
restart=1
do_swap=1
do_kubelet=1
do_runtime=1
runtime=""
mode=auto
root="/"

usage() { sed -n '2,24s/^# \{0,1\}//p' "$0"; }
# Output: a dry run's plan (what would change) is the result, on stdout without a prefix;
# progress, notes, warnings and errors go to stderr as "k8s-config: ..." (as enflame-ctk does).
say() { printf 'k8s-config: %s\n' "$*" >&2; }
plan() { printf '%s\n' "$*"; }
die() { printf 'k8s-config: error: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'k8s-config: error: %s\n' "$*" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --no-restart) restart=0 ;;
        --skip-swap) do_swap=0 ;;
        --skip-kubelet) do_kubelet=0 ;;
        --skip-runtime) do_runtime=0 ;;
        --runtime)
            [ "$#" -ge 2 ] || usage_error "--runtime needs a value: docker, containerd or crio"
            runtime=$2
            shift
            ;;
        --runtime=*) runtime=${1#--runtime=} ;;
        --mode)
            [ "$#" -ge 2 ] || usage_error "--mode needs a value: auto, device-specs, cdi, runtimeclass or default-runtime"
            mode=$2
            shift
            ;;
        --mode=*) mode=${1#--mode=} ;;
        --host-root | --root) # --root: the old spelling
            [ "$#" -ge 2 ] || usage_error "$1 needs a directory"
            root=$2
            shift
            ;;
        --host-root=* | --root=*) root=${1#*=} ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; usage_error "unknown argument: $1" ;;
    esac
    shift
done
case "$runtime" in
    "" | docker | containerd | crio) ;;
    *) usage_error "--runtime must be docker, containerd or crio, not '$runtime'" ;;
esac
case "$mode" in
    auto | device-specs | cdi | runtimeclass | default-runtime) ;;
    *) usage_error "--mode must be auto, device-specs, cdi, runtimeclass or default-runtime, not '$mode'" ;;
esac
[ -d "$root" ] || usage_error "--host-root $root is not a directory"
root=$(cd "$root" && pwd)
root=${root%/}
live=1
if [ -n "$root" ]; then live=0; fi # any --host-root other than / is a test tree
if [ "$dry_run" -eq 0 ] && [ "$live" -eq 1 ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (or with --dry-run to see what would change)"
fi

# Run a command that acts on the live system; only print it in dry-run mode or under --host-root.
run_live() {
    if [ "$dry_run" -eq 1 ]; then
        plan "would run: $*"
    elif [ "$live" -eq 0 ]; then
        say "would run: $* (not run: $root is not this host's /)"
    else
        say "running: $*"
        "$@"
    fi
}

# --- 1. swap ---------------------------------------------------------------------------------
configure_swap() {
    local fstab="$root/etc/fstab" active=""
    if [ "$live" -eq 1 ] && [ -r /proc/swaps ]; then
        active=$(tail -n +2 /proc/swaps)
    fi
    if [ "$live" -eq 0 ]; then
        say "swap: the live system's swap is not touched under --host-root"
    elif [ -n "$active" ]; then
        run_live swapoff -a
    else
        say "swap: no active swap"
    fi
    if [ ! -f "$fstab" ]; then
        say "swap: no $fstab"
        return
    fi
    local lines
    lines=$(awk '$0 !~ /^[[:space:]]*#/ && $3 == "swap" { print NR": "$0 }' "$fstab")
    if [ -z "$lines" ]; then
        say "swap: no active swap entry in $fstab"
        return
    fi
    if [ "$dry_run" -eq 1 ]; then
        plan "would comment out in $fstab:"
        printf '    %s\n' "$lines"
        return
    fi
    cp -p "$fstab" "$fstab.enflame-k8s-config.bak"
    local tmp
    tmp=$(mktemp "$fstab.XXXXXX")
    awk '$0 !~ /^[[:space:]]*#/ && $3 == "swap" { print "# disabled by k8s-config.sh: " $0; next } { print }' \
        "$fstab" >"$tmp"
    chmod --reference="$fstab" "$tmp"
    mv "$tmp" "$fstab"
    say "swap: commented out the swap entries of $fstab (backup: $fstab.enflame-k8s-config.bak)"
}

# --- 2. kubelet ------------------------------------------------------------------------------
kubelet_bin=${KUBELET:-kubelet}

kubelet_version() { # prints MAJOR MINOR, or nothing when no kubelet is found
    command -v "$kubelet_bin" >/dev/null 2>&1 || return 0
    "$kubelet_bin" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p' | head -n 1
}

kubelet_settings() { # the running kubelet's command line, its config file and its defaults file
    if [ "$live" -eq 1 ]; then
        local pid
        pid=$(pgrep -o -x kubelet 2>/dev/null || true)
        if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ]; then tr '\0' ' ' <"/proc/$pid/cmdline"; echo; fi
    fi
    local f
    for f in "$root/var/lib/kubelet/config.yaml" "$root/etc/default/kubelet" "$root/etc/sysconfig/kubelet"; do
        if [ -r "$f" ]; then cat "$f"; fi
    done
}

configure_kubelet() {
    local version major minor
    version=$(kubelet_version)
    if [ -z "$version" ]; then
        say "kubelet: '$kubelet_bin' not found; skipping the kubelet checks"
        return
    fi
    read -r major minor <<<"$version"
    if [ "$major" -eq 1 ] && [ "$minor" -lt 10 ]; then
        die "kubelet $major.$minor is too old: enflame-device-plugin speaks device plugin API v1beta1, served by kubelet 1.10 and newer"
    fi
    if [ "$major" -eq 1 ] && [ "$minor" -ge 26 ]; then
        say "kubelet $major.$minor: device plugins are always on (DevicePlugins is GA)"
        return
    fi
    if ! kubelet_settings | grep -Eq 'DevicePlugins[=:][[:space:]]*"?false'; then
        say "kubelet $major.$minor: DevicePlugins is on (the default since 1.10); nothing to change"
        return
    fi
    local defaults="$root/etc/default/kubelet"
    say "kubelet $major.$minor: DevicePlugins was turned off; turning it on in $defaults"
    if [ "$dry_run" -eq 1 ]; then
        plan "would append --feature-gates=DevicePlugins=true to KUBELET_EXTRA_ARGS in $defaults"
        say "(a command-line flag overrides the featureGates of the kubelet config file)"
    else
        mkdir -p "$(dirname "$defaults")"
        touch "$defaults"
        cp -p "$defaults" "$defaults.enflame-k8s-config.bak"
        if grep -q '^KUBELET_EXTRA_ARGS=' "$defaults"; then
            sed -i 's/^KUBELET_EXTRA_ARGS="\{0,1\}\([^"]*\)"\{0,1\}$/KUBELET_EXTRA_ARGS="\1 --feature-gates=DevicePlugins=true"/' "$defaults"
        else
            echo 'KUBELET_EXTRA_ARGS="--feature-gates=DevicePlugins=true"' >>"$defaults"
        fi
    fi
    if [ "$restart" -eq 1 ]; then
        run_live systemctl daemon-reload
        run_live systemctl restart kubelet
    fi
}

# --- 3. container engine ---------------------------------------------------------------------
# The engine the kubelet runs, as one line "ENGINE: why": `enflame-ctk runtime detect` answers
# (doctor and the installer use the same Python); without an enflame-ctk that has that command
# the shell below follows the same rules (tests/deploy/test_engine_detection.py holds the two to
# one table): the kubelet's CRI endpoint (a running kubelet's flag, else the config file its
# --config names; with no kubelet running, the flag in the files its unit passes, else
# /var/lib/kubelet/config.yaml; the last word wins), else the first socket found: containerd,
# CRI-O, docker. Prints nothing (and says why on stderr) when no engine is found.
endpoint_engine() {
    case "$1" in
        *cri-dockerd* | *dockershim*) echo docker ;;
        *crio*) echo crio ;;
        *containerd*) echo containerd ;;
    esac
}

last_flag() { # the last value of flag $1 among the words on stdin (one a line)
    awk -v f="$1" '$0 == f { if ((getline v) > 0) val = v; next }
        index($0, f "=") == 1 { val = substr($0, length(f) + 2) }
        END { if (val != "") print val }'
}

running_kubelet() { # the pid of the oldest kubelet under $root/proc
    local f first pid best=""
    for f in "$root"/proc/[0-9]*/cmdline; do
        [ -f "$f" ] || continue # a regular file: a FIFO would block the read
        first=$(tr '\0' '\n' <"$f" 2>/dev/null | head -n 1 || true)
        [ "${first##*/}" = kubelet ] || continue
        pid=${f%/cmdline}
        pid=${pid##*/}
        if [ -z "$best" ] || [ "$pid" -lt "$best" ]; then best=$pid; fi
    done
    echo "$best"
}

config_endpoint() { # "VALUE<TAB>where" from the kubelet config file $1
    local value
    [ -f "$root$1" ] || return 0
    value=$(sed -n "s/^containerRuntimeEndpoint:[[:space:]]*[\"']\{0,1\}\([^\"'[:space:]#]*\).*/\1/p" "$root$1" | tail -n 1)
    if [ -n "$value" ]; then printf '%s\tcontainerRuntimeEndpoint in %s\n' "$value" "$1"; fi
}

kubelet_endpoint() { # "VALUE<TAB>where": the kubelet's CRI endpoint, nothing when not set
    local flag=--container-runtime-endpoint pid value file found=""
    pid=$(running_kubelet)
    if [ -n "$pid" ]; then
        value=$(tr '\0' '\n' <"$root/proc/$pid/cmdline" | last_flag "$flag")
        if [ -n "$value" ]; then printf '%s\t%s of the running kubelet\n' "$value" "$flag"; return; fi
        file=$(tr '\0' '\n' <"$root/proc/$pid/cmdline" | last_flag --config)
        config_endpoint "${file:-/var/lib/kubelet/config.yaml}"
        return
    fi
    for file in /var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet /etc/sysconfig/kubelet; do
        [ -f "$root$file" ] || continue
        value=$(grep -v '^[[:space:]]*#' "$root$file" \
            | grep -o -- "${flag}[= ][= ]*[\"']\{0,1\}[^\"'[:space:]]*" \
            | tail -n 1 | sed "s/^${flag}[= ]*[\"']\{0,1\}//" || true)
        if [ -n "$value" ]; then found=$(printf '%s\t%s in %s' "$value" "$flag" "$file"); fi
    done
    if [ -n "$found" ]; then echo "$found"; return; fi
    config_endpoint /var/lib/kubelet/config.yaml
}

detect_runtime_here() { # the shell's own answer, the same line enflame-ctk prints
    local said value where engine why path
    said=$(kubelet_endpoint)
    if [ -n "$said" ]; then
        value=${said%%$'\t'*}
        where=${said#*$'\t'}
        engine=$(endpoint_engine "$value")
        if [ -n "$engine" ]; then
            echo "$engine: the kubelet's CRI endpoint $value ($where)"
            return
        fi
        why="the kubelet's CRI endpoint $value ($where) names no engine we know"
    else
        why="the kubelet's CRI endpoint is not set"
    fi
    for path in containerd:/run/containerd/containerd.sock crio:/var/run/crio/crio.sock \
        crio:/run/crio/crio.sock docker:/var/run/docker.sock docker:/run/docker.sock; do
        if [ -e "$root${path#*:}" ] || [ -L "$root${path#*:}" ]; then
            echo "${path%%:*}: socket ${path#*:} ($why)"
            return
        fi
    done
    printf 'k8s-config: no containerd, CRI-O or docker socket (%s)\n' "$why" >&2
}

find_ctk() { # ENFLAME_CTK when set (not executable: none), else enflame-ctk on PATH or ours
    if [ -n "${ENFLAME_CTK:-}" ]; then
        if [ -x "$ENFLAME_CTK" ]; then echo "$ENFLAME_CTK"; fi
        return
    fi
    if command -v enflame-ctk >/dev/null 2>&1; then command -v enflame-ctk; return; fi
    if [ -x /opt/enflame-gcu/bin/enflame-ctk ]; then echo /opt/enflame-gcu/bin/enflame-ctk; fi
}

detect_runtime() {
    local ctk answer status=0
    ctk=$(find_ctk)
    if [ -n "$ctk" ]; then
        answer=$("$ctk" runtime detect --host-root "${root:-/}") || status=$?
        # 2: a usage error, i.e. an enflame-ctk without `runtime detect`: the shell answers.
        if [ "$status" -ne 2 ]; then
            echo "$answer"
            return
        fi
    fi
    detect_runtime_here
}

configure_runtime() {
    if [ -z "$runtime" ]; then
        local detected
        detected=$(detect_runtime)
        runtime=${detected%%:*}
        case "$runtime" in
            docker | containerd | crio) ;;
            *) die "no container engine found (the kubelet's CRI endpoint, containerd, CRI-O or docker sockets); pass --runtime" ;;
        esac
        say "runtime: detected $detected"
    fi
    local chosen=$mode
    if [ "$chosen" = auto ]; then
        if [ "$runtime" = docker ]; then chosen=default-runtime; else chosen=device-specs; fi
    fi
    case "$chosen" in
        device-specs)
            say "runtime: node mode device-specs: $runtime is left as it is (the kubelet hands the device plugin's DeviceSpecs to it)"
            return
            ;;
        cdi)
            say "runtime: node mode cdi: nothing to configure here; deploy/install.sh --mode cdi (or the toolkit DaemonSet) writes the CDI specs and keeps them current"
            return
            ;;
    esac
    local ctk
    ctk=$(find_ctk)
    local args=(runtime configure --runtime "$runtime")
    [ "$chosen" = default-runtime ] && args+=(--set-as-default)
    say "runtime: node mode $chosen"
    if [ "$live" -eq 0 ]; then args+=(--host-root "$root"); fi
    if [ "$dry_run" -eq 1 ]; then
        plan "would run: enflame-ctk ${args[*]}$([ "$restart" -eq 1 ] && [ "$live" -eq 1 ] && echo ' --restart-engine')"
        if [ -n "$ctk" ]; then
            plan "changes enflame-ctk would make:"
            "$ctk" "${args[@]}" --dry-run || say "enflame-ctk could not show the diff (see its message above)"
        fi
        return
    fi
    [ -n "$ctk" ] || die "enflame-ctk not found: install the toolkit first (deploy/install.sh) or set ENFLAME_CTK"
    if [ "$restart" -eq 1 ] && [ "$live" -eq 1 ]; then args+=(--restart-engine); fi
    say "running: $ctk ${args[*]}"
    "$ctk" "${args[@]}"
}

[ "$dry_run" -eq 1 ] && say "dry run: nothing will be changed"
if [ "$do_swap" -eq 1 ]; then configure_swap; fi
if [ "$do_kubelet" -eq 1 ]; then configure_kubelet; fi
if [ "$do_runtime" -eq 1 ]; then configure_runtime; fi
say "done"
