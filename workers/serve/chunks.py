"""What a streamed chat-completions chunk says beside its delta (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def chunk_usage(chunk: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The (prompt, completion, cached) tokens a usage chunk reports; None when it reports none."""
    usage = chunk.get("usage")
    if not isinstance(usage, Mapping) or usage.get("prompt_tokens") is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
    return (
        int(usage["prompt_tokens"]),
        int(usage.get("completion_tokens") or 0),
        int(cached or 0),
    )


def first_choice_deltas(chunk: Mapping[str, Any]) -> Iterator[tuple[Any, Mapping[str, Any]]]:
    """Each entry of choice 0 in the chunk: its finish reason (None until the last) and its
    delta (the other choices a client did not ask for are left out)."""
    for choice in chunk.get("choices") or ():
        if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
            yield choice.get("finish_reason"), choice.get("delta") or {}
