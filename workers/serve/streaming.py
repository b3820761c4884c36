"""Streamed replies: upstream chunks passed through as server-sent events as they arrive.

``relay`` forwards each chunk and keeps it; ``TurnStream`` runs a close step however the
response ends (finished, client gone, error), where a stored turn saves the assembled reply (only
when the stream finished: a reply the client never fully received is not stored, so the branch
ends at the request's last message and stays consistent) and lets go of the conversation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from workers.serve.direct import Chunk

DONE = b"data: [DONE]\n\n"
EVENT_STREAM = "text/event-stream"


def event(payload: bytes) -> bytes:
    """One server-sent event holding a JSON payload."""
    return b"data: " + payload + b"\n\n"


class Relay:
    """The upstream stream, forwarded chunk by chunk; ``chunks`` and ``finished`` tell the close
    step what arrived."""

    def __init__(self, stream: Any, *, include_usage: bool) -> None:
        self.stream = stream
        self.include_usage = include_usage
        self.chunks: list[Any] = []
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            self.chunks.append(chunk)
            payload = self._payload(chunk)
            if payload is not None:
                yield event(payload)
        self.finished = True
        yield DONE

    def _payload(self, chunk: Any) -> bytes | None:
        """The chunk as the client asked for it: usage only with ``include_usage`` (a chunk of
        the direct path as the upstream wrote it, unless its usage must go)."""
        if isinstance(chunk, Chunk):
            if self.include_usage:
                return chunk.raw
            if not chunk.data.get("choices"):
                return None
            if "usage" not in chunk.data:
                return chunk.raw
            data = {k: v for k, v in chunk.data.items() if k != "usage"}
            return json.dumps(data, separators=(",", ":")).encode()
        if self.include_usage:
            return str(chunk.model_dump_json(exclude_none=True)).encode()
        if not chunk.choices:
            return None  # the usage chunk Recap asked for on its own account
        data = chunk.model_dump(exclude_none=True)
        data.pop("usage", None)
        return json.dumps(data, separators=(",", ":")).encode()

    async def close(self) -> None:
        """Stop reading the upstream (a no-op once it finished)."""
        with contextlib.suppress(Exception):
            await self.stream.aclose()


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
