"""The chaos run's pure parts (tests/cluster/chaos.py) on crafted inputs: the fault schedule is
the seed's, the checker flags what breaks an invariant (and nothing in a clean observation),
recovery times and the report come out of the records as they should."""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from typing import Any

import pytest

from tests.cluster import chaos
from tests.cluster.chaos import Checker, FaultRecord, Probe, Seen


def seen(pod: str, cards: set[str], *, node: str = "gcu-node-1", cid: str = "",
         dev: set[str] | None = None, whole: tuple[str, ...] | None = None,
         slices: tuple[str, ...] | None = None) -> Seen:  # fmt: skip
    return Seen(
        node=node,
        namespace="chaos",
        pod=pod,
        container="gcu",
        cid=cid or f"id-{pod}",
        cards=frozenset(cards),
        dev=None if dev is None else frozenset(dev),
        whole=whole,
        slices=slices,
    )


def seeded(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311 (a reproducible schedule, not a secret)


# -- the schedule ---------------------------------------------------------------------------


def test_schedule_is_the_seeds() -> None:
    first = chaos.schedule(seeded(7), 600, chaos.KINDS, 60)
    again = chaos.schedule(seeded(7), 600, chaos.KINDS, 60)
    other = chaos.schedule(seeded(8), 600, chaos.KINDS, 60)
    assert first == again
    assert first != other


def test_schedule_deals_every_kind_and_keeps_the_tail_quiet() -> None:
    plan = chaos.schedule(seeded(1), 180, chaos.KINDS, 24)
    assert len(plan) == 24
    assert {f.kind for f in plan} == set(chaos.KINDS)
    assert [f.kind for f in plan].count("plugin-version-change") == 1
    assert all(0 < f.at <= 165 for f in plan)
    assert [f.at for f in plan] == sorted(f.at for f in plan)
    for fault in plan:
        low, high = chaos.DURATIONS.get(fault.kind, (0, 0))
        assert low <= fault.duration <= high


def test_schedule_refuses_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds \\['cosmic-ray'\\]"):
        chaos.schedule(seeded(1), 60, ["cosmic-ray"], 3)


def test_pod_names_carry_the_ask() -> None:
    assert chaos.ask_of("c12-g4") == ("gcu", 4)
    assert chaos.ask_of("c3-s2") == ("shared", 2)
    assert chaos.ask_of("enflame-k8s-device-plugin-x7") is None


# -- the checker ----------------------------------------------------------------------------


def test_clean_observations_pass() -> None:
    checker = Checker(slices_per_card=4)
    observation = [
        seen("c1-g2", {"gcu0", "gcu1"}, dev={"gcu0", "gcu1"}, whole=("gcu0", "gcu1")),
        seen("c2-g1", {"gcu2"}, whole=("gcu2",)),
        seen("c3-s1", {"gcu2"}, node="gcu-node-2", slices=("gcu2-slice0",)),
        seen("c4-s2", {"gcu2"}, node="gcu-node-2", slices=("gcu2-slice1", "gcu2-slice2")),
        # another node's gcu2 is another card
        seen("c5-g1", {"gcu3"}, node="gcu-node-2"),
        seen("enflame-k8s-device-plugin-abc", set()),
        # privileged (the toolkit): every device of the node, none held through the kubelet
        seen("enflame-container-toolkit-x", {f"gcu{i}" for i in range(8)}, whole=()),
    ]
    assert checker.observe(1.0, observation) == []
    assert checker.observe(4.0, observation) == []
    assert checker.violations == []


def test_a_card_held_whole_by_two_containers_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    found = checker.observe(2.5, [seen("c1-g2", {"gcu0", "gcu1"}), seen("c2-g1", {"gcu1"})])
    assert [v.rule for v in found] == ["card-in-two-containers"]
    assert found[0].evidence["card"] == "gcu1"
    assert {h["pod"] for h in found[0].evidence["holders"]} == {"chaos/c1-g2", "chaos/c2-g1"}
    # Seen again: one violation, not one per check.
    assert checker.observe(5.0, [seen("c1-g2", {"gcu0", "gcu1"}), seen("c2-g1", {"gcu1"})]) == []


def test_a_card_held_by_a_workload_pod_and_listed_for_another_pod_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    found = checker.observe(
        1.0, [seen("c1-g1", {"gcu3"}), seen("validator", {"gcu3"}, whole=("gcu3",))]
    )
    assert [v.rule for v in found] == ["card-in-two-containers"]


def test_a_whole_card_shared_with_a_slice_holder_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    found = checker.observe(1.0, [seen("c1-g1", {"gcu2"}), seen("c2-s1", {"gcu2"})])
    assert [v.rule for v in found] == ["card-in-two-containers"]


def test_a_card_beyond_its_share_is_flagged() -> None:
    checker = Checker(slices_per_card=2)
    holders = [seen(f"c{i}-s1", {"gcu2"}, node="gcu-node-2") for i in range(3)]
    assert [v.rule for v in checker.observe(1.0, holders)] == ["card-beyond-its-share"]


def test_one_device_id_listed_for_two_containers_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    found = checker.observe(
        1.0,
        [
            seen("c1-s1", {"gcu2"}, slices=("gcu2-slice0",)),
            seen("c2-s1", {"gcu2"}, slices=("gcu2-slice0",)),
        ],
    )
    assert [v.rule for v in found] == ["device-id-in-two-containers"]
    assert found[0].evidence["device"] == "gcu2-slice0"


def test_a_changed_card_set_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    assert checker.observe(1.0, [seen("c1-g1", {"gcu0"})]) == []
    found = checker.observe(3.5, [seen("c1-g1", {"gcu5"}, cid="id-restarted")])
    assert [v.rule for v in found] == ["cards-changed-while-running"]
    assert found[0].evidence["first"] == ["gcu0"] and found[0].evidence["cards"] == ["gcu5"]


def test_a_container_with_other_than_its_ask_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    found = checker.observe(1.0, [seen("c1-g4", {"gcu0", "gcu1"}), seen("c2-s2", set())])
    assert sorted(v.rule for v in found) == ["running-without-its-ask"] * 2


def test_dev_differing_from_the_runtime_config_is_flagged() -> None:
    checker = Checker(slices_per_card=4)
    found = checker.observe(1.0, [seen("c1-g1", {"gcu0"}, dev={"gcu0", "gcu1"})])
    assert [v.rule for v in found] == ["dev-differs-from-runtime-config"]


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def pod(name: str, phase: str, **status: object) -> dict[str, object]:
    return {"metadata": {"namespace": "chaos", "name": name}, "spec": {},
            "status": {"phase": phase, **status}}  # fmt: skip


def test_a_pod_stuck_terminating_is_flagged_only_after_two_quiet_minutes() -> None:
    now = 1_800_000_000.0
    stuck = pod("c1-g1", "Running")
    stuck["metadata"]["deletionTimestamp"] = stamp(now - 400)  # type: ignore[index]
    checker = Checker(slices_per_card=4)
    assert checker.pods(10, [stuck], None, now) == []  # faults still running
    assert checker.pods(10, [stuck], now - 60, now) == []  # quiet for 60 s only
    found = checker.pods(10, [stuck], now - 130, now)
    assert [v.rule for v in found] == ["stuck-terminating"]


def test_pending_and_failed_pods_need_a_readable_reason() -> None:
    checker = Checker(slices_per_card=4)
    readable = [
        pod(
            "c1-g8",
            "Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient enflame.com/gcu.",
                }
            ],
        ),
        pod("c2-g1", "Failed", reason="UnexpectedAdmissionError", message="Allocate failed: gcu3"),
        pod("c3-g1", "Pending"),  # just created: nothing to say yet
    ]
    assert checker.pods(1, readable, None, time.time()) == []
    silent = [
        pod("c4-g1", "Failed"),
        pod("c5-g1", "Pending", conditions=[{"type": "PodScheduled", "status": "False"}]),
    ]
    assert sorted(v.evidence["pod"] for v in checker.pods(1, silent, None, time.time())) == [
        "chaos/c4-g1",
        "chaos/c5-g1",
    ]


