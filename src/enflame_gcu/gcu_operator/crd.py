"""The GcuResource CustomResourceDefinitions, built once here (deploy/operator/crd.yaml is made
from this; a test keeps it current): `python -m enflame_gcu.gcu_operator.crd`.

Two CRDs, since a CRD belongs to one API group and Kubernetes converts only between versions of
one CRD: ``gcuresources.topscloud.enflame.com`` (the vendor's 2.4.6 group, ours) and
``gcuresources.topsops.enflame.com`` (operator 2.0-2.1). Both are served with the same schema
and both are reconciled; the operator converts the 2.0 keys on read. A conversion webhook could
not join two groups, and the 1.20 tier has no webhook serving either.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from enflame_gcu.gcu_operator import resource as rs

Obj = dict[str, Any]
DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A label value (empty, or alphanumerics with '-', '_', '.' inside), checked at admission.
LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A DRS selection as the DRA driver's --drs takes it (enflame_gcu.drs.SELECTION_ITEM, listed).
_DRS_ITEM = "\\s*(all|gcu[0-9]+|[A-Za-z][A-Za-z0-9 ]{0,31})\\s*"
DRS_SELECTION = f"^$|^{_DRS_ITEM}(,{_DRS_ITEM})*$"


def _string(description: str, **extra: Any) -> Obj:
    return {"type": "string", "description": description, **extra}


def base_fields() -> dict[str, Obj]:
    """The vendor's BaseFields: the same keys in every component."""
    return {
        "notDeploy": {"type": "boolean", "default": False, "description": "skip this component"},
        "name": _string("workload name", pattern=DNS_LABEL, maxLength=63),
        "image": _string("image name (without repository and tag)"),
        "repository": _string("registry path"),
        "version": _string("image tag; 'default' and 'latest' mean this release's tag"),
        "imagePullPolicy": _string("pull policy", enum=list(rs.PULL_POLICIES)),
        "namespace": _string("namespace", pattern=DNS_LABEL, maxLength=63),
        "env": {
            "type": "array",
            "description": "extra environment variables",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": _string("variable name", minLength=1),
                    "value": _string("value"),
                },
            },
        },
        "nodeSelector": {
            "type": "object",
            "description": "node labels the component's pods require",
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        },
        "tolerations": {
            "type": "array",
            "description": "taints the component's pods tolerate, besides the operator's own",
            "items": {
                "type": "object",
                "properties": {
                    "key": _string("taint key (empty with Exists: every taint)"),
                    "operator": _string("Exists or Equal (Equal)", enum=["Exists", "Equal"]),
                    "value": _string("taint value (Equal)"),
                    "effect": _string(
                        "NoSchedule, PreferNoSchedule, NoExecute (empty: any)",
                        enum=["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
                    ),
                    "tolerationSeconds": {"type": "integer"},
                },
            },
        },
        "affinity": {
            "type": "object",
            "description": "the pods' affinity (a Kubernetes Affinity); its required node "
            "affinity narrows where the component runs",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "command": {"type": "array", "items": {"type": "string"}, "description": "not honoured"},
        "args": {"type": "array", "items": {"type": "string"}, "description": "extra arguments"},
    }


def _component(description: str, **more: Obj) -> Obj:
    return {"type": "object", "description": description, "properties": {**base_fields(), **more}}


def _base(description: str) -> Obj:
    return _component(description)


def _plugin(description: str) -> Obj:
    """The device plugin: BaseFields and what it publishes (ours)."""
    # Absolute, with no empty, "." or ".." segment (the operator checks the same again).
    segment = "[^/.\\x00][^/\\x00]*|\\.[^/.\\x00][^/\\x00]*|\\.\\.[^/\\x00]+"
    host_dir = f"^(/({segment}))+$"
    return _component(
        description,
        nodeState=_flag(
            "ours: keep the Node's enflame.com/gcu-node-state annotation current for the "
            "scheduler extender (its own ServiceAccount may get and patch Nodes); off unless "
            "true: set it where the scheduler extender runs"
        ),
        telemetry={
            "type": "object",
            "description": "ours: card telemetry through the host's libefml (off by default)",
            "properties": {
                "enabled": _flag("collect card telemetry (docs/metrics.md)"),
                "interval": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": rs.TELEMETRY_MAX_INTERVAL,
                    "description": "seconds between collection passes (10)",
                },
                "timeout": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": rs.TELEMETRY_MAX_TIMEOUT,
                    "description": "seconds one card's libefml calls may take (5)",
                },
                "isolation": _string(
                    "thread: libefml in the plugin; process: in a child process (thread)",
                    enum=list(rs.TELEMETRY_ISOLATION),
                ),
                "libraryDir": _string(
                    "host directory holding libefml.so, mounted read-only (/usr/lib)",
                    pattern=host_dir,
                ),
                "efsmiDir": _string(
                    "the vendor's install directory, mounted read-only; empty: none "
                    "(/usr/local/efsmi)",
                    pattern=f"^$|{host_dir}",
                ),
            },
        },
    )


