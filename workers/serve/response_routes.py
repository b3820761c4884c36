"""``GET`` and ``DELETE /v1/responses/{id}``: a stored response read back, or deleted, by the key
that owns its conversation; any other key, an id Recap did not give, one that names nothing
stored (``store: false``, a stream whose reply was never stored) or a deleted response is the
same 404, so a key learns nothing of another's conversations.

A stored response is the reply its id names (``responses_api``): read back (whole, or as the
events of a stream with ``?stream=true``), it has the stored reply's output items, the
provider's usage of the request it answered, the conversation's model and the reply's time.
Recap does not keep a request's settings beside its reply, so the repeated fields (``tools``,
``instructions``, ``temperature``...) are their defaults.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recap.core.errors import NotFoundError
from recap.core.service import serving
from recap.core.values.serving import StoredReply
from recap.workers.serve import response_events, responses_api, routes
from recap.workers.serve.errors import ServeError, bad_request

log = structlog.get_logger(__name__)

# The longest id Recap gives: a 255-character conversation id (up to 1,020 UTF-8 bytes), a
# 19-digit message id and three more bytes, in base64, after ``resp_``.
MAX_ID_CHARS = 1_400
SHOWN_ID_CHARS = 64  # of an unknown id, what its 404 repeats


def response_not_found(value: str) -> ServeError:
    shown = value if len(value) <= SHOWN_ID_CHARS else value[:SHOWN_ID_CHARS] + "…"
    return ServeError(404, f"Response with id {shown!r} not found.", param="response_id")


def checked_reference(value: str) -> responses_api.Reference:
    """The reference a path's response id holds: a 400 for an oversized id, a 404 for one Recap
    did not give or that names nothing stored."""
    if len(value) > MAX_ID_CHARS:
        raise bad_request(
            f"The response id is longer than {MAX_ID_CHARS} characters.", param="response_id"
        )
    ref = responses_api.parse_response_id(value)
    if ref is None:
        raise response_not_found(value)
    return ref


def stored_object(value: str, reply: StoredReply) -> dict[str, Any]:
    """The response object of a stored reply, under the id it was asked by."""
    created = int(reply.created_at.timestamp())
    head = responses_api.Head(id=value, model=reply.model, echo={}, created_at=created)
    output = responses_api.output_items(head, reply.message)
    usage = responses_api.usage_object(reply.usage)
    response = head.response(output, status="completed", usage=usage)
    response["completed_at"] = created
    return response


def replayed(value: str, reply: StoredReply) -> bytes:
    """A stored reply as the events of its stream (``GET ...?stream=true``): the same items,
    ids and final response as ``stored_object`` gives."""
    created = int(reply.created_at.timestamp())
    events = response_events.ResponseEvents(
        responses_api.Head(id=value, model=reply.model, echo={}, created_at=created)
    )
    message = reply.message
    delta: dict[str, Any] = {
        "reasoning_content": message.get("reasoning_content"),
        "content": message.get("content") if isinstance(message.get("content"), str) else None,
        "tool_calls": [
            {**call, "index": n} for n, call in enumerate(message.get("tool_calls") or ())
        ],
    }
    out = events.start()
    out += events.feed({"choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]})
    events.usage = reply.usage
    out += events.finish()
    out[-1]["response"]["completed_at"] = created
    return b"".join(response_events.sse(event) for event in out)


def _read(state: routes.State, ref: responses_api.Reference, owner: str) -> StoredReply:
    engine = state.turns.recap.recap.engine
    return serving.stored_reply(
        engine, ref.conversation_id, ref.message_id, exact=ref.exact, owner=owner
    )


def _forget(state: routes.State, ref: responses_api.Reference, owner: str) -> None:
    reply = _read(state, ref, owner)  # the model's reply, or the 404 of a GET
    serving.forget_response(state.turns.recap.recap.engine, ref.conversation_id, reply.id, owner)


async def _stored(state: routes.State, value: str, owner: str) -> responses_api.Reference:
    """The response id's reference with its conversation as this key's is stored (a name is
    scoped per key); the same 404 when the key has no conversation of that name."""
    ref = checked_reference(value)
    try:
        stored = await state.turns.stored_id(owner, ref.conversation_id)
    except NotFoundError:
        raise response_not_found(value) from None
    return replace(ref, conversation_id=stored)


async def retrieve(request: Request) -> Response:
    """``GET /v1/responses/{response_id}``."""
    state = routes.state_of(request)
    value = str(request.path_params["response_id"])
    owner = routes.authorize(request)
    ref = await _stored(state, value, owner)
    try:
        reply = await state.turns.recap.run(_read, state, ref, owner)
    except NotFoundError:
        raise response_not_found(value) from None
    if request.query_params.get("stream", "").lower() in ("true", "1"):
        return Response(replayed(value, reply), media_type="text/event-stream")
    return JSONResponse(stored_object(value, reply))


async def delete(request: Request) -> Response:
    """``DELETE /v1/responses/{response_id}``: OpenAI's answer, ``{"id", "object":
    "response.deleted", "deleted": true}``."""
    state = routes.state_of(request)
    value = str(request.path_params["response_id"])
    owner = routes.authorize(request)
    ref = await _stored(state, value, owner)
    try:
        await state.turns.recap.run(_forget, state, ref, owner)
    except NotFoundError:
        raise response_not_found(value) from None
    log.info("serve_response_deleted", conversation_id=ref.conversation_id)
    return JSONResponse({"id": value, "object": "response.deleted", "deleted": True})
