"""Every program we ship: help on every subcommand and option, choices and defaults shown,
old spellings hidden but working with a warning that names the new one."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.errors import ConfigError
from enflame_gcu.support import cli_options
from tests import program_parsers

_NO_VALUE = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse.BooleanOptionalAction,
    argparse._SubParsersAction,
)


def problems_of(found: list[program_parsers.Found]) -> list[str]:
    """What breaks the grammar in these parsers (empty when nothing does)."""
    problems = []
    for item in found:
        where = " ".join(item.path)
        if not item.help:
            problems.append(f"{where}: no help")
        for action in item.parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            if action.help == argparse.SUPPRESS:
                if not isinstance(action, cli_options.DeprecatedOption):
                    problems.append(f"{where} {name}: hidden without being a deprecated alias")
                continue
            if isinstance(action, cli_options.DeprecatedOption):
                problems.append(f"{where} {name}: deprecated alias shown in --help")
            longs = [o for o in action.option_strings if o.startswith("--")]
            if len(longs) > 1 and not isinstance(action, argparse.BooleanOptionalAction):
                problems.append(f"{where} {name}: two visible spellings")
            text = action.help or ""
            if not text:
                problems.append(f"{where} {name}: no help")
                continue
            shown = f"{text} {action.metavar or ''}"
            choices = action.choices or item.declared.get(action.dest, ())
            if action.metavar is not None or action.dest in item.declared:
                missing = [c for c in choices if str(c) not in shown]
                if missing and "%(choices)s" not in text:
                    problems.append(f"{where} {name}: help misses the choices {missing}")
            takes_value = action.option_strings and not isinstance(action, _NO_VALUE)
            has_default = action.default not in (None, False, "", [], (), argparse.SUPPRESS)
            if takes_value and has_default and "default" not in text:
                problems.append(f"{where} {name}: default {action.default!r} not shown")
    return problems


@pytest.mark.parametrize("program", sorted(program_parsers.PROGRAMS))
def test_every_option_of_every_program_has_help_choices_and_default(program: str) -> None:
    found = program_parsers.PROGRAMS[program]()
    assert len(found) >= {"enflame-ctk": 20}.get(program, 1), [f.path for f in found]
    assert problems_of(found) == []


def test_the_check_fails_on_each_kind_of_gap() -> None:
    """Each rule above catches what it is for (a parser with every gap, one at a time)."""
    parser = argparse.ArgumentParser(prog="demo", description="a demo program")
    parser.add_argument("--bare")
    parser.add_argument("--mode", choices=("a", "b"), metavar="M", help="the mode")
    parser.add_argument("--level", default="x", help="the level")
    parser.add_argument("--new", "--old", help="two spellings (default: 1)", default="1")
    cli_options.add_deprecated(parser, "--older", "--new", "new", prog="demo")
    parser.add_argument("--secret", help=argparse.SUPPRESS)
    sub = parser.add_subparsers()
    sub.add_parser("quiet")
    found = program_parsers.walk(parser, ("demo",))
    found[1] = program_parsers.Found(found[1].path, found[1].parser, found[1].help, {})
    problems = problems_of(found)
    assert problems == [
        "demo --bare: no help",
        "demo --mode: help misses the choices ['a', 'b']",
        "demo --level: default 'x' not shown",
        "demo --new/--old: two visible spellings",
        "demo --secret: hidden without being a deprecated alias",
        "demo quiet: no help",
    ]
    declared = program_parsers.Found(("demo",), parser, "d", {"bare": ("p", "q")})
    assert "demo --bare: no help" in problems_of([declared])


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_dra_plugin_old_root_spelling_works_hidden_and_warns(tmp_path: os.PathLike[str]) -> None:
    root = str(tmp_path)
    settings = dra_config.parse(["--node-name", "n", "--root", root], {})
    assert settings.root == root
    assert "--root" not in dra_config.build_parser({}).format_help()
    # The warning, as an operator sees it (a usage error stops the process right after it).
    result = _run(
        "enflame_gcu.dra_plugin.main", "--node-name", "n", "--root", root, "--unhealthy", "x"
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "enflame-dra-plugin: warning: --root is deprecated, use --host-root"
    assert "argument --unhealthy: 'x' is not one of taint, omit" in result.stderr


@pytest.mark.parametrize(
    ("args", "environ", "message"),
    [
        (["--health-interval", "abc"], {}, "--health-interval: 'abc' is not a number of seconds"),
        ([], {"ENFLAME_DRA_HEALTH_INTERVAL": "0"}, "0 is outside 0.05..3600 seconds"),
        (["--log-level", "loud"], {}, "'loud' is not one of debug, info, warning, error"),
        ([], {"ENFLAME_DRA_UNHEALTHY": "evict"}, "'evict' is not one of taint, omit"),
        (["--shared-slices", "two"], {}, "'two' is not a whole number (0..64)"),
    ],
)
def test_dra_plugin_bad_values_are_usage_errors_that_say_what_is_wrong(
    args: list[str],
    environ: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ConfigError, match="invalid command line"):
        dra_config.parse(["--node-name", "n", *args], environ)
    assert message in capsys.readouterr().err


def test_dra_plugin_environment_values_are_read_in_any_case() -> None:
    settings = dra_config.parse(
        [], {"NODE_NAME": "n", "ENFLAME_DRA_LOG_LEVEL": "DEBUG", "ENFLAME_DRA_UNHEALTHY": "Omit"}
    )
    assert (settings.log_level, settings.unhealthy) == ("debug", "omit")
