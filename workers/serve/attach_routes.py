"""``POST /v1/conversations/{name}/attach``: attach another conversation of the same key (a
sub-agent's, another branch's) after this one's head, as ``recap attach`` does.

Body: ``{"source": "<conversation name>", "leaf": <message id or null>}``. The answer names the
attachment: ``{"object": "recap.attachment", "conversation": ..., "source": ..., "leaf": ...,
"open_message_id": ..., "close_message_id": ...}``. Both names are the key's own (a name is
scoped per key): another key's conversation, or none, is the same 404 as a turn's. The next
turn's request carries the source's messages between the attachment's markers, once; the client
keeps sending its own history as before (it never holds the markers: a resent history maps over
them, ``core.request.prefix``). The attachment waits for a turn of either conversation under
way in this process, and a turn waits for it.
"""

from __future__ import annotations

from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recap.core.errors import InputError, NotFoundError
from recap.workers.serve import routes
from recap.workers.serve.errors import ServeError, bad_request, echoed, not_found

log = structlog.get_logger(__name__)

FIELDS = frozenset({"source", "leaf"})


def checked(body: dict[str, Any]) -> tuple[str, int | None]:
    """The body's source name and leaf; a 400 naming what is wrong."""
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"Unknown field {unknown[0]!r}: an attachment takes 'source' and 'leaf'.")
    source = body.get("source")
    if not isinstance(source, str) or not source:
        raise bad_request("'source' must be a non-empty string.", param="source")
    leaf = body.get("leaf")
    if leaf is not None and (isinstance(leaf, bool) or not isinstance(leaf, int) or leaf < 1):
        raise bad_request("'leaf' must be a positive message id or null.", param="leaf")
    return source, leaf


async def attach(request: Request) -> Response:
    """``POST /v1/conversations/{name}/attach``."""
    state = routes.state_of(request)
    turns = state.turns
    name = str(request.path_params["name"])
    owner = routes.authorize(request)
    source, leaf = checked(await routes.read_json(request, turns.settings.serve_max_body_bytes))
    if source == name:
        raise bad_request("A conversation cannot attach itself.", param="source")
    try:
        source_id = await turns.stored_id(owner, source)
    except NotFoundError:
        raise not_found(source) from None
    key = (owner, name)
    await turns.locks.acquire(key)
    try:
        target = await turns.lookup(owner, name)
        if not target.exists:
            raise not_found(name)
        done = await turns.recap.attach(target.conversation_id, source=source_id, leaf=leaf)
    except NotFoundError:  # the source's leaf (a name is the key's; its stored id is not)
        if leaf is None:
            raise not_found(name) from None
        raise ServeError(
            404,
            f"No message {leaf} in conversation {echoed(source)} for this key.",
            param="leaf",
            code="message_not_found",
        ) from None
    except InputError as exc:
        raise bad_request(str(exc)) from None
    finally:
        turns.locks.release(key)
    log.info("serve_attached", conversation=name, source=source, leaf=done.leaf)
    return JSONResponse(
        {
            "object": "recap.attachment",
            "conversation": name,
            "source": source,
            "leaf": done.leaf,
            "open_message_id": done.open_id,
            "close_message_id": done.close_id,
        }
    )
