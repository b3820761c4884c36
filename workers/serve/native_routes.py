"""The Responses and Messages routes' native path (``workers.serve.native``): what of a body
Recap reads and stores (``readable_body``: the items and blocks it cannot read are the
upstream's, and come back from the stored reply they belong to), the client's answer made from
the upstream's own reply (``native_shape``), streamed from the whole reply (``NativeRelay``),
and a request nothing is stored of (``passthrough``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Protocol

from starlette.responses import Response

from recap.workers.serve import messages_api, response_events, routes, upstream
from recap.workers.serve.native import Report
from recap.workers.serve.shapes import Shape
from recap.workers.serve.streaming import ClientGone, Relay, TurnStream

JSON_TYPE = "application/json"
RESPONSES_READ = frozenset(
    {"message", "function_call", "function_call_output", "reasoning", "item_reference"}
)
MESSAGES_READ = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})


class NativeTurn(Protocol):
    """``native_responses.ResponsesTurn`` or ``native_messages.MessagesTurn``."""

    dialect: str
    report: Report

    def request(self, messages: Any, params: Mapping[str, Any]) -> bytes: ...
    def reply_message(self, data: Mapping[str, Any]) -> dict[str, Any]: ...
    def usage(self, data: Mapping[str, Any]) -> tuple[int, int, int] | None: ...
    def answer(self, data: Mapping[str, Any], response_id: str, store: bool) -> dict[str, Any]: ...
    def events(self, answer: Mapping[str, Any]) -> Iterable[dict[str, Any]]: ...


def readable_responses_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses body as Recap reads it on the native path: input items of other types
    than messages, function calls and outputs and reasoning left out (built-in tool items and
    compaction items: the stored reply they came in keeps them), tools other than functions
    and a tool choice of one left to the upstream."""
    out = dict(body)
    items = body.get("input")
    if isinstance(items, list):
        kept = [
            item
            for item in items
            if not isinstance(item, Mapping)
            or item.get("type", "message") in RESPONSES_READ
            or "role" in item
        ]
        out["input"] = kept or items
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [t for t in tools if isinstance(t, Mapping) and t.get("type") == "function"]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") != "function":
        out.pop("tool_choice")
    return out


def readable_messages_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages body as Recap reads it on the native path: assistant blocks of other types
    than text, tool use and thinking left out (server tool blocks, compaction blocks: the
    stored reply they came in keeps them), server tools left to the upstream."""
    out = dict(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        readable = []
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            assistant = isinstance(message, Mapping) and message.get("role") == "assistant"
            if assistant and isinstance(content, list):
                kept = [
                    b
                    for b in content
                    if not isinstance(b, Mapping) or b.get("type") in MESSAGES_READ
                ]
                message = {**message, "content": kept or ""}
            readable.append(message)
        out["messages"] = readable
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            t for t in tools if isinstance(t, Mapping) and t.get("type") in (None, "custom")
        ]
    for field in ("context_management", "compaction"):
        out.pop(field, None)  # the upstream's: passed on as given
    return out


class NativeRelay(Relay):
    """A native reply streamed to the client from the whole reply (``turn.events``): every
    event but the last, then the reply stored (``on_finished``), then the last."""

    def __init__(
        self,
        completion: upstream.Completion,
        answer: Callable[[dict[str, Any]], dict[str, Any]],
        events: Callable[[Mapping[str, Any]], Iterable[dict[str, Any]]],
        encode: Callable[[Mapping[str, Any]], bytes],
        *,
        storable: bool,
    ) -> None:
        super().__init__(None, include_usage=True, storable=storable)
        self.completion = completion
        self.whole: upstream.Completion | None = None  # set once finished: what is stored
        self._answer, self._events, self._encode = answer, events, encode

    async def __aiter__(self) -> AsyncIterator[bytes]:
        events = list(self._events(self._answer(json.loads(self.completion.body))))
        try:
            for event in events[:-1]:
                if self.gone:
                    raise ClientGone
                yield self._encode(event)
        except ClientGone:
            return
        self.finished = True
        self.whole = self.completion
        if self.on_finished is not None:
            await self.on_finished()
        for event in events[-1:]:
            yield self._encode(event)

    async def close(self) -> None:
        return None


def native_shape(turn: NativeTurn, name: Callable[[int | None], str], store: bool = True) -> Shape:
    """The client's answer in the turn's API: the upstream's own reply (under Recap's response
    id for the Responses API), whole or as its stream."""
    encode = messages_api.sse if turn.dialect == "messages" else response_events.sse

    def body(data: Any, reply_id: int | None) -> bytes:
        answer = turn.answer(data, name(reply_id), store)
        return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()

    def relay(completion: upstream.Completion, storable: bool = True) -> Relay:
        def answer(data: dict[str, Any]) -> dict[str, Any]:
            return turn.answer(data, name(None), store)

        return NativeRelay(completion, answer, turn.events, encode, storable=storable)

    return Shape(body, relay)


async def passthrough(
    state: routes.State,
    turn: NativeTurn,
    messages: list[Any],
    params: dict[str, Any],
    stream: bool,
    shape: Shape,
) -> Response:
    """The request sent natively as it came, nothing stored."""
    settings = state.turns.settings
    try:
        completion = await state.turns.upstream.native_call(turn, messages, params)
    except Exception as exc:
        raise upstream.as_serve_error(exc, settings) from None
    headers = {**routes.PASSTHROUGH, **turn.report.headers()}
    if not stream:
        return Response(
            shape.body(json.loads(completion.body), None), media_type=JSON_TYPE, headers=headers
        )
    relay = shape.relay(completion, False)
    return TurnStream(relay, relay.close, headers=headers)