def _webhook() -> Obj:
    """spec.dra.webhook: enflame-dra-webhook, the switch-local rewrite (the chart's dra.webhook)."""
    return {
        "type": "object",
        "description": "ours: enflame-dra-webhook rewrites enflame.com/gcu: N pods to a "
        "switch-local DRA claim (docs/dra.md, Unmodified pods); needs resource.k8s.io/v1 "
        "(Kubernetes >= 1.34) and cert-manager (its certificate)",
        "properties": {
            "enabled": _flag("deploy it (off by default)"),
            "namespaceSelector": {
                "type": "object",
                "description": "namespaces whose pods are rewritten (a label selector; default "
                f"matchLabels {rs.WEBHOOK_OPT_IN}: 'true'; {{}} = every namespace)",
                "properties": {
                    "matchLabels": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                    },
                    "matchExpressions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["key", "operator"],
                            "properties": {
                                "key": {"type": "string"},
                                "operator": {
                                    "type": "string",
                                    "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                                },
                                "values": {"type": "array", "items": {"type": "string"}},
                            },
                        },
                    },
                },
            },
        },
    }


def _flag(description: str) -> Obj:
    return {"type": "boolean", "description": description}


def spec_schema() -> Obj:
    """The spec: every vendor key (2.0 and 2.4.6) and ours."""
    nightingale_deploys = {
        f"{name}-deploy": _base(f"Nightingale {name} Deployment (not honoured)")
        for name in ("agentd", "mysql", "nserver", "nwebapi", "prometheus", "redis")
    }
    properties: dict[str, Obj] = {
        "containerToolkit": _base("the toolkit installer DaemonSet (enflame-ctk install)"),
        "toolkit": _base("operator 2.0's name for containerToolkit"),
        "devicePlugin": _plugin("the device plugin DaemonSet"),
        "plugin": _plugin("operator 2.0's name for devicePlugin"),
        "gcuExporter": _base("metrics: the device plugin's port 9402 behind a Service"),
        "exporter": _base("operator 2.0's name for gcuExporter"),
        "gfd": _base("node labels: the device plugin keeps NFD's feature file current"),
        "dra": _component(
            "ours: the DRA driver on nodes labelled enflame.com/gcu.mode=dra (k8s >= 1.34)",
            drs=_string(
                "DRS partitions (docs/dra.md): empty off; 'all', or comma-separated cards (gcu3), "
                "models (S60) or families (S); needs Kubernetes >= 1.36 and efsmi on the node, "
                "and runs the driver privileged",
                pattern=DRS_SELECTION,
            ),
            efsmi=_string(
                "the efsmi program in the container (the host's /usr/local/efsmi is mounted "
                "there; /usr/local/efsmi/efsmi)",
                pattern="^(/[^/\\x00]+)+$",
            ),
            webhook=_webhook(),
        ),
        "validator": _base(
            "ours: a pod per node that asks for one GCU and checks it (on by default)"
        ),
        "nodeMode": _string(
            "ours: how nodes put cards into containers", enum=list(rs.NODE_MODES), default="auto"
        ),
        "upgradePolicy": {
            "type": "object",
            "description": "ours: how a changed component rolls over the nodes",
            "properties": {
                "maxUnavailable": {
                    "x-kubernetes-int-or-string": True,
                    "default": 1,
                    "description": "nodes upgraded at once: a count or a percentage such as 25%",
                    # 1.20 allows only bare types inside an int-or-string anyOf; minimum applies
                    # to the integer form, pattern to the string form.
                    "anyOf": [{"type": "integer"}, {"type": "string"}],
                    "minimum": 1,
                    "pattern": "^([1-9][0-9]?|100)%$",
                },
                "podReadyTimeoutSeconds": {
                    "type": "integer",
                    "minimum": 10,
                    "default": 300,
                    "description": "a new pod (or the validator) not ready by then fails the node",
                },
                "drain": {
                    "type": "object",
                    "properties": {
                        "enable": {
                            "type": "boolean",
                            "default": False,
                            "description": "cordon the node and evict its GCU pods first",
                        },
                        "timeoutSeconds": {"type": "integer", "minimum": 0, "default": 300},
                    },
                },
            },
        },
        "nfd": _component(
            "node-feature-discovery (not part of this toolkit; reported)",
            master=_base("NFD master"),
            worker=_base("NFD worker"),
        ),
        "driver": _base("the vendor's driver container (not honoured; reported)"),
        "nodeExporter": _base("node-exporter (not honoured; reported)"),
        "k8sDriverManager": _base("driver manager (not honoured; reported)"),
        "gcusharePlugin": _component(
            "gcushare device plugin (not honoured; reported)",
            memoryUnit={"type": "string", "enum": ["1", "0.1", "0.01", "0.001"], "default": "1"},
            gcushareNodes={"type": "array", "items": {"type": "string"}},
        ),
        "gcushareScheduler": _base("gcushare scheduler extender (not honoured; reported)"),
        "gcushareConfigManager": _base("gcushare config manager (not honoured; reported)"),
        "nightingale": {
            "type": "object",
            "description": "Nightingale monitoring (not honoured; reported)",
            "properties": {
                "notDeploy": {"type": "boolean", "default": False},
                "namespace": _string("namespace", pattern=DNS_LABEL),
                **nightingale_deploys,
                "mysql-pv": {
                    "type": "object",
                    "required": ["name", "hostpath"],
                    "properties": {"name": {"type": "string"}, "hostpath": {"type": "string"}},
                },
                "mysql-pvc": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                },
            },
        },
        "volcano": {
            "type": "object",
            "description": "Volcano (not honoured; reported)",
            "properties": {
                "notDeploy": {"type": "boolean", "default": False},
                "namespace": _string("namespace", pattern=DNS_LABEL),
                "controller": _base("Volcano controller"),
                "admission": _base("Volcano admission"),
                "scheduler": _base("Volcano scheduler"),
            },
        },
    }
    return {"type": "object", "description": "the components to deploy", "properties": properties}


