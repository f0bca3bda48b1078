"""Labels, annotations and names the operator puts on what it creates and on the nodes."""

from __future__ import annotations

OPERATOR = "enflame-gcu-operator"
MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF = "app.kubernetes.io/part-of"
APP_NAME = "app.kubernetes.io/name"
# Which GcuResource (by uid: the two API groups may hold resources of the same name) and which
# of its components an object or pod belongs to.
RESOURCE_LABEL = "enflame.com/gcu.resource-uid"
COMPONENT_LABEL = "enflame.com/gcu.component"
# Set on a component's pod template: a pod whose value differs from its DaemonSet's is outdated.
TEMPLATE_HASH = "enflame.com/gcu.template-hash"
# Node labels the operator sets (and only those it recorded setting are ever removed).
DEPLOY_LABEL_PREFIX = "enflame.com/gcu.deploy."
VALIDATED_LABEL = "enflame.com/gcu.validated"
# Which resource (uid) owns a component on a node: its DaemonSet selects it, so two resources
# never both run one component on one node (set and removed with the deploy label).
OWNER_LABEL_PREFIX = "enflame.com/gcu.owner."
# The user's per-node choice of DRA (the same label the chart and deploy/dra use).
MODE_LABEL = "enflame.com/gcu.mode"
# GCU nodes: Node Feature Discovery's stock label (PCI class 1200, the processing accelerator
# class GCUs report, and vendor 1e36), its short form (deviceLabelFields: [vendor]), or the one
# the NodeFeatureRule (deploy/yaml/enflame-gcu-nodefeaturerule.yaml) or a person sets.
GCU_NODE_LABELS = (
    ("feature.node.kubernetes.io/pci-1200_1e36.present", "true"),
    ("feature.node.kubernetes.io/pci-1e36.present", "true"),
    ("enflame.com/gcu.present", "true"),
)
# JSON on each node: the labels we set, the last validation, whether we cordoned it.
NODE_STATE_ANNOTATION = "enflame.com/gcu.operator-state"
# A validator pod's target hash (the plugin's and toolkit's template hashes it validates).
VALIDATES_ANNOTATION = "enflame.com/gcu.validates"
GCU_RESOURCE_PREFIX = "enflame.com/"
# The whole-card resource a device-plugin node's validator pod asks one of.
GCU_RESOURCE = "enflame.com/gcu"
# The node a validator pod checks: an annotation (node names run to 253 characters, label
# values to 63), and a label too when the name fits in one.
VALIDATOR_NODE = "enflame.com/gcu.node"


def deploy_label(component: str) -> str:
    """The node label that lets ``component``'s DaemonSet run on a node."""
    return DEPLOY_LABEL_PREFIX + component


def owner_label(component: str) -> str:
    """The node label naming (by uid) the resource whose ``component`` runs on a node."""
    return OWNER_LABEL_PREFIX + component
