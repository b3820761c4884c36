"""The one reader of request bodies: bounded while it reads and parses, checked before any
handler sees the body.

``read_body`` stops at ``RECAP_SERVE_MAX_BODY_BYTES`` (413). ``parse_object`` parses it with
``bounded.loads``: strict UTF-8, numbers checked as the parser meets them (no 5,000-digit
integer reaches ``int``, no ``NaN``), at most ``bounded.MAX_DEPTH`` levels, valid Unicode. Every
failure is a ``ServeError`` of status 400 (413 for the size), which each route renders in its
own API's error format; ``read_object`` is both steps, for any route.

``check_chat_request`` reads a chat-completions body into a ``ChatRequest``: message shapes
(content a string, a list of known part types, or null only for an assistant that calls tools),
string ids, and every forwarded parameter by its rule in ``validation.fields`` (the rules the
Responses and Messages bodies are checked with too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from recap.core.values.records import ROLES
from recap.workers.serve import bounded
from recap.workers.serve.errors import bad_request, too_large
from recap.workers.serve.upstream import parameters
from recap.workers.serve.validation.fields import (
    PARAM_CHECKS,
    PART_TYPES,
    anything,
    metadata,
    optional,
)

CALLS_KEYS = ("tool_calls", "function_call")  # an assistant message with these may have no text


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (before reading it when the length is
    declared, and as soon as the count passes it otherwise)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


def parse_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, bounded in depth and numbers (``bounded.loads``); a 400
    otherwise."""
    try:
        data = bounded.loads(body)
    except bounded.Unreadable as exc:
        raise bad_request(f"The request body is refused: {exc}.") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    return data


async def read_object(request: Request, limit: int) -> dict[str, Any]:
    """``read_body`` then ``parse_object``: what every route calls first."""
    return parse_object(await read_body(request, limit))


# --- the chat-completions request -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """A checked chat-completions request."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    params: dict[str, Any]  # the parameters passed on upstream, each checked
    conversation: str | None  # ``metadata.recap_conversation``, when given


def check_chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """The request's fields checked; a 400 naming the first that is wrong."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` must be a non-empty string.", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty list.", param="messages")
    for index, message in enumerate(messages):
        check_message(message, f"messages[{index}]")
    stream = _optional(body, "stream", bool, "true or false") or False
    options = _optional(body, "stream_options", dict, "an object") or {}
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise bad_request("`stream_options.include_usage` must be true or false.")
    _optional(body, "store", bool, "true or false")
    optional(metadata)(body.get("metadata"), "metadata")  # the rule Responses' metadata has
    named = (body.get("metadata") or {}).get("recap_conversation")
    params = parameters(body)
    for name, value in params.items():
        PARAM_CHECKS.get(name, anything)(value, name)
    return ChatRequest(
        model=model,
        messages=messages,
        stream=stream,
        include_usage=bool(include),
        params=params,
        conversation=named,
    )


def _optional(body: Mapping[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise bad_request(f"`{name}` must be {what}.", param=name)
    return value


MAX_MESSAGE_ID = 2**63 - 1


def _is_message_id(value: Any) -> bool:
    """A message's ``id``: any string, or a stored message id as ``recap export`` prints it."""
    if isinstance(value, str):
        return True
    return type(value) is int and 0 < value <= MAX_MESSAGE_ID


def check_message(message: Any, where: str) -> None:
    """One message: a known role, its content of an allowed shape, its ids strings."""
    if not isinstance(message, dict):
        raise bad_request(f"{where} must be a JSON object.", param="messages")
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(
            f"{where}: unknown role {_short(role)} (expected one of {', '.join(ROLES)}).",
            param="messages",
        )
    _check_content(message, role, where)
    for key in ("tool_call_id", "name"):
        if key in message and not isinstance(message[key], str):
            raise bad_request(f"{where}: {key} must be a string.", param="messages")
    if "id" in message and not _is_message_id(message["id"]):  # a recap export's ids are ints
        raise bad_request(
            f"{where}: id must be a string or a message id (a positive integer).", param="messages"
        )
    if role == "tool" and not message.get("tool_call_id"):
        raise bad_request(f"{where}: a tool message needs a tool_call_id.", param="messages")
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad_request(f"{where}: tool_calls must be a list.", param="messages")
        for index, call in enumerate(calls):
            check_call(call, f"{where}.tool_calls[{index}]")


def _check_content(message: dict[str, Any], role: str, where: str) -> None:
    """The content: a string, a list of known parts, or null for an assistant that calls
    tools (or refuses)."""
    content = message.get("content")
    if content is None:
        if role != "assistant" or not any(message.get(key) for key in (*CALLS_KEYS, "refusal")):
            raise bad_request(
                f"{where}: content is required (null only for an assistant message with tool "
                "calls).",
                param="messages",
            )
    elif isinstance(content, list):
        for index, part in enumerate(content):
            _check_part(part, f"{where}.content[{index}]")
    elif not isinstance(content, str):
        raise bad_request(
            f"{where}: content must be a string, a list of content parts, or null.",
            param="messages",
        )


def _check_part(part: Any, where: str) -> None:
    if not isinstance(part, dict) or part.get("type") not in PART_TYPES:
        kind = part.get("type") if isinstance(part, dict) else part
        raise bad_request(
            f"{where}: not a known content part ({_short(kind)}; expected a type of "
            f"{', '.join(sorted(PART_TYPES))}).",
            param="messages",
        )
    if part["type"] in ("text", "refusal") and not isinstance(part.get(part["type"]), str):
        raise bad_request(f"{where}: a {part['type']} part needs its text.", param="messages")


def check_call(call: Any, where: str) -> None:
    """A tool call: a string id, a function with a string name and string arguments."""
    if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
        raise bad_request(f"{where}: a tool call needs a string id.", param="messages")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"{where}: a tool call needs function.name.", param="messages")
    if not isinstance(function.get("arguments", ""), str):
        raise bad_request(f"{where}: function.arguments must be a JSON string.", param="messages")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
