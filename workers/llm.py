"""The one place that calls a model: litellm with an explicit timeout, its own retries off, and
every failure sorted into retry later, shrink the input, or give up.

Retrying belongs to Celery (``self.retry`` with backoff), not to litellm: a retry inside the call
would hold the worker thread and hide the attempt from the task's bounded count.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote price map at import

import litellm

from recap.core import tracing
from recap.core.settings import Settings
from recap.workers import metrics

litellm.suppress_debug_info = True
litellm.telemetry = False

RETRY_BASE_SECONDS = 1.0  # the first retry waits about this long, then doubles
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


class LLMError(Exception):
    """The summarizer call failed; ``retryable`` says whether trying again later may help."""

    retryable = False

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RetryableLLMError(LLMError):
    """A rate limit, a server error, a timeout or a refused connection: try again later."""

    retryable = True


class FatalLLMError(LLMError):
    """Authentication, a bad request, an unknown model: trying again cannot help."""


class ContextTooLongError(LLMError):
    """The input did not fit the model's window: send it in smaller chunks instead."""

    sent_tokens: int | None = None  # what the refused request took, input and output, if known


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """The text of one reply and what it cost."""

    text: str
    model: str
    input_tokens: int
    output_tokens: int
    cost: float
    cached_tokens: int = 0  # the part of the input read from the provider's cache


def backoff_seconds(attempt: int, cap: float, *, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: a random wait up to ``base x 2**attempt``, capped."""
    ceiling = min(cap, RETRY_BASE_SECONDS * (2**attempt))
    return (rng or random).uniform(ceiling / 2, ceiling)


def classify(exc: Exception) -> LLMError:
    """One of Recap's three kinds of failure for a litellm (or transport) exception.

    ``ContextWindowExceededError`` subclasses ``BadRequestError``, so it is tested first.
    """
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    if isinstance(exc, litellm.exceptions.ContextWindowExceededError):
        return ContextTooLongError(message, status)
    if isinstance(
        exc, litellm.exceptions.Timeout | litellm.exceptions.APIConnectionError | TimeoutError
    ):
        return RetryableLLMError(message, status)
    if isinstance(exc, litellm.exceptions.RateLimitError | litellm.exceptions.InternalServerError):
        return RetryableLLMError(message, status)
    if isinstance(
        exc, litellm.exceptions.ServiceUnavailableError | litellm.exceptions.BadGatewayError
    ):
        return RetryableLLMError(message, status)
    if status is not None and (status in RETRYABLE_STATUSES or status >= 500):
        return RetryableLLMError(message, status)
    return FatalLLMError(message, status)


def complete(
    messages: Sequence[Mapping[str, Any]],
    settings: Settings,
    *,
    model: str | None = None,
    max_tokens: int | None = None,
    timeout: float | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
    cache_params: Mapping[str, str] | None = None,
) -> Completion:
    """One chat completion; raises an ``LLMError`` subclass on any failure. ``timeout`` (at most
    ``RECAP_LLM_TIMEOUT``) is what is left of the run's time when that is less. ``tools`` and
    ``cache_params`` (OpenAI's ``prompt_cache_key``) are sent as the chat's request sent them,
    for a request built on its prefix (the model is not asked to call a tool)."""
    name = model or settings.summary_model
    if not name:
        raise FatalLLMError("no summary model is configured (RECAP_SUMMARY_MODEL)")
    key = settings.summary_api_key.get_secret_value() if settings.summary_api_key else None
    limit = max_tokens or settings.summary_max_output_tokens
    server = tracing.server_of(settings.summary_api_base)
    call = tracing.model_call(name, max_tokens=limit, temperature=0, server=server)
    try:
        response = litellm.completion(
            model=name,
            messages=[dict(m) for m in messages],
            timeout=min(timeout, settings.llm_timeout) if timeout else settings.llm_timeout,
            max_retries=0,
            num_retries=0,
            api_base=settings.summary_api_base,
            api_key=key,
            max_tokens=limit,
            temperature=0,
            **_prefix_params(tools, cache_params, name),
        )
    except Exception as exc:  # every failure is sorted, none escapes unclassified
        metrics.summarizer_error()
        tracing.failed(call, exc)
        call.end()
        raise classify(exc) from exc
    completion = _completion_of(response, name)
    metrics.summarizer_call(completion.input_tokens, completion.output_tokens)
    _traced(call, response, completion)
    return completion


CACHE_HINT_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai"})


def takes_cache_hints(model: str) -> bool:
    """Whether litellm calls ``model`` as OpenAI does (it takes ``prompt_cache_key``)."""
    try:
        return litellm.get_llm_provider(model)[1] in CACHE_HINT_PROVIDERS
    except Exception:  # a name litellm cannot place: not one it calls as OpenAI
        return False


def _prefix_params(
    tools: Sequence[Mapping[str, Any]], cache_params: Mapping[str, str] | None, model: str
) -> dict[str, Any]:
    """The tools and caching hints (for a model called as OpenAI) of a request built on the
    chat's prefix (none otherwise)."""
    params: dict[str, Any] = dict(cache_params or {}) if takes_cache_hints(model) else {}
    if tools:
        params["tools"] = [dict(tool) for tool in tools]
    return params


def cached_tokens_of(usage: Any) -> int:
    """The input tokens a reply's usage says were read from the provider's cache (OpenAI's
    ``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``)."""
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    if not cached:
        cached = getattr(usage, "cache_read_input_tokens", None)
    return int(cached or 0)


def _traced(call: Any, response: Any, completion: Completion) -> None:
    """The reply's usage, model, id and finish reason on the call's span, then its end."""
    if call.is_recording():
        choices = getattr(response, "choices", None) or []
        reasons = [getattr(choice, "finish_reason", None) for choice in choices]
        tracing.replied(
            call,
            input_tokens=completion.input_tokens,
            output_tokens=completion.output_tokens,
            response_model=getattr(response, "model", None),
            response_id=getattr(response, "id", None),
            finish_reasons=[r for r in reasons if isinstance(r, str)],
        )
    call.end()


def _completion_of(response: Any, model: str) -> Completion:
    choice = response.choices[0] if getattr(response, "choices", None) else None
    text = getattr(getattr(choice, "message", None), "content", None) or ""
    usage = getattr(response, "usage", None)
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = float(hidden.get("response_cost") or 0.0)  # litellm prices each reply it can
    return Completion(
        text=str(text),
        model=model,
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost=cost,
        cached_tokens=cached_tokens_of(usage),
    )
