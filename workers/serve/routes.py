"""The endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recap.core.counting.tokens import UnknownModelError
from recap.core.errors import NotFoundError, RecapError
from recap.core.request.prefix import split_system
from recap.core.service.database import ping
from recap.core.values.serving import Mapped, Owner
from recap.workers.serve import headers, reader, upstream
from recap.workers.serve.auth import KeyRing
from recap.workers.serve.errors import bad_request, client_text, not_found, unauthorized
from recap.workers.serve.replies import Reply
from recap.workers.serve.shapes import Shape
from recap.workers.serve.startup import upstream_models
from recap.workers.serve.streaming import Relay, TurnStream
from recap.workers.serve.turns import Answer, Turn, Turns, reply_headers, whole

log = structlog.get_logger(__name__)

CONVERSATION_HEADER = "x-recap-conversation"
METADATA_KEY = "recap_conversation"  # the OpenAI `metadata` field may name the conversation
MAX_CONVERSATION_ID = 255  # the conversations.id column
PASSTHROUGH = {"X-Recap-Mode": "passthrough"}
JSON_TYPE = "application/json"


@dataclass
class State:
    """What every request handler shares."""

    turns: Turns
    keys: KeyRing
    health_fields: Callable[[], dict[str, Any]] | None = None  # what /health adds


def state_of(request: Request) -> State:
    state: State = request.app.state.serve
    return state


def authorize(request: Request) -> str:
    """The caller's key fingerprint; 401 for a missing or unknown key."""
    owner = state_of(request).keys.owner(request.headers.get("authorization"))
    if owner is None:
        raise unauthorized()
    return owner


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a bounded, checked JSON object (``reader.read_object``)."""
    return await reader.read_object(request, limit)


def conversation_id(request: Request, named: Any) -> str | None:
    """The conversation the request names (the header, decoded by the header rule, else
    ``metadata.recap_conversation``), if any."""
    raw = request.headers.get(CONVERSATION_HEADER)
    try:
        header = headers.decode(raw) if raw is not None else None
    except ValueError:
        raise bad_request("X-Recap-Conversation is not UTF-8 (percent-encoded or raw).") from None
    if isinstance(named, dict):  # a whole body, as callers passed it before ``reader``
        metadata = named.get("metadata")
        named = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if header is not None and named is not None and header != named:
        raise bad_request("X-Recap-Conversation and metadata.recap_conversation differ.")
    value = header if header is not None else named
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_CONVERSATION_ID:
        raise bad_request(f"A conversation id is 1 to {MAX_CONVERSATION_ID} characters.")
    if not value.isprintable():
        raise bad_request("A conversation id must not hold control characters.")
    return value


async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completions: a stored turn when the request names a conversation, the
    request passed through unchanged otherwise."""
    started = time.perf_counter()
    state = state_of(request)
    owner = authorize(request)
    body = await read_json(request, state.turns.settings.serve_max_body_bytes)
    checked = reader.check_chat_request(body)
    cid = conversation_id(request, checked.conversation)
    model = upstream.resolve_model(checked.model, state.turns.settings)
    messages, params, stream = checked.messages, checked.params, checked.stream
    if cid is None:
        return await passthrough(state, model, messages, params, stream, checked.include_usage)
    turn = new_turn(state, cid, owner, model, messages, params, user=user_header(request))
    return await stored_turn(state, turn, stream, checked.include_usage, started)


USER_HEADER = "X-Recap-User"


def user_header(request: Request) -> str | None:
    """The user the ``X-Recap-User`` header names (decoded as the conversation header is)."""
    raw = request.headers.get(USER_HEADER)
    try:
        return headers.decode(raw) if raw is not None else None
    except ValueError:
        raise bad_request("X-Recap-User is not UTF-8 (percent-encoded or raw).") from None


def turn_user(owner: str, params: dict[str, Any], header: str | None) -> str | None:
    """The stored id of the user a turn is for: the header's name, else the API's ``user``
    field, scoped by the client key as conversation ids are (``serve_user``); None
    when the request names no user."""
    from recap.core.values.memory import serve_user

    name = header if header is not None else params.get("user")
    if name is None or name == "":
        return None
    try:
        return serve_user(owner, name)
    except RecapError as exc:
        raise bad_request(f"{USER_HEADER} or `user`: {exc}") from None


