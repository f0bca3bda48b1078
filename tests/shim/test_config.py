"""The runtime config: the flat TOML subset, defaults, validation and the template."""

from __future__ import annotations

import os
import sys
from importlib import resources

import pytest

from enflame_gcu.errors import ConfigError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import toml_subset

# The reference the built-in parser is compared with: tomllib, or tomlkit before 3.11.
if sys.version_info >= (3, 11):
    import tomllib

    reference_loads = tomllib.loads
else:
    import tomlkit

    def reference_loads(text: str) -> dict[str, object]:
        return tomlkit.parse(text).unwrap()


def template() -> str:
    return resources.files("enflame_gcu").joinpath("data/config.toml").read_text("utf-8")


def test_template_parses_the_same_as_tomllib_and_gives_defaults() -> None:
    text = template()
    assert toml_subset.parse(text) == reference_loads(text)
    config = runtime_config.from_values(toml_subset.parse(text))
    default = runtime_config.RuntimeConfig()
    assert repr(config) == repr(default)


@pytest.mark.parametrize(
    "text",
    [
        "a = \"x\" # comment\nb = 'lit\\eral'\n",
        "n = -12\nflag = false\n",
        'arr = [\n  "a", # one\n  "b",\n]\n',
        '"quoted key" = "\\u00e9\\t\\"q\\""\n',
        "empty = []\n",
    ],
)
def test_subset_matches_tomllib(text: str) -> None:
    assert toml_subset.parse(text) == reference_loads(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[table]\n", "line 1: tables are not supported"),
        ('a = "x"\na = "y"\n', "line 2: key 'a' is defined twice"),
        ("a = 1979-05-27\n", "line 1: expected a value"),
        ('a = "open\n', "line 1: string is not closed"),
        ("a = [1, 2\n", "array is not closed"),
        ("a.b = 1\n", "dotted keys"),
        ('a = "x" b\n', "unexpected text after the value"),
    ],
)
def test_outside_the_subset_is_rejected_with_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        toml_subset.parse(text, "cfg")


def test_missing_default_file_means_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime_config.PATH_ENV, raising=False)
    monkeypatch.setattr(runtime_config, "DEFAULT_PATH", "/nonexistent/config.toml")
    assert runtime_config.load().runtimes == ("runc", "crun")


def test_missing_named_file_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime_config.PATH_ENV, "/nonexistent/x.toml")
    with pytest.raises(ConfigError, match=r"/nonexistent/x\.toml does not exist"):
        runtime_config.load()


def test_values_are_read(write_config: object) -> None:
    path = write_config(  # type: ignore[operator]
        runtimes="/usr/sbin/runc",
        root="/host",
        accept_envvar_when_unprivileged=False,
        log_level="DEBUG",
        mounts=["/usr/bin/efsmi", "/opt/lib/libefml.so:/usr/lib/libefml.so"],
        env=["EF_MODE=1"],
    )
    config = runtime_config.load(path)
    assert config.runtimes == ("/usr/sbin/runc",)
    assert config.root == "/host"
    assert config.accept_envvar_when_unprivileged is False
    assert config.log_level == "debug"
    assert config.mounts == (
        ("/usr/bin/efsmi", "/usr/bin/efsmi"),
        ("/opt/lib/libefml.so", "/usr/lib/libefml.so"),
    )
    assert config.env == (("EF_MODE", "1"),)
    assert config.log_file == os.path.join(os.path.dirname(path), "runtime.log")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"runtime": ["runc"]}, "unknown key.*runtime.*valid keys"),
        ({"runtimes": []}, "at least one"),
        ({"root": "relative"}, "absolute"),
        ({"accept-envvar-when-unprivileged": "no"}, "true or false"),
        ({"log-level": "loud"}, "log-level must be one of"),
        ({"mounts": ["relative:/x"]}, "mounts entry"),
        ({"env": ["NOEQUALS"]}, "KEY=VALUE"),
        ({"cdi-spec-dirs": "/etc/cdi"}, "array of strings"),
        ({"prepared-edits": "relative.json"}, "prepared-edits must be an absolute path"),
        ({"prepared-edits": ["/x"]}, "prepared-edits must be a string"),
    ],
)
def test_invalid_values_are_named(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        runtime_config.from_values(values, "cfg.toml")


def test_prepared_edits_defaults_to_the_documented_path_and_can_be_turned_off() -> None:
    assert runtime_config.from_values({}).prepared_edits == runtime_config.DEFAULT_PREPARED_EDITS
    assert runtime_config.from_values({"prepared-edits": ""}).prepared_edits == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('# c\nruntimes = ["runc"]\nfuture = 1\n', r"line 3: unknown key\(s\) future"),
        ('root = "/"\n\nlog-level = "loud"\n', "line 3: log-level must be one of"),
        ('root = "rel"\n', "line 1: root must be an absolute path"),
        ("runtimes = []\n", "line 1: runtimes must name at least one"),
        ('env = ["A=1",\n  "NOEQ"]\n', "line 1: env entry 'NOEQ' must be KEY=VALUE"),
        ("x = ²\n", "line 1: expected a value"),  # not read as the integer 2
        ('root = "/"\nn = 1٣\n', "line 2: expected a value"),
    ],
)
def test_every_config_error_names_the_file_and_line(
    tmp_path: os.PathLike[str], text: str, message: str
) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    with pytest.raises(ConfigError, match=f"^{path} {message}"):
        runtime_config.load(path)


def test_a_config_that_is_not_utf8_names_the_line(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "wb") as handle:
        handle.write(b'root = "/"\nlog-file = "/var/log/\xff"\n')
    with pytest.raises(ConfigError, match=r"line 2: the file is not UTF-8 \(byte 0xff\)"):
        runtime_config.load(path)
