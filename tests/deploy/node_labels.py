"""What Kubernetes and Node Feature Discovery do with node labels, for the deploy tests.

:func:`schedules_on` is the DaemonSet controller's node check for a pod spec (nodeSelector and
the required node affinity, as k8s.io/component-helpers/scheduling/corev1/nodeaffinity has
it). :func:`stock_nfd_labels` is the PCI labels nfd-worker makes with its stock settings
(deviceClassWhitelist 03, 0b40, 12; deviceLabelFields class, vendor) from a node's sysfs, and
:func:`nfd_rule_labels` what nfd-master makes of a NodeFeatureRule's In expressions on it.
"""

from __future__ import annotations

import os
from typing import Any

NFD = "feature.node.kubernetes.io/"
NFD_STOCK_CLASSES = ("03", "0b40", "12")


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt"):
        if key not in labels or not labels[key].lstrip("-").isdigit():
            return False
        have, want = int(labels[key]), int(values[0])
        return have > want if operator == "Gt" else have < want
    raise AssertionError(f"unknown node selector operator {operator!r}")


def schedules_on(pod_spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a DaemonSet with this pod spec runs a pod on a node with these labels."""
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )  # fmt: skip
    if required is None:
        return True
    # Terms are ORed, a term's expressions ANDed; a term without expressions matches nothing.
    return any(
        term.get("matchExpressions")
        and all(_expression_holds(e, labels) for e in term["matchExpressions"])
        for term in required["nodeSelectorTerms"]
    )


def pci_devices(host_root: str) -> list[dict[str, str]]:
    """NFD's pci.device features of a node: vendor, device and class as it writes them."""
    top = os.path.join(host_root, "sys", "bus", "pci", "devices")
    found = []
    for name in sorted(os.listdir(top)):
        attributes = {}
        for field in ("vendor", "device", "class"):
            with open(os.path.join(top, name, field), encoding="ascii") as handle:
                value = handle.read().strip().removeprefix("0x")
            attributes[field] = value[:4]  # class: 0x120000 -> 1200 (class, subclass)
        found.append(attributes)
    return found


def stock_nfd_labels(host_root: str) -> dict[str, str]:
    """The PCI labels of a stock nfd-worker: pci-<class>_<vendor>.present for whitelisted
    classes (matched by prefix)."""
    return {
        f"{NFD}pci-{d['class']}_{d['vendor']}.present": "true"
        for d in pci_devices(host_root)
        if d["class"].startswith(NFD_STOCK_CLASSES)
    }


def nfd_rule_labels(rule_object: dict[str, Any], host_root: str) -> dict[str, str]:
    """The labels a NodeFeatureRule's rules give this node (pci.device In expressions only:
    anything else in a rule is an AssertionError, so a rule this cannot read fails the test)."""
    labels: dict[str, str] = {}
    devices = pci_devices(host_root)
    for rule in rule_object["spec"]["rules"]:
        matched = True
        for term in rule["matchFeatures"]:
            assert term["feature"] == "pci.device", term
            assert all(e["op"] == "In" for e in term["matchExpressions"].values()), term
            matched = matched and any(
                all(d.get(k) in e["value"] for k, e in term["matchExpressions"].items())
                for d in devices
            )
        if matched:
            labels.update(rule["labels"])
    return labels
