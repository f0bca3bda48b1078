"""The tier's own pieces, checked in ``make test`` (no kubelet needed): the host ledger that
undoes what a run changed, the OCI image writer and the PodResources client."""

from __future__ import annotations

import json
import os
import tarfile
import time
from concurrent import futures

import grpc
import pytest

from enflame_gcu._proto import podresources_v1_pb2
from enflame_gcu.errors import KubeletApiError
from enflame_gcu.simulation.testing import oci_image, podresources
from tests.kubelet import host


def test_ledger_undoes_dirs_it_recorded_and_keeps_what_was_there(
    tmp_path: os.PathLike[str],
) -> None:
    base = str(tmp_path)
    existing = os.path.join(base, "existing")
    os.makedirs(os.path.join(existing, "old"))
    ledger = host.Ledger(os.path.join(base, "ledger.json"))
    ledger.dir_entries[existing] = sorted(os.listdir(existing))
    created = os.path.join(base, "created")
    ledger.will_create_dir(created)
    os.makedirs(os.path.join(created, "deep", "er"))
    os.makedirs(os.path.join(existing, "new"))
    private = ledger.private_dir(os.path.join(base, "private"))
    os.makedirs(private)
    # The ledger is on disk before anything else happens: a killed run can be undone.
    saved = host.Ledger.load(ledger.path)
    assert saved is not None and saved.created_dirs == [created]
    done = saved.restore()
    assert sorted(os.listdir(base)) == ["existing"]
    assert sorted(os.listdir(existing)) == ["old"]
    assert any("created" in line for line in done)
    assert not os.path.exists(ledger.path)


def test_ledger_does_not_claim_a_dir_that_already_exists(tmp_path: os.PathLike[str]) -> None:
    ledger = host.Ledger(os.path.join(str(tmp_path), "ledger.json"))
    ledger.will_create_dir(str(tmp_path))
    assert ledger.created_dirs == []


def test_ledger_kills_only_processes_that_are_still_ours(tmp_path: os.PathLike[str]) -> None:
    import subprocess

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        # Popen returns before the kernel shows the new command line: /proc/PID/cmdline reads
        # empty for a moment (seen under load), and the ledger rightly spares a process it
        # cannot recognise. The harness records processes long before it restores.
        deadline = time.monotonic() + 10
        while host._cmdline(sleeper.pid)[:1] != [b"sleep"] and time.monotonic() < deadline:
            time.sleep(0.01)
        ledger = host.Ledger(os.path.join(str(tmp_path), "ledger.json"))
        ledger.started(sleeper.pid, "not-sleep")  # a recycled PID running something else
        ledger.restore()
        assert sleeper.poll() is None
        ledger.started(sleeper.pid, "sleep")
        ledger.restore()
        assert sleeper.wait(10) == -9
    finally:
        sleeper.kill()
        sleeper.wait()


def test_differences_name_each_change() -> None:
    before = {
        "sysctls": {"vm/overcommit_memory": "0"},
        "fixed_dirs": {"/var/lib/kubelet": None, "/var/log/pods": ["a"]},
        "cgroups": {"/sys/fs/cgroup/cpu": ["user.slice"]},
        "mounts": ["/", "/proc"],
        "dev": [],
    }
    assert host.differences(before, before) == []
    after = json.loads(json.dumps(before))
    after["sysctls"]["vm/overcommit_memory"] = "1"
    after["fixed_dirs"]["/var/lib/kubelet"] = []
    after["fixed_dirs"]["/var/log/pods"] = ["a", "b"]
    after["cgroups"]["/sys/fs/cgroup/cpu"] += ["kubepods", "someone-elses"]
    after["mounts"] += ["/var/lib/kubelet", "/tmp/someone-elses"]
    after["dev"] = ["/dev/gcu0"]
    found = "\n".join(host.differences(before, after))
    assert "someone-elses" not in found  # other test runs on a shared machine do not count
    for expected in (
        "sysctl vm/overcommit_memory: 0 -> 1",
        "/var/lib/kubelet: absent -> present",
        "/var/log/pods: added ['b']",
        "kubepods",
        "mounts added: ['/var/lib/kubelet']",
        "/dev/gcu0",
    ):
        assert expected in found


def test_oci_archive_holds_one_image_with_the_files(tmp_path: os.PathLike[str]) -> None:
    binary = os.path.join(str(tmp_path), "tool")
    with open(binary, "wb") as handle:
        handle.write(b"\x7fELF-not-really")
    os.chmod(binary, 0o700)
    archive = os.path.join(str(tmp_path), "image.tar")
    spec = oci_image.ImageSpec(
        name="docker.io/x/y:2", files={"/bin/tool": binary}, symlinks={"/bin/sh": "tool"}
    )
    oci_image.write_archive(archive, spec)
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        (descriptor,) = index["manifests"]
        assert descriptor["annotations"]["io.containerd.image.name"] == "docker.io/x/y:2"
        blob = outer.extractfile(f"blobs/sha256/{descriptor['digest'].split(':')[1]}")
        manifest = json.load(blob)  # type: ignore[arg-type]
        (layer,) = manifest["layers"]
        data = outer.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}")
        with tarfile.open(fileobj=data) as inner:
            names = {member.name: member for member in inner.getmembers()}
    assert names["bin/tool"].mode & 0o100
    assert names["bin/sh"].issym() and names["bin/sh"].linkname == "tool"
    assert {"dev", "proc", "sys"} <= set(names)


def test_podresources_client_reads_a_list_answer(tmp_path: os.PathLike[str]) -> None:
    answer = podresources_v1_pb2.ListPodResourcesResponse()
    pod = answer.pod_resources.add(name="p", namespace="ns")
    container = pod.containers.add(name="c")
    container.devices.add(resource_name="enflame.com/gcu", device_ids=["gcu4", "gcu5"])
    container.devices.add(resource_name="other/x", device_ids=["a"])
    served = []

    def list_pods(request: object, context: object) -> object:
        served.append(request)
        return answer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                list_pods,
                request_deserializer=podresources_v1_pb2.ListPodResourcesRequest.FromString,
                response_serializer=lambda message: message.SerializeToString(),
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    path = os.path.join(str(tmp_path), "pr.sock")
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        holdings = podresources.list_holdings(path)
    finally:
        server.stop(None)
    assert served
    assert holdings == [
        podresources.Holding("ns", "p", "c", "enflame.com/gcu", ("gcu4", "gcu5")),
        podresources.Holding("ns", "p", "c", "other/x", ("a",)),
    ]


def test_podresources_client_names_a_missing_socket(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(KubeletApiError, match=r"not available at .*the socket does not exist"):
        podresources.list_holdings(os.path.join(str(tmp_path), "absent.sock"), timeout=1)
