"""The upstream model: which model a request names, which of its parameters are passed on, how
it is called (``Upstream``: directly for an OpenAI-compatible base URL, through litellm
otherwise; see ``RECAP_UPSTREAM_CLIENT``), and the reply and usage read back from either.

Only the OpenAI chat-completions parameters below are passed on. litellm also takes arguments
that choose where a request goes and with which key (``api_base``, ``api_key``, ``headers``...):
those come from settings alone, so a client can never send the upstream key elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx

from recap.core import tracing
from recap.core.errors import InputError, RecapError
from recap.core.redact import known_secrets, mask_strings, redact
from recap.core.request.validate import check_message
from recap.core.settings import Settings
from recap.workers.serve import direct, metrics, native
from recap.workers.serve import tracing as serve_tracing
from recap.workers.serve.chunks import usage_counts
from recap.workers.serve.errors import UPSTREAM, ServeError, client_text
from recap.workers.serve.replies import (
    BAD_GATEWAY,
    OVERFLOW_CODE,
    ChunkStream,
    Reply,
    Transport,
    UpstreamError,
    Usage,
    failure_text,
    outgoing,
)
from recap.workers.serve.validation.fields import PART_TYPES

if TYPE_CHECKING:
    from recap.workers.serve.via_litellm import LitellmClient

__all__ = ["UpstreamError", "outgoing"]

PASSED_PARAMS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "seed",
        "service_tier",
        "stop",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
# Read by recap serve itself and not passed on as such.
OWN_PARAMS = frozenset({"model", "messages", "stream", "stream_options", "metadata", "store"})
# OpenAI's caching hints: a client's own are passed on to an OpenAI-family model, and a stored
# turn without them gets its conversation's (``AssembledRequest.cache_params``); other
# providers are sent neither.
CACHE_PARAMS = ("prompt_cache_key", "prompt_cache_retention")
INTERNAL = 500  # an upstream's (or litellm's reading of an upstream reply) is relayed as 502


def parameters(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's parameters to pass on; an unknown one is an OpenAI-style 400."""
    unknown = sorted(set(body) - PASSED_PARAMS - OWN_PARAMS)
    if unknown:
        raise ServeError(
            400, f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0]
        )
    return {k: v for k, v in body.items() if k in PASSED_PARAMS and v is not None}


def resolve_model(name: str, settings: Settings) -> str:
    """The litellm model string for a requested name: ``RECAP_MODEL_MAP``'s, else the name."""
    return settings.model_map.get(name, name)


