"""Requests to every API of `recap serve`, valid and hostile, shared by the suite and
``bench.serve_hostile``.

``send`` posts one body to one API (``chat``, ``responses``, ``messages``, ``count``) with the
key in the header that API's clients use, and reads the answer whole (a stream to its end).
``responses_bodies`` and ``messages_bodies`` are hypothesis strategies of Responses and Messages
requests: half of them well-formed (text turns, tool calls and their results, typed
parameters, either stream flag), half with any field of the request given any JSON value, at
the top, in an item or in a block (wrong types, NaN, numeric strings, unknown block types).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from hypothesis import strategies as st

from recap.workers.serve.headers import encode
from tests.support.hostile_clients import REQUEST_TIMEOUT, json_values


@dataclass(frozen=True)
class Api:
    """One API: its path, how its clients send the key, and its error format."""

    path: str
    anthropic: bool

    def headers(self, key: str, conversation: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.anthropic:
            headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
        else:
            headers["Authorization"] = f"Bearer {key}"
        if conversation is not None:
            strip = conversation != conversation.strip()
            headers["X-Recap-Conversation"] = encode(conversation) if strip else conversation
        return headers


APIS = {
    "chat": Api("/chat/completions", anthropic=False),
    "responses": Api("/responses", anthropic=False),
    "messages": Api("/messages", anthropic=True),
    "count": Api("/messages/count_tokens", anthropic=True),
}


@dataclass(frozen=True)
class Answered:
    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)

    def error_message(self, api: str) -> str | None:
        """The error's message when the body is an error in ``api``'s format, else None."""
        try:
            body = self.json()
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
            return None
        error = body["error"]
        if APIS[api].anthropic:
            ok = body.get("type") == "error" and isinstance(error.get("type"), str)
        else:
            ok = {"message", "type", "param", "code"} <= set(error)
        return str(error.get("message")) if ok else None


def send(base_url: str, key: str, api: str, body: Any, conversation: str | None = None) -> Answered:
    """One request (the body as Python's json writes it, NaN included), read whole."""
    target = APIS[api]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {k.encode(): v.encode("utf-8") for k, v in target.headers(key, conversation).items()}
    with (
        httpx.Client(timeout=REQUEST_TIMEOUT) as client,
        client.stream("POST", base_url + target.path, content=content, headers=headers) as reply,
    ):
        reply.read()
        return Answered(reply.status_code, reply.text)


# --- the strategies ------------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs", "Co")), max_size=30)
_name = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
_number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["NaN", "inf", "1e999", "-5", "0.5", "1"]),
    st.integers(-10, 10),
)
_anything = st.one_of(json_values, _number)


def _spoil(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with one of its fields (at any depth) given any JSON value, or dropped."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        if draw(st.booleans()):
            return {**value, key: _spoil(draw, value[key])}
        if draw(st.integers(0, 4)) == 0:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: draw(_anything)}
    if isinstance(value, list) and value and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        return [*value[:index], _spoil(draw, value[index]), *value[index + 1 :]]
    return draw(_anything)


@st.composite
def _responses_valid(draw: st.DrawFn, model: str) -> dict[str, Any]:
    call_id = "call_" + draw(_name)
    items: list[dict[str, Any]] = [
        {"role": "user", "content": draw(_text) or "hello"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": draw(_text)}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": draw(_text)}]},
        {"type": "function_call", "call_id": call_id, "name": draw(_name), "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": draw(_text)},
        {"role": "user", "content": [{"type": "input_text", "text": draw(_text) or "and?"}]},
    ]  # fmt: skip
    body: dict[str, Any] = {
        "model": model,
        "input": items if draw(st.booleans()) else (draw(_text) or "hi"),
        "stream": draw(st.booleans()),
    }
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "instructions": _text,
                    "temperature": st.floats(0, 2),
                    "top_p": st.floats(0, 1),
                    "max_output_tokens": st.integers(16, 4096),
                    "tools": st.just(
                        [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
                    ),
                    "tool_choice": st.sampled_from(["auto", "none", "required"]),
                    "text": st.just({"format": {"type": "text"}, "verbosity": "low"}),
                    "reasoning": st.just({"effort": "low"}),
                    "truncation": st.sampled_from(["auto", "disabled"]),
                    "user": _text,
                },
            )
        )
    )
    return body


@st.composite
def _messages_valid(draw: st.DrawFn, model: str) -> dict[str, Any]:
    use_id = "toolu_" + draw(_name)
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": draw(_text) or "hello"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": draw(_text), "signature": "sig"},
            {"type": "text", "text": draw(_text) or "ok"},
            {"type": "tool_use", "id": use_id, "name": draw(_name), "input": {"a": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use_id, "content": draw(_text)},
            {"type": "text", "text": draw(_text) or "and?"}]},
    ]  # fmt: skip
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": draw(st.integers(1, 4096)),
        "messages": turns if draw(st.booleans()) else turns[:1],
        "stream": draw(st.booleans()),
    }
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "system": st.one_of(_text, st.just([{"type": "text", "text": "be brief"}])),
                    "temperature": st.floats(0, 1),
                    "top_p": st.floats(0, 1),
                    "top_k": st.integers(0, 100),
                    "stop_sequences": st.lists(_text, max_size=2),
                    "metadata": st.just({"user_id": "u-1"}),
                    "tools": st.just([{"name": "ls", "input_schema": {"type": "object"}}]),
                    "tool_choice": st.just({"type": "auto"}),
                    "thinking": st.just({"type": "enabled", "budget_tokens": 2048}),
                    "cache_control": st.just({"type": "ephemeral"}),
                    "output_config": st.just({"effort": "low"}),
                    "service_tier": st.sampled_from(["auto", "standard_only"]),
                },
            )
        )
    )
    return body


def _hostile(valid: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    @st.composite
    def spoiled(draw: st.DrawFn) -> Any:
        body = draw(valid)
        for _ in range(draw(st.integers(1, 3))):
            body = _spoil(draw, body)
        return body

    return spoiled()


_conversation = st.one_of(
    st.none(),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20),
    st.sampled_from(["chat-会话", "emoji-🙂"]),
)


def _bodies(valid: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    @st.composite
    def one(draw: st.DrawFn) -> tuple[Any, str | None]:
        body = draw(valid) if draw(st.booleans()) else draw(_hostile(valid))
        return body, draw(_conversation)

    return one()


def responses_bodies(model: str) -> st.SearchStrategy[tuple[Any, str | None]]:
    """A Responses body (half well-formed, half spoiled) and the conversation to name."""
    return _bodies(_responses_valid(model))


def messages_bodies(model: str) -> st.SearchStrategy[tuple[Any, str | None]]:
    """A Messages body (half well-formed, half spoiled) and the conversation to name."""
    return _bodies(_messages_valid(model))
