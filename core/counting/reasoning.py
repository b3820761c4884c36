"""Reasoning and thinking content (pure): what each provider family takes back, and its text.

Assistant messages can carry the model's reasoning, as litellm stores it:

- ``thinking_blocks``: Anthropic's ``thinking`` (text and signature) and ``redacted_thinking``
  (encrypted ``data``) blocks, and the same blocks as content parts of those types;
- ``reasoning_content``: the chain of thought of OpenAI-compatible servers (DeepSeek and others).

Whether a request sends them back depends on the provider family of the conversation's model
(``family_of``), from each provider's documentation:

- ``anthropic`` (``anthropic/``, any name with ``claude``): the thinking blocks of the tool-use
  turn in progress (the assistant messages after the last user message) are sent back unchanged
  and in order, as Anthropic requires; older ones are dropped (Anthropic strips them from the
  context itself and never requires them).
- ``deepseek`` (a name starting ``deepseek``, not ``deepseek-r1``): ``reasoning_content`` of every
  assistant message that made tool calls, in every later request (DeepSeek's thinking mode answers
  400 without it); other turns' reasoning is ignored by the API, so it is not sent.
- ``openai`` (everything else: OpenAI, DeepSeek-R1 weights on any host, local servers): nothing.
  R1-era reasoning models answer 400 to ``reasoning_content`` in input messages, and no other
  family reads it.

``reasoning_content`` is never sent to Anthropic (litellm rebuilds it from the blocks), and thinking
blocks never to the other families. A text-only request sends no reasoning at all.

``provider_items``: items a provider made that Recap cannot read (OpenAI's encrypted reasoning,
compaction and built-in tool items; Anthropic's signed thinking, redacted thinking, compaction and
server tool blocks), each kept as ``{"provider", "model", "kind", "at", "tokens", "readable",
"raw"}``: ``raw`` the item's JSON text as the provider wrote it, ``at`` its place among the
reply's output items, ``tokens`` the provider's count when its usage gave one. They are sent
only to the provider and model that made them (``same_model``), reasoning items
(``kind == "reasoning"``) only while their turn is within the thinking window (``in_progress``),
and never in a text-only request.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from recap.core.counting import providers

ANTHROPIC = "anthropic"
DEEPSEEK = "deepseek"
OPENAI = "openai"
FAMILIES = (ANTHROPIC, DEEPSEEK, OPENAI)
ALL = "all"  # the basis of a count made with no model: every reasoning string counted
REASONING_KEY = "reasoning_content"
BLOCKS_KEY = "thinking_blocks"
ITEMS_KEY = "provider_items"
# On a message as sent: how many of its provider items were another model's, left out (what
# ``recap serve`` reports; never sent upstream).
LEFT_OUT_KEY = "provider_items_left_out"
REASONING_KIND = "reasoning"  # a provider item under the thinking window (others: always sent)
THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
# Strings a thinking block carries: its text, its signature, or the encrypted redacted data.
BLOCK_FIELDS = ("thinking", "signature", "data")
# Stored counts made for rows that carry reasoning name the family after the encoding.
BASIS_SEPARATOR = "/"


def family_of(model: str | None) -> str:
    """The reasoning family of a litellm model string (see the module's table): Anthropic's
    thinking blocks, DeepSeek's ``reasoning_content`` (not R1's), or OpenAI's fields."""
    provider = providers.provider_of(model)
    if provider == providers.ANTHROPIC:
        return ANTHROPIC
    if provider == providers.DEEPSEEK and not providers.model_name(model).startswith("deepseek-r1"):
        return DEEPSEEK
    return OPENAI


def _is_thinking_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in THINKING_TYPES


def same_model(item: Mapping[str, Any], model: str | None) -> bool:
    """Whether a provider item was made by ``model`` (its provider and its own name)."""
    if not model:
        return False
    return providers.provider_of(model) == item.get("provider") and providers.model_name(
        model
    ) == providers.model_name(str(item.get("model") or ""))


