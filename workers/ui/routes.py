"""The console's pages and actions (Starlette endpoints over ``workers.ui.views``).

Pages are sync endpoints (Starlette runs them on its thread pool: the database work never
blocks the event loop); forms are read here with a size cap. Every POST but the login carries the
session's CSRF token, and a POST whose ``Origin`` names another host is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import structlog
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from recap.core.errors import NotFoundError
from recap.core.redact import error_text
from recap.core.settings import Settings
from recap.core.values.console import SORTS
from recap.workers.ui import fields, views
from recap.workers.ui.auth import COOKIE, LoginLimiter, Session, Sessions
from recap.workers.ui.fields import FieldError
from recap.workers.ui.headers import PAGE_HEADERS

log = structlog.get_logger(__name__)

FORM_BYTES_MAX = 8_192  # a login or action form is a few fields
PAGE_SIZES = (10, 25, 50, 100, fields.PAGE_SIZE_MAX)
DEFAULT_PORTS = {"http": 80, "https": 443}  # an Origin names its port only when it is another


@dataclass(kw_only=True)
class Console:
    """What the endpoints share: settings, the engine, the sessions, the templates."""

    settings: Settings
    engine: Engine
    sessions: Sessions
    templates: Jinja2Templates
    secrets: list[str]
    logins: LoginLimiter


def console_of(request: Request) -> Console:
    value: Console = request.app.state.console
    return value


def base_of(request: Request) -> str:
    """The path the console is mounted at (``/ui``), with no trailing slash."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def conversation_url(base: str, conversation_id: str, leaf: int | None = None) -> str:
    url = f"{base}/c/{quote(conversation_id, safe='')}"
    return f"{url}?leaf={leaf}" if leaf is not None else url


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> Response:
    console = console_of(request)
    session = current(request)
    full = {
        "base": base_of(request),
        "session": session,
        "conversation_url": conversation_url,
        **context,
    }
    response = console.templates.TemplateResponse(request, name, full, status_code=status_code)
    response.headers.update(PAGE_HEADERS)
    return response


def current(request: Request) -> Session | None:
    return console_of(request).sessions.get(request.cookies.get(COOKIE))


def to_login(request: Request) -> Response:
    return RedirectResponse(f"{base_of(request)}/login", status_code=303)


def not_found(request: Request, what: str) -> Response:
    return render(request, "error.html", {"title": "Not found", "message": what}, 404)


def refused(request: Request, problem: FieldError) -> Response:
    """A field that does not read as what it names (``workers.ui.fields``): one line."""
    title = "Not found" if problem.status == 404 else "Bad request"
    context = {"title": title, "message": problem.message}
    return render(request, "error.html", context, problem.status)


def not_a_message(conversation_id: str, leaf: int) -> FieldError:
    return FieldError(f"message {leaf} is not in conversation {conversation_id!r}", status=404)


async def read_form(request: Request) -> dict[str, str] | None:
    """The url-encoded form, one value per field, or None when it is too large or malformed."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES_MAX:
            return None
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[-1] for name, values in fields.items()}


def same_origin(request: Request) -> bool:
    """A POST from a page of this console: an ``Origin`` of the same scheme, host and port
    (default ports filled in), or none (a client that sends no Origin); ``null`` and an
    origin that does not parse are another origin."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    try:
        given = urlsplit(origin)
        port = given.port
    except ValueError:  # a port that is no number
        return False
    own = request.url
    if given.scheme not in DEFAULT_PORTS or not given.hostname or own.scheme not in DEFAULT_PORTS:
        return False
    return (
        given.scheme == own.scheme
        and given.hostname == (own.hostname or "").lower()
        and (port or DEFAULT_PORTS[given.scheme]) == (own.port or DEFAULT_PORTS[own.scheme])
    )


# --- login ----------------------------------------------------------------------------------------


def login_form(request: Request) -> Response:
    if current(request) is not None:
        return RedirectResponse(f"{base_of(request)}/", status_code=303)
    return render(request, "login.html", {"problem": None})


async def login(request: Request) -> Response:
    form = await read_form(request)
    if form is None or not same_origin(request):
        return render(request, "login.html", {"problem": "the form could not be read"}, 400)
    console = console_of(request)
    address = request.client.host if request.client else ""
    wait = console.logins.wait(address)
    if wait:  # refused before the key is looked at: a right key does not pass either
        problem = f"too many wrong keys from this address: try again in {wait} seconds"
        log.warning("console_login_limited", client=address, retry_after=wait)
        response = render(request, "login.html", {"problem": problem}, 429)
        response.headers["Retry-After"] = str(wait)
        return response
    scope = console.sessions.scope_of(form.get("key", ""))
    if scope is None:
        console.logins.failed(address)
        log.warning("console_login_refused", client=address)
        return render(request, "login.html", {"problem": "wrong key"}, 401)
    console.logins.succeeded(address)
    token, _ = console.sessions.open(scope)
    response = RedirectResponse(f"{base_of(request)}/", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=f"{base_of(request)}/",
    )
    return response


