"""The daemons' options tables in docs/ (EN and ZH) are what their argparse parsers give."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
from collections.abc import Callable
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "flag_tables", ROOT / "scripts" / "flag_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flag_tables = _script()


def _listed(path: str, prog: str) -> list[str]:
    """The first cell of every row of ``prog``'s table in ``path``."""
    text = (ROOT / path).read_text("utf-8")
    begin = flag_tables.BEGIN.format(prog=prog)
    assert text.count(begin) == 1, f"{path}: no single table of {prog}"
    body = text.split(begin, 1)[1].split(flag_tables.END, 1)[0]
    return [line.split("|")[1].strip() for line in body.strip().splitlines()[2:]]


def test_every_table_is_current() -> None:
    assert flag_tables.main(["--check"]) == 0, "stale: run python scripts/flag_tables.py"


@pytest.mark.parametrize("prog", sorted(flag_tables.DOCS))
def test_each_table_lists_every_option_help_shows_and_no_old_spelling(prog: str) -> None:
    with flag_tables._no_environment():
        parser = flag_tables.parsers()[prog]()
    shown = [
        a.option_strings
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]
    for path in flag_tables.DOCS[prog]:
        cells = _listed(path, prog)
        assert [re.findall(r"`(--[a-z-]+)", cell) for cell in cells] == shown, path
        assert "`--http-address HOST:PORT`" in cells and "`--log-format {text,json}`" in cells
        for old in ("--metrics-port", "--bind-address", "--port ", "--health-port"):
            assert not any(cell.startswith(f"`{old}") for cell in cells), (path, old)


def test_a_changed_parser_makes_the_check_fail_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = flag_tables.parsers

    def with_one_more() -> dict[str, Callable[[], argparse.ArgumentParser]]:
        made: dict[str, Callable[[], argparse.ArgumentParser]] = real()
        extender = made["enflame-scheduler-extender"]

        def grown() -> argparse.ArgumentParser:
            parser: argparse.ArgumentParser = extender()
            parser.add_argument(
                "--brand-new", help="a new option [env ENFLAME_BRAND_NEW; default 1]"
            )
            return parser

        made["enflame-scheduler-extender"] = grown
        return made

    before = {
        path: (ROOT / path).read_bytes() for docs in flag_tables.DOCS.values() for path in docs
    }
    monkeypatch.setattr(flag_tables, "parsers", with_one_more)
    assert flag_tables.main(["--check"]) == 1
    said = capsys.readouterr().out
    assert "docs/scheduler-extender.md: stale" in said
    assert "docs/scheduler-extender.zh-CN.md: stale" in said
    assert "docs/dra.md" not in said
    assert before == {path: (ROOT / path).read_bytes() for path in before}
    text = flag_tables.expected()["docs/scheduler-extender.md"]
    assert "| `--brand-new BRAND_NEW` | `ENFLAME_BRAND_NEW` | 1 | a new option |" in text


def test_a_doc_without_its_markers_is_named() -> None:
    parser = argparse.ArgumentParser(prog="x")
    with pytest.raises(ValueError, match="no marker"):
        flag_tables.render("no table here\n", "enflame-dra-plugin", parser, "en")
    begin = flag_tables.BEGIN.format(prog="enflame-dra-plugin")
    with pytest.raises(ValueError, match="no '<!-- end of options -->'"):
        flag_tables.render(f"{begin}\n| a |\n", "enflame-dra-plugin", parser, "en")
