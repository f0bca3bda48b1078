"""enflame-container-runtime in front of the real runc on the simulated vendor 8-card node."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from typing import IO, Any

import pytest

from enflame_gcu import naming
from enflame_gcu.shim import config as runtime_config
from tests.e2e.conftest import Node, gcu_nodes
from tests.shim.schemas import assert_valid_oci

pytestmark = pytest.mark.runc
ENV = naming.VISIBLE_DEVICES_ENV
LS_GCU = ["sh", "-c", "ls /dev/gcu*"]


def spec_bytes(bundle: str) -> bytes:
    with open(os.path.join(bundle, "config.json"), "rb") as handle:
        return handle.read()


def test_two_cards_show_up_with_gcuctl(node: Node) -> None:
    bundle = node.bundle(LS_GCU, env=[f"{ENV}=0,1"])
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]
    with open(os.path.join(bundle, "config.json"), encoding="utf-8") as handle:
        assert_valid_oci(json.load(handle))


def test_injected_nodes_pass_the_device_cgroup(node: Node) -> None:
    # No driver serves major 238 here: an allowed open fails with ENXIO ("No such device or
    # address"); one the device cgroup denies fails with EPERM ("Operation not permitted").
    probe = ["sh", "-c", "cat /dev/gcu3 2>&1; cat /dev/gcuctl 2>&1; true"]
    result = node.run(node.bundle(probe, env=[f"{ENV}=3"]))
    assert result.stdout.decode().count("No such device or address") == 2, result.stdout
    assert b"Operation not permitted" not in result.stdout


def test_without_an_allow_rule_runc_denies_the_node(node: Node) -> None:
    # The fact the runtime is built on (SPEC §5): linux.devices alone is not enough for runc.
    def add_node_only(spec: dict[str, object]) -> None:
        spec["linux"]["devices"] = [  # type: ignore[index]
            {"path": "/dev/gcu3", "type": "c", "major": 238, "minor": 3, "fileMode": 0o666}
        ]

    bundle = node.bundle(["sh", "-c", "cat /dev/gcu3 2>&1; true"], edit=add_node_only)
    result = node.run(bundle, through_wrapper=False)
    assert b"Operation not permitted" in result.stdout, result.stdout


def test_all_gives_eight_cards_and_gcuctl(node: Node) -> None:
    result = node.run(node.bundle(LS_GCU, env=[f"{ENV}=all"]))
    assert result.returncode == 0, result.stderr
    expected = [f"/dev/gcu{n}" for n in range(8)] + ["/dev/gcuctl"]
    assert result.stdout.decode().split() == expected


@pytest.mark.parametrize("env", [[], [f"{ENV}=void"]], ids=["unset", "void"])
def test_unset_and_void_get_nothing_and_spec_is_byte_identical(node: Node, env: list[str]) -> None:
    bundle = node.bundle(["ls", "/dev"], env=env)
    before = spec_bytes(bundle)
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    assert gcu_nodes(result.stdout) == []
    assert b"null" in result.stdout  # the container did run and list /dev
    assert spec_bytes(bundle) == before


def test_unknown_card_aborts_before_runc_runs(node: Node) -> None:
    bundle = node.bundle(["ls", "/dev"], env=[f"{ENV}=9"])
    before = spec_bytes(bundle)
    cid = node.new_id()
    result = node.wrapped("run", "--bundle", bundle, cid)
    assert result.returncode != 0
    assert result.stdout == b""
    message = result.stderr.decode()
    assert f"{ENV}='9' asks for '9', which is not on this node" in message
    assert "cards on this node: 0 (0000:11:00.0), 1 (0000:12:00.0)" in message
    assert not node.exists(cid)
    assert not os.path.exists(os.path.join(node.state, cid))
    assert spec_bytes(bundle) == before
    with open(node.log, encoding="utf-8") as handle:
        assert "which is not on this node" in json.loads(handle.readline())["msg"]


def test_volume_mount_request(node: Node) -> None:
    mounts = [
        {
            "destination": f"{naming.VOLUME_MOUNT_DIR}/gcu2",
            "type": "bind",
            "source": "/dev/null",
            "options": ["rbind", "ro"],
        }
    ]
    bundle = node.bundle(LS_GCU, env=[f"{ENV}={naming.VOLUME_MOUNT_DIR}"], mounts=mounts)
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["/dev/gcu2", "/dev/gcuctl"]


def test_cdi_annotation_request(node: Node) -> None:
    bundle = node.bundle(LS_GCU, annotations={naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=5"})
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["/dev/gcu5", "/dev/gcuctl"]


def test_unprivileged_env_ignored_when_option_false(node: Node) -> None:
    node.ignore_envvar_when_unprivileged()
    unprivileged = node.bundle(["ls", "/dev"], env=[f"{ENV}=all"])
    result = node.run(unprivileged)
    assert result.returncode == 0, result.stderr
    assert gcu_nodes(result.stdout) == []
    privileged = node.bundle(["ls", "/dev"], env=[f"{ENV}=0"], privileged=True)
    result = node.run(privileged)
    assert result.returncode == 0, result.stderr
    assert gcu_nodes(result.stdout) == ["gcu0", "gcuctl"]


def test_create_start_state_delete_lifecycle_through_the_wrapper(node: Node) -> None:
    # The containerd shim's sequence: create (edited), then start/state/delete (pass-through).
    bundle = node.bundle(LS_GCU, env=[f"{ENV}=6,7"])
    cid = node.new_id()
    out_path = os.path.join(node.workdir, "container.out")
    with open(out_path, "wb") as out:
        created = launch_create(node, bundle, cid, out)
    with open(out_path, encoding="utf-8") as handle:
        assert created.returncode == 0, handle.read()
    wrapped_state = node.wrapped("state", cid)
    plain_state = node.plain("state", cid)
    assert wrapped_state.returncode == plain_state.returncode == 0
    assert json.loads(wrapped_state.stdout) == json.loads(plain_state.stdout)
    assert json.loads(wrapped_state.stdout)["status"] == "created"
    assert node.wrapped("start", cid).returncode == 0
    node.wait_stopped(cid)
    deleted = node.wrapped("delete", cid)
    assert deleted.returncode == 0, deleted.stderr
    assert not node.exists(cid)
    with open(out_path, "rb") as handle:
        assert handle.read().decode().split() == ["/dev/gcu6", "/dev/gcu7", "/dev/gcuctl"]


def launch_create(
    node: Node, bundle: str, cid: str, out: IO[bytes]
) -> subprocess.CompletedProcess[bytes]:
    """``create`` with the container's stdio on a file (a pipe would stay open until it exits)."""
    env = dict(os.environ, **{runtime_config.PATH_ENV: node.config})
    pid_file = os.path.join(node.workdir, f"{cid}.pid")
    args = node.runtime_args("create", "--bundle", bundle, "--pid-file", pid_file, cid)
    # stderr goes to the file too: the container inherits it and holds it until it exits.
    return subprocess.run(
        [node.wrapper, *args], stdout=out, stderr=out, env=env, check=False, timeout=30
    )


