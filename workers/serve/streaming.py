"""Streamed replies: upstream chunks passed through as server-sent events as they arrive.

``relay`` forwards each chunk and keeps it; ``TurnStream`` runs a close step however the
response ends (finished, client gone, error), where a stored turn saves the assembled reply (only
when the stream finished: a reply the client never fully received is not stored, so the branch
ends at the request's last message and stays consistent) and lets go of the conversation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from core.redact import StreamMasker
from workers.serve import direct, upstream
from workers.serve.direct import Chunk
from workers.serve.errors import UPSTREAM

DONE = b"data: [DONE]\n\n"
EVENT_STREAM = "text/event-stream"
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")  # a delta's texts, masked each


def event(payload: bytes) -> bytes:
    """One server-sent event holding a JSON payload."""
    return b"data: " + payload + b"\n\n"


class Relay:
    """The upstream stream, forwarded chunk by chunk, each checked and masked as it passes.

    A chunk that is no chunk (not an object, choices that are no list, content that is no
    text), an upstream error, a broken connection, or a stream that ends before choice 0 has a
    ``finish_reason`` ends the client's stream with an OpenAI error event instead of
    ``[DONE]``; only a finished stream sets ``reply`` (the whole masked reply, as a
    non-streamed one) and ``finished``, so nothing else is ever stored. Text that could begin a
    known secret is held back until the next chunk shows it does not (``StreamMasker``)."""

    def __init__(
        self,
        stream: Any,
        *,
        include_usage: bool,
        secrets: Iterable[str] = (),
        storable: bool = True,
    ) -> None:
        self.stream = stream
        self.storable = storable  # the reply will be stored: it must be storable to finish
        self.include_usage = include_usage
        self.secrets = list(secrets)
        self.masker = StreamMasker(self.secrets)
        self.chunks: list[Chunk] = []  # as relayed (masked), for the stored reply
        self.finished = False
        self.reply: dict[str, Any] | None = None
        self.error: str | None = None
        self._finished_first = False  # choice 0 has its finish_reason
        self._held: dict[int, set[tuple[Any, ...]]] = {}  # per choice, the keys text is held under

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for item in self.stream:
                payload = self._relay(item)
                if payload is not None:
                    yield event(payload)
            if not self._finished_first:
                raise upstream.MalformedReply("the upstream ended its stream before the reply")
            reply = direct.build_from_chunks(self.chunks)
            upstream.message_of(reply, storable=self.storable)
        except Exception as exc:  # the stream ends with an error event, nothing is stored
            self.error = upstream.describe_failure(exc, self.secrets)
            yield event(error_payload(self.error))
            return
        self.reply = reply
        self.finished = True
        yield DONE

    def _relay(self, item: Any) -> bytes | None:
        """The chunk as the client gets it (None: nothing to send), kept for the reply."""
        raw, data = _parts(item)
        choices = data.get("choices")
        if choices is None and "usage" not in data:
            raise upstream.MalformedReply("a streamed chunk holds neither choices nor usage")
        if choices is not None and not isinstance(choices, list):
            raise upstream.MalformedReply("a streamed chunk's choices are not a list")
        changed = False
        for choice in choices or ():
            changed |= self._choice(choice)
        self.chunks.append(Chunk(b"", data))
        if not self.include_usage:
            if not choices:
                return None  # the usage chunk Recap asked for on its own account
            if "usage" in data:
                data = {k: v for k, v in data.items() if k != "usage"}
                changed = True
        if raw is not None and not changed:
            return raw
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    def _choice(self, choice: Any) -> bool:
        """Check and mask one choice's delta in place; whether anything in it changed."""
        if not isinstance(choice, dict):
            raise upstream.MalformedReply("a streamed choice is not an object")
        index, delta = choice.get("index", 0), choice.get("delta")
        if delta is None:
            delta = choice["delta"] = {}
        if not isinstance(index, int) or not isinstance(delta, dict):
            raise upstream.MalformedReply("a streamed choice has no index or delta")
        changed = False
        for field in TEXT_FIELDS:
            changed |= self._mask((index, field), delta, field)
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise upstream.MalformedReply("a streamed tool_calls is not a list")
            for call in calls:
                changed |= self._call(index, call)
        finish = choice.get("finish_reason")
        if finish:
            changed |= self._flush(index, delta)
            self._finished_first |= index == 0
        return changed

    def _call(self, index: int, call: Any) -> bool:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
            raise upstream.MalformedReply("a streamed tool call is not an object")
        if not isinstance(call.get("id", ""), str | None):
            raise upstream.MalformedReply("a streamed tool call's id is not a string")
        if function is None:
            return False
        if not isinstance(function, dict) or not all(
            isinstance(function.get(k, ""), str | None) for k in ("name", "arguments")
        ):
            raise upstream.MalformedReply("a streamed tool call's function is malformed")
        return self._mask((index, "call", call.get("index", 0)), function, "arguments")

    def _mask(self, key: tuple[Any, ...], holder: dict[str, Any], field: str) -> bool:
        """Mask ``holder[field]`` as the next piece of the text under ``key``; whether it
        changed."""
        value = holder.get(field)
        if value is None:
            return False
        if not isinstance(value, str):
            raise upstream.MalformedReply(f"a streamed {field} is not text")
        masked = self.masker.feed(key, value)
        if self.masker.holding(key):
            self._held.setdefault(key[0], set()).add(key)
        if masked == value:
            return False
        holder[field] = masked
        return True

    def _flush(self, index: int, delta: dict[str, Any]) -> bool:
        """The text held for a finished choice, put into its last delta."""
        keys = self._held.pop(index, set())
        changed = False
        for key in sorted(keys, key=repr):
            rest = self.masker.flush(key)
            if not rest:
                continue
            changed = True
            if key[1] == "call":
                calls = delta.setdefault("tool_calls", [])
                calls.append({"index": key[2], "function": {"arguments": rest}})
            else:
                delta[key[1]] = (delta.get(key[1]) or "") + rest
        return changed

    async def close(self) -> None:
        """Stop reading the upstream (a no-op once it finished)."""
        with contextlib.suppress(Exception):
            await self.stream.aclose()


def _parts(item: Any) -> tuple[bytes | None, dict[str, Any]]:
    """A chunk of either path: the upstream's bytes (direct path) and its JSON object."""
    if isinstance(item, Chunk):
        return item.raw, dict(item.data)
    data = item.model_dump(exclude_none=True)
    if not isinstance(data, dict):
        raise upstream.MalformedReply("a streamed chunk is not an object")
    return None, data


def error_payload(message: str) -> bytes:
    """An OpenAI error event's payload: what the SDKs raise as an API error mid-stream."""
    body = {"error": {"message": message, "type": UPSTREAM, "param": None, "code": None}}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


class TurnStream(StreamingResponse):
    """A streaming response whose close step runs however the response ends."""

    def __init__(
        self,
        relay: Relay,
        on_close: Callable[[], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(relay.__aiter__(), media_type=EVENT_STREAM, headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
