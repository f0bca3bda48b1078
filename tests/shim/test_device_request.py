"""The ENFLAME_VISIBLE_DEVICES grammar, volume-mount and CDI annotation requests, resolution."""

from __future__ import annotations

import os

import pytest

from enflame_gcu import devices, naming
from enflame_gcu.errors import InvalidRequestError
from enflame_gcu.shim import request as device_request
from tests.shim.conftest import make_spec, plugin_mount

ENV = naming.VISIBLE_DEVICES_ENV


@pytest.mark.parametrize(
    ("value", "kind", "tokens"),
    [
        ("", "void", ()),
        ("   ", "void", ()),
        ("void", "void", ()),
        ("VOID", "void", ()),
        ("none", "none", ()),
        (" None ", "none", ()),
        ("all", "list", ("all",)),
        ("0,1", "list", ("gcu0", "gcu1")),
        (" 0 , 1 ,", "list", ("gcu0", "gcu1")),
        ("gcu3,GCU4", "list", ("gcu3", "gcu4")),
        ("vgcu5", "list", ("vgcu5",)),
        ("007", "list", ("gcu7",)),
        ("0000:11:00.0", "list", ("0000:11:00.0",)),
        ("12:00.0, 0", "list", ("0000:12:00.0", "gcu0")),
        ("/var/run/enflame-container-devices", "mounts", ()),
        ("/var/run/enflame-container-devices/", "mounts", ()),
    ],
)
def test_env_grammar(value: str, kind: str, tokens: tuple[str, ...]) -> None:
    assert device_request.parse_visible_devices(value, "env") == (kind, tokens)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu0", "'gpu0' is not a device id; use void, none, all"),
        ("0-3", "'0-3' is not a device id"),
        ("all,0", "'all' cannot be combined"),
        ("-1", "'-1' is not a device id"),
        ("0000:11:00", "is not a device id"),
    ],
)
def test_bad_syntax_names_the_request(value: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        device_request.parse_visible_devices(value, f"{ENV}={value!r}")


def test_unset_and_void_want_no_edits() -> None:
    assert not device_request.from_spec(make_spec(), True).wants_edits
    assert not device_request.from_spec(make_spec(env=[f"{ENV}=void"]), True).wants_edits
    assert not device_request.from_spec(make_spec(env=[f"{ENV}="]), True).wants_edits


def test_none_wants_edits_without_devices() -> None:
    request = device_request.from_spec(make_spec(env=[f"{ENV}=none"]), True)
    assert request.wants_edits
    assert request.none_requested
    assert request.sources == ()


def test_last_definition_of_the_env_var_wins() -> None:
    spec = make_spec(env=[f"{ENV}=all", f"{ENV}=2"])
    (source,) = device_request.from_spec(spec, True).sources
    assert source.tokens == ("gcu2",)


def test_volume_mounts_and_annotations_are_requests() -> None:
    spec = make_spec(
        env=[f"{ENV}={naming.VOLUME_MOUNT_DIR}"],
        mounts=[
            plugin_mount("gcu2"),
            plugin_mount("3"),
        ],
        annotations={
            naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=4,nvidia.com/gpu=0",
            "cdi.k8s.io/other": "enflame.com/vgcu=9",
            "unrelated": "enflame.com/gcu=5",
        },
    )
    request = device_request.from_spec(spec, True)
    tokens = [token for source in request.sources for token in source.tokens]
    assert tokens == ["gcu2", "gcu3", "gcu4", "vgcu9"]


def test_bad_cdi_name_is_an_error() -> None:
    spec = make_spec(annotations={naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=x1"})
    with pytest.raises(InvalidRequestError, match=r"names no enflame\.com/gcu device"):
        device_request.from_spec(spec, True)


def test_env_is_ignored_for_unprivileged_when_not_accepted() -> None:
    spec = make_spec(env=[f"{ENV}=all"])
    request = device_request.from_spec(spec, accept_envvar_when_unprivileged=False)
    assert not request.wants_edits
    assert "lacks CAP_SYS_ADMIN" in request.ignored[0]


def test_env_counts_for_privileged_when_not_accepted() -> None:
    spec = make_spec(env=[f"{ENV}=0"], privileged=True)
    request = device_request.from_spec(spec, accept_envvar_when_unprivileged=False)
    assert [s.tokens for s in request.sources] == [("gcu0",)]


def test_volume_mounts_count_when_env_is_not_accepted() -> None:
    spec = make_spec(
        env=[f"{ENV}=all"],
        mounts=[plugin_mount("gcu1")],
    )
    request = device_request.from_spec(spec, accept_envvar_when_unprivileged=False)
    assert [s.tokens for s in request.sources] == [("gcu1",)]


def resolve(vendor_node: str, value: str) -> list[str]:
    request = device_request.from_spec(make_spec(env=[f"{ENV}={value}"]), True)
    return device_request.resolve(request, devices.discover(vendor_node))


def test_resolution_by_minor_name_and_bus_id_in_index_order(vendor_node: str) -> None:
    assert resolve(vendor_node, "1, gcu0,0000:19:00.0,15:00.0,1") == [
        "gcu0",
        "gcu1",
        "gcu2",
        "gcu3",
    ]
    assert resolve(vendor_node, "all") == [f"gcu{n}" for n in range(8)]


def test_unknown_card_names_request_and_existing_cards(vendor_node: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        resolve(vendor_node, "0,9")
    message = str(caught.value)
    assert f"{ENV}='0,9' asks for '9', which is not on this node" in message
    assert "cards on this node: 0 (0000:11:00.0), 1 (0000:12:00.0)" in message
    assert "7 (0000:a4:00.0)" in message


def test_all_on_a_node_without_cards_is_an_error(tmp_path: object) -> None:
    request = device_request.from_spec(make_spec(env=[f"{ENV}=all"]), True)
    with pytest.raises(InvalidRequestError, match="asks for all cards but none is usable"):
        device_request.resolve(request, devices.discover(str(tmp_path)))


def _with(**fields: object) -> dict[str, object]:
    mount = plugin_mount("all")
    mount.update(fields)
    return mount


NOT_THE_PLUGINS_MOUNT = {
    "emptyDir": (_with(source="/var/lib/kubelet/pods/x/volumes/empty-dir/v"), "its source is"),
    "hostPath dir": (_with(source="/etc"), "its source is '/etc'"),
    "tmpfs": (_with(type="tmpfs", source="tmpfs", options=["nosuid"]), "its source is"),
    "alias of /dev/null": (_with(source="/dev/../dev/null"), "its source is"),
    "no source": ({"destination": f"{naming.VOLUME_MOUNT_DIR}/all"}, "its source is None"),
    "read-write": (_with(options=["rbind", "rw"]), "not read-only"),
    "ro then rw": (_with(options=["ro", "rbind", "rw"]), "not read-only"),
    "no options": (_with(options=None), "not read-only"),
    "not a bind": (_with(type="devtmpfs"), "not a bind"),
    "no type, no bind option": (_with(type=None, options=["ro"]), "not a bind"),
    "options not strings": (_with(options=[{"ro": True}]), "not a list of strings"),
}


@pytest.mark.parametrize(
    ("mount", "reason"), list(NOT_THE_PLUGINS_MOUNT.values()), ids=list(NOT_THE_PLUGINS_MOUNT)
)
@pytest.mark.parametrize("accept_env", [True, False], ids=["lenient", "strict"])
def test_a_device_mount_counts_only_in_the_plugins_shape(
    mount: dict[str, object], reason: str, accept_env: bool
) -> None:
    request = device_request.from_spec(make_spec(mounts=[mount]), accept_env)
    assert not request.wants_edits
    [ignored] = request.ignored
    assert ignored.startswith(f"volume mount {naming.VOLUME_MOUNT_DIR}/all (")
    assert reason in ignored


@pytest.mark.parametrize(
    "mount",
    [
        plugin_mount("gcu1"),
        _with(destination=f"{naming.VOLUME_MOUNT_DIR}/gcu1", options=["ro", "rbind", "rprivate"]),
        _with(destination=f"{naming.VOLUME_MOUNT_DIR}/gcu1", type="none", options=["bind", "ro"]),
        _with(destination=f"{naming.VOLUME_MOUNT_DIR}/gcu1", type=None, options=["rbind", "ro"]),
    ],
    ids=["containerd", "cri-o", "type none", "no type"],
)
def test_the_plugins_mount_counts_as_engines_write_it(mount: dict[str, object]) -> None:
    request = device_request.from_spec(make_spec(mounts=[mount]), False)
    assert [source.tokens for source in request.sources] == [("gcu1",)]


# Digits of other scripts: str.isdigit() says yes to all of them, int() takes most.
NOT_ASCII_DIGITS = ["²", "٣", "３", "੩", "𝟑", "1٣"]


@pytest.mark.parametrize("digits", NOT_ASCII_DIGITS)
@pytest.mark.parametrize("spelling", ["{}", "gcu{}", "vgcu{}", "GCU{}", "0000:11:00.{}"])
def test_only_ascii_digits_are_indexes_in_the_env_grammar(digits: str, spelling: str) -> None:
    value = spelling.format(digits)
    with pytest.raises(InvalidRequestError, match="is not a device id"):
        device_request.parse_visible_devices(value, f"{ENV}={value!r}")


@pytest.mark.parametrize("value", ["\u00a00", "0\x1c", "\u20030", "ａｌｌ", "all\u0085"])
def test_only_ascii_whitespace_is_ignored_around_items(value: str) -> None:
    with pytest.raises(InvalidRequestError, match="is not a device id"):
        device_request.parse_visible_devices(value, "env")


@pytest.mark.parametrize(
    "value", ["9" * 5000, "gcu" + "1" * 5000, "0000000000007", str(1 << 20), "0000:11:00.8"]
)
def test_oversized_ids_are_not_device_ids(value: str) -> None:
    with pytest.raises(InvalidRequestError, match="is not a device id"):
        device_request.parse_visible_devices(value, "env")


@pytest.mark.parametrize(
    "device", [*NOT_ASCII_DIGITS, "03", "+3", "3_0", "", "-1", "ALL", "gcu3", "3\x00"]
)
def test_cdi_annotation_accepts_only_the_names_our_cdi_specs_define(device: str) -> None:
    notes = {naming.CDI_ANNOTATION_KEY: f"enflame.com/gcu={device}"}
    with pytest.raises(InvalidRequestError, match=r"names no enflame\.com/gcu device"):
        device_request.from_spec(make_spec(annotations=notes), False)


def test_cdi_vgcu_has_no_all() -> None:
    notes = {naming.CDI_ANNOTATION_KEY: "enflame.com/vgcu=all"}
    with pytest.raises(InvalidRequestError, match=r"names no enflame\.com/vgcu device"):
        device_request.from_spec(make_spec(annotations=notes), False)


def test_cdi_annotation_counts_in_strict_mode_and_names_exact_devices(vendor_node: str) -> None:
    notes = {
        "cdi.k8s.io/a": "enflame.com/gcu=5,enflame.com/gcu=1",
        "cdi.k8s.io/b": "ENFLAME.COM/gcu=2,enflame.com/gpu=3,nvidia.com/gpu=all",  # not ours
    }
    request = device_request.from_spec(make_spec(annotations=notes), False)
    assert device_request.resolve(request, devices.discover(vendor_node)) == ["gcu1", "gcu5"]


def test_cdi_annotation_naming_a_missing_card_is_refused(vendor_node: str) -> None:
    notes = {naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=1,enflame.com/gcu=8"}
    request = device_request.from_spec(make_spec(annotations=notes), False)
    with pytest.raises(InvalidRequestError, match="asks for '8', which is not on this node"):
        device_request.resolve(request, devices.discover(vendor_node))


def test_ignored_env_is_not_even_parsed() -> None:
    # Strict mode ignores an unprivileged container's env: an image's odd value cannot fail it.
    request = device_request.from_spec(make_spec(env=[f"{ENV}=gpu0,²"]), False)
    assert not request.wants_edits
    assert "lacks CAP_SYS_ADMIN" in request.ignored[0]


@pytest.mark.parametrize("capabilities", [["CAP_SYS_ADMIN"], "CAP_SYS_ADMIN", 1])
def test_capabilities_of_the_wrong_shape_are_an_error_not_a_crash(capabilities: object) -> None:
    spec = make_spec(env=[f"{ENV}=0"])
    spec["process"]["capabilities"] = capabilities
    with pytest.raises(InvalidRequestError, match=r"process\.capabilities"):
        device_request.from_spec(spec, False)


def test_a_known_but_unusable_card_is_refused_with_its_problem(vendor_node: str) -> None:
    os.unlink(os.path.join(vendor_node, "dev", "gcu3"))
    with pytest.raises(InvalidRequestError) as caught:
        resolve(vendor_node, "1,3")
    message = str(caught.value)
    assert f"{ENV}='1,3' asks for '3', which is not usable (/dev/gcu3 is missing)" in message
    assert "3 (0000:19:00.0, unusable)" in message
