"""Provider items (pure): what a provider made that Recap cannot read, kept on a stored assistant
message (``core.counting.reasoning.ITEMS_KEY``) and put back at its place, byte for byte, when a
request goes to the provider and model that made it (``placed``).

Shared by ``recap serve``'s native dialects and the Python API (``recap.native``); the
conversions of each API are ``native_openai`` (Responses) and ``native_anthropic`` (Messages).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recap.core.counting import reasoning

SENT_HEADER = "X-Recap-Provider-Items-Sent"
# On a summary message as assembled for the model whose provider compacted the same span
# (``core.compression.provider``): the provider's items, sent in place of the summary's text.
SUMMARY_ITEMS_KEY = "provider_summary_items"
LEFT_OUT_HEADER = "X-Recap-Provider-Items-Left-Out"


def dumps(value: Any) -> str:
    """JSON text as Recap writes a provider item and the request around it: compact, UTF-8
    (so an item's stored text and its bytes in the request are the same)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
    message: Mapping[str, Any],
    readable: Sequence[Any],
    model: str,
    report: Report,
    wrap: Callable[[str], Any] = json.loads,
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
        out.insert(min(max(at, 0), len(out)), wrap(str(item["raw"])))
    return out


def stored_items(text: str | None) -> list[dict[str, Any]]:
    """A summary's stored provider items (``summaries.provider_items``; none when absent or
    unreadable)."""
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    return [i for i in value if isinstance(i, dict) and isinstance(i.get("raw"), str)]


def described(text: str | None) -> str:
    """A summary's provider items in a few words (the console, ``recap summaries``): ``""``
    without any, else their model, provider and how many ("openai/gpt-5 (openai): 2 items")."""
    items = stored_items(text)
    if not items:
        return ""
    first = items[0]
    count = f"{len(items)} item{'s' if len(items) != 1 else ''}"
    return f"{first.get('model')} ({first.get('provider')}): {count}"


def summary_items(
    message: Mapping[str, Any], model: str, report: Report, wrap: Callable[[str], Any] = json.loads
) -> list[Any] | None:
    """The provider's items sent in place of a summary message for ``model`` (each as the
    provider wrote it), or None to send the message's readable text; a summary whose items
    are another model's counts them in ``report`` as left out."""
    earlier = message.get(reasoning.LEFT_OUT_KEY)
    if isinstance(earlier, int) and not isinstance(earlier, bool):
        report.left_out += earlier
    found = message.get(SUMMARY_ITEMS_KEY)
    items = [i for i in found or () if isinstance(i, Mapping) and isinstance(i.get("raw"), str)]
    if not items:
        return None
    if not all(reasoning.same_model(item, model) for item in items):
        report.left_out += len(items)
        return None
    report.sent += len(items)
    return [wrap(str(i["raw"])) for i in sorted(items, key=lambda i: int(i.get("at") or 0))]


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or its parts' texts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""