# -- recovery and the report ------------------------------------------------------------------


def test_recovery_is_measured_from_each_faults_end_over_its_dip() -> None:
    records = [
        FaultRecord(1, "kubelet-restart", 10, 12),  # allocatable dips 13-15
        FaultRecord(2, "kubelet-restart", 30, 31),  # no dip at all
        FaultRecord(3, "plugin-kill", 50, 50, error="ChaosFailed: no target"),  # not injected
        FaultRecord(4, "apiserver-down", 60, 80),  # allocatable never right again
    ]
    probes = [Probe(float(t), not 13 <= t < 15, not 13 <= t < 14, True) for t in range(0, 50)]
    probes += [Probe(float(t), False, True, True) for t in range(60, 90)]
    found = chaos.recovery(records, probes)
    assert set(found) == {"kubelet-restart", "apiserver-down"}
    allocatable = found["kubelet-restart"]["allocatable"]
    assert (allocatable["n"], allocatable["max"], allocatable["p50"]) == (2, 3.0, 1.5)
    assert found["kubelet-restart"]["plugins_ready"]["max"] == 2.0
    assert found["kubelet-restart"]["pending_scheduled"]["max"] == 0.0
    assert found["apiserver-down"]["allocatable"]["never"] == 1
    # The same from the transitions alone, as a saved report keeps them.
    assert chaos.recovery(records, chaos.probes_of(chaos.changes(probes))) == found


