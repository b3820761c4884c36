"""The litellm transport of the upstream seam (``replies.Transport``): every provider litellm
calls, its replies and chunks read into plain values and its failures into ``UpstreamError``
here, once, so nothing past the seam sees a litellm object.

litellm takes about three seconds to import. `recap serve` imports this module at startup when
every request goes through litellm (``RECAP_UPSTREAM_CLIENT=litellm``, or no
``RECAP_UPSTREAM_API_BASE``); with a base URL in ``auto`` mode, when it first needs it (a request
for a model it does not send directly, or an error message to read), never for the direct path
alone.

Two litellm habits are handled here too: a server that answers a streamed request with one JSON
body is read as an empty stream by litellm (``answered_whole``, ``whole_reply_stream``), and
litellm's own logging copies each request unless told not to (the environment below).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote price map at import
# Recap registers no litellm logging callback: skip the copy of every request litellm makes for
# one (a whole history per call, several milliseconds on a long conversation).
os.environ.setdefault("MAX_BASE64_LENGTH_FOR_LOGGING", "0")

import httpx
import litellm
from litellm.litellm_core_utils.exception_mapping_utils import ExceptionCheckers

from recap.core.settings import Settings
from recap.workers.serve import direct
from recap.workers.serve.replies import (
    BAD_GATEWAY,
    OVERFLOW_CODE,
    Chunk,
    Reply,
    UpstreamError,
    failure_text,
    outgoing,
)

litellm.suppress_debug_info = True
logging.getLogger("LiteLLM").setLevel(logging.WARNING)  # no line per call; errors still show
litellm.telemetry = False
# litellm's aiohttp transport stalls on small local upstreams (a delayed ACK per request);
# httpx is as fast against real providers and has no such stall.
litellm.disable_aiohttp_transport = True

OPENAI_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai"})
JSON_TYPE = "application/json"


@functools.lru_cache(maxsize=256)
def is_openai_model(model: str) -> bool:
    """Whether litellm calls ``model`` as OpenAI (or Azure OpenAI) does."""
    try:
        provider = litellm.get_llm_provider(model)[1]
    except Exception:  # a name litellm cannot place: not one it calls as OpenAI
        return False
    return provider in OPENAI_PROVIDERS


def says_overflow(message: str) -> bool:
    """Whether an error message says the request does not fit the model's window, by litellm's
    reading of the providers' messages."""
    return bool(ExceptionCheckers.is_error_str_context_window_exceeded(message))


def upstream_error(exc: Exception) -> UpstreamError:
    """A failure under litellm as the seam's one error: the provider's status when litellm
    kept it (a gateway error otherwise), its message, and the overflow code for litellm's
    context-window error."""
    if isinstance(exc, UpstreamError):
        return exc
    status = None if isinstance(exc, httpx.HTTPError) else getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and 400 <= status < 600 else BAD_GATEWAY
    overflow = isinstance(exc, litellm.exceptions.ContextWindowExceededError)
    return UpstreamError(status, failure_text(exc), OVERFLOW_CODE if overflow else None)


def _plain(value: Any, what: str) -> dict[str, Any]:
    """A litellm reply or chunk as its JSON object."""
    try:
        data = value.model_dump(exclude_none=True)
    except Exception as exc:  # a litellm object that cannot be read back
        raise UpstreamError(BAD_GATEWAY, f"{what} cannot be read ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise UpstreamError(BAD_GATEWAY, f"{what} is not a JSON object")
    return data


class LitellmStream:
    """litellm's stream of a reply, chunk by chunk as plain ``Chunk`` values (no bytes of the
    upstream's own: litellm has parsed them), its failures as ``UpstreamError``."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        try:
            async for item in self._stream:
                yield Chunk(b"", _plain(item, "a streamed chunk"))
        except Exception as exc:
            raise upstream_error(exc) from None

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._stream.aclose()


class LitellmClient:
    """Calls through ``litellm.acompletion`` with the upstream's base URL and key from
    settings alone."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def reply(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        try:
            response = await complete(
                model, messages, params, self.settings, stream=False, headers=headers
            )
            data = _plain(response, "the reply")
        except Exception as exc:
            raise upstream_error(exc) from None
        return Reply(direct.request_bytes(data), data)

    async def stream(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> LitellmStream | direct.ReplyStream:
        try:
            stream = await complete(
                model, messages, params, self.settings, stream=True, headers=headers
            )
            if answered_whole(stream):
                return await self._whole(stream, model, messages, params)
        except Exception as exc:
            raise upstream_error(exc) from None
        return LitellmStream(stream)

    async def _whole(
        self,
        stream: Any,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
    ) -> direct.ReplyStream:
        """A whole JSON reply to a streamed request, as the stream of one chunk the direct
        path relays for it. litellm reads such a body as an empty stream (the reply's text is
        lost), so the body is read here: from the HTTP response under litellm's stream when
        it is the `openai` SDK's and still unread (every provider litellm calls through that
        SDK speaks OpenAI's format), else by asking once more without ``stream`` (litellm's
        other handlers keep no body to read)."""
        response = getattr(getattr(stream, "completion_stream", None), "response", None)
        try:
            if isinstance(response, httpx.Response) and not response.is_stream_consumed:
                return direct.ReplyStream(direct.parse_reply(await direct.read_body(response)))
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
        return direct.ReplyStream(await self.reply(model, messages, params))

    async def aclose(self) -> None:
        return None


async def complete(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    settings: Settings,
    *,
    stream: bool,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """One ``litellm.acompletion`` call as `recap serve` makes it: a litellm ``ModelResponse``,
    or its stream when ``stream``; ``headers`` (the trace context) go with the HTTP request."""
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    # an empty value (compose passes unset variables as "") means litellm's own defaults
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if stream else {}
    if headers:
        extra["extra_headers"] = dict(headers)
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


def answered_whole(stream: Any) -> bool:
    """Whether the upstream answered a streamed request with one JSON body (a server that
    ignores ``stream``), by the content type litellm reports among the reply's headers
    (``_hidden_params["additional_headers"]``; an event stream, an NDJSON stream or no
    content type at all is a stream)."""
    hidden = getattr(stream, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    found = headers.get("llm_provider-content-type") if isinstance(headers, dict) else None
    return isinstance(found, str) and found.split(";")[0].strip().lower() == JSON_TYPE