def items_of(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The message's provider items (``ITEMS_KEY``), well-formed ones only."""
    items = message.get(ITEMS_KEY)
    if not isinstance(items, list):
        return []
    return [i for i in items if isinstance(i, Mapping) and isinstance(i.get("raw"), str)]


def items_sent(
    message: Mapping[str, Any], model: str | None, *, in_progress: bool
) -> list[Mapping[str, Any]]:
    """The provider items a request for ``model`` sends of the message: the model's own, and of
    its reasoning items only those of a turn within the thinking window."""
    return [
        item
        for item in items_of(message)
        if same_model(item, model) and (in_progress or item.get("kind") != REASONING_KIND)
    ]


def item_tokens(item: Mapping[str, Any]) -> int:
    """A provider item's tokens: the provider's count when known, else its readable text's
    length, else its JSON's (four characters a token)."""
    tokens = item.get("tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
        return tokens
    readable = item.get("readable")
    text = readable if isinstance(readable, str) and readable else str(item.get("raw") or "")
    return max(len(text) // 4, 1)


def carries(message: Mapping[str, Any]) -> bool:
    """Whether the message holds any reasoning or thinking content."""
    if message.get(REASONING_KEY) or message.get(BLOCKS_KEY) or message.get(ITEMS_KEY):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(_is_thinking_part(part) for part in content)


def sends(family: str, message: Mapping[str, Any], *, in_progress: bool) -> tuple[bool, bool]:
    """What of its reasoning the message sends: (thinking blocks and parts, reasoning_content).

    ``in_progress``: the message belongs to the turn in progress (after the last user message).
    """
    if message.get("role") != "assistant":
        return False, False
    if family == ANTHROPIC:
        return in_progress, False
    if family == DEEPSEEK:
        return False, bool(message.get("tool_calls"))
    return False, False


def as_sent(
    message: dict[str, Any],
    family: str,
    *,
    in_progress: bool,
    text_only: bool = False,
    model: str | None = None,
) -> dict[str, Any]:
    """The message as the request sends it: a copy without the reasoning that is not sent (the
    message itself when it carries none or sends all it carries); provider items only those
    ``items_sent`` keeps for ``model`` (none without one)."""
    if not carries(message):
        return message
    blocks, content = (
        (False, False) if text_only else sends(family, message, in_progress=in_progress)
    )
    out = message
    if ITEMS_KEY in message:
        kept = [] if text_only else items_sent(message, model, in_progress=in_progress)
        if len(kept) != len(items_of(message)) or not kept:
            out = {k: v for k, v in out.items() if k != ITEMS_KEY}
            if kept:
                out[ITEMS_KEY] = kept
            others = sum(1 for i in items_of(message) if not same_model(i, model))
            if others and not text_only:
                out[LEFT_OUT_KEY] = others
    if not content and REASONING_KEY in message:
        out = {k: v for k, v in out.items() if k != REASONING_KEY}
    if not blocks:
        if BLOCKS_KEY in out:
            out = {k: v for k, v in out.items() if k != BLOCKS_KEY}
        parts = out.get("content")
        if isinstance(parts, list) and any(_is_thinking_part(part) for part in parts):
            kept = [part for part in parts if not _is_thinking_part(part)]
            out = {**out, "content": kept or None}
    return out


def strings(message: Mapping[str, Any]) -> Iterator[tuple[str, bool]]:
    """Every reasoning string the message carries, each with whether it starts a new block
    (a thinking block or part, or the ``reasoning_content`` field)."""
    text = message.get(REASONING_KEY)
    if isinstance(text, str) and text:
        yield text, True
    for block in _blocks(message):
        first = True
        for field in BLOCK_FIELDS:
            value = block.get(field)
            if isinstance(value, str) and value:
                yield value, first
                first = False


def _blocks(message: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    blocks = message.get(BLOCKS_KEY)
    if isinstance(blocks, list):
        yield from (block for block in blocks if isinstance(block, Mapping))
    content = message.get("content")
    if isinstance(content, list):
        yield from (part for part in content if _is_thinking_part(part))


def basis(encoding: str, family: str, message: Mapping[str, Any]) -> str:
    """What a stored count was made with: the encoding, and the family when the message carries
    reasoning (the family decides whether that reasoning is in the count)."""
    return f"{encoding}{BASIS_SEPARATOR}{family}" if carries(message) else encoding


def bases_for(encoding: str, family: str) -> tuple[str, str]:
    """The stored bases that are current for a model of this encoding and family."""
    return encoding, f"{encoding}{BASIS_SEPARATOR}{family}"
