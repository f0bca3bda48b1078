"""Deliberately broken operators, each run against the harness test that should catch it.

``python -m tests.controlplane.mutants [NAME ...]`` (``make mutants``) copies the checkout to a
temporary directory, makes one mutation there (a one-line change of the operator, its chart or
the hand-written fake), and runs the harness tests named for it with that copy's code first on
``PYTHONPATH`` (the operator process inherits it). A mutant is *killed* when the tests fail;
a surviving mutant is a test that cannot fail. Prints one JSON object and exits 1 if any mutant
survived. Without names, every mutant runs (about two minutes each on the cached build).

The list is checked by ``tests/test_mutants.py`` in ``make test``: every mutation's text is in
the file it names exactly once, and every test it names exists, so the list cannot rot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = "src/enflame_gcu/gcu_operator"


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # what the broken operator does wrong
    path: str  # relative to the checkout
    old: str
    new: str
    tests: tuple[str, ...]  # test functions of tests/controlplane/test_*.py


MUTANTS = (
    Mutant(
        "budget-ignored",
        "maxUnavailable is ignored: every outdated node starts at once",
        f"{OPERATOR}/reconcile.py",
        "limit = max_unavailable(spec.upgrade.max_unavailable, len(views))",
        "limit = len(views)",
        ("test_a_version_change_drains_and_rolls_node_by_node_within_the_budget",),
    ),
    Mutant(
        "drain-without-cordon",
        "a drain rollout never cordons the node it drains",
        f"{OPERATOR}/reconcile.py",
        "cordoned=spec.upgrade.drain and not admin_cordoned,",
        "cordoned=False,",
        ("test_a_version_change_drains_and_rolls_node_by_node_within_the_budget",),
    ),
    Mutant(
        "drain-without-eviction",
        "a drain evicts nothing",
        f"{OPERATOR}/reconcile.py",
        "    left = _workloads(observed, view)\n    for pod in left:",
        "    left: list[Any] = []\n    for pod in left:",
        ("test_a_version_change_drains_and_rolls_node_by_node_within_the_budget",),
    ),
    Mutant(
        "admin-cordon-lifted",
        "a drain rollout uncordons a node an administrator had cordoned",
        f"{OPERATOR}/reconcile.py",
        "cordoned=spec.upgrade.drain and not admin_cordoned,",
        "cordoned=spec.upgrade.drain,",
        ("test_a_drain_rollout_leaves_an_admins_cordon_in_place",),
    ),
    Mutant(
        "validator-without-cordon-toleration",
        "a validator pod does not tolerate the cordon of the node it validates",
        f"{OPERATOR}/components.py",
        "            *TOLERATIONS,\n            CORDON_TOLERATION,\n",
        "            *TOLERATIONS,\n",
        ("test_a_dra_validator_pod_schedules_onto_its_cordoned_node",),
    ),
    Mutant(
        "failure-not-stopping",
        "a node whose new pods never become ready does not stop the rollout",
        f"{OPERATOR}/reconcile.py",
        "failed = [(v.name, r) for v in in_progress if (r := failing(v))]",
        "failed: list[tuple[str, str]] = []",
        ("test_a_broken_version_stops_on_the_first_node_and_the_old_version_rolls_it_back",),
    ),
    Mutant(
        "node-selector-ignored",
        "a component's nodeSelector is ignored when the operator picks the resource's nodes",
        f"{OPERATOR}/nodes.py",
        "return all(node_labels.get(k) == v for k, v in component.node_selector) and (",
        "return bool(component) and (",
        ("test_a_resource_scoped_by_node_selector_runs_on_its_nodes_only",),
    ),
    Mutant(
        "tolerations-dropped",
        "a component's tolerations never reach its DaemonSet",
        f"{OPERATOR}/components.py",
        '"tolerations": [*TOLERATIONS, *(dict(t) for t in component.tolerations)],',
        '"tolerations": [*TOLERATIONS],',
        ("test_a_node_with_an_untolerated_taint_is_reported_and_left_out_of_the_budget",),
    ),
    Mutant(
        "unplaceable-in-budget",
        "a node no pod can be placed on stays in the rollout and its budget",
        f"{OPERATOR}/reconcile.py",
        "unplaceable = [v for v in views if v.blocked and not v.state.upgrading]",
        "unplaceable: list[nodes.NodeView] = []",
        ("test_a_node_with_an_untolerated_taint_is_reported_and_left_out_of_the_budget",),
    ),
    Mutant(
        "no-owner",
        "two resources wanting one node both deploy there",
        f"{OPERATOR}/reconcile.py",
        "taken = {p: _display(by_uid[owner[p]]) for p in wants[uid] if owner[p] != uid}",
        "taken: dict[tuple[str, str], str] = {}",
        (
            "test_a_second_resource_for_the_same_nodes_is_ignored_naming_the_owner",
            "test_an_overlap_that_appears_later_leaves_one_toolkit_per_node_and_names_the_conflict",
        ),
    ),
    Mutant(
        "dra-assumed-served",
        "nodes asking for DRA move to it on a cluster that does not serve the DRA API",
        f"{OPERATOR}/nodes.py",
        '        if dra_served:\n            return "dra", ""',
        '        if True:\n            return "dra", ""',
        ("test_nodes_asking_for_dra_where_the_cluster_serves_none_keep_the_device_plugin",),
    ),
    Mutant(
        "stock-nfd-unknown",
        "a node labelled only by stock Node Feature Discovery is not a GCU node",
        f"{OPERATOR}/names.py",
        '    ("feature.node.kubernetes.io/pci-1200_1e36.present", "true"),\n',
        "",
        ("test_a_node_labelled_only_by_stock_node_feature_discovery_is_served",),
    ),
    Mutant(
        "rbac-unnamed",
        "the chart lets the operator update and delete every ClusterRole and binding",
        "deploy/helm/enflame-gcu/templates/operator.yaml",
        '    resourceNames: {{ toJson . }}\n    verbs: ["update", "delete"]\n  {{- end }}\n'
        "  # Whether the cluster serves DRA",
        '    verbs: ["update", "delete"]\n  {{- end }}\n  # Whether the cluster serves DRA',
        ("test_the_operators_account_cannot_delete_or_rewrite_what_is_not_its_own",),
    ),
    Mutant(
        "fake-drifts",
        "the hand-written fake's validator pods fail where Kubernetes' succeed",
        "tests/gcu_operator/fake_api.py",
        "bad = pods.node_of(pod) in self.bad_nodes",
        "bad = True",
        ("test_the_hand_written_fake_agrees_with_kubernetes_on_a_deploy_and_a_rollout",),
    ),
)


def problems(mutants: tuple[Mutant, ...] = MUTANTS) -> list[str]:
    """What is wrong with the list against the checkout (empty when every mutant applies)."""
    found = []
    tests = "".join(
        p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "tests/controlplane").glob("test_*.py"))
    )
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        found.append("two mutants share a name")
    for mutant in mutants:
        text = (ROOT / mutant.path).read_text(encoding="utf-8")
        count = text.count(mutant.old)
        if count != 1:
            found.append(f"{mutant.name}: its text is in {mutant.path} {count} times, not once")
        found.extend(
            f"{mutant.name}: no test {t} in tests/controlplane"
            for t in mutant.tests
            if f"def {t}(" not in tests
        )
    return found


def _copy(target: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", ".mypy_cache")
    for entry in ("src", "tests", "deploy", "scripts", "pyproject.toml"):
        source = ROOT / entry
        if source.is_dir():
            shutil.copytree(source, target / entry, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(source, target / entry)
    for venv in (".venv", ".venv-helm"):
        if (ROOT / venv).exists():
            (target / venv).symlink_to(ROOT / venv)


def run(mutant: Mutant, log_dir: Path) -> dict[str, object]:
    """Apply ``mutant`` in a copy of the checkout and run its tests there; the outcome."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"enflame-mutant-{mutant.name}-") as work:
        copy = Path(work)
        _copy(copy)
        path = copy / mutant.path
        text = path.read_text(encoding="utf-8")
        if text.count(mutant.old) != 1:
            return {"mutant": mutant.name, "outcome": "not applied"}
        path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": f"{copy / 'src'}{os.pathsep}{copy}"}
        selected = " or ".join(mutant.tests)
        log = log_dir / f"{mutant.name}.log"
        with open(log, "wb") as out:
            result = subprocess.run(
                ["bash", "scripts/controlplane.sh", "-x", "-k", selected, "-p", "no:randomly"],
                cwd=copy,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
    if result.returncode == 1:
        outcome = "killed"
    elif result.returncode == 0:
        outcome = "survived"
    else:  # 5: nothing collected, 2/3/4: the run itself broke; neither kills the mutant
        outcome = f"error (exit {result.returncode})"
    return {
        "mutant": mutant.name,
        "why": mutant.why,
        "tests": list(mutant.tests),
        "outcome": outcome,
        "seconds": round(time.monotonic() - started, 1),
        "summary": tail[0] if tail else "",
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: every one)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--logs", default="", help="directory for each run's log (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.name}: {m.why}")
        return 0
    wrong = problems()
    if wrong:
        print("\n".join(wrong), file=sys.stderr)
        return 2
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        print(f"no such mutant: {', '.join(unknown)} (--list names them)", file=sys.stderr)
        return 2
    chosen = [by_name[n] for n in args.names] if args.names else list(MUTANTS)
    log_dir = Path(args.logs or tempfile.mkdtemp(prefix="enflame-mutants-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for mutant in chosen:
        print(f"mutants: {mutant.name} ...", file=sys.stderr, flush=True)
        results.append(run(mutant, log_dir))
        print(f"mutants: {mutant.name}: {results[-1]['outcome']}", file=sys.stderr, flush=True)
    killed = sum(r["outcome"] == "killed" for r in results)
    print(json.dumps({"mutants": results, "killed": killed, "of": len(results)}, indent=1))
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
