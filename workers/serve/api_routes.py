"""The endpoints of the other APIs, over the chat-completions pipeline: ``POST /v1/responses``
(OpenAI Responses), ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic
Messages), and the JSON 404 every other path gets.

Each request is converted to chat completions (``responses_api``, ``messages_api``), run as a
stored turn or passed through exactly as a chat-completions request is (``routes``), and the
reply converted back by a ``Shape``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from recap.core.counting.tokens import TOKENS_REPLY_PRIMING
from recap.core.errors import BudgetError, InputError, NotFoundError
from recap.core.request.prefix import split_system
from recap.core.service import serving
from recap.workers.serve import (
    messages_api,
    native,
    native_messages,
    native_responses,
    native_routes,
    recall,
    response_events,
    response_routes,
    responses_api,
    routes,
    upstream,
)
from recap.workers.serve.errors import ServeError, bad_request, context_too_long, echoed, not_found
from recap.workers.serve.replies import ChunkStream
from recap.workers.serve.shapes import Shape
from recap.workers.serve.streaming import ClientGone, Relay

log = structlog.get_logger(__name__)

SHOWN_PATH_CHARS = 120  # of an unknown path, what its 404 repeats
ENDPOINTS = (
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "GET /v1/responses/{id}",
    "DELETE /v1/responses/{id}",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "GET /v1/models",
    "GET /health",
)


class Events(Protocol):
    """Chat-completions chunks in, one API's stream events out."""

    def start(self) -> list[dict[str, Any]]: ...
    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]: ...
    def finish(self) -> list[dict[str, Any]]: ...
    def failed(self, error: ServeError) -> list[dict[str, Any]]: ...


class ConvertedRelay(Relay):
    """The upstream's chunks, checked and masked by the chat relay's own reading
    (``Relay.checked``: secrets masked across chunk boundaries, a stream that never finished
    refused), as another API's events; a stream that fails ends with that API's error event
    (and is not stored: ``finished`` stays false)."""

    def __init__(
        self,
        stream: ChunkStream,
        events: Events,
        encode: Callable[[Mapping[str, Any]], bytes],
        error: Callable[[BaseException], ServeError],
        secrets: Iterable[str] = (),
        *,
        storable: bool = True,
    ) -> None:
        super().__init__(stream, include_usage=True, secrets=secrets, storable=storable)
        self.events = events
        self.encode = encode
        self.to_error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self.events.start():
            yield self.encode(event)
        try:
            async for _raw, chunk in self.checked():
                for event in self.events.feed(chunk):
                    yield self.encode(event)
        except ClientGone:
            return
        except Exception as exc:
            error = self.to_error(exc)
            self.error = error.message
            log.warning("serve_stream_broken", status=error.status, error=error.message)
            for event in self.events.failed(error):
                yield self.encode(event)
            return
        self.finished = True
        if self.on_finished is not None:  # the reply stored before the events that end it
            await self.on_finished()
        for event in self.events.finish():
            yield self.encode(event)


def finish_reason(response: Any) -> str | None:
    """Choice 0's finish reason, of a reply's JSON (the checked reply a shape is given) or of a
    reply of either upstream path."""
    data = response if isinstance(response, Mapping) else getattr(response, "data", None)
    if isinstance(data, Mapping):
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        reason = first.get("finish_reason") if isinstance(first, Mapping) else None
        return str(reason) if reason else None
    choices = getattr(response, "choices", None) or []
    reason = getattr(choices[0], "finish_reason", None) if choices else None
    return str(reason) if reason else None


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# --- POST /v1/responses ------------------------------------------------------------------------