def test_recovery_tells_isolated_faults_from_overlapping_ones() -> None:
    records = [
        FaultRecord(1, "plugin-kill", 10, 10),  # dip 11-40 (the API server was down 12-38)
        FaultRecord(2, "apiserver-down", 12, 38),
        FaultRecord(3, "plugin-kill", 60, 60),  # dip 61-63, alone
    ]
    probes = [Probe(float(t), not (11 <= t < 40 or 61 <= t < 64), True, True) for t in range(90)]
    found = chaos.recovery(records, probes)["plugin-kill"]["allocatable"]
    assert (found["n"], found["max"]) == (2, 30.0)
    assert (found["isolated"]["n"], found["isolated"]["max"]) == (1, 4.0)


def test_probe_changes_keep_only_the_transitions() -> None:
    probes = [Probe(1, True, True, True), Probe(2, True, True, True), Probe(3, False, True, True),
              Probe(4, False, True, True), Probe(5, True, True, True)]  # fmt: skip
    assert chaos.changes(probes) == [
        [1, True, True, True],
        [3, False, True, True],
        [5, True, True, True],
    ]


def test_report_fails_on_a_violation_or_too_few_faults() -> None:
    records = [
        FaultRecord(1, "etcd-restart", 1, 2),
        FaultRecord(2, "etcd-restart", 3, 3, error="x"),
    ]

    def report(min_faults: int, violations: list[chaos.Violation]) -> dict[str, Any]:
        return chaos.summarize(
            seed=1, minutes=3, min_faults=min_faults, records=records, probes=[],
            violations=violations, pods={"created": 3}, observations=10,
        )  # fmt: skip

    clean = report(1, [])
    assert clean["ok"] and clean["faults"] == {
        "total": 1, "by_kind": {"etcd-restart": 1}, "not_injected": {"etcd-restart": ["x"]},
    }  # fmt: skip
    few = report(2, [])
    assert not few["ok"] and "fewer than --min-faults 2" in few["problems"][0]
    bad = report(1, [chaos.Violation("card-in-two-containers", 1, "x")])
    assert not bad["ok"] and bad["violations"][0]["rule"] == "card-in-two-containers"


def test_the_plugin_config_shares_two_cards_on_one_node_only() -> None:
    import yaml

    from enflame_gcu.device_plugin import config_file

    shared = yaml.safe_load(chaos.plugin_config(chaos.SHARED_NODE))
    assert shared["flags"]["resources"] == ["gcu", "shared-gcu"]
    assert shared["sharing"]["cards"] == list(chaos.SHARED_CARDS)
    assert yaml.safe_load(chaos.plugin_config("gcu-node-1"))["flags"]["resources"] == ["gcu"]
    # The plugin's own parser takes both (it refuses unknown keys and bad values).
    for node in ("gcu-node-1", chaos.SHARED_NODE):
        assert config_file.parse(chaos.plugin_config(node))


