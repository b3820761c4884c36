"""The SERVER span of each request to ``recap serve`` when ``RECAP_TRACING`` is on.

A pure ASGI middleware, outermost: it continues the client's trace when the request carries a
W3C ``traceparent`` header, names the span by the route (``POST /v1/chat/completions``), and
records the HTTP status. A stored turn's spans are its children: ``recap.read`` (the history
mapped onto the stored tree), ``recap.assemble``, the upstream's ``chat {model}``, ``recap.store``
(the reply and its usage) and ``send compress`` (the enqueued compression, whose task continues
the trace in a worker); the background enqueue runs inside the request's span.

A streamed upstream call's ``chat`` span stays open while the stream is relayed: the request
keeps it (``streaming``), and the stored reply ends it with the usage of its last chunk
(``streams_ended``); whatever is still open when the response has ended (a stream passed
through, or cut off) ends then, without usage.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

import recap.core.tracing as tracing
from recap.workers.serve.metrics import APIS, api_of

SERVER_ERROR = 500
# the request's streamed model calls still open (one list per request, shared by reference
# with the tasks and threads its context is copied to)
_streams: ContextVar[list[Any] | None] = ContextVar("recap_serve_streams", default=None)


def streaming(call: Any) -> None:
    """A streamed call's span, ended by ``streams_ended`` or at the response's end (at once
    outside a traced request)."""
    open_calls = _streams.get()
    if open_calls is None or not call.is_recording():
        call.end()
    else:
        open_calls.append(call)


def streams_ended() -> list[Any]:
    """The request's streamed calls still open, handed over to be ended."""
    open_calls = _streams.get()
    if not open_calls:
        return []
    ended = list(open_calls)
    open_calls.clear()
    return ended


def route_of(path: str) -> str | None:
    """The route a path belongs to (``http.route``): a fixed set, never an id."""
    if path in APIS:
        return path
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{response_id}"
    return None


class TracingMiddleware:
    """One SERVER span per HTTP request, the client's trace continued."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        carrier = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key in (b"traceparent", b"tracestate")
        }
        method, path = scope["method"], scope["path"]
        route = route_of(path)
        attributes = {
            "http.request.method": method,
            "url.path": path,
            "url.scheme": scope.get("scheme", "http"),
            "recap.api": api_of(path),
        }
        if route is not None:
            attributes["http.route"] = route
        name = f"{method} {route}" if route else method
        parent = tracing.extract(carrier)
        token = _streams.set([])
        with tracing.span(name, attributes, kind=tracing.SERVER, context=parent) as span:

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= SERVER_ERROR:
                        span.set_attribute("error.type", str(status))
                        tracing.error_status(span, str(status))
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                for call in streams_ended():
                    call.end()
                _streams.reset(token)
