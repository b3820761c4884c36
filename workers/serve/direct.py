"""The direct upstream client: OpenAI chat-completions requests sent by `recap serve` itself,
with one shared HTTP client, to an OpenAI-compatible upstream at an explicit base URL.

litellm spends several milliseconds per call translating, logging and wrapping a request that,
for an OpenAI-compatible upstream, goes out as it came; this path sends the JSON as is, passes
streamed chunks through as the upstream wrote them, and reads the reply (content, tool calls,
reasoning, usage) from the JSON. Failures map as litellm maps them: the upstream's status and
message, and a context overflow recognized by litellm's own rule. The key comes from settings
only and is sent as the ``Authorization`` header, never logged.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import certifi
import httpx
import orjson

from recap.workers.serve import bounded
from recap.workers.serve.replies import (
    BAD_GATEWAY,
    GATEWAY_TIMEOUT,
    OVERFLOW_CODE,
    Chunk,
    Reply,
    UpstreamError,
)

__all__ = ["OVERFLOW_CODE", "Chunk", "DirectClient", "Reply", "UpstreamError"]

PROVIDER_PREFIX = "openai/"
MAX_ERROR_TEXT = 2_000  # characters of a non-JSON error body kept in the message
CONNECTIONS = 100  # at most this many upstream requests at once (the rest wait for one)
USER_AGENT = f"recap-serve aiohttp/{aiohttp.__version__}"  # what the upstream sees calling
DNS_CACHE_SECONDS = 10  # an upstream's address is looked up again after this long
DATA = "data:"
DONE = "[DONE]"
EVENT_STREAM = "text/event-stream"

# httpx logs every request's URL at INFO: one line per turn, and the base URL is a setting that
# may carry credentials; failures reach the log through recap serve's own masked lines.
logging.getLogger("httpx").setLevel(logging.WARNING)


def error_from(status: int, body: bytes) -> UpstreamError:
    """An error response as an ``UpstreamError``: OpenAI's ``{"error": {...}}`` when it is one,
    else the start of the body."""
    try:
        data = bounded.loads(body)
    except bounded.Unreadable:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        message = str(error.get("message") or error)
        return UpstreamError(status, message, str(code) if code is not None else None)
    text = body.decode("utf-8", "replace")[:MAX_ERROR_TEXT] or f"HTTP {status}"
    return UpstreamError(status, str(error) if error is not None else text)


class Stream:
    """The chunks of a streamed reply, read as they arrive; ``aclose`` lets the connection go."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        done = False
        try:
            # read to the end of the body even after [DONE]: a connection whose response was
            # read whole goes back to the pool for the next request instead of being closed
            async for line in self._lines():
                if done or not line.startswith(DATA):
                    continue
                payload = line[len(DATA) :].strip()
                if payload == DONE:
                    done = True
                    continue
                try:
                    data = bounded.loads(payload)
                except bounded.Unreadable as exc:
                    raise UpstreamError(BAD_GATEWAY, f"a streamed chunk is {exc}") from None
                if isinstance(data, dict) and isinstance(data.get("error"), dict):
                    raise error_from(self._response.status, payload.encode())
                if not isinstance(data, dict):
                    raise UpstreamError(BAD_GATEWAY, "a streamed chunk is not a JSON object")
                yield Chunk(payload.encode(), data)
        finally:
            self._response.release()

    async def _lines(self) -> AsyncIterator[str]:
        """The body's lines (ended by a line feed, a carriage return, or both, as server-sent
        events end them; bytes not UTF-8 replaced), read in whatever pieces arrive: a line of
        any length (a tool call's arguments in one chunk) is one line; a connection lost mid-way
        is an ``UpstreamError``."""
        pending = b""
        try:
            async for piece in self._response.content.iter_any():
                pending += piece
                if b"\r" in piece:  # a CR and LF split between pieces makes one empty line more
                    pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                elif b"\n" not in piece:
                    continue
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(
                BAD_GATEWAY, f"the upstream's stream broke off ({type(exc).__name__})"
            ) from None
        if pending:
            yield pending.decode("utf-8", "replace")

    async def aclose(self) -> None:
        self._response.release()