# -- the logs of a failed run ---------------------------------------------------------------


def test_the_logs_go_beside_the_report() -> None:
    assert chaos.logs_dir("/work/logs/chaos-seed7.json") == "/work/logs/chaos-seed7.logs"
    assert chaos.logs_dir("report") == "report.logs"


def test_copy_tail_keeps_the_end_and_says_what_it_left_out(tmp_path: Any) -> None:
    source = tmp_path / "kubelet.log"
    source.write_bytes(b"old line\n" * 10 + b"the failure\n")
    target = tmp_path / "kept" / "kubelet.log"

    assert chaos.copy_tail(str(source), str(target), limit=12) == 12
    kept = target.read_bytes()
    assert kept.endswith(b"the failure\n")
    assert b"the first 90 bytes of" in kept.splitlines()[0]
    assert chaos.copy_tail(str(tmp_path / "missing.log"), str(tmp_path / "x")) == -1
    assert not (tmp_path / "x").exists()


def test_pod_logs_are_copied_with_their_layout(tmp_path: Any) -> None:
    pods = tmp_path / "var_log_pods"
    for relative, text in {
        "kube-system_enflame-container-toolkit-8mgkp_u1/enflame-container-toolkit/0.log": "a",
        "kube-system_enflame-container-toolkit-8mgkp_u1/enflame-container-toolkit/1.log": "b",
        "chaos_c19-g2_u2/gcu/0.log": "",
    }.items():
        (pods / relative).parent.mkdir(parents=True, exist_ok=True)
        (pods / relative).write_text(text)

    copied = chaos.copy_pod_logs(str(pods), str(tmp_path / "kept"))

    assert len(copied) == 3
    toolkit = "kube-system_enflame-container-toolkit-8mgkp_u1/enflame-container-toolkit"
    assert (tmp_path / "kept" / toolkit / "1.log").read_text() == "b"
    assert chaos.copy_pod_logs(str(tmp_path / "none"), str(tmp_path / "k2")) == []


class _Node:
    """A node's files as the tier lays them out, with daemons that do not answer."""

    def __init__(self, work: Any, name: str) -> None:
        self.name, self.work = name, str(work / name)
        self.node_ip, self.kubelet_port = "127.0.0.1", 1  # nothing listens there
        self.containerd = None
        self.socket = str(work / name / "none.sock")
        self.binaries = type("B", (), {"ctr": str(work / "no-ctr")})()
        self.config_path = str(work / name / "config.toml")

    def private(self, path: str) -> str:
        return f"{self.work}/private/{path.strip('/').replace('/', '_')}"


def test_keep_logs_keeps_what_there_is_and_names_what_is_not(tmp_path: Any) -> None:
    nodes = [_Node(tmp_path, "gcu-node-1"), _Node(tmp_path, "gcu-node-2")]
    for node in nodes:
        os.makedirs(node.private("/var/log/pods") + "/ns_pod_u/c")
        with open(node.private("/var/log/pods") + "/ns_pod_u/c/0.log", "w") as handle:
            handle.write(f"{node.name} pod")
        with open(f"{node.work}/kubelet.log", "w") as handle:
            handle.write(f"{node.name} kubelet")
        os.makedirs(node.private("/etc/enflame-gcu"))
        with open(node.private("/etc/enflame-gcu") + "/node-mode.json", "w") as handle:
            handle.write("{}")
    (tmp_path / "cp").mkdir()
    (tmp_path / "cp" / "kube-apiserver.log").write_text("apiserver")
    plane = type("P", (), {"work": str(tmp_path / "cp"), "bin": str(tmp_path / "no-bin"),
                           "kubeconfig": "none"})()  # fmt: skip
    cluster = type("C", (), {"nodes": nodes, "plane": plane})()
    said: list[str] = []

    kept = chaos.keep_logs(cluster, str(tmp_path / "r.logs"), said.append)

    out = tmp_path / "r.logs"
    assert kept == str(out) and said == [f"kept the tier's logs of the failed run in {out}"]
    for node in nodes:
        assert (out / node.name / "kubelet.log").read_text() == f"{node.name} kubelet"
        assert (out / node.name / "pods/ns_pod_u/c/0.log").read_text() == f"{node.name} pod"
        assert (out / node.name / "etc-enflame-gcu/node-mode.json").read_text() == "{}"
        assert (
            "GET https://127.0.0.1:1/" in (out / node.name / "kubelet-goroutines.txt").read_text()
        )
        assert "not run to the end" in (out / node.name / "ctr-tasks.txt").read_text()
        assert not (out / node.name / "containerd.log").exists()  # none was there
    assert (out / "control-plane" / "kube-apiserver.log").read_text() == "apiserver"
    assert "not run to the end" in (out / "api" / "pods.json").read_text()
    assert "PID" in (out / "processes.txt").read_text()