# --- strict mode: only what the device plugin sends counts (issue 10) ----------------------

PLUGIN_MOUNT_OPTIONS = ["rbind", "rprivate", "ro"]  # what containerd writes for Allocate's mount


def device_mount(name: str, source: str = "/dev/null", **fields: Any) -> dict[str, Any]:
    mount: dict[str, Any] = {
        "destination": f"{naming.VOLUME_MOUNT_DIR}/{name}",
        "type": "bind",
        "source": source,
        "options": PLUGIN_MOUNT_OPTIONS,
    }
    mount.update(fields)
    return mount


def runtime_log(node: Node) -> str:
    with open(os.path.join(node.workdir, "runtime.log"), encoding="utf-8") as handle:
        return handle.read()


def forged_mounts(workdir: str) -> dict[str, dict[str, Any]]:
    """Mounts a pod author can write that are not the plugin's /dev/null bind."""
    directory = os.path.join(workdir, "emptydir")
    os.makedirs(directory, exist_ok=True)
    fake_null = os.path.join(workdir, "null")  # a real char device 1:3, but not /dev/null
    if not os.path.exists(fake_null):
        os.mknod(fake_null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.symlink("/dev/null", os.path.join(workdir, "null-link"))
    return {
        "emptyDir": device_mount("all", directory),
        "hostPath dir": device_mount("all", "/etc"),
        "tmpfs": device_mount("all", "tmpfs", type="tmpfs", options=["nosuid", "nodev"]),
        "char 1:3 elsewhere": device_mount("all", fake_null),
        "symlink to /dev/null": device_mount("all", os.path.join(workdir, "null-link")),
        "/dev/../dev/null": device_mount("all", "/dev/../dev/null"),
        "/dev/null read-write": device_mount("all", options=["rbind", "rprivate", "rw"]),
        "/dev/null without ro": device_mount("all", options=["rbind"]),
    }


FORGED = [
    "emptyDir",
    "hostPath dir",
    "tmpfs",
    "char 1:3 elsewhere",
    "symlink to /dev/null",
    "/dev/../dev/null",
    "/dev/null read-write",
    "/dev/null without ro",
]


@pytest.mark.parametrize("kind", FORGED)
def test_strict_mode_ignores_a_device_mount_that_is_not_the_plugins(node: Node, kind: str) -> None:
    node.ignore_envvar_when_unprivileged()
    mount = forged_mounts(node.workdir)[kind]
    bundle = node.bundle(["ls", "/dev"], env=[f"{ENV}=all"], mounts=[mount])
    before = spec_bytes(bundle)
    cid = node.new_id()
    result = node.wrapped("run", "--bundle", bundle, cid)
    assert result.returncode == 0, result.stderr
    assert gcu_nodes(result.stdout) == []
    assert b"null" in result.stdout  # the container did run and list /dev
    assert spec_bytes(bundle) == before
    warnings = [line for line in runtime_log(node).splitlines() if "WARNING" in line]
    ignored = [line for line in warnings if f"{naming.VOLUME_MOUNT_DIR}/all" in line]
    assert len(ignored) == 1, warnings
    assert cid in ignored[0]


def test_strict_mode_grants_the_plugins_mount_only(node: Node) -> None:
    node.ignore_envvar_when_unprivileged()
    genuine = device_mount("gcu2")
    forged = forged_mounts(node.workdir)["emptyDir"]
    bundle = node.bundle(LS_GCU, env=[f"{ENV}={naming.VOLUME_MOUNT_DIR}"], mounts=[genuine, forged])
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["/dev/gcu2", "/dev/gcuctl"]


@pytest.mark.parametrize(
    "strategies",
    [("envvar",), ("volume-mounts",), ("cdi-annotations",), ("volume-mounts", "cdi-cri")],
    ids="+".join,
)
def test_cards_are_listed_in_index_order_whatever_the_kubelets_order(
    node: Node, strategies: tuple[str, ...]
) -> None:
    # A real kubelet asked Allocate for "1,0": logical card 0 must still be /dev/gcu0.
    from enflame_gcu import devices
    from enflame_gcu.container_toolkit import cdi
    from enflame_gcu.device_plugin import config as plugin_config
    from enflame_gcu.device_plugin import service
    from enflame_gcu.device_plugin import state as plugin_state
    from tests.e2e import kubelet_emulation

    if "envvar" not in strategies:
        node.ignore_envvar_when_unprivileged()
    snapshot = plugin_state.snapshot_for(devices.discover(node.root), "topology")
    config = plugin_config.PluginConfig(host_root=node.root, device_list_strategy=strategies)
    response = service.container_response(
        plugin_state.grants(snapshot, [["gcu5", "gcu1", "gcu0"]], config)[0]
    )
    assert [device.name for device in response.cdi_devices] in (
        [],
        [f"{naming.CDI_VENDOR}/gcu={n}" for n in (0, 1, 5)],
    )
    specs = [named.spec for named in cdi.build_specs(devices.discover(node.root))]
    bundle = node.bundle(
        ["sh", "-c", f"echo ${ENV}; ls /dev/gcu*"],
        edit=lambda spec: kubelet_emulation.apply_response(spec, response, node.root, specs),
    )
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    visible, *nodes = result.stdout.decode().split()
    assert visible == "0,1,5"
    assert nodes == ["/dev/gcu0", "/dev/gcu1", "/dev/gcu5", "/dev/gcuctl"]


def test_env_request_in_any_order_is_listed_in_index_order(node: Node) -> None:
    result = node.run(node.bundle(["sh", "-c", f"echo ${ENV}"], env=[f"{ENV}=7,gcu2,0"]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["0,2,7"]


def test_a_card_unbound_after_preparing_is_not_granted_though_its_node_stays(node: Node) -> None:
    from enflame_gcu import devices
    from enflame_gcu.container_toolkit import cdi
    from tests.e2e.conftest import write_runtime_config

    prepared = os.path.join(node.workdir, "prepared-edits.json")
    assert cdi.refresh_prepared_edits(prepared, devices.discover(node.root))
    write_runtime_config(
        node.config,
        runtimes=[node.tools.runc],
        root=node.root,
        prepared_edits=prepared,
        log_file=os.path.join(node.workdir, "runtime.log"),
    )
    assert node.run(node.bundle(LS_GCU, env=[f"{ENV}=2"])).returncode == 0  # fast path works
    card = devices.discover(node.root).card_by_name()["gcu2"]
    function = os.path.realpath(os.path.join(node.root, naming.PCI_DEVICES[1:], card.bdf))
    shutil.rmtree(os.path.join(function, card.driver_dir))  # unbind; /dev/gcu2 stays
    assert os.path.exists(os.path.join(node.root, "dev", "gcu2"))
    refused = node.run(node.bundle(LS_GCU, env=[f"{ENV}=2"]))
    assert refused.returncode != 0
    assert b"asks for '2', which is not on this node" in refused.stderr
    every = node.run(node.bundle(LS_GCU, env=[f"{ENV}=all"]))
    assert every.returncode == 0, every.stderr
    expected = [f"/dev/gcu{n}" for n in (0, 1, 3, 4, 5, 6, 7)] + ["/dev/gcuctl"]
    assert every.stdout.decode().split() == expected
    assert "sysfs changed since the edits were prepared" in runtime_log(node)


# --- every create error is reported, never a traceback (issue 10) ----------------------------


def _deeply_nested(bundle: str) -> None:
    path = os.path.join(bundle, "config.json")
    with open(path, "rb") as handle:
        raw = handle.read().rstrip()
    depth = 100_000
    with open(path, "wb") as handle:
        handle.write(raw[:-1] + b',"x-deep":' + b"[" * depth + b"]" * depth + b"}")


def _capabilities_list(spec: dict[str, Any]) -> None:
    spec["process"]["capabilities"] = ["CAP_SYS_ADMIN"]


HOSTILE: dict[str, dict[str, Any]] = {
    "superscript two": {"env": [f"{ENV}=²"]},
    "gcu superscript two": {"env": [f"{ENV}=gcu²"]},
    "Arabic-Indic three": {"env": [f"{ENV}=٣"]},
    "full-width three": {"env": [f"{ENV}=0,３"]},
    "huge index": {"env": [f"{ENV}={'9' * 5000}"]},
    "CDI Arabic-Indic three": {"annotations": {naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=٣"}},
    "newline in env": {"env": [f"{ENV}=0\nINFO forged line"]},
    "newline in mount": {"mounts": [device_mount("gcu1\nINFO forged line")]},
    # strict: only then does the runtime read the capabilities (is CAP_SYS_ADMIN kept?)
    "capabilities list": {"env": [f"{ENV}=0"], "edit": _capabilities_list, "strict": True},
    "lone surrogate": {"env": [f"{ENV}=0", "X=\ud800"]},
    "deeply nested": {"env": [f"{ENV}=0"], "raw": _deeply_nested},
}
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} pid=\d+ [A-Z]+ ")


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_request_is_reported_everywhere_and_runc_never_runs(
    node: Node, case: str
) -> None:
    spec = dict(HOSTILE[case])
    raw_edit = spec.pop("raw", None)
    if spec.pop("strict", False):
        node.ignore_envvar_when_unprivileged()
    bundle = node.bundle(["ls", "/dev"], **spec)
    if raw_edit:
        raw_edit(bundle)
    before = spec_bytes(bundle)
    cid = node.new_id()
    result = node.wrapped("run", "--bundle", bundle, cid)
    assert result.returncode == 1
    assert result.stdout == b""
    # stderr: one line, no traceback
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    [line] = stderr.splitlines()
    assert line.startswith(f"enflame-container-runtime: run {cid} ")
    assert "runc was not run" in line
    # runc's --log, in its --log-format (json): the same message
    with open(node.log, encoding="utf-8") as handle:
        [entry] = [json.loads(text) for text in handle.read().splitlines()]
    assert entry["level"] == "error"
    assert entry["msg"] == line
    assert not node.exists(cid)
    assert not os.path.exists(os.path.join(node.state, cid))
    assert spec_bytes(bundle) == before
    assert sorted(os.listdir(bundle)) == ["config.json", "rootfs"]
    # the runtime log: the same message, and every line is one escaped line
    text = runtime_log(node)
    assert all(LOG_LINE.match(log_line) for log_line in text.splitlines()), text
    assert f"ERROR {line.split(': ', 1)[1]}" in text


def test_a_forged_mount_with_a_newline_is_logged_on_one_escaped_line(node: Node) -> None:
    node.ignore_envvar_when_unprivileged()
    forged = device_mount("all\nWARNING container x: ignoring nothing", source="/etc")
    result = node.run(node.bundle(["ls", "/dev"], mounts=[forged]))
    assert result.returncode == 0, result.stderr
    assert gcu_nodes(result.stdout) == []
    text = runtime_log(node)
    assert all(LOG_LINE.match(log_line) for log_line in text.splitlines()), text
    assert "all\\nWARNING container x" in text
