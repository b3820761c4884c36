"""The headers every console response carries (pages, redirects, errors, static files).

``SecurityHeaders`` is a pure ASGI middleware: it adds each header the response does not set
itself. Pages are per session and never stored by a cache (``no-store``); the static files
(the style sheet, the scripts, Chart.js) may be kept but are checked again on each use
(``no-cache``: their ETag answers a 304).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make the browser send Origin: null
}
PAGE_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
STATIC_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}


class SecurityHeaders:
    """Adds ``PAGE_HEADERS`` (``STATIC_HEADERS`` with ``pages=False``) to every HTTP response
    of ``app`` that does not set them itself."""

    def __init__(self, app: ASGIApp, *, pages: bool = True) -> None:
        self.app = app
        self.headers = PAGE_HEADERS if pages else STATIC_HEADERS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