class Upstream:
    """The upstream as ``RECAP_UPSTREAM_CLIENT`` chooses to call it: ``direct`` sends every
    request to ``RECAP_UPSTREAM_API_BASE`` with one shared HTTP client, ``litellm`` sends every
    one through litellm, ``auto`` sends ``openai/`` models directly when a base URL is set and
    the rest through litellm."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.mode = settings.upstream_client
        base = settings.upstream_api_base or None
        if self.mode == "direct" and base is None:
            raise RecapError("RECAP_UPSTREAM_CLIENT=direct needs RECAP_UPSTREAM_API_BASE")
        key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        self._direct = (
            direct.DirectClient(base, key, settings.llm_timeout)
            if base is not None and self.mode != "litellm"
            else None
        )
        self._litellm: LitellmClient | None = None  # made on first use (``via_litellm``)
        if self._direct is None:  # every request goes through litellm: ready from the start
            self._litellm_client()
        self._server = tracing.server_of(base)  # the calls' server.address and server.port
        if settings.upstream_dialect == "native" and base is None:
            raise RecapError("RECAP_UPSTREAM_DIALECT=native needs RECAP_UPSTREAM_API_BASE")
        self.native = (
            native.NativeClient(settings)
            if base is not None and settings.upstream_dialect != "chat"
            else None
        )

    def dialect_for(self, api: str, model: str) -> str | None:
        """The native dialect a request of ``api`` for ``model`` goes in (``native``), None
        for chat completions."""
        if self.native is None:
            return None
        openai_model = api == native.RESPONSES and (
            model.startswith(("openai/", "azure/")) or is_openai_model(model)
        )
        return native.dialect_for(api, model, self.settings, openai_model=openai_model)

    async def native_call(
        self, turn: Any, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
    ) -> Completion:
        """One request in ``turn``'s native dialect (``native_responses.ResponsesTurn`` or
        ``native_messages.MessagesTurn``): the reply read, masked and checked as a
        ``Completion`` whose body is the upstream's JSON."""
        assert self.native is not None, "a native turn needs the native client"
        # the call's CLIENT span, as on the chat path, carried upstream as W3C traceparent
        call = tracing.model_call(
            native.upstream_name(turn.model),
            provider="anthropic" if turn.dialect == native.MESSAGES else "openai",
            max_tokens=params.get("max_output_tokens", params.get("max_tokens")),
            temperature=params.get("temperature"),
            server=self._server,
        )
        carried: dict[str, str] = {}
        tracing.inject_span(call, carried)
        metrics.upstream_started()
        try:
            try:
                status, raw = await self.native.post(
                    turn.dialect, turn.request(messages, params), headers=carried
                )
            except httpx.HTTPError as exc:
                raise direct.UpstreamError(BAD_GATEWAY, describe_failure(exc, ())) from None
            metrics.upstream_answered(stream=False)
            if status >= 400:
                raise direct.error_from(status, raw)
            completion = read_native(raw, turn, known_secrets(self.settings))
        except BaseException as exc:
            tracing.failed(call, exc)
            call.end()
            raise
        native.traced(call, completion.body)
        call.end()
        return completion

    def is_direct(self, model: str) -> bool:
        """Whether a request for ``model`` goes out on the direct path."""
        if self._direct is None:
            return False
        return self.mode == "direct" or model.startswith(direct.PROVIDER_PREFIX)

    def takes_cache_hints(self, model: str) -> bool:
        """Whether a request for ``model`` goes to an OpenAI-family model: the direct path (an
        OpenAI-compatible base URL), or a model litellm calls as OpenAI."""
        return self.is_direct(model) or is_openai_model(model)

    def with_cache_hints(
        self, model: str, params: Mapping[str, Any], hints: Mapping[str, str]
    ) -> dict[str, Any]:
        """``params`` with the conversation's caching ``hints`` where the client set none of
        its own (a client's value wins), for an OpenAI-family model; without any for another."""
        if not self.takes_cache_hints(model):
            return {k: v for k, v in params.items() if k not in CACHE_PARAMS}
        return {**hints, **params}

    def transport_for(self, model: str) -> Transport:
        """The transport a request for ``model`` goes out on."""
        if self._direct is not None and self.is_direct(model):
            return self._direct
        return self._litellm_client()

    def _litellm_client(self) -> LitellmClient:
        if self._litellm is None:
            from recap.workers.serve.via_litellm import LitellmClient

            self._litellm = LitellmClient(self.settings)
        return self._litellm

    @overload
    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        stream: Literal[False],
    ) -> Reply: ...

    @overload
    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        stream: Literal[True],
    ) -> ChunkStream: ...

    @overload
    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Reply | ChunkStream: ...

    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Reply | ChunkStream:
        """One upstream call: the reply, or its stream when ``stream``; a failure is an
        ``UpstreamError`` whichever transport made the call."""
        if any(name in params for name in CACHE_PARAMS):
            params = self.with_cache_hints(model, params, {})
        transport = self.transport_for(model)
        is_direct = transport is self._direct
        call = tracing.model_call(
            model.removeprefix(direct.PROVIDER_PREFIX) if is_direct else model,
            provider="openai" if is_direct else None,
            max_tokens=params.get("max_completion_tokens", params.get("max_tokens")),
            temperature=params.get("temperature"),
            server=self._server,
        )
        carried: dict[str, str] = {}  # the call's span as W3C traceparent, when tracing
        tracing.inject_span(call, carried)
        metrics.upstream_started()
        sent = outgoing(messages, copy=False) if is_direct else messages
        try:
            if stream:
                chunks = await transport.stream(model, sent, params, headers=carried)
            else:
                reply = await transport.reply(model, sent, params, headers=carried)
        except BaseException as exc:
            tracing.failed(call, exc)
            call.end()
            raise
        metrics.upstream_answered(stream=stream)
        if stream:  # open while relayed: the stored reply ends it (``serve.tracing``)
            serve_tracing.streaming(call)
            return chunks
        traced_reply(call, reply)
        call.end()
        return reply

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()
        if self.native is not None:
            await self.native.aclose()


def is_context_overflow(exc: BaseException) -> bool:
    """The provider said the request does not fit its window: its code says so, or its
    message does by litellm's reading."""
    if not isinstance(exc, UpstreamError):
        return False
    if exc.code == OVERFLOW_CODE:
        return True
    from recap.workers.serve.via_litellm import says_overflow

    return says_overflow(exc.message)


def is_openai_model(model: str) -> bool:
    """Whether litellm calls ``model`` as OpenAI (or Azure OpenAI) does."""
    from recap.workers.serve import via_litellm

    return via_litellm.is_openai_model(model)


def as_serve_error(exc: BaseException, settings: Settings) -> ServeError:
    """An upstream failure as the client sees it: the provider's status when it gave one (a
    gateway error otherwise) and its message with every secret masked, without a traceback or
    a server path (litellm puts both in some of its messages)."""
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and 400 <= status < 600 else BAD_GATEWAY
    if status == INTERNAL or isinstance(exc, MalformedReply):
        status = BAD_GATEWAY  # the upstream failed, not recap serve: a 500 would say it did
    message = describe_failure(exc, known_secrets(settings))
    code = "context_length_exceeded" if is_context_overflow(exc) else None
    return ServeError(status, f"upstream model error: {message}", type=UPSTREAM, code=code)


