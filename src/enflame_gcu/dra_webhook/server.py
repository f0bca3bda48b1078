"""The webhook's HTTPS port: ``POST /mutate`` (AdmissionReview), ``GET /healthz``, ``/readyz``.

Served by :mod:`enflame_gcu.bounded_http` (the project's bounded server): bodies over
``max_body`` refused with 413 before they are read, a whole request within ``request_timeout``,
per-peer connection caps. A review is answered on the server's worker thread (it may wait for
the API server), never on the loop that answers the probes. A body that is not an
AdmissionReview gets 400 naming the problem; the API server then applies the webhook's
``failurePolicy`` (Ignore: the pod is admitted as written). Every pod answer is ``allowed``:
the webhook rewrites or leaves alone, it never refuses a pod.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable

from enflame_gcu import bounded_http
from enflame_gcu.dra_webhook import rewrite
from enflame_gcu.dra_webhook.cluster import Cluster

log = logging.getLogger(__name__)
JSON = "application/json"
MAX_BODY = 3 << 20  # the API server's own request limit (3 MiB): any pod it accepts fits
POD = "/v1/Pod"


class WebhookServer:
    """Admission reviews and probes on one bounded HTTPS server."""

    def __init__(
        self,
        address: tuple[str, int],
        cluster: Cluster,
        ssl_context: ssl.SSLContext | None,
        *,
        resource: str = rewrite.RESOURCE,
        request_timeout: float = 10.0,
        max_body: int = MAX_BODY,
        ready: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.resource = resource
        self._ready = ready
        self.rewritten = 0
        self.limits = bounded_http.Limits(
            connections=64,
            per_client=64,  # the API servers' addresses are few and they pool connections
            rate_per_client=200.0,
            burst_per_client=200,
            head_bytes=16384,
            head_timeout=request_timeout,
            body_bytes=max_body,
            keep_alive=True,
            idle_timeout=90.0,
            methods=("GET", "POST"),
            offloaded=32,
        )
        sock = bounded_http.listen(address[0], address[1], self.limits.backlog, "the webhook")
        self._server = bounded_http.BoundedServer(
            self.answer,
            sock,
            self.limits,
            name="dra-webhook-http",
            ssl_context=ssl_context,
            offload=lambda request: request.method == "POST",
        )

    def answer(self, request: bounded_http.Request) -> bounded_http.Response:
        """One request: a review, a probe, or 404."""
        path = request.path.rstrip("/") or "/"
        if request.method == "POST" and path == "/mutate":
            try:
                review = rewrite.parse_review(request.body)
            except rewrite.ReviewError as exc:
                log.warning("refused a request from %s: %s", request.peer, exc)
                return bounded_http.Response(400, f"not an AdmissionReview: {exc}\n")
            try:
                document = self.review(review)
            except Exception:  # a bug must not take the pod's cards: admit it as written
                log.exception("reviewing pod %s failed; admitted as written", review.uid)
                document = rewrite.response(review, warnings=[_note("internal error")])
            return bounded_http.Response(200, json.dumps(document), JSON)
        if request.method == "GET" and path == "/healthz":
            return bounded_http.Response(200, "ok\n")
        if request.method == "GET" and path == "/readyz":
            ok, reason = self._ready() if self._ready else (True, "ok")
            return bounded_http.Response(200 if ok else 503, f"{reason}\n")
        return bounded_http.Response(404, "not found; POST /mutate, GET /healthz, /readyz\n")

    def review(self, review: rewrite.Review) -> dict[str, object]:
        """The answer to one review: the pod's patch, or the pod as written (and why)."""
        if review.kind != POD or review.operation != "CREATE":
            return rewrite.response(review)
        chosen = rewrite.plan(review.pod, self.resource)
        if chosen.skip:
            log.debug("pod %s left as written: %s", review.uid, chosen.skip)
            return rewrite.response(review, warnings=[_note(chosen.skip)] if chosen.warn else ())
        problem = self.cluster.dra_problem()
        for cards in chosen.sizes:
            if problem:
                break
            problem = self.cluster.template_problem(
                review.namespace, cards, create=not review.dry_run
            )
        if problem:
            log.warning("pod in %s left as written: %s", review.namespace, problem)
            return rewrite.response(review, warnings=[_note(problem)])
        self.rewritten += 1
        return rewrite.response(review, rewrite.patch(review.pod, chosen, self.resource))

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._server.start()

    def stop(self) -> None:
        """Stop listening and end every connection."""
        self._server.stop()

    @property
    def port(self) -> int:
        """The port bound (useful with port 0)."""
        return self._server.port


def _note(why: str) -> str:
    return f"enflame-dra-webhook: not rewritten to a switch-local claim: {why}"
