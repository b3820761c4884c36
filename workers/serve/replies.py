"""The upstream seam's values: what one chat-completions call gives back, whichever transport
made it (``direct.DirectClient`` over HTTP, ``via_litellm.LitellmClient`` through litellm).

A transport takes plain values in (the model, the messages as ``outgoing`` leaves them, the
parameters, the headers to send) and gives plain values back: a whole ``Reply``, or a
``ChunkStream`` of ``Chunk``; its failures are ``UpstreamError`` (the status, the provider's
message and code) whatever went wrong underneath. Nothing past this module knows which
transport answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

OVERFLOW_CODE = "context_length_exceeded"
BAD_GATEWAY = 502
GATEWAY_TIMEOUT = 504

Usage = tuple[int, int, int]  # prompt, completion and cached tokens, as the provider reported
# recorded with the reply, never sent back upstream (provider items: the native path alone)
NOT_RESENT_KEYS = (
    "reasoning_content",
    "provider_items",
    "provider_items_left_out",
    "provider_summary_items",
)


def outgoing(
    messages: Sequence[Mapping[str, Any]], *, copy: bool = True
) -> list[Mapping[str, Any]]:
    """The messages as a transport sends them: recorded reasoning stays out (each message
    copied unless ``copy`` is false: the direct path only serializes them)."""
    return [
        {k: v for k, v in m.items() if k not in NOT_RESENT_KEYS}
        if any(k in m for k in NOT_RESENT_KEYS)
        else (dict(m) if copy else m)
        for m in messages
    ]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed chunk: its JSON as the upstream wrote it (``b""`` when the transport has
    no bytes of its own to pass on), and parsed."""

    raw: bytes
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole (non-streamed) reply: its JSON as the client gets it, and parsed."""

    raw: bytes
    data: dict[str, Any]


class ChunkStream(Protocol):
    """The chunks of a streamed reply, read as they arrive; ``aclose`` lets the connection go."""

    def __aiter__(self) -> AsyncIterator[Chunk]: ...

    async def aclose(self) -> None: ...


class Transport(Protocol):
    """One way of calling an OpenAI chat-completions upstream."""

    async def reply(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Reply: ...

    async def stream(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> ChunkStream: ...

    async def aclose(self) -> None: ...


class UpstreamError(Exception):
    """The upstream refused or failed a request: its status, message and code
    (``upstream.is_context_overflow`` reads whether it says the request was too large)."""

    def __init__(self, status_code: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code


def failure_text(exc: BaseException) -> str:
    """What went wrong upstream, in one text before masking: a connection that failed (httpx's
    errors, which litellm lets through too), else the exception's message."""
    if isinstance(exc, httpx.HTTPError):
        return f"the connection to the upstream failed ({type(exc).__name__})"
    text = getattr(exc, "message", None)
    return text if isinstance(text, str) and text else str(exc) or type(exc).__name__
