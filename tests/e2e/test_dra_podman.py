"""podman consumes the DRA driver's per-claim CDI spec: the CDI-aware engine path, for real.

The claim is prepared through the stub kubelet exactly as in test_dra_runc.py; then podman
(Debian 12 ships 4.3.1, which reads CDI specs only from /etc/cdi and /var/run/cdi) runs a
busybox rootfs with ``--device <the CDI names the driver returned>``. So that nothing on the
host changes, podman runs in a private mount namespace where a tmpfs covers /run and the
driver's CDI directory is bound on /run/cdi; podman's storage, run and tmp dirs live there too.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess

import pytest

from enflame_gcu import resourceslices
from tests.e2e.conftest import Node, gcu_nodes
from tests.e2e.test_dra_runc import (
    ARGS,
    cdi_dir,
    kubelet_cdi_ids,
    prepare,
    prepare_devices,
    prepare_results,
)

pytestmark = pytest.mark.runc
DRIVER = resourceslices.DRIVER
INSTALL_HINT = "run `make setup` as root (scripts/bootstrap.sh installs podman)"
UNSHARE = ("unshare", "--mount", "--propagation", "private")
# Run inside `unshare --mount --propagation private`: the mounts vanish with the namespace.
ISOLATE = """set -e
mount -t tmpfs enflame-test /run
mkdir /run/cdi
mount --bind "$1" /run/cdi
shift
exec "$@"
"""


def podman() -> str:
    path = shutil.which("podman")
    if path is None:
        pytest.fail(f"podman is not installed; {INSTALL_HINT}")
    return path


def run_podman(node: Node, devices: list[str]) -> subprocess.CompletedProcess[bytes]:
    """``podman run --device D ... --rootfs <busybox>`` with the node's CDI dir as /run/cdi."""
    work = os.path.join(node.workdir, "podman")
    os.makedirs(work, exist_ok=True)
    conf = os.path.join(work, "containers.conf")
    with open(conf, "w", encoding="utf-8") as handle:
        handle.write('[engine]\nevents_logger = "file"\ncgroup_manager = "cgroupfs"\n')
    os.makedirs(cdi_dir(node), exist_ok=True)
    rootfs = os.path.join(node.bundle(ARGS), "rootfs")
    # podman asks for limits above this sandbox's hard ones unless told the current values.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[0], 4096)
    command = [
        podman(),
        # All of podman's state lives in the namespace's private /run tmpfs: short paths
        # (podman limits the runroot to 50 characters), gone when the namespace ends.
        "--root",
        "/run/podman/storage",
        "--runroot",
        "/run/podman/run",
        "--tmpdir",
        "/run/podman/tmp",
        "--storage-driver",
        "vfs",
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        f"nofile={nofile}:{nofile}",
        "--ulimit",
        f"nproc={nproc}:{nproc}",
        *(arg for device in devices for arg in ("--device", device)),
        "--rootfs",
        rootfs,
        *ARGS,
    ]
    return subprocess.run(
        [*UNSHARE, "sh", "-c", ISOLATE, "isolate", cdi_dir(node), *command],
        capture_output=True,
        env={**os.environ, "CONTAINERS_CONF": conf},
        timeout=120,
        check=False,
    )


def seen(result: subprocess.CompletedProcess[bytes]) -> tuple[list[str], dict[str, str]]:
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    listing, _, env = result.stdout.partition(b"---")
    variables = dict(
        line.split("=", 1) for line in env.decode().splitlines() if line.startswith("ENFLAME_")
    )
    return gcu_nodes(listing), variables


def test_podman_gives_the_switch_local_claim_exactly_its_two_cards(node: Node) -> None:
    claim = ("enflame", "podman-pair", "4e4c3b1a-0000-4000-8000-0000000000a1")
    names, cdi_ids = prepare(node, claim, "two-gcus-one-switch")
    assert names == ["gcu-0", "gcu-1"]
    assert cdi_ids == [f"k8s.gcu.enflame.com/claim={claim[2]}-gcus"]
    cards, env = seen(run_podman(node, cdi_ids))
    assert cards == ["gcu0", "gcu1", "gcuctl"]
    assert env == {"ENFLAME_VISIBLE_DEVICES": "0,1"}


def test_podman_gives_a_shared_slice_its_card_and_its_share(node: Node) -> None:
    claim = ("enflame", "podman-slice", "4e4c3b1a-0000-4000-8000-0000000000a2")
    share = {
        "request": "slice",
        "device": "gcu-5",
        "shareID": "7d3c2a10-0000-4000-8000-000000000001",
        "consumedCapacity": {"slices": "2"},
    }
    names, cdi_ids = prepare_results(node, claim, [share], shared_slices=6)
    assert names == ["gcu-5"]
    cards, env = seen(run_podman(node, cdi_ids))
    assert cards == ["gcu5", "gcuctl"]
    assert env == {
        "ENFLAME_VISIBLE_DEVICES": "5",
        "ENFLAME_CONTAINER_SUB_CARD": "true",
        "ENFLAME_CONTAINER_USABLE_PROCESSOR": "2/6",
    }


def test_podman_refuses_a_claim_that_was_never_prepared(node: Node) -> None:
    missing = "k8s.gcu.enflame.com/claim=4e4c3b1a-0000-4000-8000-00000000dead-gcus"
    result = run_podman(node, [missing])
    assert result.returncode != 0
    assert b"unresolvable CDI devices" in result.stderr


def test_pods_and_containers_sharing_a_claim_see_what_they_reference(node: Node) -> None:
    claim = ("enflame", "podman-shared", "4e4c3b1a-0000-4000-8000-0000000000a3")
    results = [("train", "gcu-0"), ("train", "gcu-1"), ("infer", "gcu-4")]
    # Two pods on one claim: the kubelet prepares it for each; the answers are the same.
    devices = prepare_devices(node, claim, results, pods=2)
    train = kubelet_cdi_ids(devices, "train")
    infer = kubelet_cdi_ids(devices, "infer")
    assert train == [f"k8s.gcu.enflame.com/claim={claim[2]}-train"]
    assert infer == [f"k8s.gcu.enflame.com/claim={claim[2]}-infer"]
    for _pod in range(2):
        assert seen(run_podman(node, train)) == (
            ["gcu0", "gcu1", "gcuctl"],
            {"ENFLAME_VISIBLE_DEVICES": "0,1"},
        )
    assert seen(run_podman(node, infer)) == (["gcu4", "gcuctl"], {"ENFLAME_VISIBLE_DEVICES": "4"})
    # A container that uses the whole claim gets every card of it; the env var is the last
    # request's (CDI: a later device's env replaces an earlier one's; docs/dra.md says so).
    assert seen(run_podman(node, kubelet_cdi_ids(devices))) == (
        ["gcu0", "gcu1", "gcu4", "gcuctl"],
        {"ENFLAME_VISIBLE_DEVICES": "4"},
    )