class DirectClient:
    """OpenAI chat completions at ``base`` (``.../v1``) over one pooled HTTP client (aiohttp:
    a 185 KB request reaches the upstream's first byte about a third sooner than through
    httpx, measured side by side; made on first use, inside the server's event loop)."""

    def __init__(self, base: str, key: str | None, timeout: float) -> None:
        self.url = base.rstrip("/") + "/chat/completions"
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        # each step (connecting, every read) may take ``timeout``, as httpx's timeout means
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._proxy = env_proxy(self.url)  # read once, as httpx reads it making its client

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=CONNECTIONS, ttl_dns_cache=DNS_CACHE_SECONDS, ssl=_tls_context()
            )
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout, connector=connector
            )
        return self._session

    async def reply(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """One request's whole reply (usage asked for); ``headers`` go with it beside the
        client's own (the trace context)."""
        response = await self._post(model, messages, params, False, headers)
        return parse_reply(await _read_all(response))

    async def stream(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Stream | ReplyStream:
        """One request's reply as it streams (usage asked for); a server that ignores
        ``stream`` answers with the whole reply: one chunk of it."""
        response = await self._post(model, messages, params, True, headers)
        if not response.headers.get("Content-Type", "").startswith(EVENT_STREAM):
            return ReplyStream(parse_reply(await _read_all(response)))
        return Stream(response)

    async def _post(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        stream: bool,
        headers: Mapping[str, str] | None,
    ) -> aiohttp.ClientResponse:
        """The request sent; its response once the status and headers are in (an error status
        read and raised as an ``UpstreamError``)."""
        body: dict[str, Any] = {**params, "model": model.removeprefix(PROVIDER_PREFIX)}
        body["messages"] = messages
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        try:
            response = await self._client().post(
                self.url, data=request_bytes(body), proxy=self._proxy, headers=headers or None
            )
        except TimeoutError:
            raise UpstreamError(GATEWAY_TIMEOUT, "the upstream did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                BAD_GATEWAY, f"cannot reach the upstream ({type(exc).__name__})"
            ) from None
        if response.status >= 400:
            raise error_from(response.status, await _read_all(response))
        return response

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def env_proxy(url: str) -> str | None:
    """The proxy ``HTTP_PROXY`` / ``HTTPS_PROXY`` name for ``url``, unless ``NO_PROXY`` leaves
    its host out (read from the environment once: a lookup per request costs a scan of it)."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _tls_context() -> ssl.SSLContext:
    """Certificates as the OpenAI and httpx clients verify them: ``SSL_CERT_FILE`` when set,
    else certifi's bundle (not the system store, which a slim container may lack)."""
    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())


async def _read_all(response: aiohttp.ClientResponse) -> bytes:
    """A direct reply's whole body; a connection lost mid-way is an ``UpstreamError``."""
    try:
        return await response.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise UpstreamError(
            BAD_GATEWAY, f"the upstream's reply broke off ({type(exc).__name__})"
        ) from None
    finally:
        response.release()


def request_bytes(body: Mapping[str, Any]) -> bytes:
    """The request's JSON as sent upstream: compact UTF-8 by orjson (a 185 KB request in a
    tenth of the stdlib's time), the stdlib's when orjson cannot write a value."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError: a type or an integer orjson does not write
        return json.dumps(body, separators=(",", ":")).encode()


async def read_body(response: httpx.Response) -> bytes:
    """The whole body of an httpx response (the one litellm's OpenAI client holds); a
    connection lost mid-way is an ``UpstreamError``."""
    try:
        return await response.aread()
    except httpx.HTTPError as exc:
        raise UpstreamError(
            BAD_GATEWAY, f"the upstream's reply broke off ({type(exc).__name__})"
        ) from None
    finally:
        await response.aclose()


def parse_reply(raw: bytes) -> Reply:
    """A whole reply's JSON; an ``UpstreamError`` (a 502) when it is no JSON object."""
    try:
        data = bounded.loads(raw)
    except bounded.Unreadable as exc:
        raise UpstreamError(BAD_GATEWAY, f"the upstream's reply is {exc}") from None
    if not isinstance(data, dict):
        raise UpstreamError(BAD_GATEWAY, "the upstream's reply is not a JSON object")
    return Reply(raw, data)


class ReplyStream:
    """A whole reply as a stream: one chunk of its choices (each message as a delta, its tool
    calls indexed, its finish reason), then one of its usage when it has any."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        for data in reply_chunks(self.reply.data):
            yield Chunk(json.dumps(data, separators=(",", ":")).encode(), data)

    async def aclose(self) -> None:
        return None


def reply_chunks(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chunks a stream of the reply ``data`` would have sent (choices left as they are
    when they are no list: the relay refuses them)."""
    head = {
        "id": data.get("id") or f"chatcmpl-{time.time_ns()}",
        "object": "chat.completion.chunk",
        "created": data.get("created") or int(time.time()),
        "model": data.get("model") or "",
    }
    choices = data.get("choices")
    deltas: Any = choices
    if isinstance(choices, list):
        deltas = [_as_delta(choice) for choice in choices]
    chunks: list[dict[str, Any]] = [{**head, "choices": deltas}]
    if data.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": data["usage"]})
    return chunks


def _as_delta(choice: Any) -> Any:
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return choice
    delta = dict(choice["message"])
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [
            {**call, "index": index} if isinstance(call, dict) else call
            for index, call in enumerate(calls)
        ]
    return {
        "index": choice.get("index", 0),
        "delta": delta,
        "finish_reason": choice.get("finish_reason") or "stop",
    }


def build_from_chunks(chunks: Sequence[Chunk]) -> dict[str, Any]:
    """The whole reply a finished stream sent, in the shape of a non-streamed one: choice 0's
    text, reasoning, refusal, tool calls (arguments joined by index) and signed thinking blocks
    (joined as litellm joins them), and the usage chunk's usage."""
    parts = _Joined()
    usage: Any = None
    finish: Any = None
    for chunk in chunks:
        data = chunk.data
        usage = data.get("usage") or usage
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            finish = choice.get("finish_reason") or finish
            parts.add(choice.get("delta") or {})
    reply: dict[str, Any] = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": parts.message(), "finish_reason": finish}],
    }
    if usage is not None:
        reply["usage"] = usage
    return reply


class _Joined:
    """Choice 0's deltas, joined: texts by field, tool calls by index, thinking pieces."""

    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {"content": [], "reasoning_content": [], "refusal": []}
        self.calls: dict[int, dict[str, Any]] = {}
        self.thinking: list[Any] = []

    def add(self, delta: Mapping[str, Any]) -> None:
        for field, found in (
            ("content", delta.get("content")),
            ("reasoning_content", delta.get("reasoning_content") or delta.get("reasoning")),
            ("refusal", delta.get("refusal")),
        ):
            if found:
                self.texts[field].append(str(found))
        for call in delta.get("tool_calls") or ():
            _merge_call(self.calls, call)
        blocks = delta.get("thinking_blocks")
        if isinstance(blocks, list):
            self.thinking += blocks

    def message(self) -> dict[str, Any]:
        content = self.texts["content"]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[index] for index in sorted(self.calls)]
        for field in ("reasoning_content", "refusal"):
            if self.texts[field]:
                message[field] = "".join(self.texts[field])
        signed = thinking_blocks(self.thinking)
        if signed:
            message["thinking_blocks"] = signed
        return message


