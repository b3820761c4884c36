"""The upstream model: which model a request names, which of its parameters are passed on, how
it is called (``Upstream``: directly for an OpenAI-compatible base URL, through litellm
otherwise; see ``RECAP_UPSTREAM_CLIENT``), and the reply and usage read back from either.

Only the OpenAI chat-completions parameters below are passed on. litellm also takes arguments
that choose where a request goes and with which key (``api_base``, ``api_key``, ``headers``...):
those come from settings alone, so a client can never send the upstream key elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote price map at import
# Recap registers no litellm logging callback: skip the copy of every request litellm makes for
# one (a whole history per call, several milliseconds on a long conversation).
os.environ.setdefault("MAX_BASE64_LENGTH_FOR_LOGGING", "0")

import litellm

from core.errors import RecapError
from core.redact import known_secrets, redact
from core.settings import Settings
from workers.serve import direct
from workers.serve.errors import UPSTREAM, ServeError

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
NOT_RESENT_KEYS = ("reasoning_content",)  # recorded with the reply, never sent back upstream
BAD_GATEWAY = 502


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

    def is_direct(self, model: str) -> bool:
        """Whether a request for ``model`` goes out on the direct path."""
        if self._direct is None:
            return False
        return self.mode == "direct" or model.startswith(direct.PROVIDER_PREFIX)

    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Any:
        """One upstream call: the reply, or its stream when ``stream``."""
        if self._direct is not None and self.is_direct(model):
            sent = outgoing(messages, copy=False)
            return await self._direct.complete(model, sent, params, stream=stream)
        return await complete(model, messages, params, self.settings, stream=stream)

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()


async def complete(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    settings: Settings,
    *,
    stream: bool,
) -> Any:
    """One upstream call: a litellm ``ModelResponse``, or its stream when ``stream``."""
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    # an empty value (compose passes unset variables as "") means litellm's own defaults
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if stream else {}
    return await litellm.acompletion(
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


def is_context_overflow(exc: BaseException) -> bool:
    """The provider said the request does not fit its window."""
    if isinstance(exc, direct.UpstreamError):
        return exc.context_overflow
    return isinstance(exc, litellm.exceptions.ContextWindowExceededError)


def as_serve_error(exc: BaseException, settings: Settings) -> ServeError:
    """An upstream failure as the client sees it: the provider's status when it gave one (a
    gateway error otherwise) and its message with every secret masked."""
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and 400 <= status < 600 else BAD_GATEWAY
    message = redact(getattr(exc, "message", None) or str(exc), known_secrets(settings))
    code = "context_length_exceeded" if is_context_overflow(exc) else None
    return ServeError(status, f"upstream model error: {message}", type=UPSTREAM, code=code)


def _data(response: Any) -> dict[str, Any] | None:
    """A reply of the direct path as its JSON (``None`` for a litellm reply)."""
    if isinstance(response, direct.Reply):
        return response.data
    return response if isinstance(response, dict) else None


def reply_message(response: Any) -> dict[str, Any]:
    """The assistant message of a reply (choice 0) in OpenAI format: content, tool calls and
    the provider's reasoning when it sent any."""
    data = _data(response)
    if data is not None:
        return _json_message(data["choices"][0].get("message") or {})
    message = response.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in calls
        ]
    reasoning = getattr(message, "reasoning_content", None)
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _json_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments"),
                },
            }
            for call in calls
        ]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def usage_of(response: Any) -> tuple[int, int, int] | None:
    """Prompt, completion and cached tokens the provider reported, if it did."""
    data = _data(response)
    if data is not None:
        found = data.get("usage")
        if not isinstance(found, dict) or not found.get("prompt_tokens"):
            return None
        details = found.get("prompt_tokens_details")
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        return int(found["prompt_tokens"]), int(found.get("completion_tokens") or 0), cached
    usage = getattr(response, "usage", None)
    if usage is None or not getattr(usage, "prompt_tokens", None):
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return int(usage.prompt_tokens), int(getattr(usage, "completion_tokens", 0) or 0), cached


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
