"""Every command the docs and manifests show exists: programs, subcommands, flags, files, targets.

Commands are taken from the shell code blocks and the inline code spans of README.md,
README.zh-CN.md and docs/user-guide*.md (a leading "# " or "$ " is a prompt), and from the
containers of the manifests and the chart. Flags of enflame-ctk and enflame-device-plugin are
looked up in the programs' own argparse parsers (the ones --help prints); the deploy scripts'
flags in their --help text; helm --set keys in the chart's values.yaml; make targets in the
Makefile; repository paths on disk.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.helpers import CHART_DIR, PLUGIN_IMAGE, REPO, YAML_DIR, load_all

DOCS = [
    "README.md",
    "README.zh-CN.md",
    "docs/user-guide.md",
    "docs/user-guide.zh-CN.md",
    "docs/packaging.md",
    "docs/packaging.zh-CN.md",
]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|"}
SCRIPTS = ("deploy/install.sh", "deploy/k8s-config.sh", "deploy/build-image.sh")


def ctk_parser() -> argparse.ArgumentParser:
    from enflame_gcu.container_toolkit import cli

    return cli.build_parser()


def plugin_parser() -> argparse.ArgumentParser:
    from enflame_gcu.device_plugin import main

    return main.build_parser()


PARSERS = {"enflame-ctk": ctk_parser, "enflame-device-plugin": plugin_parser}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def command_problems(program: str, args: list[str]) -> list[str]:
    """What in ``program args`` the program's parser does not know (empty when all is known)."""
    parser = PARSERS[program]()
    chain = [parser]
    problems = []
    skip_value = False
    positional_seen = False
    for token in args:
        if skip_value:
            skip_value = False
            continue
        if token.startswith("-") and token != "-":
            flag = token.split("=", 1)[0]
            action = next(
                (p._option_string_actions[flag] for p in chain if flag in p._option_string_actions),
                None,
            )
            if action is None:
                where = " ".join([program, *[p.prog.split()[-1] for p in chain[1:]]])
                problems.append(f"{where}: no option {flag}")
            elif "=" not in token and action.nargs != 0:
                skip_value = True
            continue
        subs = subcommands(chain[-1])
        if subs is not None and not positional_seen:
            if token in subs:
                chain.append(subs[token])
                continue
            problems.append(f"{chain[-1].prog}: no subcommand {token!r} (has {sorted(subs)})")
            return problems
        positional_seen = True
    return problems


# --- extraction ------------------------------------------------------------------------------


def read(relative: str) -> str:
    with open(os.path.join(REPO, relative), encoding="utf-8") as handle:
        return handle.read()


def shell_lines(text: str) -> Iterator[str]:
    """Lines of shell code blocks (continuations joined, prompts removed) and inline spans."""
    in_block, lang, pending = False, "", ""
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\S*)", line)
        if fence:
            in_block, lang = (not in_block), fence.group(1)
            continue
        if in_block:
            if lang not in SHELL_LANGS:
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield re.sub(r"^\s*[#$]\s+", "", pending + line)
            pending = ""
        else:
            yield from re.findall(r"`([^`\n]+)`", line)


class UnparsableLine(ValueError):
    """A shell line of a doc that shlex cannot split: it is reported, never skipped."""


def commands(text: str) -> Iterator[list[str]]:
    """Every simple command (token list) in the shell lines of a Markdown text.

    Raises UnparsableLine for a line it cannot split, so no command escapes the checks.
    """
    for line in shell_lines(text):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UnparsableLine(f"cannot parse {line!r} as shell: {exc}") from exc
        current: list[str] = []
        for token in [*tokens, ";"]:
            if token in SEPARATORS:
                while current and (current[0] == "sudo" or re.match(r"^\w+=", current[0])):
                    current.pop(0)
                if current:
                    yield current
                current = []
            else:
                current.append(token)


def program_of(token: str) -> str | None:
    name = os.path.basename(token)
    return name if name in PARSERS or name == "enflame-container-runtime" else None


def script_help(script: str) -> str:
    result = subprocess.run(
        ["bash", os.path.join(REPO, script), "--help"], capture_output=True, text=True
    )
    return result.stdout + result.stderr


def values_keys(node: Any, prefix: str = "") -> set[str]:
    keys = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(prefix + key)
            keys |= values_keys(value, f"{prefix}{key}.")
    return keys


