"""Prometheus metrics of ``recap serve`` (``RECAP_SERVE_METRICS``): ``GET /metrics``.

A pure ASGI middleware opens one ``Observation`` per request in a context variable; the turn
code reports into it through four plain functions (``assembled``, ``upstream_started``,
``upstream_answered``, ``recall_answered``) that return at once when metrics are off (no
observation is open). When the response ends, the middleware records the request: its API and
status, the last assembly's tokens and truncation, the upstream's time to its first byte and in
total, and the time serve added before its own first byte. Each app has its own registry, so
two apps in one process never share or clash.
"""

from __future__ import annotations

import hmac
import time
from contextvars import ContextVar
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from recap.core.settings import Settings

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ADDED = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKENS = (256, 1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)

# The API a path belongs to (the ``api`` label): a fixed set, so a scan of odd paths cannot
# grow the label space.
APIS = {
    "/v1/chat/completions": "chat_completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/models": "models",
    "/health": "health",
}


def api_of(path: str) -> str:
    api = APIS.get(path)
    if api is not None:
        return api
    if path.startswith("/v1/responses/"):
        return "responses"
    if path.startswith("/v1/messages/"):
        return "messages"
    return "other"


class ServeMetrics:
    """The metrics of one app, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "recap_serve_requests", "Requests answered, by API and HTTP status",
            ["api", "status"], registry=r,
        )  # fmt: skip
        self.request_tokens = Histogram(
            "recap_serve_request_tokens", "Tokens of the request Recap assembled for a turn",
            buckets=TOKENS, registry=r,
        )  # fmt: skip
        self.turns = Counter("recap_serve_turns", "Stored turns assembled", registry=r)
        self.truncated = Counter(
            "recap_serve_truncated_turns", "Turns whose older history was left out to fit",
            registry=r,
        )  # fmt: skip
        self.left_out = Counter(
            "recap_serve_left_out_tokens", "Stored tokens of older history left out of requests",
            registry=r,
        )  # fmt: skip
        self.upstream_first = Histogram(
            "recap_serve_upstream_first_byte_seconds",
            "Time waiting for upstream answers, a request's calls summed (a stream: to headers)",
            buckets=SECONDS, registry=r,
        )  # fmt: skip
        self.upstream_total = Histogram(
            "recap_serve_upstream_seconds",
            "Upstream time of a request to the end of its reply (a stream: its last chunk)",
            buckets=SECONDS, registry=r,
        )  # fmt: skip
        self.added = Histogram(
            "recap_serve_added_seconds",
            "Time serve adds before its first byte, upstream time excluded",
            buckets=ADDED, registry=r,
        )  # fmt: skip
        self.recalls = Counter(
            "recap_serve_recalls_answered", "recap_recall calls answered", registry=r
        )

    def record(self, seen: Observation, status: int, first: float, end: float) -> None:
        """One request's metrics, at its end."""
        self.requests.labels(seen.api, str(status)).inc()
        assembled = seen.assembled
        if assembled is not None:
            self.turns.inc()
            self.request_tokens.observe(assembled.tokens.total)
            if assembled.truncated:
                self.truncated.inc()
                self.left_out.inc(assembled.truncated_tokens)
        if seen.recalls:
            self.recalls.inc(seen.recalls)
        if seen.upstream_first:  # an upstream call answered
            upstream = seen.upstream_spent  # every call's wait for its answer, summed
            self.upstream_first.observe(upstream)
            rest = max(end - seen.upstream_first, 0.0) if seen.streamed else 0.0
            self.upstream_total.observe(upstream + rest)
            self.added.observe(max(first - seen.started - upstream, 0.0))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Observation:
    """What one request reports while it runs."""

    __slots__ = (
        "_call",
        "api",
        "assembled",
        "recalls",
        "started",
        "streamed",
        "upstream_first",
        "upstream_spent",
    )  # fmt: skip

    def __init__(self, api: str, started: float) -> None:
        self.api = api
        self.started = started
        self.assembled: Any = None
        self.recalls = 0
        self.upstream_first = 0.0  # when the last upstream call answered
        self.upstream_spent = 0.0  # seconds spent waiting for upstream answers, all calls
        self.streamed = False
        self._call = 0.0


_current: ContextVar[Observation | None] = ContextVar("recap_serve_observation", default=None)


def assembled(request: Any) -> None:
    """The turn's (latest) assembly: its tokens and truncation are the request's."""
    seen = _current.get()
    if seen is not None:
        seen.assembled = request


def upstream_started() -> None:
    seen = _current.get()
    if seen is not None:
        seen._call = time.perf_counter()


def upstream_answered(*, stream: bool) -> None:
    seen = _current.get()
    if seen is not None and seen._call:
        now = time.perf_counter()
        seen.upstream_first = now
        seen.upstream_spent += now - seen._call
        seen.streamed = stream


def recall_answered(count: int = 1) -> None:
    seen = _current.get()
    if seen is not None:
        seen.recalls += count


class MetricsMiddleware:
    """Opens an ``Observation`` for each HTTP request and records it when the response ends."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            await self.app(scope, receive, send)
            return
        seen = Observation(api_of(scope["path"]), time.perf_counter())
        token = _current.set(seen)
        status = 500
        first = last = 0.0

        async def sending(message: Message) -> None:
            nonlocal status, first, last
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "http.response.body":
                now = time.perf_counter()
                first = first or now
                if not message.get("more_body", False):
                    last = now
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            _current.reset(token)
            end = last or time.perf_counter()  # the response's end, before background tasks
            self.metrics.record(seen, status, first or end, end)


def endpoint(metrics: ServeMetrics, settings: Settings) -> Any:
    """``GET /metrics``: the exposition, to ``Authorization: Bearer RECAP_SERVE_METRICS_KEY``
    when that is set (anyone else: 401)."""
    key = settings.serve_metrics_key.get_secret_value() if settings.serve_metrics_key else None
    expected = f"Bearer {key}".encode() if key else None

    async def metrics_route(request: Request) -> Response:
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return Response("unauthorized\n", status_code=401, media_type="text/plain")
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return metrics_route