def thinking_blocks(pieces: Sequence[Any]) -> list[dict[str, Any]]:
    """Streamed thinking-block pieces as whole blocks, as litellm joins them: the texts up to
    each signature make one signed block, a redacted block stands alone, and text no signature
    closed is left out (an unsigned block cannot be sent back)."""
    blocks: list[dict[str, Any]] = []
    text: list[str] = []
    for piece in pieces:
        if not isinstance(piece, dict):
            continue
        if piece.get("type") == "redacted_thinking":
            text = []
            if piece.get("data"):
                blocks.append({"type": "redacted_thinking", "data": piece["data"]})
            continue
        if isinstance(piece.get("thinking"), str):
            text.append(piece["thinking"])
        if isinstance(piece.get("signature"), str) and piece["signature"]:
            blocks.append(
                {"type": "thinking", "thinking": "".join(text), "signature": piece["signature"]}
            )
            text = []
    return blocks


def _merge_call(calls: dict[int, dict[str, Any]], call: Mapping[str, Any]) -> None:
    index = call.get("index")
    slot = calls.setdefault(
        index if isinstance(index, int) else len(calls),
        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
    )
    if call.get("id"):
        slot["id"] = call["id"]
    function = call.get("function") or {}
    if function.get("name") and not slot["function"]["name"]:
        slot["function"]["name"] = function["name"]
    if function.get("arguments"):
        slot["function"]["arguments"] += function["arguments"]
