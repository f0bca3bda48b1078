"""The rewriting webhook over real HTTPS: an unmodified ``enflame.com/gcu: N`` pod becomes a
pod whose claim the strict DRA stand-in API server accepts and the allocator model resolves to
N cards under one switch (then root port, NUMA node, any); everything it cannot do safely (no
``resource.k8s.io/v1``, a template it cannot make, bad input) leaves the pod exactly as written.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from typing import Any

import pytest

from enflame_gcu.dra_webhook import rewrite
from tests.dra_plugin import allocator
from tests.dra_plugin import slices_helpers as helpers
from tests.dra_webhook.conftest import Webhook, admission_review, apply_patch, pod

GCU = "enflame.com/gcu"


def _unchanged(webhook: Webhook, document: dict[str, Any], **request: Any) -> list[str]:
    answer = webhook.review(document, **request)
    assert "patch" not in answer and "patchType" not in answer
    return list(answer.get("warnings") or [])


def test_two_cards_become_a_switch_local_claim_the_server_accepts(webhook: Webhook) -> None:
    written = pod(2)
    answer = webhook.review(written)
    assert answer["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    patched = apply_patch(written, answer)
    container = patched["spec"]["containers"][0]
    assert GCU not in container["resources"]["limits"]
    assert container["resources"]["limits"] == {"cpu": "1"}  # nothing else touched
    assert container["resources"]["claims"] == [{"name": "enflame-gcu-c0"}]
    assert patched["spec"]["resourceClaims"] == [
        {"name": "enflame-gcu-c0", "resourceClaimTemplateName": "enflame-gcu-switch-local-2"}
    ]
    assert patched["metadata"]["annotations"] == {rewrite.ANNOTATION: f"{GCU}: c0=2"}
    # The template was made in the pod's namespace, through the strict server's rules.
    assert webhook.api.refusals == []
    stored = webhook.api.templates[("team-a", "enflame-gcu-switch-local-2")]
    devices = stored["spec"]["spec"]["devices"]
    assert [sub["name"] for sub in devices["requests"][0]["firstAvailable"]] == [
        "switch", "rootport", "numa", "any",
    ]  # fmt: skip
    assert devices["constraints"] == [
        {"requests": ["gcus/switch"], "matchAttribute": "gcu.enflame.com/pcieSwitch"},
        {"requests": ["gcus/rootport"], "matchAttribute": "gcu.enflame.com/pcieRootPort"},
        {"requests": ["gcus/numa"], "matchAttribute": "resource.kubernetes.io/numaNode"},
    ]
    for version in helpers.VERSIONS:  # the published schemas of 1.34 and the newest
        helpers.validate(stored, version)
        helpers.validate(patched, version)
    # A second pod reuses it (no second create).
    creates = [r for r in webhook.api.requests if r[0] == "POST"]
    assert "patch" in webhook.review(pod(2))
    assert [r for r in webhook.api.requests if r[0] == "POST"] == creates


# vendor-8card: switches {0,1} {4,5} (2, 3, 6, 7 alone), root ports and NUMA nodes {0-3} {4-7};
# 2socket-16card: switches = root ports {0-3} {4-7} {8-11} {12-15}, NUMA nodes {0-7} {8-15}.
@pytest.mark.parametrize(
    ("board", "free", "cards", "alternative", "chosen"),
    [
        ("vendor-8card", (1, 2, 4, 5), 2, "gcus/switch", [4, 5]),  # first fit: 1+2, two switches
        ("vendor-8card", (1, 2, 5), 2, "gcus/rootport", [1, 2]),
        ("vendor-8card", (0, 1, 2, 4), 3, "gcus/rootport", [0, 1, 2]),
        ("vendor-8card", (1, 5), 2, "gcus/any", [1, 5]),
        ("2socket-16card", (3, 8, 12, 13), 2, "gcus/switch", [12, 13]),
        ("2socket-16card", (3, 4, 8, 12), 2, "gcus/numa", [3, 4]),
        ("2socket-16card", (0, 5, 6, 7, 9), 4, "gcus/numa", [0, 5, 6, 7]),
        ("2socket-16card", (0, 1, 9, 10, 11, 12), 4, "gcus/numa", [9, 10, 11, 12]),
    ],
)
def test_the_allocator_resolves_the_patched_pod_switch_local_first(  # noqa: PLR0917
    webhook: Webhook,
    tmp_path: Any,
    board: str,
    free: tuple[int, ...],
    cards: int,
    alternative: str,
    chosen: list[int],
) -> None:
    patched = apply_patch(pod(cards), webhook.review(pod(cards)))
    name = patched["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    claim = webhook.api.templates[("team-a", name)]["spec"]["spec"]
    inventory = helpers.make_fixture_node(str(tmp_path), board)
    wanted = {f"gcu-{m}" for m in free}
    available = [d for d in helpers.published(inventory) if d["name"] in wanted]
    assert allocator.allocate(claim, helpers.device_classes(), available) == {
        alternative: [f"gcu-{m}" for m in chosen]
    }


def test_one_card_is_a_plain_request(webhook: Webhook) -> None:
    patched = apply_patch(pod(1), webhook.review(pod(1)))
    assert patched["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].endswith("-1")
    stored = webhook.api.templates[("team-a", "enflame-gcu-switch-local-1")]
    assert stored["spec"]["spec"]["devices"] == {
        "requests": [
            {
                "name": "gcus",
                "exactly": {"deviceClassName": "gcu.enflame.com", "allocationMode": "ExactCount",
                            "count": 1},
            }
        ]
    }  # fmt: skip


def test_each_container_and_sidecar_gets_its_own_claim(webhook: Webhook) -> None:
    written = pod(2, 0, 4)
    sidecar = {"name": "s", "image": "x", "restartPolicy": "Always",
               "resources": {"requests": {GCU: "1"}, "limits": {GCU: "1"}}}  # fmt: skip
    written["spec"]["initContainers"] = [sidecar]
    written["spec"]["containers"][1]["resources"]["limits"].pop(GCU)
    written["metadata"]["annotations"] = {"keep": "me"}
    patched = apply_patch(written, webhook.review(written))
    spec = patched["spec"]
    assert spec["initContainers"][0]["resources"] == {
        "requests": {}, "limits": {}, "claims": [{"name": "enflame-gcu-init0"}],
    }  # fmt: skip
    assert "claims" not in spec["containers"][1]["resources"]
    assert spec["containers"][2]["resources"]["claims"] == [{"name": "enflame-gcu-c2"}]
    assert [c["resourceClaimTemplateName"] for c in spec["resourceClaims"]] == [
        "enflame-gcu-switch-local-2", "enflame-gcu-switch-local-4", "enflame-gcu-switch-local-1",
    ]  # fmt: skip
    assert patched["metadata"]["annotations"]["keep"] == "me"
    assert sorted(n for _, n in webhook.api.templates) == [
        "enflame-gcu-switch-local-1", "enflame-gcu-switch-local-2", "enflame-gcu-switch-local-4",
    ]  # fmt: skip


def test_a_server_without_resource_k8s_io_v1_gets_the_pod_as_written(webhook: Webhook) -> None:
    # A server before 1.34 would drop spec.resourceClaims and the pod would lose its cards.
    webhook.api.served = False
    (warning,) = _unchanged(webhook, pod(2))
    assert "does not serve DeviceClass gcu.enflame.com in resource.k8s.io/v1" in warning
    assert webhook.api.templates == {}


def test_no_device_class_means_no_rewrite(webhook: Webhook) -> None:
    webhook.api.device_classes.pop("gcu.enflame.com")
    (warning,) = _unchanged(webhook, pod(2))
    assert "DeviceClass gcu.enflame.com" in warning


def test_a_template_the_server_refuses_leaves_the_pod_as_written(webhook: Webhook) -> None:
    # DRAPrioritizedList off: firstAvailable is dropped and the claim spec is refused.
    webhook.api.gates["DRAPrioritizedList"] = False
    (warning,) = _unchanged(webhook, pod(2))
    assert "enflame-gcu-switch-local-2" in warning
    assert webhook.api.templates == {}
    assert webhook.api.refusals


def test_a_template_edited_by_hand_is_not_used(webhook: Webhook) -> None:
    other = rewrite.template(2, "team-a")
    other["spec"]["spec"]["devices"].pop("constraints")
    other["metadata"].update(uid="u", resourceVersion="1", generation=1)
    webhook.api.templates[("team-a", "enflame-gcu-switch-local-2")] = other
    (warning,) = _unchanged(webhook, pod(2))
    assert "another spec" in warning


def test_an_api_server_that_does_not_answer_leaves_the_pod_as_written(webhook: Webhook) -> None:
    webhook.api.down = True
    (warning,) = _unchanged(webhook, pod(2))
    assert "did not answer" in warning


def test_a_dry_run_creates_nothing(webhook: Webhook) -> None:
    (warning,) = _unchanged(webhook, pod(2), dryRun=True)
    assert "dry run" in warning
    assert webhook.api.templates == {}
    assert not [r for r in webhook.api.requests if r[0] == "POST"]
    # Once the template exists, a dry run shows the rewrite the real create would get.
    webhook.review(pod(2))
    assert "patch" in webhook.review(pod(2), dryRun=True)


@pytest.mark.parametrize(
    "change",
    ["no-gcu", "opted-out", "pod-claims", "container-claims", "update", "not-a-pod", "node-name"],
)
def test_pods_it_leaves_alone(webhook: Webhook, change: str) -> None:
    written = pod(2)
    request: dict[str, Any] = {}
    container = written["spec"]["containers"][0]
    if change == "no-gcu":
        container["resources"]["limits"].pop(GCU)
    elif change == "opted-out":
        written["metadata"]["labels"] = {rewrite.OPT_OUT_LABEL: "false"}
    elif change == "pod-claims":
        written["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimTemplateName": "mine"}]
    elif change == "container-claims":
        container["resources"]["claims"] = [{"name": "x"}]
    elif change == "node-name":
        written["spec"]["nodeName"] = "gcu-node-7"
    elif change == "update":
        request = {"operation": "UPDATE", "oldObject": written}
    else:
        request = {"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}}
    _unchanged(webhook, written, **request)
    assert webhook.api.templates == {}


@pytest.mark.parametrize(
    ("limits", "requests", "said"),
    [
        ("-1", None, "not a whole number"),
        ("1.5", None, "not a whole number"),
        ("2k", None, "not a whole number"),
        ("500m", None, "not a whole number"),
        ("33", None, "more than one claim holds"),
        ([2], None, "not a quantity"),
        ("2", "1", "differ"),
    ],
)
def test_quantities_it_cannot_serve_leave_the_pod_as_written(
    webhook: Webhook, limits: Any, requests: Any, said: str
) -> None:
    written = pod(2)
    written["spec"]["containers"][0]["resources"]["limits"][GCU] = limits
    if requests is not None:
        written["spec"]["containers"][0]["resources"]["requests"] = {GCU: requests}
    (warning,) = _unchanged(webhook, written)
    assert said in warning
    assert webhook.api.templates == {}


def test_an_init_container_asking_cards_keeps_the_plain_path(webhook: Webhook) -> None:
    # The device plugin lets app containers reuse an init container's cards; a claim cannot.
    written = pod(2)
    written["spec"]["initContainers"] = [
        {"name": "warm", "image": "x", "resources": {"limits": {GCU: "2"}}}
    ]
    (warning,) = _unchanged(webhook, written)
    assert "init container warm" in warning


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        pytest.param(b"[" * 50_000, "nested too deeply", id="deep"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}), "want"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "request"),
        (
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"uid": ""},
                }
            ),
            "uid",
        ),
        (json.dumps(admission_review({"metadata": {}, "spec": []}, object=7)), "object"),
    ],
)
def test_malformed_reviews_get_400_naming_the_problem(
    webhook: Webhook, body: bytes | str, said: str
) -> None:
    status, answer = webhook.post(body.encode() if isinstance(body, str) else body)
    assert status == 400
    assert said in answer.decode()
    assert webhook.api.templates == {}


def test_a_huge_body_is_refused_before_it_is_read(webhook: Webhook) -> None:
    # Only the head is sent: the answer comes from the Content-Length alone.
    context = ssl.create_default_context(cafile=os.path.join(webhook.pki, "ca.crt"))
    connection = http.client.HTTPSConnection("127.0.0.1", webhook.server.port, context=context)
    try:
        connection.putrequest("POST", "/mutate")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(70 << 10))
        connection.endheaders()
        assert connection.getresponse().status == 413
    finally:
        connection.close()
    assert webhook.api.templates == {}


def test_unknown_paths_get_404(webhook: Webhook) -> None:
    status, body = webhook.post(b"{}", path="/other")
    assert (status, b"POST /mutate" in body) == (404, True)