def crd(group: str) -> Obj:
    """The CRD of GcuResource in ``group``."""
    is_ours = group == rs.GROUP
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{rs.PLURAL}.{group}",
            "labels": {"app.kubernetes.io/part-of": "enflame-gcu"},
        },
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {
                "kind": rs.KIND,
                "listKind": f"{rs.KIND}List",
                "plural": rs.PLURAL,
                "singular": "gcuresource",
                # One short name for one group: kubectl would have to guess between two.
                "shortNames": ["gr"] if is_ours else ["gr-legacy"],
            },
            "versions": [
                {
                    "name": rs.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "READY",
                            "type": "string",
                            "jsonPath": ".status.readyResource",
                            "description": "running components / components in this resource",
                        },
                        {"name": "STATUS", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Enflame GCU components of a cluster (docs/operator.md)",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    """Both CRDs as one YAML stream."""
    header = (
        "# Generated by `python -m enflame_gcu.gcu_operator.crd` (src/enflame_gcu/gcu_operator/"
        "crd.py);\n# do not edit: tests/gcu_operator/test_crd.py keeps it current.\n"
    )
    docs = [crd(rs.GROUP), crd(rs.LEGACY_GROUP)]
    return header + "---\n".join(yaml.safe_dump(d, sort_keys=False, width=100) for d in docs)


if __name__ == "__main__":
    sys.stdout.write(render())
