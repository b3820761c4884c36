"""What a streamed chat-completions chunk says beside its delta (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from recap.core.values.limits import TOKENS_MAX


def chunk_usage(chunk: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The (prompt, completion, cached) tokens a usage chunk reports; None when it reports
    none, or none readable (``usage_counts``)."""
    return usage_counts(chunk.get("usage"))


def usage_counts(found: Any) -> tuple[int, int, int] | None:
    """Prompt, completion and cached tokens of a usage object, or None when it is missing or
    not counts (a string, a negative or oversized number: no reading is better than a wrong
    one)."""
    if not isinstance(found, Mapping):
        return None
    prompt, completion = found.get("prompt_tokens"), found.get("completion_tokens") or 0
    details = found.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    counts = (prompt, completion, cached)
    if not all(_count(value) for value in counts) or not prompt or cached > prompt:
        return None
    return prompt, completion, cached


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= TOKENS_MAX


def first_choice_deltas(chunk: Mapping[str, Any]) -> Iterator[tuple[Any, Mapping[str, Any]]]:
    """Each entry of choice 0 in the chunk: its finish reason (None until the last) and its
    delta (the other choices a client did not ask for are left out)."""
    for choice in chunk.get("choices") or ():
        if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
            yield choice.get("finish_reason"), choice.get("delta") or {}
