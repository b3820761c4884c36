"""The upstream model: which model a request names, which of its parameters are passed on, how
it is called (``Upstream``: directly for an OpenAI-compatible base URL, through litellm
otherwise; see ``RECAP_UPSTREAM_CLIENT``), and the reply and usage read back from either.

Only the OpenAI chat-completions parameters below are passed on. litellm also takes arguments
that choose where a request goes and with which key (``api_base``, ``api_key``, ``headers``...):
those come from settings alone, so a client can never send the upstream key elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote price map at import
# Recap registers no litellm logging callback: skip the copy of every request litellm makes for
# one (a whole history per call, several milliseconds on a long conversation).
os.environ.setdefault("MAX_BASE64_LENGTH_FOR_LOGGING", "0")

import httpx
import litellm

from recap.core import tracing
from recap.core.errors import InputError, RecapError
from recap.core.redact import known_secrets, mask_strings, redact
from recap.core.request.validate import check_message
from recap.core.settings import Settings
from recap.workers.serve import direct, metrics, native
from recap.workers.serve import tracing as serve_tracing
from recap.workers.serve.chunks import usage_counts
from recap.workers.serve.errors import UPSTREAM, ServeError, client_text
from recap.workers.serve.validation.fields import PART_TYPES

litellm.suppress_debug_info = True
logging.getLogger("LiteLLM").setLevel(logging.WARNING)  # no line per call; errors still show
litellm.telemetry = False
# litellm's aiohttp transport stalls on small local upstreams (a delayed ACK per request);
# httpx is as fast against real providers and has no such stall.
litellm.disable_aiohttp_transport = True

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
OPENAI_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai"})
# recorded with the reply, never sent back upstream (provider items: the native path alone)
NOT_RESENT_KEYS = (
    "reasoning_content",
    "provider_items",
    "provider_items_left_out",
    "provider_summary_items",
)
BAD_GATEWAY = 502
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


@functools.lru_cache(maxsize=256)
def is_openai_model(model: str) -> bool:
    """Whether litellm calls ``model`` as OpenAI (or Azure OpenAI) does."""
    try:
        provider = litellm.get_llm_provider(model)[1]
    except Exception:  # a name litellm cannot place: not one it calls as OpenAI
        return False
    return provider in OPENAI_PROVIDERS


def outgoing(
    messages: Sequence[Mapping[str, Any]], *, copy: bool = True
) -> list[Mapping[str, Any]]:
    """The messages as sent upstream: recorded reasoning stays out (each message copied unless
    ``copy`` is false: the direct path only serializes them)."""
    return [
        {k: v for k, v in m.items() if k not in NOT_RESENT_KEYS}
        if any(k in m for k in NOT_RESENT_KEYS)
        else (dict(m) if copy else m)
        for m in messages
    ]


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

    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Any:
        """One upstream call: the reply, or its stream when ``stream``."""
        if any(name in params for name in CACHE_PARAMS):
            params = self.with_cache_hints(model, params, {})
        is_direct = self._direct is not None and self.is_direct(model)
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
        try:
            if is_direct:
                assert self._direct is not None
                sent = outgoing(messages, copy=False)
                reply = await self._direct.complete(
                    model, sent, params, stream=stream, headers=carried
                )
            else:
                reply = await complete(
                    model, messages, params, self.settings, stream=stream, headers=carried
                )
        except BaseException as exc:
            tracing.failed(call, exc)
            call.end()
            raise
        metrics.upstream_answered(stream=stream)
        if stream:  # open while relayed: the stored reply ends it (``serve.tracing``)
            serve_tracing.streaming(call)
            return reply
        traced_reply(call, reply)
        call.end()
        return reply

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()
        if self.native is not None:
            await self.native.aclose()


async def complete(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    settings: Settings,
    *,
    stream: bool,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """One upstream call: a litellm ``ModelResponse``, or its stream when ``stream``;
    ``headers`` (the trace context) go with the HTTP request."""
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    # an empty value (compose passes unset variables as "") means litellm's own defaults
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if stream else {}
    if headers:
        extra["extra_headers"] = dict(headers)
    response = await litellm.acompletion(
        model=model,
        messages=outgoing(messages),
        stream=stream,
        api_base=settings.upstream_api_base or None,
        api_key=key or None,
        timeout=settings.llm_timeout,
        max_retries=0,
        num_retries=0,
        **extra,
        **params,
    )
    if stream and answered_whole(response):
        return await whole_reply_stream(response, model, messages, params, settings)
    return response


JSON_TYPE = "application/json"


def answered_whole(stream: Any) -> bool:
    """Whether the upstream answered a streamed request with one JSON body (a server that
    ignores ``stream``), by the content type litellm reports among the reply's headers
    (``_hidden_params["additional_headers"]``; an event stream, an NDJSON stream or no
    content type at all is a stream)."""
    hidden = getattr(stream, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    found = headers.get("llm_provider-content-type") if isinstance(headers, dict) else None
    return isinstance(found, str) and found.split(";")[0].strip().lower() == JSON_TYPE


async def whole_reply_stream(
    stream: Any,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    settings: Settings,
) -> direct.ReplyStream:
    """A whole JSON reply to a streamed request, as the stream of one chunk the direct path
    relays for it. litellm reads such a body as an empty stream (the reply's text is lost), so
    the body is read here: from the HTTP response under litellm's stream when it is the
    `openai` SDK's and still unread (every provider litellm calls through that SDK speaks
    OpenAI's format), else by asking once more without ``stream`` (litellm's other handlers
    keep no body to read)."""
    response = getattr(getattr(stream, "completion_stream", None), "response", None)
    try:
        if isinstance(response, httpx.Response) and not response.is_stream_consumed:
            return direct.ReplyStream(direct.parse_reply(await direct.read_body(response)))
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()
    reply = await complete(model, messages, params, settings, stream=False)
    data = reply_data(reply)
    return direct.ReplyStream(direct.Reply(json.dumps(data).encode(), data))


def is_context_overflow(exc: BaseException) -> bool:
    """The provider said the request does not fit its window."""
    if isinstance(exc, direct.UpstreamError):
        return exc.context_overflow
    return isinstance(exc, litellm.exceptions.ContextWindowExceededError)


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
    if isinstance(exc, httpx.HTTPError):  # litellm lets some of httpx's errors through
        return f"the connection to the upstream failed ({type(exc).__name__})"
    text = getattr(exc, "message", None)
    text = text if isinstance(text, str) and text else str(exc) or type(exc).__name__
    return client_text(redact(text, secrets))


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
    usage: tuple[int, int, int] | None


def traced_reply(call: Any, reply: Any) -> None:
    """The reply's usage, model, id and finish reasons on its model call's span."""
    if not call.is_recording():
        return
    try:
        data = reply_data(reply)
    except MalformedReply:
        return
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


def reply_data(response: Any) -> dict[str, Any]:
    """A reply of either path as its JSON object."""
    data = _data(response)
    if data is not None:
        return data
    try:
        dumped = response.model_dump(exclude_none=True)
    except Exception as exc:  # a litellm object that cannot be read back
        raise MalformedReply(f"the reply cannot be read ({type(exc).__name__})") from None
    if not isinstance(dumped, dict):
        raise MalformedReply("the reply is not a JSON object")
    return dumped


def read_reply(response: Any, secrets: Iterable[str], *, storable: bool = True) -> Completion:
    """The reply checked and masked; a ``MalformedReply`` when it holds no whole message (or,
    with ``storable``, one the database cannot hold)."""
    data = reply_data(response)
    masked, changed = mask_strings(data, secrets)
    assert isinstance(masked, dict)
    message = message_of(masked, storable=storable)
    if isinstance(response, direct.Reply) and not changed:
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


def _data(response: Any) -> dict[str, Any] | None:
    """A reply of the direct path as its JSON (``None`` for a litellm reply)."""
    if isinstance(response, direct.Reply):
        return response.data
    return response if isinstance(response, dict) else None


def reply_message(response: Any) -> dict[str, Any]:
    """The assistant message of a reply (choice 0) in OpenAI format: content, tool calls and
    the provider's reasoning when it sent any; a ``MalformedReply`` when it holds none."""
    return message_of(reply_data(response))


def usage_of(response: Any) -> tuple[int, int, int] | None:
    """Prompt, completion and cached tokens the provider reported, if it did readably."""
    try:
        data = reply_data(response)
    except MalformedReply:
        return None
    return usage_from(data.get("usage"))


def build_from_chunks(chunks: list[Any], messages: Sequence[Mapping[str, Any]]) -> Any:
    """The whole reply of a finished stream, assembled from its chunks (by litellm for its own)."""
    if not chunks or isinstance(chunks[0], direct.Chunk):
        return direct.build_from_chunks(chunks)
    return litellm.stream_chunk_builder(chunks, messages=list(messages))


def reply_bytes(response: Any) -> bytes:
    """A non-streamed reply as the client gets it: the upstream's own JSON on the direct path."""
    if isinstance(response, direct.Reply):
        return response.raw
    return str(response.model_dump_json(exclude_none=True)).encode()
