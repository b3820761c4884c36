"""The console's ASGI app, mounted at ``/ui`` by ``recap serve`` and by ``recap ui``.

``create_app`` builds the console for a settings object; it needs ``RECAP_UI_KEYS``.
``mounts(settings)`` is what ``recap serve`` adds to its routes: the console under ``/ui`` when
UI keys are set, nothing otherwise. ``serve`` runs the console on its own (``recap ui``), for a
host that does not run ``recap serve``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from recap.core.errors import RecapError
from recap.core.redact import error_text, known_secrets
from recap.core.request.native_items import described
from recap.core.service.database import get_engine
from recap.core.settings import Settings, get_settings
from recap.workers.ui import memory, routes
from recap.workers.ui.auth import LoginLimiter, Sessions
from recap.workers.ui.headers import SecurityHeaders

log = structlog.get_logger(__name__)

HERE = Path(__file__).parent
PREFIX = "/ui"
DEFAULT_HOST = "127.0.0.1"  # local only unless asked: the console shows every conversation
DEFAULT_PORT = 8401  # beside recap serve's 8400


def _number(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _provider(value: int, calibration: float, up: bool = True) -> str:
    """Recap's count in provider tokens (times the calibration factor), as ``recap stats`` and
    ``recap timeline`` report them: a request rounded up, a budget (``up=False``) down."""
    scaled = value * calibration
    return _number(math.ceil(scaled) if up else math.floor(scaled))


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def templates() -> Jinja2Templates:
    """The page templates (autoescaped), with the console's filters."""
    pages = Jinja2Templates(directory=str(HERE / "templates"))
    pages.env.trim_blocks = pages.env.lstrip_blocks = True  # no blank lines where tags were
    pages.env.filters.update(number=_number, when=_when, percent=_percent, provider=_provider)
    pages.env.filters["provider_items"] = described  # a summary's provider compaction, in words
    return pages


def create_app(settings: Settings | None = None) -> Starlette:
    """The console for these settings (default: the environment's); refuses to start without
    ``RECAP_UI_KEYS``."""
    settings = settings or get_settings()
    if not settings.ui_keys:
        raise RecapError("RECAP_UI_KEYS is empty: set at least one console key")
    secrets = known_secrets(settings)
    static_files = StaticFiles(directory=str(HERE / "static"))

    async def unexpected(request: Request, exc: Exception) -> Response:
        """Any other failure: a page saying it was logged, with no detail (it is in the log)."""
        log.error("console_error", path=request.url.path, error=error_text(exc, secrets))
        message = "internal error (logged by the console)"
        return routes.render(request, "error.html", {"title": "Error", "message": message}, 500)

    app = Starlette(
        routes=[
            Route("/", routes.conversations, methods=["GET"], name="conversations"),
            Route("/login", routes.login_form, methods=["GET"], name="login_form"),
            Route("/login", routes.login, methods=["POST"], name="login"),
            Route("/logout", routes.logout, methods=["POST"], name="logout"),
            Route("/c/{cid:path}", routes.conversation, methods=["GET"], name="conversation"),
            Route("/memory", memory.users, methods=["GET"], name="memory"),
            Route("/memory/u/{user:path}", memory.user, methods=["GET"], name="memory_user"),
            Route("/actions/compress", routes.compress, methods=["POST"], name="compress"),
            Route("/actions/retry", routes.retry, methods=["POST"], name="retry"),
            Mount("/static", app=SecurityHeaders(static_files, pages=False), name="static"),
        ],
        exception_handlers={Exception: unexpected},
        middleware=[Middleware(SecurityHeaders)],
    )
    app.state.console = routes.Console(
        settings=settings,
        engine=get_engine(settings.database_url, create=False),
        sessions=Sessions(settings.ui_keys, settings.serve_keys),
        templates=templates(),
        secrets=secrets,
        logins=LoginLimiter(settings.ui_login_attempts),
    )
    return app


def mounts(settings: Settings) -> list[BaseRoute]:
    """The console under ``/ui`` for ``recap serve``, when console keys are set."""
    if not settings.ui_keys:
        return []
    return [Mount(PREFIX, app=create_app(settings))]


def standalone(settings: Settings | None = None) -> Starlette:
    """The console on its own (``recap ui``): ``/ui``, and ``/`` leading there."""

    def home(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    console = create_app(settings)
    return Starlette(
        routes=[Route("/", home), Mount(PREFIX, app=console)],
        middleware=[Middleware(SecurityHeaders)],
    )


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Run the console under uvicorn until interrupted."""
    import uvicorn

    from recap.workers.logs import configure_logging

    settings = get_settings()
    configure_logging(json_output=settings.log_json, level=settings.log_level)
    app = standalone(settings)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
