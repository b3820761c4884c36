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
from starlette.types import Message, Receive, Scope, Send

from recap.core.redact import StreamMasker, mask_in_place
from recap.workers.serve import direct, upstream
from recap.workers.serve.errors import UPSTREAM
from recap.workers.serve.replies import Chunk, ChunkStream

DONE = b"data: [DONE]\n\n"
EVENT_STREAM = "text/event-stream"
TEXT_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")  # a delta's streamed texts
HEAD_FIELDS = ("id", "object", "created", "model", "system_fingerprint")  # of a released chunk


class ClientGone(Exception):
    """The client of a stream disconnected: the upstream is read no further."""


def event(payload: bytes) -> bytes:
    """One server-sent event holding a JSON payload."""
    return b"data: " + payload + b"\n\n"


class Relay:
    """The upstream stream, forwarded chunk by chunk, each checked and masked as it passes.

    ``checked`` is the one reading of an upstream stream every API's relay shares: a chunk
    that is no chunk (not an object, choices that are no list, content that is no text), an
    upstream error, a broken connection, or a stream that ends before choice 0 has a
    ``finish_reason`` raises; only a finished stream sets ``reply`` (the whole masked reply,
    as a non-streamed one), so nothing else is ever stored. The texts a chunk streams
    (content, reasoning, refusal, tool-call arguments) are masked across chunk boundaries:
    text that could begin a known secret is held back until the next piece shows it does not
    (``StreamMasker``), and released before a piece of another text of the same choice (in a
    chunk of its own, so every API's events keep their order); every other string of a chunk
    is masked where it stands. This relay sends the chunks as chat-completions events and ends
    the client's stream with an OpenAI error event instead of ``[DONE]`` when reading fails;
    another API's relay (``api_routes.ConvertedRelay``) turns the same checked chunks into its
    own events."""

    def __init__(
        self,
        stream: ChunkStream | None,  # None: a subclass relays a whole reply of its own
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
        self._secret_bytes = [secret.encode() for secret in self.masker.secrets]
        self.chunks: list[Chunk] = []  # as relayed (masked), for the stored reply
        self.finished = False
        self.reply: dict[str, Any] | None = None
        self.error: str | None = None
        # awaited once the upstream's stream has finished whole, before the client's stream
        # ends: a stored turn stores the reply there, so its end names a stored reply
        self.on_finished: Callable[[], Awaitable[None]] | None = None
        # set by ``TurnStream`` when the client disconnects: the next chunk read stops the
        # relay (a cancellation alone may never land while a fast upstream keeps it busy)
        self.gone = False
        self._finished_first = False  # choice 0 has its finish_reason
        self._held: dict[int, set[tuple[Any, ...]]] = {}  # per choice, the keys text is held under

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for raw, data in self.checked():
                payload = self._payload(raw, data)
                if payload is not None:
                    yield event(payload)
        except ClientGone:
            return
        except Exception as exc:  # the stream ends with an error event, nothing is stored
            self.error = upstream.describe_failure(exc, self.secrets)
            yield event(error_payload(self.error))
            return
        self.finished = True
        if self.on_finished is not None:
            await self.on_finished()
        yield DONE

    async def checked(self) -> AsyncIterator[tuple[bytes | None, dict[str, Any]]]:
        """Each chunk checked and masked: the upstream's own bytes when nothing in it changed
        (else None), and its JSON object; sets ``reply`` once the stream has finished whole,
        raises when it did not."""
        assert self.stream is not None, "a relay of chunks needs their stream"
        async for item in self.stream:
            if self.gone:
                raise ClientGone()
            raw, data = _parts(item)
            released, changed = self._check(data, raw)
            if released is not None:
                self.chunks.append(Chunk(b"", released))
                yield None, released
            self.chunks.append(Chunk(b"", data))
            yield (raw if not changed else None), data
        if not self._finished_first:
            raise upstream.MalformedReply("the upstream ended its stream before the reply")
        reply = direct.build_from_chunks(self.chunks)
        upstream.message_of(reply, storable=self.storable)
        self.reply = reply

    def _payload(self, raw: bytes | None, data: dict[str, Any]) -> bytes | None:
        """The chunk as a chat-completions client gets it (None: nothing to send)."""
        if not self.include_usage:
            if not data.get("choices"):
                return None  # the usage chunk Recap asked for on its own account
            if "usage" in data:
                data = {k: v for k, v in data.items() if k != "usage"}
                raw = None
        if raw is not None:
            return raw
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    def _check(
        self, data: dict[str, Any], raw: bytes | None = None
    ) -> tuple[dict[str, Any] | None, bool]:
        """Check and mask one chunk in place (``raw``: the upstream's bytes of it, when there
        are any): the chunk of held text to send before it (None when there is none), and
        whether anything in it changed."""
        choices = data.get("choices")
        if choices is None and "usage" not in data:
            raise upstream.MalformedReply("a streamed chunk holds neither choices nor usage")
        if choices is not None and not isinstance(choices, list):
            raise upstream.MalformedReply("a streamed chunk's choices are not a list")
        released: list[dict[str, Any]] = []
        changed = False
        for choice in choices or ():
            changed |= self._choice(choice, released)
        other = self._may_hold_secret(raw) and mask_in_place(data, self.masker.secrets)
        head = {k: data[k] for k in HEAD_FIELDS if k in data}
        return ({**head, "choices": released} if released else None), changed or other

    def _may_hold_secret(self, raw: bytes | None) -> bool:
        """Whether a chunk's other strings need masking: always for a chunk without its bytes
        (litellm's) or with an escape in them (``\\u0073`` spells ``s``); else only when its
        bytes hold a known secret or a ``://`` (without escapes a JSON string's bytes are its
        text's own UTF-8, so looking in the bytes is looking in every string at once)."""
        if raw is None or b"\\" in raw:
            return True
        return b"://" in raw or any(secret in raw for secret in self._secret_bytes)

    def _choice(self, choice: Any, released: list[dict[str, Any]]) -> bool:
        """Check and mask one choice's delta in place (text held for another of its texts
        goes into ``released``); whether anything in it changed."""
        if not isinstance(choice, dict):
            raise upstream.MalformedReply("a streamed choice is not an object")
        index, delta = choice.get("index", 0), choice.get("delta")
        if delta is None:
            delta = choice["delta"] = {}
        if not isinstance(index, int) or not isinstance(delta, dict):
            raise upstream.MalformedReply("a streamed choice has no index or delta")
        keys = [(index, field) for field in TEXT_FIELDS if delta.get(field)]
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise upstream.MalformedReply("a streamed tool_calls is not a list")
            keys += [_call_key(index, call) for call in calls]
        other = self._held.get(index, set()) - set(keys) if keys else set()
        if other:  # another text goes on: what was held of the one before is sent first
            rest: dict[str, Any] = {}
            self._flush(index, rest, other)
            if rest:
                released.append({"index": index, "delta": rest, "finish_reason": None})
        changed = False
        for field in TEXT_FIELDS:
            changed |= self._mask((index, field), delta, field)
        for call in calls or ():
            changed |= self._call(index, call)
        if choice.get("finish_reason"):
            changed |= self._flush(index, delta, set(self._held.get(index, ())))
            self._finished_first |= index == 0
        return changed

    def _call(self, index: int, call: Any) -> bool:
        function = call.get("function")
        if not isinstance(call.get("id", ""), str | None):
            raise upstream.MalformedReply("a streamed tool call's id is not a string")
        if function is None:
            return False
        if not isinstance(function, dict) or not all(
            isinstance(function.get(k, ""), str | None) for k in ("name", "arguments")
        ):
            raise upstream.MalformedReply("a streamed tool call's function is malformed")
        return self._mask(_call_key(index, call), function, "arguments")

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
        else:
            self._held.get(key[0], set()).discard(key)
        if masked == value:
            return False
        holder[field] = masked
        return True

    def _flush(self, index: int, delta: dict[str, Any], keys: set[tuple[Any, ...]]) -> bool:
        """The text held under ``keys`` of a choice, put into ``delta`` (a tool call's before
        the calls already in it); whether any was."""
        held = self._held.get(index, set())
        changed = False
        front: list[dict[str, Any]] = []
        for key in sorted(keys, key=repr):
            held.discard(key)
            rest = self.masker.flush(key)
            if not rest:
                continue
            changed = True
            if key[1] == "call":
                front.append({"index": key[2], "function": {"arguments": rest}})
            else:
                delta[key[1]] = (delta.get(key[1]) or "") + rest
        if front:
            delta["tool_calls"] = [*front, *(delta.get("tool_calls") or ())]
        return changed

    async def close(self) -> None:
        """Stop reading the upstream (a no-op once it finished)."""
        if self.stream is not None:
            with contextlib.suppress(Exception):
                await self.stream.aclose()


def _call_key(index: int, call: Any) -> tuple[Any, ...]:
    """The key a tool call's arguments are masked under (a malformed call: a 502)."""
    if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
        raise upstream.MalformedReply("a streamed tool call is not an object")
    return (index, "call", call.get("index", 0))


def _parts(item: Chunk) -> tuple[bytes | None, dict[str, Any]]:
    """A chunk's bytes from the upstream (None when the transport has none of its own) and
    its JSON object (a copy: checking masks it in place)."""
    return item.raw or None, dict(item.data)


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
        on_first: Callable[[], None] | None = None,
    ) -> None:
        body = relay.__aiter__() if on_first is None else _after_first(relay, on_first)
        super().__init__(body, media_type=EVENT_STREAM, headers=headers)
        self._relay = relay
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watched() -> Message:  # what Starlette listens with for the client leaving
            message = await receive()
            if message["type"] == "http.disconnect":
                self._relay.gone = True
            return message

        try:
            await super().__call__(scope, watched, send)
        finally:
            await self._on_close()


async def _after_first(relay: Relay, on_first: Callable[[], None]) -> AsyncIterator[bytes]:
    """The relay's chunks, ``on_first`` called once the first has been sent to the client."""
    first = True
    async for chunk in relay:
        yield chunk
        if first:  # back here: the server has sent the chunk before asking for the next
            first = False
            on_first()
