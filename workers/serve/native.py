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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from recap.core.counting import providers, reasoning
from recap.core.settings import Settings

RESPONSES = "responses"
MESSAGES = "messages"
ANTHROPIC_VERSION = "2023-06-01"
PREFIXES = ("openai/", "azure/", "anthropic/")  # litellm's prefixes the upstream never sees
SENT_HEADER = "X-Recap-Provider-Items-Sent"
LEFT_OUT_HEADER = "X-Recap-Provider-Items-Left-Out"


def dumps(value: Any) -> str:
    """JSON text as Recap writes a provider item and the request around it: compact, UTF-8
    (so an item's stored text and its bytes in the request are the same)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def upstream_name(model: str) -> str:
    """The model as the provider's own API names it (without litellm's prefix)."""
    for prefix in PREFIXES:
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model


def provider_item(
    provider: str,
    model: str,
    item: Mapping[str, Any],
    at: int,
    *,
    kind: str,
    readable: str = "",
    tokens: int | None = None,
) -> dict[str, Any]:
    """One provider item as stored on an assistant message."""
    out: dict[str, Any] = {
        "provider": provider,
        "model": model,
        "kind": kind,
        "type": str(item.get("type") or ""),
        "at": at,
        "readable": readable,
        "raw": dumps(item),
    }
    if tokens is not None:
        out["tokens"] = tokens
    return out


@dataclass
class Report:
    """A request's provider items: how many were sent back, how many left out (another model's,
    or reasoning past the thinking window)."""

    sent: int = 0
    left_out: int = 0

    def headers(self) -> dict[str, str]:
        return {SENT_HEADER: str(self.sent), LEFT_OUT_HEADER: str(self.left_out)}


def placed(
    message: Mapping[str, Any], readable: Sequence[Any], model: str, report: Report
) -> list[Any]:
    """The message's readable items (``readable``, in the provider's order) with its provider
    items of ``model`` put back at their places, each as the provider wrote it; the others
    left out and counted in ``report``."""
    items = reasoning.items_of(message)
    kept = [item for item in items if reasoning.same_model(item, model)]
    report.sent += len(kept)
    earlier = message.get(reasoning.LEFT_OUT_KEY)  # left out by the assembly already
    report.left_out += len(items) - len(kept) + (earlier if isinstance(earlier, int) else 0)
    out: list[Any] = list(readable)
    for item in sorted(kept, key=lambda i: int(i.get("at") or 0)):
        at = int(item.get("at") or 0)
        out.insert(min(max(at, 0), len(out)), RawItem(str(item["raw"])))
    return out


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

    async def post(self, dialect: str, body: bytes) -> tuple[int, bytes]:
        """The upstream's status and body for one request of ``dialect``."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        response = await self._client.post(
            self.urls[dialect], content=body, headers=self.headers(dialect)
        )
        return response.status_code, response.content

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