def _dialect(state: routes.State, api: str, body: Mapping[str, Any]) -> str | None:
    """The native dialect the request goes upstream in (``workers.serve.native``), if any."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return None  # refused by the API's own rules
    resolved = upstream.resolve_model(model, state.turns.settings)
    return state.turns.upstream.dialect_for(api, resolved)


def previous_not_found(value: str) -> ServeError:
    return ServeError(
        404,
        f"Previous response with id {echoed(value)} not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def resolve_previous(engine: Any, ref: responses_api.Reference, owner: str) -> int:
    """The stored message a response id continues after (``core.service.serving``); ``ref``'s
    conversation is the id it is stored under (``Previous.conversation_id``)."""
    return serving.reply_to_continue(
        engine, ref.conversation_id, ref.message_id, exact=ref.exact, owner=owner
    )


@dataclass(frozen=True, slots=True)
class Previous:
    """What ``previous_response_id`` names for this key: the reference as the id holds it
    (the conversation as the client names it), the id that conversation is stored under, and
    the stored message the turn continues after."""

    ref: responses_api.Reference
    conversation_id: str
    parent: int


def responses_shape(
    state: routes.State, head: responses_api.Head, name: Callable[[int | None], str]
) -> Shape:
    """Responses objects and events; ``name(reply_id)`` gives the response its id."""
    settings = state.turns.settings

    def body(response: Any, reply_id: int | None) -> bytes:
        head.id = name(reply_id)
        message = upstream.reply_message(response)
        usage = upstream.usage_of(response)
        return _dumps(responses_api.response_object(head, message, usage, finish_reason(response)))

    def relay(stream: ChunkStream, storable: bool = True) -> Relay:
        head.id = name(None)
        return ConvertedRelay(
            stream,
            response_events.ResponseEvents(head),
            response_events.sse,
            lambda exc: upstream.as_serve_error(exc, settings),
            state.turns.secrets,
            storable=storable,
        )

    return Shape(body, relay)


async def responses(request: Request) -> Response:
    """OpenAI's Responses API: a stored turn (the conversation the header, the metadata or
    ``previous_response_id`` names, else one of this key and first message), or with
    ``store: false`` a request nothing is kept of."""
    started = time.perf_counter()
    state = routes.state_of(request)
    settings = state.turns.settings
    owner = routes.authorize(request)
    body = await routes.read_json(request, settings.serve_max_body_bytes)
    dialect = _dialect(state, native.RESPONSES, body)
    readable = native_routes.readable_responses_body(body) if dialect else body
    chat = responses_api.chat_request(readable)
    model = upstream.resolve_model(chat.model, settings)
    named = routes.conversation_id(request, body)
    previous = await _previous(state, chat, owner, named)
    head = responses_api.Head(id="", model=chat.model, echo=chat.echo, store=chat.store)
    nt = native_responses.ResponsesTurn(body, model) if dialect else None
    if not chat.store:
        return await _unstored(state, chat, model, previous, head, nt)
    cid = named or (previous.ref.conversation_id if previous is not None else None)
    if cid is None:
        first = responses_api.first_message(chat.messages)
        cid = responses_api.derived_conversation(owner, first)
    turn = routes.new_turn(
        state, cid, owner, model, chat.with_system(), chat.params,
        user=routes.user_header(request),
    )  # fmt: skip
    turn.after = previous.parent if previous is not None else None

    def name(reply_id: int | None) -> str:  # the conversation as the client names it
        if reply_id is not None:
            return responses_api.response_id(turn.name, reply_id, exact=True)
        assert turn.leaf_id is not None, "a stored turn's request has a leaf"
        return responses_api.response_id(turn.name, turn.leaf_id, exact=False)

    turn.native = nt
    shape = native_routes.native_shape(nt, name) if nt else responses_shape(state, head, name)
    return await routes.stored_turn(state, turn, chat.stream, True, started, shape)


async def _previous(
    state: routes.State, chat: responses_api.ChatRequest, owner: str, named: str | None
) -> Previous | None:
    """What ``previous_response_id`` continues: its conversation as this key's (a name is
    scoped per key: another key's response id names nothing here) and the stored message the
    turn continues after. A turn of this key on that conversation under way in this process is
    waited for first, so an id given at a stream's start names its reply once it is stored."""
    value = chat.previous_response_id
    if value is None:
        return None
    ref = responses_api.parse_response_id(value)
    if ref is None:
        raise previous_not_found(value)
    if named is not None and named != ref.conversation_id:
        raise bad_request(
            "previous_response_id belongs to another conversation than the one named.",
            param="previous_response_id",
        )
    try:
        stored, parent = await stored_reference(state, ref, owner)
    except NotFoundError:
        raise previous_not_found(value) from None
    return Previous(ref, stored.conversation_id, parent)


async def stored_reference(
    state: routes.State, ref: responses_api.Reference, owner: str
) -> tuple[responses_api.Reference, int]:
    """A response id's reference as stored for this key (its conversation the id it is stored
    under: a name is scoped per key, so another key's response id names nothing here) and the
    stored message it names (``resolve_previous``); a ``NotFoundError`` when there is none. A
    turn of this key on that conversation under way in this process is waited for first, so
    an id given at a stream's start names its reply once it is stored."""
    turns = state.turns
    stored = replace(ref, conversation_id=await turns.stored_id(owner, ref.conversation_id))
    parent = await turns.recap.run(resolve_previous, turns.recap.recap.engine, stored, owner)
    return stored, parent


