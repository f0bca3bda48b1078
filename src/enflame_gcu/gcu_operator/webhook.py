"""enflame-dra-webhook's objects (spec.dra.webhook), as deploy/dra/ has them.

The certificate comes from cert-manager, as in the static manifest: a self-signed CA, a serving
certificate for the Service's names that it signs and renews, and the CA injected into the
MutatingWebhookConfiguration's caBundle (``cert-manager.io/inject-ca-from``). The operator
makes no key itself: the project depends on no crypto library and its images are not promised
an ``openssl`` binary, and a key the operator made would need a rotation story of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from enflame_gcu.gcu_operator import components, names
from enflame_gcu.gcu_operator import resource as rs

Obj = dict[str, Any]
NAME = "enflame-dra-webhook"
CA = f"{NAME}-ca"
SELF_SIGNED = f"{NAME}-selfsigned"
TLS_SECRET = f"{NAME}-tls"
PORT = 8443
# The component label of its objects (reconcile removes them with the first stage).
COMPONENT = "draWebhook"
# desired()'s keys for these objects, in the order they are created (the certificate's issuers
# before the certificates, the Service before the registration that names it).
ACCOUNT_KEY = "draWebhookServiceAccount"
ROLE_KEY = "draWebhookRole"
BINDING_KEY = "draWebhookBinding"
SELF_SIGNED_KEY = "draWebhookSelfSignedIssuer"
CA_CERT_KEY = "draWebhookCaCertificate"
CA_ISSUER_KEY = "draWebhookCaIssuer"
CERT_KEY = "draWebhookCertificate"
SERVICE_KEY = "draWebhookService"
DEPLOYMENT_KEY = "draWebhookDeployment"
REGISTRATION_KEY = "draWebhookConfiguration"
KEYS = (
    ACCOUNT_KEY,
    ROLE_KEY,
    BINDING_KEY,
    SELF_SIGNED_KEY,
    CA_CERT_KEY,
    CA_ISSUER_KEY,
    CERT_KEY,
    SERVICE_KEY,
    DEPLOYMENT_KEY,
    REGISTRATION_KEY,
)
# What it may do (the chart's ClusterRole): read the whole-card DeviceClass, read and create the
# switch-local ResourceClaimTemplates; no update, no delete.
RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates"],
        "verbs": ["get", "create"],
    },
]
# Pods labelled so are never rewritten (docs/dra.md).
OPT_OUT = {"key": rs.WEBHOOK_OPT_IN, "operator": "NotIn", "values": ["false"]}


def refusal(dra_served: bool, cert_manager_served: bool) -> str:
    """Why spec.dra.webhook.enabled cannot be deployed here ("" when it can)."""
    if not dra_served:
        # Such a server drops a pod's claim fields silently: a rewritten pod would lose its GCUs.
        return (
            "spec.dra.webhook.enabled: not deployed: the API server does not serve "
            "resource.k8s.io/v1 (the webhook needs Kubernetes >= 1.34)"
        )
    if not cert_manager_served:
        return (
            "spec.dra.webhook.enabled: not deployed: the API server does not serve "
            "cert-manager.io/v1, which makes the webhook's certificate (install cert-manager "
            ">= 1.0, or use the Helm chart's dra.webhook.enabled, which makes it itself)"
        )
    return ""


def _meta(resource: Mapping[str, Any], own: Mapping[str, str], namespace: str, name: str) -> Obj:
    meta: Obj = {
        "name": name,
        "labels": dict(own),
        "ownerReferences": [components.owner_reference(resource)],
    }
    if namespace:
        meta["namespace"] = namespace
    return meta


def _container(component: rs.Component) -> Obj:
    """The webhook's container: the DRA driver's image, the static manifest's settings."""
    probe = {"scheme": "HTTPS", "port": "https"}
    return {
        "name": "webhook",
        "image": component.image,
        "imagePullPolicy": component.pull_policy,
        "command": [NAME],
        "args": [
            f"--http-address=:{PORT}",
            f"--tls-cert-file=/etc/{NAME}/tls.crt",
            f"--tls-key-file=/etc/{NAME}/tls.key",
        ],
        "ports": [{"name": "https", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {**probe, "path": "/readyz"}, "periodSeconds": 10},
        "livenessProbe": {
            "httpGet": {**probe, "path": "/healthz"},
            "periodSeconds": 20,
            "failureThreshold": 3,
        },
        "volumeMounts": [{"name": "tls", "mountPath": f"/etc/{NAME}", "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "48Mi"},
            "limits": {"memory": "192Mi"},
        },
    }


def objects(resource: Mapping[str, Any], spec: rs.ResourceSpec) -> dict[str, Obj]:
    """The webhook's objects by key, in the DRA driver's namespace (none without spec.dra)."""
    component = spec.components.get(rs.DRA)
    if component is None or not spec.dra.webhook:
        return {}
    ns = component.namespace
    own = components.labels(resource, COMPONENT, NAME)
    pods = {names.APP_NAME: NAME, names.RESOURCE_LABEL: own[names.RESOURCE_LABEL]}
    issuer = {"kind": "Issuer"}
    deployment_spec: Obj = {
        "replicas": 2,
        "selector": {"matchLabels": pods},
        "template": {
            "metadata": {"labels": pods},
            "spec": {
                "serviceAccountName": NAME,
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "podAffinityTerm": {
                                    "topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {"matchLabels": pods},
                                },
                            }
                        ]
                    }
                },
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65534,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [_container(component)],
                "volumes": [{"name": "tls", "secret": {"secretName": TLS_SECRET}}],
            },
        },
    }
    registration_meta = _meta(resource, own, "", NAME)
    registration_meta["annotations"] = {"cert-manager.io/inject-ca-from": f"{ns}/{NAME}"}
    return {
        ACCOUNT_KEY: {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(resource, own, ns, NAME),
        },
        ROLE_KEY: {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(resource, own, "", NAME),
            "rules": RULES,
        },
        BINDING_KEY: {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(resource, own, "", NAME),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": NAME,
            },
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}],
        },
        SELF_SIGNED_KEY: {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": _meta(resource, own, ns, SELF_SIGNED),
            "spec": {"selfSigned": {}},
        },
        CA_CERT_KEY: {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": _meta(resource, own, ns, CA),
            "spec": {
                "isCA": True,
                "commonName": CA,
                "secretName": CA,
                "duration": "87600h",
                "issuerRef": {**issuer, "name": SELF_SIGNED},
            },
        },
        CA_ISSUER_KEY: {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": _meta(resource, own, ns, CA),
            "spec": {"ca": {"secretName": CA}},
        },
        CERT_KEY: {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": _meta(resource, own, ns, NAME),
            "spec": {
                "secretName": TLS_SECRET,
                "dnsNames": [NAME, f"{NAME}.{ns}", f"{NAME}.{ns}.svc"],
                "issuerRef": {**issuer, "name": CA},
            },
        },
        SERVICE_KEY: {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(resource, own, ns, NAME),
            "spec": {
                "selector": pods,
                "ports": [{"name": "https", "port": 443, "targetPort": "https"}],
            },
        },
        DEPLOYMENT_KEY: {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(resource, own, ns, NAME),
            "spec": deployment_spec,
        },
        REGISTRATION_KEY: {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": registration_meta,
            "webhooks": [
                {
                    "name": "switch-local.gcu.enflame.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "NoneOnDryRun",
                    "failurePolicy": "Ignore",
                    "matchPolicy": "Equivalent",
                    "reinvocationPolicy": "Never",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "service": {"name": NAME, "namespace": ns, "path": "/mutate", "port": 443}
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": dict(spec.dra.webhook_namespaces),
                    "objectSelector": {"matchExpressions": [OPT_OUT]},
                }
            ],
        },
    }


def wanted(
    resource: Mapping[str, Any], spec: rs.ResourceSpec, dra_served: bool, cert_manager_served: bool
) -> dict[str, Obj]:
    """The webhook's objects where this cluster can run it (none where refusal() says why)."""
    if refusal(dra_served, cert_manager_served):
        return {}
    return objects(resource, spec)