def new_turn(
    state: State,
    cid: str,
    owner: str,
    model: str,
    messages: list[Any],
    params: dict[str, Any],
    *,
    user: str | None = None,
) -> Turn:
    """A stored turn for a checked request; ``user`` is the ``X-Recap-User`` header's name."""
    if params.get("n", 1) != 1:
        raise bad_request("A stored conversation records one reply per turn: n must be 1.")
    settings = state.turns.settings
    system, rest = split_system(messages)
    if not rest:
        raise bad_request("`messages` holds no message besides the system prompt.")
    tools = params.get("tools")
    return Turn(
        conversation_id=cid,
        owner=Owner(owner, model, settings.serve_max_input_tokens),
        model=model,
        system=system,
        tools=tools if isinstance(tools, list) else None,
        history=rest,
        params=params,
        user_id=turn_user(owner, params, user),
    )


async def passthrough(
    state: State,
    model: str,
    messages: list[Any],
    params: dict[str, Any],
    stream: bool,
    usage: bool,
    shape: Shape | None = None,
) -> Response:
    """The request sent upstream as it came, nothing stored (the reply in ``shape``'s API)."""
    settings = state.turns.settings
    try:
        if stream:
            chunks = await state.turns.upstream.complete(model, messages, params, stream=True)
        else:
            reply = await state.turns.upstream.complete(model, messages, params, stream=False)
            completion = state.turns.completion(reply, storable=False)  # nothing stored
            body = shape.body(json.loads(completion.body), None) if shape else completion.body
            return Response(body, media_type=JSON_TYPE, headers=PASSTHROUGH)
    except Exception as exc:
        raise upstream.as_serve_error(exc, settings) from None
    if shape is not None:
        relay = shape.relay(chunks, False)  # nothing of it is stored
    else:
        relay = Relay(chunks, include_usage=usage, secrets=state.turns.secrets, storable=False)
    return TurnStream(relay, relay.close, headers=PASSTHROUGH)


async def stored_turn(
    state: State, turn: Turn, stream: bool, usage: bool, started: float, shape: Shape | None = None
) -> Response:
    """Store the request, call upstream, store the reply; the conversation locked throughout,
    once the key is checked against it (``Turns.resolve``: another key's conversation of the
    same name is never waited for)."""
    turns = state.turns
    answer_headers = dict(reply_headers(turn))  # made before anything is stored
    await turns.resolve(turn)
    await turns.locks.acquire(turn.key)
    handed_over = False
    try:
        turn.stream = stream
        mapped = await _prepare(turns, turn)
        if not stream:  # written while the upstream answers (a stream: once its first chunk is out)
            turns.start_recording(turn)
        response = await turns.call(turn, stream=stream)
        if stream:
            handed_over = True
            return _stream_turn(turns, turn, response, usage, mapped, started, shape)
        try:  # the reply checked, and the client's answer built, before anything is stored
            completion = turns.completion(whole(response))
            data = json.loads(completion.body) if shape else None
            body = shape.body(data, None) if shape else completion.body
        except Exception as exc:  # a reply the answer cannot be made of is the upstream's fault
            raise upstream.as_serve_error(exc, turns.settings) from None
        answer_headers = dict(reply_headers(turn))  # now with the outcome, before the reply
        reply_id = await turns.finish(turn, completion)
    finally:
        if not handed_over:
            try:
                await turns.recorded(turn)
            finally:
                turns.locks.release(turn.key)
    _log_turn(turn, mapped, started, "stored")
    if shape is not None:  # again, naming the stored reply (the same bytes but for its id)
        try:
            body = shape.body(data, reply_id)
        except Exception as exc:  # never an error after a stored turn: the answer made before
            log.error("serve_answer_rebuilt_failed", error=turns.error_text(exc))
    return Response(
        body,
        media_type=JSON_TYPE,
        headers=answer_headers,
        background=BackgroundTask(turns.enqueue, turn.conversation_id, turn.leaf_id, turn.user_id),
    )