async def _unstored(
    state: routes.State,
    chat: responses_api.ChatRequest,
    model: str,
    previous: Previous | None,
    head: responses_api.Head,
    nt: native_responses.ResponsesTurn | None = None,
) -> Response:
    """``store: false``: Recap's assembly of the previous response's branch (when one is
    named) and the new input, sent upstream; nothing of the turn is kept."""
    messages: list[Any] = chat.with_system()
    if previous is not None:
        system, rest = split_system(messages)
        tools = chat.params.get("tools")
        try:
            assembled = await state.turns.recap.assemble(
                previous.conversation_id, leaf=previous.parent, system=system, tools=tools
            )
        except BudgetError as exc:
            raise context_too_long(str(exc)) from None
        except NotFoundError:
            raise not_found(previous.ref.conversation_id) from None
        messages = [*assembled.messages, *rest]
    if nt is not None:
        shape = native_routes.native_shape(nt, lambda _r: responses_api.unstored_id(), False)
        return await native_routes.passthrough(state, nt, messages, chat.params, chat.stream, shape)
    shape = responses_shape(state, head, lambda _reply: responses_api.unstored_id())
    return await routes.passthrough(state, model, messages, chat.params, chat.stream, True, shape)


# --- every other path --------------------------------------------------------------------------


def is_anthropic(request: Request) -> bool:
    """Whether the request looks like an Anthropic SDK's (its error format is Anthropic's)."""
    headers = request.headers
    return (
        "anthropic-version" in headers
        or "x-api-key" in headers
        or request.url.path.rstrip("/").endswith(("/messages", "/count_tokens", "/complete"))
    )


async def unknown_route(request: Request, exc: Exception) -> Response:
    """A path (or method) recap serve does not answer: a JSON 404 (405) naming what it does,
    in the format of the API the client speaks."""
    status = getattr(exc, "status_code", 404)
    status = status if status in (404, 405) else 404
    what = "Unknown path" if status == 404 else f"{request.method} is not allowed on"
    path = request.url.path
    shown = path if len(path) <= SHOWN_PATH_CHARS else path[:SHOWN_PATH_CHARS] + "…"
    message = f"{what} {shown}: recap serve answers {', '.join(ENDPOINTS)}."
    if is_anthropic(request):
        return messages_api.error_response(ServeError(status, message, code="not_found"))
    return ServeError(status, message, code="unknown_url").response()


# --- POST /v1/messages, POST /v1/messages/count_tokens -----------------------------------------


def anthropic_owner(request: Request) -> str:
    """The caller's key fingerprint from ``x-api-key`` (the Anthropic SDKs') or a bearer key."""
    key = request.headers.get("x-api-key")
    authorization = f"Bearer {key}" if key else request.headers.get("authorization")
    owner = routes.state_of(request).keys.owner(authorization)
    if owner is None:
        raise ServeError(
            401,
            "Invalid or missing API key: send `x-api-key: KEY` (or `Authorization: Bearer KEY`) "
            "with a key from RECAP_SERVE_KEYS.",
        )
    return owner


def anthropic_reply(message: dict[str, Any], response: Any) -> dict[str, Any]:
    """The upstream's reply for an Anthropic client: litellm's signed thinking blocks kept,
    tool inputs written as the client sends them back."""
    if isinstance(response, Mapping):  # the checked reply's JSON
        choices = response.get("choices") or []
        first = choices[0].get("message") if choices and isinstance(choices[0], Mapping) else None
        blocks = first.get("thinking_blocks") if isinstance(first, Mapping) else None
    else:
        choices = getattr(response, "choices", None)
        blocks = getattr(choices[0].message, "thinking_blocks", None) if choices else None
    if blocks:
        message = {**message, "thinking_blocks": [dict(b) for b in blocks]}
    return messages_api.canonical_reply(message)


def messages_shape(state: routes.State, model: str, input_tokens: Callable[[], int]) -> Shape:
    """Anthropic messages and events."""
    settings = state.turns.settings
    message_id = messages_api.new_message_id()

    def body(response: Any, _reply_id: int | None) -> bytes:
        message = anthropic_reply(upstream.reply_message(response), response)
        usage = upstream.usage_of(response)
        reply = messages_api.message_object(
            message_id, model, message, usage, finish_reason(response)
        )
        return _dumps(reply)

    def relay(stream: ChunkStream, storable: bool = True) -> Relay:
        events = messages_api.MessageEvents(
            message_id=message_id, model=model, input_tokens=input_tokens()
        )
        return ConvertedRelay(
            stream,
            events,
            messages_api.sse,
            lambda exc: upstream.as_serve_error(exc, settings),
            state.turns.secrets,
            storable=storable,
        )

    return Shape(body, relay)