async def logout(request: Request) -> Response:
    """End the session: only with its CSRF token from this console's origin (a forged logout
    ends nothing and keeps the cookie); with no session there is nothing to end."""
    session = current(request)
    if session is not None:
        form = await read_form(request)
        if form is None or not same_origin(request) or not session.csrf_matches(form.get("csrf")):
            return csrf_refused(request)
        console_of(request).sessions.close(request.cookies.get(COOKIE))
    response = to_login(request)
    response.delete_cookie(COOKIE, path=f"{base_of(request)}/")
    return response


def csrf_refused(request: Request) -> Response:
    message = "the form's CSRF token is missing or wrong: reload the page and try again"
    return render(request, "error.html", {"title": "Refused", "message": message}, 403)


# --- pages ----------------------------------------------------------------------------------------


def conversations(request: Request) -> Response:
    session = current(request)
    if session is None:
        return to_login(request)
    console = console_of(request)
    params = request.query_params
    try:
        search = fields.search(params.get("q"))
        sort = fields.sort(params.get("sort"))
        descending = fields.descending(params.get("dir"))
        page = fields.page(params.get("page"))
        size = fields.size(params.get("size"))
    except FieldError as problem:
        return refused(request, problem)
    view = views.list_view(
        console.engine,
        console.settings,
        session.scope,
        search=search,
        sort=sort,
        descending=descending,
        page=page,
        page_size=size,
    )
    return render(request, "list.html", {"view": view, "size": size, "sorts": SORTS})


def conversation(request: Request) -> Response:
    session = current(request)
    if session is None:
        return to_login(request)
    console = console_of(request)
    params = request.query_params
    try:
        cid = fields.conversation(str(request.path_params["cid"]))
        exists, owner = views.conversation_owner(console.engine, cid)
        if not exists or not session.scope.may_see(owner):  # another key's: as if not there
            raise FieldError(f"unknown conversation {cid!r}", status=404)
        leaf = fields.leaf(params.get("leaf"))
        notice = fields.task_id(params.get("enqueued"))
        if leaf is not None and not views.has_message(console.engine, cid, leaf):
            raise not_a_message(cid, leaf)
    except FieldError as problem:
        return refused(request, problem)
    as_of = params.get("as_of")
    as_of = as_of if as_of and as_of.strip() else None
    try:
        view = views.conversation_view(console.engine, console.settings, cid, leaf, as_of)
    except NotFoundError as exc:
        return not_found(request, str(exc))
    status = 400 if view.as_of is not None and view.as_of.bad_input else 200
    return render(request, "conversation.html", {"view": view, "enqueued": notice}, status)


# --- actions --------------------------------------------------------------------------------------


async def compress(request: Request) -> Response:
    return await _enqueue(request, "compress")


async def retry(request: Request) -> Response:
    return await _enqueue(request, "retry")


async def _enqueue(request: Request, action: str) -> Response:
    """Compress now (the manual button: forced, as ``recap compress --force --enqueue``) or
    retry a failed run (as ``recap retry``: forced too), through ``compress_later``."""
    session = current(request)
    if session is None:
        return to_login(request)
    form = await read_form(request)
    if form is None or not same_origin(request) or not session.csrf_matches(form.get("csrf")):
        return csrf_refused(request)
    if not session.scope.operator:
        message = "actions need a console key (RECAP_UI_KEYS); a client key only reads"
        return render(request, "error.html", {"title": "Refused", "message": message}, 403)
    console = console_of(request)
    try:
        cid = fields.conversation(form.get("conversation"))
        leaf = fields.leaf(form.get("leaf")) if action == "compress" else None
        exists, _ = await run_in_threadpool(views.conversation_owner, console.engine, cid)
        if not exists:
            raise FieldError(f"unknown conversation {cid!r}", status=404)
        if leaf is not None and not await run_in_threadpool(
            views.has_message, console.engine, cid, leaf
        ):
            raise not_a_message(cid, leaf)
    except FieldError as problem:
        return refused(request, problem)
    try:
        task_id = await run_in_threadpool(_send, cid, leaf)
    except Exception as exc:  # the broker is down, say: one masked line, not a traceback
        message = f"could not enqueue: {error_text(exc, console.secrets)}"
        log.warning("console_enqueue_failed", conversation_id=cid, error=message)
        return render(request, "error.html", {"title": "Not enqueued", "message": message}, 503)
    log.info("console_enqueued", conversation_id=cid, action=action, task_id=task_id)
    target = conversation_url(base_of(request), cid, leaf)
    joiner = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{joiner}enqueued={quote(task_id)}", status_code=303)


def _send(conversation_id: str, leaf: int | None) -> str:
    from recap.workers.enqueue import compress_later

    return compress_later(conversation_id, leaf, force=True)
