"""The summarizer's request on the chat's own prefix (pure), where the provider caches prefixes.

The chat's last request holds the span to summarize behind the same system prompt and tools, and
the provider has it cached. Sent as that request's messages and tools, byte for byte and with its
cache marks where they were, followed by one instruction, most of the summarizer's input is read
from the cache (a tenth of the price at Anthropic) instead of written afresh.

The instruction keeps the cutoff-marker rule: it names the last message of the span (its place
among the messages after the system prompt and the summary, and how it begins) and says that the
messages after it are recent context only. The summary prompt's ``{previous_summary}`` names the
summary message at the start of the request, which the prefix already holds.

``on_prefix`` gives None, and the summarizer keeps its own request shape
(``core.summaries.planning.build_summary_messages``), when the prefix cannot serve:

- the provider caches no prefixes (``cacheable`` false);
- no request was recorded, or it was for another model than the summarizer's (a cache is per
  model), or sent another summary than the one the span follows;
- the span does not begin the request's history (older messages were left out, or the request
  starts elsewhere), or a message of the span is not in the request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from recap.core.summaries.planning import system_prompt
from recap.core.summaries.prompts import SUMMARY_REMINDER

PREVIOUS_IN_REQUEST = (
    "(the summary message at the start of the conversation above, if there is one: merge it in)"
)
QUOTE_CHARS = 160  # how much of the last summarized message the marker quotes


@dataclass(frozen=True, slots=True, kw_only=True)
class SentRequest:
    """The chat's last request as it was sent: its model, messages (cache marks included) and
    tools, the stored id of each message (None for the system prompt, the summary, a stub or
    context file), the summary it sent, and the caching hints it was sent with (OpenAI's
    ``prompt_cache_key``: the summarizer's call goes to the same cache)."""

    model: str
    messages: tuple[dict[str, Any], ...]
    ids: tuple[int | None, ...]
    tools: tuple[dict[str, Any], ...] = ()
    summary_id: int | None = None
    cache_params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PrefixRequest:
    """The summarizer's request: the chat's messages and tools, then the instruction."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    cache_params: dict[str, str] = field(default_factory=dict)

    @property
    def shared(self) -> list[dict[str, Any]]:
        """What it shares with the chat's request: all but the instruction."""
        return self.messages[:-1]


def on_prefix(
    sent: SentRequest | None,
    *,
    model: str,
    summary_id: int | None,
    span: Sequence[int],
    prompt: str,
    cacheable: bool = True,
) -> PrefixRequest | None:
    """The summarizer's request for ``span`` (stored ids, oldest first) on ``sent``, or None
    where the old shape is kept (the module's rules)."""
    if not cacheable or sent is None or not span or sent.model != model:
        return None
    if sent.summary_id != summary_id or len(sent.ids) != len(sent.messages):
        return None
    stored = [(at, mid) for at, mid in enumerate(sent.ids) if mid is not None]
    if not stored or stored[0][1] != span[0]:
        return None  # the span does not begin the request's history
    where = {mid: at for at, mid in stored}
    if any(mid not in where for mid in span):
        return None
    first, last = where[span[0]], where[span[-1]]
    if any(where[a] > where[b] for a, b in pairwise(span)):
        return None
    instruction = {
        "role": "user",
        "content": instruction_text(prompt, last - first + 1, sent.messages[last]),
    }
    return PrefixRequest([*sent.messages, instruction], list(sent.tools), dict(sent.cache_params))


def instruction_text(prompt: str, count: int, last: dict[str, Any]) -> str:
    """The summary prompt, the cutoff (the ``count``-th message of the history, quoted), and
    the reminder."""
    quote = _text_of(last)[:QUOTE_CHARS]
    cutoff = (
        f"=== CUTOFF: summarize the first {count} messages of the conversation above after the "
        f"system prompt and any summary, up to and including the {last.get('role', 'message')} "
        f"message that begins: {quote!r}. The messages after it are recent context only; do not "
        "summarize them. ==="
    )
    return "\n\n".join((system_prompt(prompt, PREVIOUS_IN_REQUEST), cutoff, SUMMARY_REMINDER))


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        ).strip()
    calls = message.get("tool_calls")
    return json.dumps(calls, sort_keys=True)[:QUOTE_CHARS] if calls else ""