async def messages(request: Request) -> Response:
    """Anthropic's Messages API: a stored turn when the request names its conversation
    (``X-Recap-Conversation``), passed through otherwise, as for chat completions."""
    started = time.perf_counter()
    state = routes.state_of(request)
    settings = state.turns.settings
    owner = anthropic_owner(request)
    body = await routes.read_json(request, settings.serve_max_body_bytes)
    dialect = _dialect(state, native.MESSAGES, body)
    chat = messages_api.chat_request(
        native_routes.readable_messages_body(body) if dialect else body
    )
    model = upstream.resolve_model(chat.model, settings)
    cid = routes.conversation_id(request, body)
    nt = native_messages.MessagesTurn(body, model) if dialect else None
    if cid is None and nt is not None:
        shape = native_routes.native_shape(nt, lambda _r: "", False)
        return await native_routes.passthrough(
            state, nt, chat.messages, chat.params, chat.stream, shape
        )
    if cid is None:
        shape = messages_shape(state, chat.model, lambda: 0)
        return await routes.passthrough(
            state, model, chat.messages, chat.params, chat.stream, True, shape
        )
    turn = routes.new_turn(
        state, cid, owner, model, chat.messages, chat.params,
        user=routes.user_header(request),
    )  # fmt: skip
    if nt is not None:
        turn.native = nt
        shape = native_routes.native_shape(nt, lambda _r: "")
        return await routes.stored_turn(state, turn, chat.stream, True, started, shape)
    turn.reply_form = anthropic_reply

    def sent_tokens() -> int:
        return turn.assembled.tokens.total if turn.assembled is not None else 0

    shape = messages_shape(state, chat.model, sent_tokens)
    return await routes.stored_turn(state, turn, chat.stream, True, started, shape)


async def count_tokens(request: Request) -> Response:
    """Anthropic's token count, by Recap's own counter: the tokens of the request as recap
    serve would send it for a conversation it has not compressed (system, tools, messages)."""
    state = routes.state_of(request)
    try:
        owner = anthropic_owner(request)
        body = await routes.read_json(request, state.turns.settings.serve_max_body_bytes)
        chat = messages_api.chat_request(body, count=True)
        model = upstream.resolve_model(chat.model, state.turns.settings)
        cid = routes.conversation_id(request, body)
        tokens = await state.turns.recap.run(counted, state, cid, owner, model, chat)
    except InputError as exc:
        return messages_api.error_response(bad_request(state.turns.masked(exc)))
    except ServeError as exc:
        return messages_api.error_response(exc)
    return JSONResponse({"input_tokens": tokens})


def counted(
    state: routes.State, cid: str | None, owner: str, model: str, chat: messages_api.ChatRequest
) -> int:
    """Recap's count of what it would send: for a named conversation of this key, its
    assembly up to the longest stored prefix of the history (summaries and clearings
    applied) and the messages past it in full; else the request as it is."""
    system, rest = split_system(chat.messages)
    tools = recall.tools_for(chat.tools, state.turns.settings)  # what a turn sends
    if cid is None:
        return request_tokens(model, chat.messages, tools)
    recap = state.turns.recap.recap
    try:  # the conversation this key's name means; none yet (or none of this key's): as is
        resolved = serving.resolve(recap.engine, cid, owner)
    except NotFoundError:
        return request_tokens(model, chat.messages, tools)
    if not resolved.exists:
        return request_tokens(model, chat.messages, tools)
    cid = resolved.conversation_id
    leaf, matched = serving.stored_prefix(recap.engine, cid, owner, rest)
    if leaf is None:
        return request_tokens(model, chat.messages, tools)
    try:
        assembled = recap.assemble(cid, leaf=leaf, system=system, tools=tools)
    except BudgetError:
        return request_tokens(model, chat.messages, tools)
    unsent = [dict(m) for m in rest[matched:]]
    return assembled.tokens.total + request_tokens(model, unsent, None) - TOKENS_REPLY_PRIMING


def request_tokens(
    model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> int:
    """Recap's count of a request's messages and tools for ``model``."""
    from recap.core.counting.tokens import (
        TOKENS_REPLY_PRIMING,
        count_message,
        count_tools,
        encoding_name_for,
    )

    encoding = encoding_name_for(model)
    total = TOKENS_REPLY_PRIMING + count_tools(tools, encoding)
    return total + sum(count_message(m, encoding, model=model) for m in messages)


ROUTES = [
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/v1/responses/{response_id:path}", response_routes.retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id:path}", response_routes.delete, methods=["DELETE"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    # the Anthropic SDKs add /v1 themselves: a base URL copied from an OpenAI client ends in it
    Route("/v1/v1/messages", messages, methods=["POST"]),
    Route("/v1/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
