"""The installed ``enflame-container-runtime``: a POSIX ``sh`` front over the Python wrapper.

runc is called many times per container (create, start, state, kill, delete ...) and only a
``create``/``run`` whose spec names a GCU request needs the wrapper. Starting Python costs
about 9 ms per call; ``dash`` about 1 ms. So the installed program is a small ``sh`` script
that parses runc's global flags exactly as :mod:`invocation` does and ``exec``s the low-level
runtime itself for every other call, and for a ``create``/``run`` whose ``config.json`` holds
none of :data:`main.REQUEST_MARKERS`. Everything else -- a marker, a flag it does not
handle, a config it cannot vouch for -- goes to ``python -IS`` running :func:`main.main`
(no site scan, no ``.pth`` files), which stays the one authority.

The front never reads ``config.toml`` (reading a file byte by byte in ``sh`` costs more than
Python's start). It reads the verdict :mod:`front` leaves after Python loaded the config
cleanly: the config's path, the runtimes it names and the file's identity, as ``sh``
assignments it sources (one ``read`` system call instead of one per byte). The front trusts
that verdict only while the config's mtime is the recorded one to the nanosecond and the
verdict is newer than the config and its directory (:mod:`front` says why that is all a
fork-free ``sh`` can compare), so a changed config sends calls to Python until Python has
checked it and written a new verdict.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

import enflame_gcu
from enflame_gcu import fileio
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import front
from enflame_gcu.shim import main as runtime_main

# How the front starts the Python wrapper: argv[0] is the front's own path (so the wrapper
# never picks itself as the low-level runtime), the rest runc's arguments, unchanged.
# String literals in JSON's spelling (valid Python): no single quote, so the code reads
# unbroken inside the sh single quotes around it.
_PYTHON_CODE = (
    "import sys; sys.path.insert(0, {package_dir}); "
    "from enflame_gcu.shim.main import main; sys.exit(main(sys.argv[1:], front={verdict}))"
)

# One sh function per decision; ``$@`` is never shifted, so it is runc's argv as given.
TEMPLATE = """\
#!/bin/sh
# enflame-container-runtime front, written by `enflame-ctk system install-runtime-launcher`
# (or `enflame-ctk install`). POSIX sh; no external command but grep, on create only.
# Every runc call that cannot need a GCU execs the low-level runtime at once; the rest (a GCU
# request marker in the spec, anything this script does not handle) runs the Python wrapper
# ({python} -IS, package {package_dir}), the one authority. Its variables start with _efr_:
# the environment runc gets stays the engine's.
_efr_py() {{ exec {python_q} -IS -c {code_q} "$0" "$@"; }}
case $0 in */*) ;; *) _efr_py "$@" ;; esac
_efr_verdict={verdict_q}
_efr_cfg=${{{config_env}:-{config_default_q}}}
# The runtimes the Python wrapper found in this config, trusted while the config is unchanged:
# six assignments the wrapper wrote (shim.front), sourced in one read where dash's `read`
# takes a system call per byte. `command` keeps a verdict removed meanwhile or broken from
# ending the script, stderr stays quiet (no line the wrapper would not print): both ask Python.
[ -f "$_efr_verdict" ] && [ ! -L "$_efr_verdict" ] && [ -O "$_efr_verdict" ] || _efr_py "$@"
_efr_format= _efr_path= _efr_state= _efr_names= _efr_identity= _efr_stamp=
command . "$_efr_verdict" 2>/dev/null || _efr_py "$@"
[ "$_efr_format" = {format_q} ] && [ "$_efr_path" = "$_efr_cfg" ] || _efr_py "$@"
# present: the config is the file Python read. Its mtime is the stamp's to the nanosecond
# (cp -p, touch -d, an older file put in place all change it), and the verdict is newer than
# the config and its directory (a rename into it: dpkg, rpm, rsync -t, tar).
case $_efr_state in
present) [ -f "$_efr_cfg" ] && [ ! -L "$_efr_cfg" ] && [ "$_efr_verdict" -nt "$_efr_cfg" ] &&
  [ "$_efr_verdict" -nt "${{_efr_cfg%/*}}/" ] && [ -f "$_efr_stamp" ] && [ ! -L "$_efr_stamp" ] &&
  [ ! "$_efr_cfg" -nt "$_efr_stamp" ] && [ ! "$_efr_cfg" -ot "$_efr_stamp" ] || _efr_py "$@" ;;
absent) [ -z "${{{config_env}}}" ] && [ -d "${{_efr_cfg%/*}}/" ] && [ ! -e "$_efr_cfg" ] &&
  [ ! -L "$_efr_cfg" ] || _efr_py "$@" ;;
*) _efr_py "$@" ;;
esac
# runc's argv, parsed as enflame_gcu.shim.invocation.parse_argv does ("$@" is never shifted).
_efr_phase=global _efr_cmd= _efr_bundle= _efr_next=
for _efr_arg; do
  if [ -n "$_efr_next" ]; then
    [ "$_efr_next" = bundle ] && _efr_bundle=$_efr_arg
    _efr_next=
    continue
  fi
  case $_efr_phase in
  command) _efr_cmd=$_efr_arg _efr_phase=args ;;
  global)
    case $_efr_arg in
    --) _efr_phase=command ;;
    -?*)
      _efr_name=$_efr_arg
      while case $_efr_name in -*) ;; *) false ;; esac; do _efr_name=${{_efr_name#-}}; done
      case $_efr_name in *=*) _efr_has=1 ;; *) _efr_has= ;; esac
      case ${{_efr_name%%=*}} in
      root | log | log-format | criu | rootless | log-level | cgroup-manager)
        [ -n "$_efr_has" ] || _efr_next=skip ;;
      help | h | version | v) _efr_py "$@" ;;
      esac ;;
    *) _efr_cmd=$_efr_arg _efr_phase=args ;;
    esac ;;
  args)
    case $_efr_cmd in create | run) ;; *) break ;; esac
    case $_efr_arg in
    --) break ;;
    -?*)
      _efr_name=$_efr_arg
      while case $_efr_name in -*) ;; *) false ;; esac; do _efr_name=${{_efr_name#-}}; done
      case $_efr_name in *=*) _efr_has=1 ;; *) _efr_has= ;; esac
      case ${{_efr_name%%=*}} in
      bundle | b)
        _efr_bundle=${{_efr_name#*=}}
        [ -n "$_efr_has" ] || _efr_bundle= _efr_next=bundle ;;
      console-socket | pid-file | preserve-fds) [ -n "$_efr_has" ] || _efr_next=skip ;;
      help | h) _efr_py "$@" ;;
      esac ;;
    esac ;;
  esac
done
[ "$_efr_phase" = args ] || _efr_py "$@"
# The low-level runtime: the first configured name found, as main.find_low_level_runtime.
_efr_runtime=
_efr_ifs=$IFS
set -f
IFS='
'
for _efr_name in $_efr_names; do
  case $_efr_name in
  /*) _efr_rest= _efr_try=$_efr_name ;;
  */*) continue ;;
  *) _efr_rest=${{PATH:-{defpath}}}: _efr_try= ;;
  esac
  while :; do
    if [ -z "$_efr_try" ]; then
      [ -n "$_efr_rest" ] || break
      _efr_dir=${{_efr_rest%%:*}} _efr_rest=${{_efr_rest#*:}}
      case $_efr_dir in '') _efr_try=./$_efr_name ;; */) _efr_try=$_efr_dir$_efr_name ;;
      *) _efr_try=$_efr_dir/$_efr_name ;; esac
    fi
    if [ -f "$_efr_try" ] && [ -x "$_efr_try" ]; then
      [ "$_efr_try" -ef "$0" ] && _efr_py "$@"
      _efr_runtime=$_efr_try
      break 2
    fi
    _efr_try=
    [ -n "$_efr_rest" ] || break
  done
