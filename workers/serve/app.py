"""The ASGI app and its server: Starlette routes under uvicorn."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from recap.core.aio import AsyncRecap
from recap.core.errors import RecapError
from recap.core.redact import error_text, known_secrets
from recap.core.settings import Settings, get_settings
from recap.workers import tracing as workers_tracing
from recap.workers.serve import (
    api_routes,
    attach_routes,
    messages_api,
    metrics,
    routes,
    startup,
    tracing,
)
from recap.workers.serve.auth import KeyRing
from recap.workers.serve.errors import SERVER, ServeError
from recap.workers.serve.turns import Turns

log = structlog.get_logger(__name__)

DEFAULT_HOST = "127.0.0.1"  # local only unless asked: the endpoint spends the upstream key
DEFAULT_PORT = 8400
MESSAGES_PATH = "/v1/messages"  # the Messages API: its errors in Anthropic's shape


def create_app(settings: Settings | None = None, address: str | None = None) -> Starlette:
    """The app for these settings (default: the environment's); refuses to start without
    client keys, so an endpoint that spends the upstream key is never open to anyone. Started,
    it says in one line where it listens (``address``) and what it uses."""
    settings = settings or get_settings()
    keys = KeyRing(settings.serve_keys)
    if not keys:
        raise RecapError("RECAP_SERVE_KEYS is empty: set at least one client key")
    if settings.upstream_client == "direct" and not settings.upstream_api_base:
        raise RecapError("RECAP_UPSTREAM_CLIENT=direct needs RECAP_UPSTREAM_API_BASE")
    secrets = known_secrets(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        recap = AsyncRecap(settings=settings)
        turns = Turns(recap, settings)
        watch = startup.WorkerWatch()
        app.state.serve = routes.State(turns=turns, keys=keys, health_fields=watch.fields)
        startup.started_line(address or "(as given)", settings, await watch.check())
        watch.warn_once()
        try:
            yield
        finally:
            await turns.upstream.aclose()
            recap.close()
            workers_tracing.flush()  # the last requests' spans, before the process exits

    async def refused(request: Request, exc: Exception) -> Response:
        """A request refused (``ServeError``, raised anywhere in a route): one log line and the
        error in the API's own shape (Anthropic's for the Messages API, OpenAI's otherwise)."""
        assert isinstance(exc, ServeError)
        log.info("serve_refused", status=exc.status, code=exc.code, error=exc.message)
        if request.url.path.startswith(MESSAGES_PATH):
            return messages_api.error_response(exc)
        return exc.response()

    async def unexpected(request: Request, exc: Exception) -> Response:
        """Any other failure: an OpenAI-format 500 with a masked one-line message."""
        log.error("serve_error", path=request.url.path, error=error_text(exc, secrets))
        return ServeError(500, "internal error (logged by recap serve)", type=SERVER).response()

    from recap.workers.ui.app import (
        mounts as console_mounts,  # here: the console imports serve.auth
    )

    observed = metrics.ServeMetrics() if settings.serve_metrics else None
    extra = [Route("/metrics", metrics.endpoint(observed, settings))] if observed else []
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            *api_routes.ROUTES,
            Route("/v1/conversations/{name:path}/attach", attach_routes.attach, methods=["POST"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
            *extra,
            *console_mounts(settings),  # the web console at /ui, when RECAP_UI_KEYS is set
        ],
        lifespan=lifespan,
        exception_handlers={
            ServeError: refused,
            Exception: unexpected,
            404: api_routes.unknown_route,
            405: api_routes.unknown_route,
        },
    )
    if observed is not None:  # outer: it sees every answer, errors included
        app.add_middleware(metrics.MetricsMiddleware, metrics=observed)
    if workers_tracing.configure(settings, "recap-serve"):  # outermost: a request's root span
        app.add_middleware(tracing.TracingMiddleware)
    return app


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Run the endpoint under uvicorn until interrupted."""
    import uvicorn

    from recap.workers.logs import configure_logging

    settings = get_settings()
    configure_logging(json_output=settings.log_json, level=settings.log_level)
    sock = listening_socket(host, port)  # before anything is created or said to be listening
    try:
        revision = startup.prepare_database(settings)
        if revision is not None:
            log.info(
                "serve_database_created", database=startup.database_url(settings), revision=revision
            )
        app = create_app(settings, address=f"http://{host}:{port}")
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket the server will listen on, bound as uvicorn binds one; an address that is
    taken, not this machine's or no address at all is one ``RecapError`` naming it (uvicorn
    would log the error after the started line, and exit 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # a taken port, an unknown host name, an address not on this host
        sock.close()
        reason = exc.strerror or type(exc).__name__
        raise RecapError(f"cannot listen on {host}:{port}: {reason.lower()}") from None
    return sock