def option_lists(text: str) -> Iterator[tuple[str, list[str]]]:
    """(program, flags) for prose paragraphs that point at `<program> --help` and list `--flags`."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for paragraph in re.split(r"\n\s*\n", prose):
        named = {p for p in PARSERS if f"`{p} --help`" in paragraph}
        flags = re.findall(r"`(--[\w-]+)(?:[= ][^`]*)?`", paragraph)
        if len(named) == 1 and flags:
            yield named.pop(), flags


def doc_problems(doc: str) -> list[str]:
    text = read(doc)
    problems = []
    for listed, flags in option_lists(text):
        for flag in flags:
            problems += [
                f"{doc}: {listed} option list: {p}" for p in command_problems(listed, [flag])
            ]
    values = values_keys(load_all(os.path.join(CHART_DIR, "values.yaml"))[0])
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as handle:
        targets = set(re.findall(r"^([\w-]+):", handle.read(), re.MULTILINE))
    try:
        found = list(commands(text))
    except UnparsableLine as exc:
        return [f"{doc}: {exc}"]
    for cmd in found:
        head = cmd[0]
        program = program_of(head)
        if program in PARSERS:
            problems += [
                f"{doc}: `{shlex.join(cmd)}`: {p}" for p in command_problems(program, cmd[1:])
            ]
        script = next((s for s in SCRIPTS if head.endswith(s)), None)
        if script is not None and os.path.exists(os.path.join(REPO, script)):
            usage = script_help(script)
            for flag in (t.split("=", 1)[0] for t in cmd[1:] if t.startswith("--")):
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage):
                    problems.append(f"{doc}: `{shlex.join(cmd)}`: {script} has no {flag}")
        if head == "make":
            problems += [f"{doc}: no make target {t}" for t in cmd[1:] if t not in targets]
        if head == "helm":
            for index, token in enumerate(cmd[:-1]):
                if token == "--set":
                    for pair in cmd[index + 1].split(","):
                        if pair.split("=", 1)[0] not in values:
                            problems.append(f"{doc}: helm --set {pair}: not a chart value")
        for token in cmd:
            is_path = re.match(r"^(deploy|docs|tests|src)/", token) and "*" not in token
            if is_path and not os.path.exists(os.path.join(REPO, token)):
                problems.append(f"{doc}: `{shlex.join(cmd)}`: {token} does not exist")
    return problems


# --- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_in_the_doc_exists(doc: str) -> None:
    assert doc_problems(doc) == []


@pytest.mark.parametrize("doc", DOCS)
def test_doc_shows_the_commands_it_is_about(doc: str) -> None:
    """Guards the test above: it must find the key commands, so an extraction bug cannot pass."""
    found = {" ".join(c[:3]) for c in commands(read(doc))}
    assert "enflame-ctk doctor" in found or any(f.startswith("enflame-ctk doctor") for f in found)
    if "packaging" in doc:
        assert any(f.startswith("helm install") for f in found)
        return
    assert any(f.startswith("kubectl apply -f") for f in found)
    if "user-guide" in doc:
        listed = dict(option_lists(read(doc)))
        assert "--pass-device-specs" in listed["enflame-device-plugin"]


def test_the_checker_catches_unknown_flags_and_subcommands() -> None:
    assert command_problems("enflame-ctk", ["info", "--host-root", "/x", "--json"]) == []
    assert command_problems("enflame-ctk", ["info", "--no-such-flag"]) == [
        "enflame-ctk info: no option --no-such-flag"
    ]
    assert command_problems("enflame-ctk", ["frobnicate"])[0].startswith(
        "enflame-ctk: no subcommand 'frobnicate'"
    )
    text = "```bash\n# enflame-ctk sim create /tmp/n --topology vendor-8card --bogus\n```\n"
    assert [c[:3] for c in commands(text)] == [["enflame-ctk", "sim", "create"]]


def test_a_line_that_cannot_be_parsed_fails_instead_of_being_skipped() -> None:
    text = "```bash\nenflame-ctk info\necho 'unclosed\n```\n"
    with pytest.raises(UnparsableLine, match='cannot parse "echo \'unclosed" as shell'):
        list(commands(text))


def test_readme_set_up_is_exactly_make_demo_then_make_test() -> None:
    for readme in ("README.md", "README.zh-CN.md"):
        text = read(readme)
        first_section = text.split("\n## ", 2)[1]
        blocks = re.findall(r"```\w*\n(.*?)```", first_section, re.DOTALL)
        assert blocks == ["make demo\nmake test\n"], readme
        assert "Debian 12" in first_section


def manifest_commands() -> Iterator[tuple[str, str, list[str]]]:
    """(file, program, args) for every container of the static manifests."""
    for directory, _, files in os.walk(YAML_DIR):
        for name in sorted(files):
            path = os.path.join(directory, name)
            for doc in load_all(path):
                spec = doc.get("spec", {})
                pod = spec.get("template", {}).get("spec", spec)
                for container in pod.get("containers", []):
                    where = os.path.relpath(path, REPO)
                    if container["image"].startswith(PLUGIN_IMAGE + ":"):
                        yield where, "enflame-device-plugin", container.get("args", [])
                    elif container.get("command", [""])[0] in PARSERS:
                        yield where, container["command"][0], container["command"][1:]


def test_every_manifest_argument_exists() -> None:
    checked = list(manifest_commands())
    assert len(checked) == 6  # five plugin variants + the toolkit installer
    problems = [
        f"{where}: {p}" for where, prog, args in checked for p in command_problems(prog, args)
    ]
    assert problems == []


def test_every_chart_argument_exists() -> None:
    with open(os.path.join(CHART_DIR, "templates", "daemonset-device-plugin.yaml")) as handle:
        plugin_flags = re.findall(r"^\s+- (--[\w-]+)", handle.read(), re.MULTILINE)
    with open(os.path.join(CHART_DIR, "templates", "daemonset-container-toolkit.yaml")) as handle:
        toolkit_words = re.findall(r"^\s+- ([\w/-]+)$", handle.read(), re.MULTILINE)
    assert "--pass-device-specs" in plugin_flags
    assert toolkit_words[:2] == ["enflame-ctk", "install"]
    problems = command_problems("enflame-device-plugin", plugin_flags)
    problems += command_problems("enflame-ctk", toolkit_words[1:])
    assert problems == []
