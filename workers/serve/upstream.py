"""The upstream model, through litellm: which model a request names, which of its parameters are
passed on, and the reply and usage read back.

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

from core.redact import known_secrets, redact
from core.settings import Settings
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


def outgoing(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as sent upstream: recorded reasoning stays out."""
    return [
        {k: v for k, v in m.items() if k not in NOT_RESENT_KEYS}
        if any(k in m for k in NOT_RESENT_KEYS)
        else dict(m)
        for m in messages
    ]


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
    return isinstance(exc, litellm.exceptions.ContextWindowExceededError)


def as_serve_error(exc: BaseException, settings: Settings) -> ServeError:
    """An upstream failure as the client sees it: the provider's status when it gave one (a
    gateway error otherwise) and its message with every secret masked."""
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and 400 <= status < 600 else BAD_GATEWAY
    message = redact(getattr(exc, "message", None) or str(exc), known_secrets(settings))
    code = "context_length_exceeded" if is_context_overflow(exc) else None
    return ServeError(status, f"upstream model error: {message}", type=UPSTREAM, code=code)


def reply_message(response: Any) -> dict[str, Any]:
    """The assistant message of a reply (choice 0) in OpenAI format: content, tool calls and
    the provider's reasoning when it sent any."""
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


def usage_of(response: Any) -> tuple[int, int, int] | None:
    """Prompt, completion and cached tokens the provider reported, if it did."""
    usage = getattr(response, "usage", None)
    if usage is None or not getattr(usage, "prompt_tokens", None):
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return int(usage.prompt_tokens), int(getattr(usage, "completion_tokens", 0) or 0), cached


def build_from_chunks(chunks: list[Any], messages: Sequence[Mapping[str, Any]]) -> Any:
    """The whole reply of a finished stream, assembled by litellm from its chunks."""
    return litellm.stream_chunk_builder(chunks, messages=list(messages))