def describe_failure(exc: BaseException, secrets: Iterable[str]) -> str:
    """One line for a client about an upstream failure: masked, no traceback, no path."""
    return client_text(redact(failure_text(exc), secrets))


class MalformedReply(Exception):
    """The upstream answered 200 with something that is not a whole reply (a 502)."""

    status_code = BAD_GATEWAY

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole reply, read and checked before anything is stored: the body the client gets,
    the assistant message to store (both masked), and the usage, when it is readable."""

    body: bytes
    message: dict[str, Any]
    usage: Usage | None


Replied = Reply | Mapping[str, Any]  # a reply, or a whole reply built from its chunks


def traced_reply(call: Any, reply: Replied) -> None:
    """The reply's usage, model, id and finish reasons on its model call's span."""
    if not call.is_recording():
        return
    data = reply_data(reply)
    found_usage, found_choices = data.get("usage"), data.get("choices")
    usage = found_usage if isinstance(found_usage, dict) else {}
    choices = found_choices if isinstance(found_choices, list) else []
    reasons = [c.get("finish_reason") for c in choices if isinstance(c, dict)]
    tracing.replied(
        call,
        input_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
        response_model=data.get("model"),
        response_id=data.get("id"),
        finish_reasons=[r for r in reasons if isinstance(r, str)],
    )


def reply_data(response: Replied) -> dict[str, Any]:
    """A reply's JSON object."""
    return response.data if isinstance(response, Reply) else dict(response)


def read_reply(response: Replied, secrets: Iterable[str], *, storable: bool = True) -> Completion:
    """The reply checked and masked; a ``MalformedReply`` when it holds no whole message (or,
    with ``storable``, one the database cannot hold)."""
    data = reply_data(response)
    masked, changed = mask_strings(data, secrets)
    assert isinstance(masked, dict)
    message = message_of(masked, storable=storable)
    if isinstance(response, Reply) and not changed:
        body = response.raw  # the upstream's own bytes
    else:
        body = json.dumps(masked, separators=(",", ":"), ensure_ascii=False).encode()
    return Completion(body, message, usage_from(masked.get("usage")))


def read_native(raw: bytes, turn: Any, secrets: Iterable[str]) -> Completion:
    """A native reply (``turn``'s dialect) read, masked and checked: the upstream's own bytes
    as the body when nothing was masked, the message Recap stores, and the usage."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise MalformedReply("the reply is not JSON") from None
    if not isinstance(data, dict):
        raise MalformedReply("the reply is not a JSON object")
    masked, changed = mask_strings(data, secrets)
    assert isinstance(masked, dict)
    try:
        message = check_message(turn.reply_message(masked), "the reply")
    except InputError as exc:
        raise MalformedReply(str(exc)) from None
    body = (
        json.dumps(masked, separators=(",", ":"), ensure_ascii=False).encode() if changed else raw
    )
    return Completion(body, message, turn.usage(masked))


def message_of(data: Mapping[str, Any], *, storable: bool = True) -> dict[str, Any]:
    """The assistant message of choice 0, checked: text or null, tool calls well-formed, some
    text or a tool call (or a refusal) present, and with ``storable`` a message both databases
    can hold (no NUL character); a ``MalformedReply`` naming what is wrong."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedReply("the reply holds no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise MalformedReply("the reply's choice holds no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str) and not _parts(content):
        raise MalformedReply("the reply's content is neither text, content parts nor null")
    out: dict[str, Any] = {"role": "assistant", "content": content}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = _calls(calls)
    refusal = message.get("refusal")
    if content is None and not calls:
        if not isinstance(refusal, str) or not refusal:
            raise MalformedReply("the reply holds neither text nor tool calls")
        out["refusal"] = refusal
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    if not storable:
        return out
    try:
        return check_message(out, "the reply")
    except InputError as exc:
        raise MalformedReply(str(exc)) from None


def _parts(content: Any) -> bool:
    """Whether a reply's content is a list of content parts of known types (some servers
    answer with text and thinking parts)."""
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") in PART_TYPES for part in content
    )


def _calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise MalformedReply("the reply's tool_calls is not a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or not call["id"]
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments", ""), str)
        ):
            raise MalformedReply(
                "the reply holds a tool call without a string id, name and arguments"
            )
        arguments = function.get("arguments") or ""
        out.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return out


usage_from = usage_counts  # a usage object's counts, None when unreadable (workers.serve.chunks)


def reply_message(response: Replied) -> dict[str, Any]:
    """The assistant message of a reply (choice 0) in OpenAI format: content, tool calls and
    the provider's reasoning when it sent any; a ``MalformedReply`` when it holds none."""
    return message_of(reply_data(response))


def usage_of(response: Replied) -> Usage | None:
    """Prompt, completion and cached tokens the provider reported, if it did readably."""
    return usage_from(reply_data(response).get("usage"))
