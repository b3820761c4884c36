"""The console's memory pages: the users with entries (``/ui/memory``) and one user's entries
with the turn that wrote each (``/ui/memory/u/{user}``), read only. A session of a serve client
key sees that key's users alone (their ids start with its scope, ``core.values.memory.serve_user``);
another key's user is a 404, as its conversations are."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from recap.core.errors import InputError
from recap.core.service import memories
from recap.core.values.memory import SERVE_PREFIX
from recap.workers.ui.fields import FieldError
from recap.workers.ui.routes import console_of, current, not_found, refused, render, to_login
from recap.workers.ui.views import Scope

USERS_SHOWN = 200


def prefix_of(scope: Scope) -> str | None:
    """The user ids a session may see start with this (None: all of them)."""
    if scope.operator:
        return None
    return f"{SERVE_PREFIX}{(scope.owner or '')[:16]}/"


def users(request: Request) -> Response:
    session = current(request)
    if session is None:
        return to_login(request)
    engine = console_of(request).engine
    found = memories.users(engine, prefix=prefix_of(session.scope), limit=USERS_SHOWN)
    return render(request, "memory.html", {"users": found, "user": None})


def user(request: Request) -> Response:
    session = current(request)
    if session is None:
        return to_login(request)
    name = str(request.path_params["user"])
    prefix = prefix_of(session.scope)
    if prefix is not None and not name.startswith(prefix):
        return not_found(request, f"unknown user {name[:80]!r}")
    engine = console_of(request).engine
    try:
        entries = memories.list_memories(engine, name)
        runs = memories.written_by(engine, name)
    except InputError as exc:
        return refused(request, FieldError(str(exc), status=404))
    context: dict[str, Any] = {"user": name, "entries": entries, "runs": runs, "users": None}
    context["enabled"] = memories.is_enabled(engine, name)
    return render(request, "memory.html", context)