@pytest.mark.parametrize(
    ("reports", "raised", "kept"),
    [([{"ok": True}], False, False), ([{"ok": True}, {"ok": False}], False, True),
     ([], False, True), ([{"ok": True}], True, True)],
)  # fmt: skip
def test_logs_are_kept_only_for_a_failed_run(
    tmp_path: Any, reports: list[dict[str, Any]], raised: bool, kept: bool
) -> None:
    plane = type("P", (), {"work": str(tmp_path / "cp"), "bin": str(tmp_path), "kubeconfig": ""})()
    cluster = type("C", (), {"nodes": [], "plane": plane})()
    report = str(tmp_path / "chaos.json")
    with contextlib.suppress(RuntimeError), chaos.kept_on_failure(cluster, report, reports, print):
        if raised:
            raise RuntimeError("deploy failed")
    assert os.path.isdir(tmp_path / "chaos.logs") is kept
    chaos.write(report, reports, [], "")
    with open(report, encoding="utf-8") as handle:
        assert json.load(handle)["logs"] == (str(tmp_path / "chaos.logs") if kept else None)


# -- the tier's nodes: daemons restarted when they exit, as systemd does --------------------


def _sleeper(started: list[int], lives: list[float]) -> Any:
    """A real process per call that lives ``lives[n]`` seconds (the last one: long)."""
    import subprocess

    def spawn() -> subprocess.Popen[bytes]:
        life = lives[min(len(started), len(lives) - 1)]
        process = subprocess.Popen(["sleep", str(life)])
        started.append(process.pid)
        return process

    return spawn


def _until(condition: Any, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_daemon_that_exits_by_itself_is_started_again() -> None:
    """The seed-7 failure: a kubelet started while containerd was down exited at once and
    nothing started it again (a real node's systemd does, 10 s later)."""
    from tests.cluster.nodes import Supervised

    started: list[int] = []
    daemon = Supervised("kubelet", _sleeper(started, [0, 0, 60]), restart_sec=0.2)
    first = daemon.start()
    try:
        assert _until(lambda: len(started) == 3)  # exited twice, started again each time
        assert [status for _, status in daemon.exits] == [0, 0]
        assert daemon.process is not None and daemon.process is not first
        assert daemon.process.poll() is None
    finally:
        daemon.stop()
    assert daemon.process.poll() is not None


def test_a_stopped_or_replaced_daemon_is_not_started_again() -> None:
    from tests.cluster.nodes import Supervised

    started: list[int] = []
    daemon = Supervised("containerd", _sleeper(started, [60]), restart_sec=0.1)
    daemon.start()
    daemon.stop()  # a fault's kill, or the teardown: stays down
    time.sleep(0.5)
    assert len(started) == 1 and daemon.exits == []
    daemon.start()  # the fault starts it again itself: one process, not two
    daemon.stop()
    daemon.start()
    time.sleep(0.5)
    assert len(started) == 3
    alive = [p for p in started if os.path.exists(f"/proc/{p}") and _running(p)]
    assert alive == [started[-1]]
    daemon.stop()


def _running(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
