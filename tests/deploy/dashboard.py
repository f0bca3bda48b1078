"""The Grafana dashboard's queries, and a check of the metric and label names they use against
a scrape of a running plugin (shared by the unit test and the real-kubelet tier)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.helpers import DEPLOY

DASHBOARD = os.path.join(DEPLOY, "grafana", "enflame-gcu-dashboard.json")
# Labels Prometheus adds to every series of a target (the monitors relabel the pod's node).
TARGET_LABELS = {"node", "instance", "job"}
_METRIC = re.compile(r"\b((?:enflame_v?gcu|process)_[a-z0-9_]+)(\{[^}]*\})?")
# The card telemetry families (libefml): only a plugin with a libefml has them.
_TELEMETRY = re.compile(
    r"\benflame_(?:vgcu_|gcu_(?:usage|sip_usage|memory_|power_|temperature|ecc_|pcie_|virt_mode"
    r"|clock|health|info|count|exporter_up|telemetry_|cluster_usage|pg_usage))"
)
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|on|without|group_left|group_right)\s*\(([^)]*)\)")


def load() -> dict[str, Any]:
    """The dashboard document."""
    with open(DASHBOARD, encoding="utf-8") as handle:
        document: dict[str, Any] = json.load(handle)
    return document


def queries(document: Mapping[str, Any] | None = None) -> list[str]:
    """Every PromQL expression: panel targets and template variable queries."""
    document = document or load()
    found = [t["expr"] for p in document["panels"] for t in p.get("targets", [])]
    for variable in document.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


def is_telemetry(expr: str) -> bool:
    """Whether the query reads card telemetry (a plugin without libefml has none of it)."""
    return bool(_TELEMETRY.search(expr))


def scraped_labels(text: str) -> dict[str, set[str]]:
    """``{sample name: label names seen}`` from a ``/metrics`` exposition."""
    seen: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            seen.setdefault(sample.name, set()).update(sample.labels)
    return seen


def problems(exprs: Iterable[str], seen: Mapping[str, set[str]]) -> list[str]:
    """What the queries use that the scrape does not have (metric names, then label names)."""
    result = []
    for expr in exprs:
        used: set[str] = set()
        metrics = _METRIC.findall(expr.replace("label_values(", "label_values( "))
        if not metrics:
            result.append(f"{expr!r} names none of our metrics")
        for name, selector in metrics:
            if name not in seen:
                result.append(f"{expr!r}: metric {name} is not in the scrape")
                continue
            used |= seen[name]
            for label in _MATCHER.findall(selector):
                if label not in seen[name] | TARGET_LABELS:
                    result.append(f"{expr!r}: {name} has no label {label}")
        for group in _GROUPING.findall(expr):
            for label in (part.strip() for part in group.split(",") if part.strip()):
                if label not in used | TARGET_LABELS:
                    result.append(f"{expr!r}: no metric of the query has label {label}")
        if "label_values(" in expr:
            label = expr.rsplit(",", 1)[1].strip(" )")
            if label not in used | TARGET_LABELS:
                result.append(f"{expr!r}: no label {label}")
    return result