async def _prepare(turns: Turns, turn: Turn) -> Mapped:
    """The history stored and the request assembled, Recap's errors as OpenAI errors."""
    try:
        mapped = await turns.prepare(turn)
    except NotFoundError:
        turns.seen.drop((turn.owner.fingerprint, turn.conversation_id))  # deleted meanwhile
        turns.names.drop(turn.key)
        raise not_found(turn.name) from None
    except UnknownModelError as exc:
        raise bad_request(
            f"{exc.args[0].split(';')[0]}: set RECAP_SERVE_MAX_INPUT_TOKENS or map the name "
            "to a known model in RECAP_MODEL_MAP",
            param="model",
        ) from None
    except RecapError as exc:  # the conversation named as the client names it
        text = turns.masked(exc).replace(turn.conversation_id, turn.name)
        raise bad_request(text) from None
    return mapped


def _stream_turn(
    turns: Turns,
    turn: Turn,
    stream: Answer,
    usage: bool,
    mapped: Mapped,
    started: float,
    shape: Shape | None = None,
) -> Response:
    """The reply streamed through, stored once the upstream's stream has finished and before
    the client's ends (``Relay.on_finished``: the response id a client reads at the end names a
    stored reply, whatever it sends next); then its usage recorded."""
    if shape is not None:
        relay = shape.relay(stream, True)
    else:  # chat completions: never a native reply
        assert not isinstance(stream, upstream.Completion | Reply), "a stream of chunks"
        relay = Relay(stream, include_usage=usage, secrets=turns.secrets)
    storing: asyncio.Future[Any] | None = None

    async def store() -> None:
        nonlocal storing
        whole = getattr(relay, "whole", None)  # a native reply, streamed from its whole
        if whole is None:
            whole = relay.reply if relay.reply is not None else relay.chunks  # converted: chunks
        if whole:
            storing = asyncio.ensure_future(turns.finish_stream(turn, whole))
            with contextlib.suppress(Exception):  # a failure is close()'s to log
                await asyncio.shield(storing)  # a client gone meanwhile does not stop the store

    relay.on_finished = store

    async def close() -> None:
        outcome, response = "disconnected", None
        try:
            await relay.close()
            if storing is not None:
                response = await storing
                outcome = "stored"
            elif relay.error is not None:
                outcome = "upstream_failed"
                log.warning("serve_stream_failed", error=relay.error)
        except Exception as exc:
            outcome = "failed"
            log.error("serve_reply_not_stored", error=turns.error_text(exc))
        finally:  # the next turn needs the reply stored, not its usage recorded
            try:
                await turns.recorded(turn)
            finally:
                turns.locks.release(turn.key)
        _log_turn(turn, mapped, started, outcome)
        if response is not None:
            try:
                await turns.record_usage(turn, response)
            except Exception as exc:
                log.error("serve_usage_not_recorded", error=turns.error_text(exc))
        await turns.enqueue(turn.conversation_id, turn.leaf_id, turn.user_id)

    # what the assembly records is written once the first chunk is out: not in the way of the
    # first byte (the thread writing it would hold the GIL the event loop relays it with)
    first = functools.partial(turns.start_recording, turn)
    return TurnStream(relay, close, headers=dict(reply_headers(turn)), on_first=first)


def _log_turn(turn: Turn, mapped: Mapped, started: float, outcome: str) -> None:
    log.info(
        "serve_turn",
        conversation_id=turn.conversation_id,
        outcome=outcome,
        matched=mapped.matched,
        appended=len(mapped.appended),
        sent_messages=len(turn.sent),
        duration_ms=round((time.perf_counter() - started) * 1000),
    )


async def models(request: Request) -> Response:
    """The model names ``RECAP_MODEL_MAP`` offers, else the upstream's own (any litellm model
    string works as well)."""
    authorize(request)
    settings = state_of(request).turns.settings
    names = sorted(settings.model_map) or await upstream_models(settings)
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "recap"} for name in names]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    """Alive, and the database answers."""
    turns = state_of(request).turns
    try:
        await turns.recap.run(ping, turns.recap.recap.engine)
    except Exception as exc:
        error = client_text(turns.error_text(exc))  # answered without a key: no server path
        return JSONResponse({"status": "unavailable", "error": error}, status_code=503)
    fields = state_of(request).health_fields
    return JSONResponse({"status": "ok", **(fields() if fields is not None else {})})