done
IFS=$_efr_ifs
set +f
[ -n "$_efr_runtime" ] || _efr_py "$@"
# create/run: the Python wrapper when the spec may ask for a GCU (main.may_request_devices).
case $_efr_cmd in
create | run)
  _efr_bundle=${{_efr_bundle:-.}}
  case /$_efr_bundle/ in */../*) _efr_py "$@" ;; esac
  [ -f "$_efr_bundle/config.json" ] || _efr_py "$@"
  LC_ALL=C grep -qF {markers} -- "$_efr_bundle/config.json" </dev/null 2>/dev/null
  [ $? -eq 1 ] || _efr_py "$@" ;;
esac
exec "$_efr_runtime" "$@"
"""


def front_python(text: str) -> str | None:
    """The interpreter a front written by :func:`render` starts, or None for another script."""
    for line in text.splitlines():
        if line.startswith("_efr_py() { exec "):
            words = shlex.split(line[len("_efr_py() { exec ") :], comments=False, posix=True)
            return words[0] if words else None
    return None


def default_package_dir() -> str:
    """The directory that contains the installed ``enflame_gcu`` package."""
    return os.path.dirname(os.path.dirname(os.path.abspath(enflame_gcu.__file__)))


def render(python: str, package_dir: str, verdict: str = front.DEFAULT_VERDICT) -> str:
    """The front script's text."""
    if not os.path.isabs(python) or any(c.isspace() for c in python):
        raise ValueError(f"python must be an absolute path without spaces, got {python!r}")
    if not os.path.isabs(verdict) or "\n" in verdict:
        raise ValueError(f"verdict must be an absolute path on one line, got {verdict!r}")
    code = _PYTHON_CODE.format(package_dir=json.dumps(package_dir), verdict=json.dumps(verdict))
    return TEMPLATE.format(
        python=python,
        python_q=shlex.quote(python),
        package_dir=package_dir.replace("\n", "\\n"),
        code_q=shlex.quote(code),
        verdict_q=shlex.quote(verdict),
        config_env=runtime_config.PATH_ENV,
        config_default_q=shlex.quote(runtime_config.DEFAULT_PATH),
        format_q=shlex.quote(front.FORMAT),
        defpath=os.defpath,
        markers=" ".join(f"-e {shlex.quote(m.decode())}" for m in runtime_main.REQUEST_MARKERS),
    )


def write_launcher(
    path: str,
    python: str | None = None,
    package_dir: str | None = None,
    verdict: str = front.DEFAULT_VERDICT,
) -> str:
    """Write the front atomically with mode 0755; return its text."""
    text = render(python or sys.executable, package_dir or default_package_dir(), verdict)
    fileio.atomic_write_text(path, text, mode=0o755)
    return text
