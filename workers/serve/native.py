"""Native upstream dialects: a Responses request sent to the upstream as a Responses request
(``POST {base}/responses``), a Messages request as a Messages request (``POST
{base without /v1}/v1/messages``), instead of through chat completions.

Which requests go natively is ``RECAP_UPSTREAM_DIALECT``'s (``dialect_for``): ``chat`` (the
default) sends every request through chat completions; ``native`` sends every Responses request
as Responses and every Messages request as Messages; ``auto`` does so where the model string
names a provider that speaks the API (Responses: an OpenAI or Azure model, as litellm places it;
Messages: an Anthropic model, ``anthropic/...`` or a name with ``claude``). Both need
``RECAP_UPSTREAM_API_BASE``, and send ``RECAP_UPSTREAM_API_KEY`` as each API expects it.

What Recap cannot read of a reply (encrypted reasoning, compaction items, signed and redacted
thinking, built-in tool calls and their results) is kept on the stored assistant message as
provider items (``core.counting.reasoning``, ``ITEMS_KEY``): the item's JSON text as the
provider wrote it, its provider and model, its place among the reply's items, and its tokens
by the provider's usage when the usage gives them. A request to that provider and model sends
it back at its place, byte for byte; a request to any other model leaves it out (the message's
readable text and calls stay), and the turn reports how many were sent and left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from recap.core import tracing
from recap.core.counting import providers
from recap.core.request.native_items import LEFT_OUT_HEADER, SENT_HEADER, Report, dumps
from recap.core.settings import Settings

__all__ = [
    "LEFT_OUT_HEADER",
    "SENT_HEADER",
    "NativeClient",
    "NativeTurn",
    "RawItem",
    "Report",
    "encode",
]

RESPONSES = "responses"
MESSAGES = "messages"
ANTHROPIC_VERSION = "2023-06-01"
PREFIXES = ("openai/", "azure/", "anthropic/")  # litellm's prefixes the upstream never sees


def upstream_name(model: str) -> str:
    """The model as the provider's own API names it (without litellm's prefix)."""
    for prefix in PREFIXES:
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model


class NativeTurn:
    """What a turn sent natively shares: the client's body, the model's string, what the last
    request built left out or sent (``Report``), and the body's fields Recap sends itself."""

    dialect: str
    own_fields: frozenset[str] = frozenset()

    def __init__(self, body: Mapping[str, Any], model: str) -> None:
        self.body = body
        self.model = model
        self.report = Report()

    def base_request(self) -> dict[str, Any]:
        """The client's body less the fields Recap sends itself, for the upstream's model name
        (a new report begun)."""
        self.report = Report()
        body: dict[str, Any] = {k: v for k, v in self.body.items() if k not in self.own_fields}
        body["model"] = upstream_name(self.model)
        return body


class RawItem:
    """A provider item's JSON text, written into the request as it is (``encode``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def encode(body: Any) -> bytes:
    """The request body as JSON, every ``RawItem`` written as its stored text, byte for byte."""
    raws: list[str] = []

    def default(value: Any) -> Any:
        if isinstance(value, RawItem):
            raws.append(value.text)
            return f"\x00raw{len(raws) - 1}\x00"
        raise TypeError(f"{type(value).__name__} is not JSON")

    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=default)
    for index, raw in enumerate(raws):
        text = text.replace(dumps(f"\x00raw{index}\x00"), raw, 1)
    return text.encode()


def dialect_for(api: str, model: str, settings: Settings, *, openai_model: bool) -> str | None:
    """The dialect a request of ``api`` (``RESPONSES`` or ``MESSAGES``) for ``model`` goes
    upstream in, None for chat completions (see the module's docstring); ``openai_model``:
    whether litellm calls the model as OpenAI does."""
    mode = settings.upstream_dialect
    if mode == "chat" or not settings.upstream_api_base:
        return None
    if api == MESSAGES:
        anthropic = providers.provider_of(model) == providers.ANTHROPIC
        return MESSAGES if mode == "native" or anthropic else None
    return RESPONSES if mode == "native" or openai_model else None


class NativeClient:
    """One HTTP client for the native dialects, to ``RECAP_UPSTREAM_API_BASE``."""

    def __init__(self, settings: Settings) -> None:
        base = (settings.upstream_api_base or "").rstrip("/")
        self.urls = {
            RESPONSES: f"{base}/responses",
            MESSAGES: f"{base.removesuffix('/v1')}/v1/messages",
        }
        key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else ""
        self.key = key
        self.timeout = settings.llm_timeout
        self._client: httpx.AsyncClient | None = None

    def headers(self, dialect: str) -> dict[str, str]:
        out = {"content-type": "application/json"}
        if dialect == MESSAGES:
            out["anthropic-version"] = ANTHROPIC_VERSION
            if self.key:
                out["x-api-key"] = self.key
        elif self.key:
            out["authorization"] = f"Bearer {self.key}"
        return out

    async def post(
        self, dialect: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """The upstream's status and body for one request of ``dialect`` (``headers``: more to
        send, the call's ``traceparent`` when tracing)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        response = await self._client.post(
            self.urls[dialect], content=body, headers={**self.headers(dialect), **(headers or {})}
        )
        return response.status_code, response.content

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def traced(call: Any, body: bytes) -> None:
    """A native reply's usage, model, id and stop reason on its call's span (Responses and
    Messages JSON both name them ``input_tokens`` and ``output_tokens``)."""
    if not call.is_recording():
        return
    try:
        data = json.loads(body)
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    found = data.get("usage")
    usage = found if isinstance(found, dict) else {}
    reason = data.get("stop_reason", data.get("status"))
    tracing.replied(
        call,
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        response_model=data.get("model"),
        response_id=data.get("id"),
        finish_reasons=[reason] if isinstance(reason, str) else [],
    )
